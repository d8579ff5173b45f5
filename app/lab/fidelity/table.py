"""The simulator's error against the real engine, from pairs of bench results files.

For every ``real-<policy>-<load>.json`` in the directory with a ``sim-<policy>-<load>.json``
beside it: throughput (output tokens/s), mean and p99 TTFT, mean inter-token latency, real vs
simulated, and the relative error (sim - real) / real. Targets (issue 8): 10 % on means and
throughput, 20 % on p99. Writes ``fidelity.json`` and ``fidelity.md`` (README-ready markdown).
The figures are summarized again from each file's requests by today's code, so that files
written by different versions compare alike: the real runs of 2026-11-30 were summarized by an
HDR histogram (the p99 of 60 TTFTs was the 59th, rounded), today's by nearest rank (the 60th).

Each row also shows the speed factor the simulation ran with (``quanta sim --speed-factor``):
from ``probe-<policy>-<load>.json`` (the reference probe right before and right after the
real run: their mean, and each), else from the simulation's own results file.

A second table, where there are ``sim-inrun-<policy>-<load>.json`` files: simulations given the
machine as the real run's own step trace saw it (``steps-<policy>-<load>.json``, written by
``quanta step-report``): what the simulator misses when the engine's speed over the run is
known (its speed per 10 s: ``quanta sim --speed-profile``; the column shows its range). A third,
where there are ``sim-cross-<policy>-<load>.json`` files (``quanta bench fidelity cross``): the
same, with a cost model fitted from the other runs' served steps. A fourth, where there are
``sim-replay-<policy>-<load>.json`` files (``quanta bench fidelity replay``): nothing from the run
itself, a cost model fitted from the engine alone replaying the other runs' steps and the speed
from the reference probe.

    quanta bench fidelity table bench/results/fidelity
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.lab.bench.report import records_of
from quanta_core.metrics import summarize

# (name, path in the overall summary, target relative error)
FIGURES: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("throughput tok/s", ("output_tokens_per_s",), 0.10),
    ("TTFT mean ms", ("ttft", "mean_ms"), 0.10),
    ("TTFT p99 ms", ("ttft", "p99_ms"), 0.20),
    ("ITL mean ms", ("itl", "mean_ms"), 0.10),
)


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return None if value is None else float(value)


def overall(result: dict[str, Any]) -> dict[str, Any]:
    """The run's overall figures, from its requests (the same code for every file)."""
    return summarize(records_of(result)).overall.as_dict()


