"""The scenario suite's one table, as Markdown (printed, and written to ``table.md``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

HEADER = (
    "| scenario | server | served / refused | TTFT p50 / p99 | ITL p99 | smooth | "
    "tokens/s | preempt | key figures |"
)


def _s(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f} %"


def key_text(scenario: str, key: dict[str, Any]) -> str:
    if scenario == "twenty":
        return f"20th first token {_s(key.get('last_first_token_s'))} s"
    if scenario == "flood":
        inter = key.get("interactive") or {}
        return (
            f"interactive served {_pct(key.get('interactive_served_fraction'))}, "
            f"p99 TTFT {_s(inter.get('ttft_p99_s'))} s; batch {key.get('batch_tokens')} tokens, "
            f"{_s(key.get('batch_tokens_per_s'), 1)}/s"
        )
    if scenario == "kv-burst":
        return f"preemptions per 10 requests {_s(key.get('preemptions_per_10'), 1)}"
    if scenario == "overload":
        return (
            f"refused in ≤ {_s(key.get('refusal_latency_max_ms'), 0)} ms; admitted on target "
            f"{_pct(key.get('admitted_meeting_targets_fraction'))}; retries admitted "
            f"{_pct(key.get('retries_admitted_fraction'))} of {key.get('retries')}"
        )
    if scenario == "weights":
        share = key.get("weighted_share") or {}
        shares = " : ".join(f"{v:.2f}" for v in share.values())
        return (
            f"tokens two/one {_s(key.get('tokens_ratio'))}, weighted share {shares}, "
            f"Jain {_s(key.get('jain_weighted'), 3)}, max difference "
            f"{_s(key.get('service_difference_max'), 0)}"
        )
    return ""


def markdown(cells: Sequence[dict[str, Any]]) -> str:
    lines = [HEADER, "|" + "---|" * 9]
    for c in cells:
        lines.append(
            f"| {c['scenario']} | {c['server']} | {c['served']} / {c['refused']} | "
            f"{_s(c['ttft_p50_s'])} / {_s(c['ttft_p99_s'])} s | {_s(c['itl_p99_s'], 3)} s | "
            f"{_pct(c['smooth_fraction'])} | {_s(c['tokens_per_s'], 1)} | "
            f"{'—' if c['preemptions'] is None else c['preemptions']} | "
            f"{key_text(c['scenario'], c['key'])} |"
        )
    return "\n".join(lines) + "\n"


def estimates_markdown(cells: Sequence[dict[str, Any]]) -> str:
    """Admission's first-token estimate vs. what happened, per Quanta run."""
    lines = [
        "| scenario | server | requests | (estimate - actual) / actual, median | "
        "abs. error median / p90 | estimate / actual, median |",
        "|---|---|---|---|---|---|",
    ]
    for c in cells:
        e = c.get("estimate")
        if not e:
            continue
        lines.append(
            f"| {c['scenario']} | {c['server']} | {e['requests']} | "
            f"{_pct(e['relative_error_median'])} | {_pct(e['abs_relative_error_median'])} / "
            f"{_pct(e['abs_relative_error_p90'])} | {_s(e['estimate_over_actual_median'])} |"
        )
    return "\n".join(lines) + "\n"
