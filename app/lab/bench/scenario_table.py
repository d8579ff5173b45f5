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
    return long_key_text(scenario, key)


def long_key_text(kind: str, key: dict[str, Any]) -> str:
    if kind == "bucket":
        return (
            f"mean first token {_s(key.get('ttft_mean_s'))} s, prompt "
            f"{_s(key.get('prompt_tokens_per_s'), 0)} tokens/s"
        )
    if kind == "replay":
        text = f"goodput {key.get('goodput')} ({_pct(key.get('goodput_fraction'))})"
        if "goodput_length_target" in key:
            text += (
                f"; at 2 s + prefill: {key['goodput_length_target']} "
                f"({_pct(key.get('goodput_length_target_fraction'))})"
            )
        return text
    if kind == "coding":
        return f"mean first token {_s(key.get('ttft_mean_s'))} s"
    if kind == "prefix":
        return (
            f"first {_s(key.get('first_ttft_s'))} s, later median "
            f"{_s(key.get('later_ttft_median_s'))} s: ratio {_s(key.get('ratio'))}"
        )
    if kind == "flood-long":
        return (
            f"interactive {key.get('interactive_served')}/{key.get('interactive_requests')}, "
            f"TTFT {_s(key.get('interactive_ttft_p50_s'))} / "
            f"{_s(key.get('interactive_ttft_p99_s'))} s, ITL "
            f"{_s(key.get('interactive_itl_p50_s'), 3)} / "
            f"{_s(key.get('interactive_itl_p99_s'), 3)} s; batch "
            f"{_s(key.get('batch_tokens_per_s'), 1)} tokens/s"
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
            f"{key_text(c.get('kind') or c['scenario'], c['key'])} |"
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


# A scenario's own figure for the ratio table: (label, key, higher is better)
RATIO_KEYS = {
    "replay": ("goodput (2 s + prefill)", "goodput_length_target", True),
    "prefix": ("later / first TTFT", "ratio", False),
    "flood-long": ("interactive TTFT p99", "interactive_ttft_p99_s", False),
}


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def ratios_markdown(
    cells: Sequence[dict[str, Any]],
    base: str = "quanta",
    peers: Sequence[str] = ("llama-server", "llama-server-kvu"),
) -> str:
    """``base`` over each peer, per scenario: tokens/s (above 1: faster), first token p50
    and p99 (below 1: sooner), and the scenario's own figure where it has one."""
    by = {(c["scenario"], c["server"]): c for c in cells}
    lines = [
        f"| scenario | {base} ÷ | tokens/s | TTFT p50 | TTFT p99 | own figure | {base} / peer |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario in dict.fromkeys(c["scenario"] for c in cells):
        mine = by.get((scenario, base))
        if mine is None:
            continue
        for peer in peers:
            other = by.get((scenario, peer))
            if other is None:
                continue
            own = RATIO_KEYS.get(mine.get("kind") or "")
            label, value = "—", "—"
            if own is not None:
                a, b = mine["key"].get(own[1]), other["key"].get(own[1])
                label = own[0]
                value = f"{_ratio(a, b)} ({_s(a)} / {_s(b)})"
            lines.append(
                f"| {scenario} | {peer} | {_ratio(mine['tokens_per_s'], other['tokens_per_s'])} "
                f"| {_ratio(mine['ttft_p50_s'], other['ttft_p50_s'])} "
                f"| {_ratio(mine['ttft_p99_s'], other['ttft_p99_s'])} | {label} | {value} |"
            )
    return "\n".join(lines) + "\n"