def compare(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    real_figures, sim_figures = overall(real), overall(sim)
    for name, path, target in FIGURES:
        a = _get(real_figures, path)
        b = _get(sim_figures, path)
        error = None if a is None or b is None or a == 0 else (b - a) / a
        ok = None if error is None else abs(error) <= target
        out[name] = {"real": a, "sim": b, "error": error, "target": target, "within": ok}
    return out


def speed(folder: Path, key: str, sim: dict[str, Any]) -> dict[str, Any] | None:
    """The speed factor of the row ``key``: mean, before and after the real run.

    The probe file keeps the factors against the cost model of its day; the simulation may
    have run on a newer one (``SKIP_REAL=1``), whose factor it recorded: the probe's two
    readings are shown against that one."""
    used = used_speed(folder, key, sim)
    path = folder / f"probe-{key}.json"
    if not path.exists():
        return used
    doc = json.loads(path.read_text())
    factor = doc["speed_factor"] if used is None else used["factor"]
    scale = factor / doc["speed_factor"]
    before, after = doc["before"]["speed_factor"], doc["after"]["speed_factor"]
    return {"factor": factor, "before": scale * before, "after": scale * after}


def used_speed(folder: Path, key: str, sim: dict[str, Any]) -> dict[str, Any] | None:
    """The speed factor the simulation ran with, from its results file."""
    used = sim.get("environment", {}).get("speed_factor") or {}
    factor = used.get("factor")
    if factor is None:
        return None
    return {"factor": factor, "before": None, "after": None, "profile": used.get("profile")}


def _speed_cell(s: dict[str, Any] | None) -> str:
    if s is None:
        return "–"
    if s.get("profile"):
        return f"{min(s['profile']):.2f}-{max(s['profile']):.2f}"
    if s["before"] is None:
        return f"{s['factor']:.2f}"
    return f"{s['factor']:.2f} ({s['before']:.2f} / {s['after']:.2f})"


PROBE_NOTE = (
    "speed factor: every simulated step × it (the probe's time at the run / at calibration)"
)
IN_RUN_NOTE = (
    "speed factor: the real run's own engine time over the cost model's for its steps "
    "(its step trace), per 10 s of the run where a range is shown, and the server's time per "
    "cycle from the same trace"
)
CROSS_NOTE = (
    "cost model: fitted from the served steps of the other eight runs; speed factor and "
    "server time as in the table above, against that model"
)
REPLAY_NOTE = (
    "cost model: fitted from the engine alone replaying the other eight runs' steps (each at "
    "its probe's speed); speed factor: the run's probe × the served / alone ratio of the other "
    "runs of its policy; server time per cycle: theirs"
)
SpeedOf = Callable[[Path, str, dict[str, Any]], dict[str, Any] | None]
TABLES: tuple[tuple[str, SpeedOf, str, str], ...] = (
    ("sim", speed, "The speed from the reference probe before and after the run", PROBE_NOTE),
    ("sim-inrun", used_speed, "The speed the run's own steps had (step trace)", IN_RUN_NOTE),
    (
        "sim-cross",
        used_speed,
        "And a cost model fitted from the other runs' served steps (quanta bench fidelity cross)",
        CROSS_NOTE,
    ),
    (
        "sim-replay",
        used_speed,
        "Nothing from the run itself: a cost model from the engine alone replaying the other "
        "runs' steps, the speed from the probe (quanta bench fidelity replay)",
        REPLAY_NOTE,
    ),
)


def table(rows: dict[str, dict[str, Any]], note: str) -> str:
    head = "| policy | load | speed factor | " + " | ".join(
        f"{n} (real / sim / err)" for n, _, _ in FIGURES
    )
    lines = [head + " |", "|" + "---|" * (3 + len(FIGURES))]
    for key, figures in rows.items():
        policy, load = key.split("-", 1)
        cells = []
        for name, _, _ in FIGURES:
            f = figures[name]
            if f["error"] is None:
                cells.append("–")
                continue
            mark = "" if f["within"] else " ✗"
            cells.append(f"{f['real']:.1f} / {f['sim']:.1f} / {100 * f['error']:+.0f}%{mark}")
        first = f"| {policy} | {load} | {_speed_cell(figures.get('speed factor'))} | "
        lines.append(first + " | ".join(cells) + " |")
    targets = ", ".join(f"{n} ±{100 * t:.0f}%" for n, _, t in FIGURES)
    return "\n".join([*lines, "", f"✗: outside the target ({targets}).", note + "."])


def rows_for(folder: Path, prefix: str, speed_of: SpeedOf) -> dict[str, dict[str, Any]]:
    """Each real run against its simulation ``<prefix>-<key>.json``, where there is one."""
    rows: dict[str, dict[str, Any]] = {}
    for real_path in sorted(folder.glob("real-*.json")):
        key = real_path.stem.removeprefix("real-")
        sim_path = folder / f"{prefix}-{key}.json"
        if not sim_path.exists():
            continue
        sim = json.loads(sim_path.read_text())
        rows[key] = compare(json.loads(real_path.read_text()), sim)
        rows[key]["speed factor"] = speed_of(folder, key, sim)
    return rows


def main(folder: Path) -> None:
    doc: dict[str, Any] = {}
    parts: list[str] = []
    for prefix, speed_of, title, note in TABLES:
        rows = rows_for(folder, prefix, speed_of)
        if rows:
            doc[prefix] = rows
            parts += [f"{title}:\n", table(rows, note), ""]
    (folder / "fidelity.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = "\n".join(parts)
    (folder / "fidelity.md").write_text(text)
    print(text)
