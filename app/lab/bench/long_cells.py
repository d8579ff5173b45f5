"""The key figures of the long-prompt scenarios (``long_scenarios.py``), from their records.

bucket      mean first token (the simulator's check), prompt tokens/s of the burst
replay      goodput: requests meeting the interactive targets (first token <= 2 s,
            time per output token <= 0.25 s), and with the first-token target grown by
            the prompt's own prefill (``Scenario.ttft_per_token_s``)
coding      mean first token (served / refused and p50 / p99 are the generic cells')
prefix      the first request's first token, the later ones', and their ratio
flood-long  the interactive tenant's first token and gaps (p50 / p99), batch tokens/s
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from quanta_core.metrics import RequestRecord, meets_slo
from quanta_core.metrics.slo import SloTargets
from quanta_core.requests import SloClass


def _q(values: Sequence[float], p: float) -> float | None:
    return float(np.percentile(np.asarray(values), p)) if values else None


def _served(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok and r.token_times]


def _ttfts(records: Sequence[RequestRecord]) -> list[float]:
    return [r.ttft for r in _served(records) if r.ttft is not None]


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def bucket(records: Sequence[RequestRecord]) -> dict[str, Any]:
    served = _served(records)
    firsts = [r.sent + r.ttft for r in served if r.ttft is not None]
    prefill_span = max(firsts) - min(r.sent for r in records) if firsts else None
    prompt = sum(r.prompt_tokens for r in served)
    return {
        "ttft_mean_s": _mean(_ttfts(records)),
        # every prompt of the burst over the time to the last first token
        "prompt_tokens_per_s": prompt / prefill_span if prefill_span else None,
    }


def length_target(targets: SloTargets, prompt_tokens: int, per_token_s: float) -> SloTargets:
    ttft = None if targets.ttft_s is None else targets.ttft_s + prompt_tokens * per_token_s
    return dataclasses.replace(targets, ttft_s=ttft)


def goodput(
    records: Sequence[RequestRecord], targets: SloTargets, per_token_s: float | None
) -> dict[str, Any]:
    n = len(records)
    good = sum(1 for r in records if meets_slo(r, targets))
    out: dict[str, Any] = {
        "goodput": good,
        "goodput_fraction": good / n if n else None,
        "ttft_mean_s": _mean(_ttfts(records)),
    }
    if per_token_s is not None:
        scaled = sum(
            1 for r in records if meets_slo(r, length_target(targets, r.prompt_tokens, per_token_s))
        )
        out["goodput_length_target"] = scaled
        out["goodput_length_target_fraction"] = scaled / n if n else None
        out["ttft_per_token_s"] = per_token_s
    return out


def coding(records: Sequence[RequestRecord]) -> dict[str, Any]:
    return {"ttft_mean_s": _mean(_ttfts(records))}


def prefix(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """First token of the first request (the plan's first: a closed loop of one user sends
    in plan order) against the later requests'."""
    ordered = sorted(records, key=lambda r: int(r.request_id[1:]))
    served = [r for r in ordered if r.ok and r.ttft is not None]
    if not served or served[0] is not ordered[0]:
        return {"first_ttft_s": None, "later_ttft_median_s": None, "ratio": None}
    first = served[0].ttft
    later = [r.ttft for r in served[1:] if r.ttft is not None]
    median = statistics.median(later) if later else None
    cached = [r.server_cached_tokens for r in served[1:] if r.server_cached_tokens is not None]
    return {
        "first_ttft_s": first,
        "later_ttft_median_s": median,
        "later_ttft_max_s": max(later) if later else None,
        "ratio": median / first if median is not None and first else None,
        "later_cached_tokens_mean": _mean([float(c) for c in cached]),
    }


def flood_long(records: Sequence[RequestRecord]) -> dict[str, Any]:
    inter = [r for r in records if r.slo_class is SloClass.INTERACTIVE]
    batch = [r for r in records if r.slo_class is SloClass.BATCH]
    ttfts = _ttfts(inter)
    gaps = [g for r in _served(inter) for g in r.itls]
    served_batch = _served(batch)
    span = (
        max(r.finished or r.token_times[-1] for r in served_batch) - min(r.sent for r in batch)
        if served_batch
        else None
    )
    return {
        "interactive_served": len(_served(inter)),
        "interactive_requests": len(inter),
        "interactive_ttft_p50_s": _q(ttfts, 50),
        "interactive_ttft_p99_s": _q(ttfts, 99),
        "interactive_itl_p50_s": _q(gaps, 50),
        "interactive_itl_p99_s": _q(gaps, 99),
        "batch_served": len(served_batch),
        "batch_tokens_per_s": (sum(r.n_output for r in served_batch) / span if span else None),
    }
