"""A sweep's curves (PNG) and its facts (summary.md), from the rows of sweep.csv.

throughput_ttft.png     throughput vs p99 TTFT, a curve per policy, a point per rate
itl_batch.png           p99 inter-token gap vs max running sequences, at the highest rate
goodput_rate.png        goodput vs arrival rate, with the offered load for reference
service_rate.png        service difference and Jain's index between tenants vs rate

A curve is one policy with one setting of the other knobs; its label names the knobs that
vary in the sweep, so a sweep of one setting reads "fcfs", not "fcfs mr=16 tb=128 …".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from app.lab.bench.table import num, pct
from quanta_core.requests import SloClass
from quanta_core.workload import WorkloadSpec

Row = dict[str, Any]
KNOBS = ("max_running", "token_budget", "block_size", "kv_blocks")
_SHORT = {"max_running": "mr", "token_budget": "tb", "block_size": "bs", "kv_blocks": "kv"}


def curves(rows: Sequence[Row], knobs: Sequence[str] = KNOBS) -> dict[str, list[Row]]:
    """Rows grouped by policy and ``knobs``, each group sorted by rate, in first-seen order."""
    varying = [k for k in knobs if len({r[k] for r in rows}) > 1]
    out: dict[str, list[Row]] = {}
    for r in rows:
        label = " ".join([r["policy"], *(f"{_SHORT[k]}={r[k]}" for k in varying)])
        out.setdefault(label, []).append(r)
    return {k: sorted(v, key=lambda r: r["rate"]) for k, v in out.items()}


def _xy(rows: Sequence[Row], x: str, y: str) -> tuple[list[float], list[float]]:
    pairs = [(r[x], r[y]) for r in rows if r[x] is not None and r[y] is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _finish(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def throughput_vs_ttft(rows: Sequence[Row], ttft_target: float | None, path: Path) -> Path:
    # The target is the interactive class's: plot that class's TTFT where there is one.
    column = "interactive_ttft_p99_s" if _has(rows, "interactive_ttft_p99_s") else "ttft_p99_s"
    who = "interactive " if column.startswith("interactive") else ""
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    for label, group in curves(rows).items():
        xs, ys = _xy(group, "throughput_rps", column)
        ax.plot(xs, ys, marker="o", label=label)
    if ttft_target is not None:
        label = f"TTFT target {ttft_target:g} s"
        ax.axhline(ttft_target, color="grey", linestyle="--", label=label)
    ax.set_yscale("log")  # past the knee TTFT grows by orders of magnitude
    _finish(
        ax,
        "throughput (requests/s); a point per arrival rate",
        f"{who}p99 TTFT (s, log)",
        "throughput vs p99 TTFT",
    )
    return _save(fig, path)


def _has(rows: Sequence[Row], column: str) -> bool:
    return any(r[column] is not None for r in rows)


def itl_vs_batch(rows: Sequence[Row], itl_target: float | None, path: Path) -> Path:
    # At low load the batch never fills and max_running does not matter: read it at the top.
    top = max(r["rate"] for r in rows)
    at_top = [r for r in rows if r["rate"] == top]
    column = "interactive_itl_p99_s" if _has(rows, "interactive_itl_p99_s") else "itl_p99_s"
    who = "interactive " if column.startswith("interactive") else ""
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    others = [k for k in KNOBS if k != "max_running"]
    for label, group in curves(at_top, others).items():
        ordered = sorted(group, key=lambda r: r["max_running"])
        xs, ys = _xy(ordered, "max_running", column)
        ax.plot(xs, ys, marker="o", label=label)
    if itl_target is not None:
        ax.axhline(itl_target, color="grey", linestyle="--", label=f"ITL target {itl_target:g} s")
    if len({r["max_running"] for r in rows}) == 1:
        note = "one max_running value swept: give --max-running 4,8,16,32 for a curve"
        ax.annotate(note, (0.02, 0.02), xycoords="axes fraction", fontsize="small")
    _finish(
        ax,
        "max running sequences (batch size cap)",
        f"{who}p99 inter-token gap (s)",
        f"p99 inter-token gap vs max batch size, at {top:g} requests/s",
    )
    return _save(fig, path)


def goodput_vs_rate(rows: Sequence[Row], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    rates = sorted({r["rate"] for r in rows})
    ax.plot(rates, rates, color="grey", linestyle=":", label="offered")
    for label, group in curves(rows).items():
        xs, ys = _xy(group, "rate", "goodput_rps")
        ax.plot(xs, ys, marker="o", label=label)
    _finish(ax, "arrival rate", "goodput (requests/s meeting every target)", "goodput vs rate")
    return _save(fig, path)


def service_vs_rate(rows: Sequence[Row], path: Path) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, constrained_layout=True)
    for label, group in curves(rows).items():
        top.plot(*_xy(group, "rate", "service_diff_max"), marker="o", label=label)
        bottom.plot(*_xy(group, "rate", "jain_min"), marker="o", label=label)
    _finish(top, "", "max service difference (weighted tokens)", "fairness between tenants")
    _finish(bottom, "arrival rate", "min Jain's index (1 = equal shares)", "")
    if (legend := bottom.get_legend()) is not None:
        legend.remove()  # the same curves as above
    bottom.set_ylim(0, 1.05)
    return _save(fig, path)


def targets_of(spec: WorkloadSpec) -> tuple[float | None, float | None]:
    """(TTFT, inter-token) targets of the interactive class, the ones the knee is read at."""
    t = spec.targets.get(SloClass.INTERACTIVE)
    return (None, None) if t is None else (t.ttft_s, t.pace_s)


def plot_all(rows: Sequence[Row], out: Path, spec: WorkloadSpec) -> list[Path]:
    ttft, itl = targets_of(spec)
    return [
        throughput_vs_ttft(rows, ttft, out / "throughput_ttft.png"),
        itl_vs_batch(rows, itl, out / "itl_batch.png"),
        goodput_vs_rate(rows, out / "goodput_rate.png"),
        service_vs_rate(rows, out / "service_rate.png"),
    ]


# ---- summary.md ----


def holds(r: Row, ttft: float | None, itl: float | None) -> bool:
    t, g = r["interactive_ttft_p99_s"], r["interactive_itl_p99_s"]
    return (
        t is not None
        and g is not None
        and (ttft is None or t <= ttft)
        and (itl is None or g <= itl)
    )


def knee(group: Sequence[Row], ttft: float | None, itl: float | None) -> Row | None:
    """The highest rate up to which (every lower rate included) both p99 targets hold."""
    last = None
    for r in group:  # sorted by rate
        if not holds(r, ttft, itl):
            break
        last = r
    return last


def summary_lines(rows: Sequence[Row], spec: WorkloadSpec) -> list[str]:
    ttft, itl = targets_of(spec)
    lines = [
        f"# Sweep: {spec.name}",
        "",
        f"{len(rows)} points, {rows[0]['requests']} requests each; rates in requests/s (trace"
        " replays: × the recorded rate). A target holds up to a rate when it holds there and at"
        f" every lower rate: interactive p99 TTFT ≤ {num(ttft)} s, interactive p99 inter-token"
        f" gap ≤ {num(itl)} s; the knee is where both hold. Goodput: requests that met every"
        " target of their class. Service difference and Jain's index: between the tenants of a"
        " class, over windows where both were backlogged, worst over all rates.",
        "",
        "| curve | TTFT holds to | ITL holds to | knee | req/s at knee | best goodput/s"
        " | at rate | good there | max service diff | min Jain | rejected at top rate |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, group in curves(rows).items():
        k = knee(group, ttft, itl)
        k_ttft, k_itl = knee(group, ttft, None), knee(group, None, itl)
        best = max(group, key=lambda r: r["goodput_rps"])
        diffs = [r["service_diff_max"] for r in group if r["service_diff_max"] is not None]
        jains = [r["jain_min"] for r in group if r["jain_min"] is not None]
        cells = [
            label,
            _rate(k_ttft),
            _rate(k_itl),
            _rate(k),
            "–" if k is None else num(k["throughput_rps"]),
            num(best["goodput_rps"]),
            f"{best['rate']:g}",
            pct(best["goodput_fraction"]),
            num(max(diffs, default=None), 0),
            num(min(jains, default=None), 3),
            str(group[-1]["rejected"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _rate(r: Row | None) -> str:
    return "none" if r is None else f"{r['rate']:g}"


def write_summary(rows: Sequence[Row], spec: WorkloadSpec, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(summary_lines(rows, spec)) + "\n")
    return path
