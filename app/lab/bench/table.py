"""A run's figures as rich tables: latency percentiles, throughput and goodput, fairness."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text


def ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value / 1000:.2f} s" if value >= 10_000 else f"{value:.1f}"


def num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _groups(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    rows = [("all", summary["overall"])]
    rows += [(f"class {k}", v) for k, v in summary["classes"].items()]
    if len(summary["tenants"]) > 1:
        rows += [(f"tenant {k}", v) for k, v in summary["tenants"].items()]
    return rows


def latency_table(summary: dict[str, Any]) -> Table:
    table = Table(title="latency (ms)", title_justify="left")
    table.add_column("group")
    for name in ("TTFT", "TPOT", "ITL", "E2E", "queue", "prefill"):
        for p in ("p50", "p90", "p99", "max") if name == "TTFT" else ("p50", "p99"):
            table.add_column(f"{name} {p}", justify="right")
    for name, g in _groups(summary):
        cells = [name]
        for key in ("ttft", "tpot", "itl", "e2e", "queue", "prefill"):
            ps = ("p50", "p90", "p99", "max") if key == "ttft" else ("p50", "p99")
            cells += [ms(g[key][f"{p}_ms"]) for p in ps]
        table.add_row(*cells)
    return table


def throughput_table(summary: dict[str, Any]) -> Table:
    table = Table(title="throughput and goodput", title_justify="left")
    for col in (
        "group",
        "requests",
        "failed",
        "rejected",
        "req/s",
        "out tok/s",
        "good",
        "goodput/s",
        "smooth good",
        "tokens on time",
        "preempted",
    ):
        table.add_column(col, justify="left" if col == "group" else "right")
    for name, g in _groups(summary):
        table.add_row(
            name,
            str(g["requests"]),
            str(g["failed"]),
            str(g.get("rejected", 0)),
            num(g["requests_per_s"]),
            num(g["output_tokens_per_s"], 1),
            f"{g['good']} ({pct(g['goodput_fraction'])})",
            num(g["goodput_per_s"]),
            f"{g['smooth_good']} ({pct(g['smooth_goodput_fraction'])})",
            f"{g['tokens_on_time']}/{g['output_tokens']}",
            str(g["preemptions"]),
        )
    return table


def headline(result: dict[str, Any]) -> Text:
    summary = result["summary"]
    ranks = summary["ttft_ranks"]
    parts = [f"{result['label']} · {result['server_kind']} · {summary['duration_s']:.2f} s"]
    if ranks:
        words = ", ".join(f"{_ordinal(int(k))} {v:.2f} s" for k, v in ranks.items())
        parts.append(f"first word seen by the {words}")
    for cls, t in summary["targets"].items():
        if cls not in summary["classes"]:
            continue
        shown = ", ".join(f"{k} {v:g}" for k, v in t.items() if v is not None)
        parts.append(f"{cls} targets: {shown or 'none'}")
    for cls, f in summary["fairness"].items():
        if f["backlogged_windows"]:
            parts.append(
                f"{cls} fairness over {f['backlogged_windows']} backlogged "
                f"{f['window_s']:g}s windows: service difference max "
                f"{num(f['max_service_difference'], 1)} mean "
                f"{num(f['mean_service_difference'], 1)}, Jain mean {num(f['mean_jain'], 3)} "
                f"min {num(f['min_jain'], 3)}"
            )
    return Text("\n".join(parts))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def render(result: dict[str, Any]) -> Group:
    summary = result["summary"]
    return Group(headline(result), latency_table(summary), throughput_table(summary))


def print_result(result: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(render(result))
