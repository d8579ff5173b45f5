"""``quanta bench compare A.json B.json``: two runs side by side, with B/A ratios.

Groups present in both files are compared (all, each class); a ratio below 1 means B's
figure is smaller (for a latency, better; for a throughput, worse).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table

from app.lab.bench.table import num

# (label, path into a group's summary, unit)
_FIGURES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("requests", ("requests",), ""),
    ("failed", ("failed",), ""),
    ("rejected", ("rejected",), ""),
    ("req/s", ("requests_per_s",), ""),
    ("output tok/s", ("output_tokens_per_s",), ""),
    ("goodput/s", ("goodput_per_s",), ""),
    ("goodput fraction", ("goodput_fraction",), ""),
    ("smooth goodput fraction", ("smooth_goodput_fraction",), ""),
    ("TTFT p50", ("ttft", "p50_ms"), "ms"),
    ("TTFT p90", ("ttft", "p90_ms"), "ms"),
    ("TTFT p99", ("ttft", "p99_ms"), "ms"),
    ("TTFT max", ("ttft", "max_ms"), "ms"),
    ("TPOT p50", ("tpot", "p50_ms"), "ms"),
    ("TPOT p99", ("tpot", "p99_ms"), "ms"),
    ("ITL p50", ("itl", "p50_ms"), "ms"),
    ("ITL p99", ("itl", "p99_ms"), "ms"),
    ("E2E p50", ("e2e", "p50_ms"), "ms"),
    ("E2E p99", ("e2e", "p99_ms"), "ms"),
    ("queue p50", ("queue", "p50_ms"), "ms"),
    ("prefill p50", ("prefill", "p50_ms"), "ms"),
)


def _get(group: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = group
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return None if value is None else float(value)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return b / a


def _groups(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    s = result["summary"]
    if len(s["classes"]) < 2:  # one class: its figures are the overall ones
        return {"all": s["overall"]}
    return {"all": s["overall"], **{f"class {k}": v for k, v in s["classes"].items()}}


def comparison_rows(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, str, Any, Any]]:
    """(group, figure, A, B) for every figure of every group both runs have."""
    ga, gb = _groups(a), _groups(b)
    rows: list[tuple[str, str, Any, Any]] = []
    for group in [g for g in ga if g in gb]:
        rows += [
            (group, label, _get(ga[group], path), _get(gb[group], path))
            for label, path, _ in _FIGURES
        ]
    ranks_a, ranks_b = a["summary"]["ttft_ranks"], b["summary"]["ttft_ranks"]
    for k in [k for k in ranks_a if k in ranks_b]:
        rows.append(("all", f"first word #{k} (s)", ranks_a[k], ranks_b[k]))
    return rows


def comparison_table(a: dict[str, Any], b: dict[str, Any]) -> Table:
    table = Table(title=f"A = {a['label']}   B = {b['label']}", title_justify="left")
    for col in ("group", "figure", "A", "B", "B/A"):
        table.add_column(col, justify="left" if col in ("group", "figure") else "right")
    for group, label, va, vb in comparison_rows(a, b):
        r = ratio(va, vb)
        table.add_row(group, label, num(va), num(vb), "–" if r is None else f"{r:.2f}×")
    return table


def print_comparison(a: dict[str, Any], b: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(Group(comparison_table(a, b)))
