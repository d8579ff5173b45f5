"""One cell of the scenario table: a run's figures, from its request records.

Every attempt is a record (a refused request retried at its retry-after has two); a request
is the last attempt of its index. Generic figures:

    served / refused     requests answered in full / refused (429, 503) at their last try
    ttft p50 / p99       over served requests (the scenario's focus class, if it has one)
    itl p99              every inter-token gap of the served requests
    smooth               served with no gap over ``SMOOTH_GAP_S``, of all requests
    tokens/s             output tokens over the run's span (first send to last answer)
    preemptions          as the server reported them (Quanta only)

and the figures a scenario's claims are about (``key``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from app.lab.bench import long_cells
from app.lab.bench.scenarios import SMOOTH_GAP_S, Scenario
from quanta_core.metrics import RequestRecord, jain_index, meets_slo
from quanta_core.metrics.fairness import service_events
from quanta_core.requests import SloClass

REFUSED = (429, 503)


def _q(values: Sequence[float], p: float) -> float | None:
    return float(np.percentile(np.asarray(values), p)) if values else None


def last_attempts(attempts: Sequence[RequestRecord]) -> list[RequestRecord]:
    final: dict[str, RequestRecord] = {}
    for r in sorted(attempts, key=lambda r: r.attempt):
        final[r.request_id] = r
    return list(final.values())


def _served(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok and r.token_times]


def _tokens_per_s(records: Sequence[RequestRecord]) -> float | None:
    served = _served(records)
    if not served:
        return None
    start = min(r.sent for r in records)
    end = max(r.finished or r.token_times[-1] for r in served)
    return sum(r.n_output for r in served) / max(end - start, 1e-9)


def generic(records: Sequence[RequestRecord], focus: SloClass | None = None) -> dict[str, Any]:
    mine = [r for r in records if focus is None or r.slo_class is focus]
    served = _served(records)
    ttfts = [r.ttft for r in _served(mine) if r.ttft is not None]
    gaps = [g for r in served for g in r.itls]
    smooth = [r for r in served if not r.itls or max(r.itls) <= SMOOTH_GAP_S]
    preempt = [r.server_preemptions for r in records if r.server_preemptions is not None]
    return {
        "requests": len(records),
        "served": len(served),
        "refused": sum(1 for r in records if r.status in REFUSED),
        "failed": sum(1 for r in records if not r.ok and r.status not in REFUSED),
        "ttft_p50_s": _q(ttfts, 50),
        "ttft_p99_s": _q(ttfts, 99),
        "itl_p99_s": _q(gaps, 99),
        "smooth_fraction": len(smooth) / len(records) if records else None,
        "tokens_per_s": _tokens_per_s(records),
        "preemptions": sum(preempt) if preempt else None,
    }


def estimate_errors(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """Admission's first-token estimate against the first token (client-side TTFT)."""
    pairs = [
        (r.server_ttft_estimate_s, r.ttft)
        for r in _served(records)
        if r.server_ttft_estimate_s is not None and r.ttft
    ]
    if not pairs:
        return None
    rel = [(est - actual) / actual for est, actual in pairs]
    absolute = [abs(x) for x in rel]
    return {
        "requests": len(pairs),
        "relative_error_median": _q(rel, 50),
        "abs_relative_error_median": _q(absolute, 50),
        "abs_relative_error_p90": _q(absolute, 90),
        "estimate_over_actual_median": _q([e / a for e, a in pairs], 50),
    }


def key_figures(scenario: Scenario, attempts: Sequence[RequestRecord]) -> dict[str, Any]:
    records = last_attempts(attempts)
    name = scenario.key_kind
    if name in LONG:
        return _long(scenario, records)
    if name == "twenty":
        ttfts = sorted(r.ttft for r in _served(records) if r.ttft is not None)
        return {"last_first_token_s": ttfts[-1] if ttfts else None}
    if name == "flood":
        inter = [r for r in records if r.slo_class is SloClass.INTERACTIVE]
        batch = [r for r in records if r.slo_class is SloClass.BATCH]
        return {
            "interactive_served_fraction": len(_served(inter)) / len(inter) if inter else None,
            "interactive": generic(inter),
            "batch_tokens": sum(r.n_output for r in _served(batch)),
            "batch_tokens_per_s": _tokens_per_s(batch),
        }
    if name == "kv-burst":
        g = generic(records)
        n = len(records)
        return {
            "preemptions_per_10": None if g["preemptions"] is None else 10 * g["preemptions"] / n
        }
    if name == "overload":
        return _overload(scenario, attempts, records)
    if name == "weights":
        return _weights(records)
    return {}


def _overload(
    scenario: Scenario, attempts: Sequence[RequestRecord], records: Sequence[RequestRecord]
) -> dict[str, Any]:
    targets = scenario.spec.targets[SloClass.INTERACTIVE]
    first = [r for r in attempts if r.attempt == 0]
    refused = [r for r in first if r.status in REFUSED]
    latency = [(r.finished or r.sent) - r.sent for r in refused]
    admitted = [r for r in records if r.status == 200]
    good = [r for r in admitted if meets_slo(r, targets)]
    retried = [r for r in attempts if r.attempt == 1]
    return {
        "refused_first_try": len(refused),
        "refusal_latency_p99_ms": None if not latency else 1000 * (_q(latency, 99) or 0.0),
        "refusal_latency_max_ms": None if not latency else 1000 * max(latency),
        "refusals_with_retry_after": sum(1 for r in refused if r.retry_after_s is not None),
        "admitted": len(admitted),
        "admitted_meeting_targets_fraction": len(good) / len(admitted) if admitted else None,
        "retries": len(retried),
        "retries_admitted_fraction": (
            sum(1 for r in retried if r.status == 200) / len(retried) if retried else None
        ),
    }


def _weights(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Weighted service (input + 2 x output tokens, / weight) while both tenants had
    requests in flight, from the first token of either to the first end of either's last."""
    tenants = sorted({r.tenant for r in records})
    if len(tenants) != 2:
        return {}
    events = {
        t: sorted(e for r in records if r.tenant == t for e in service_events(r)) for t in tenants
    }
    ends = [max((r.finished or r.sent) for r in records if r.tenant == t) for t in tenants]
    start = min(r.sent for r in records)
    stop = min(ends)
    served = {t: sum(s for when, s in events[t] if start <= when < stop) for t in tenants}
    tokens = {
        t: sum(1 for r in records if r.tenant == t for x in r.token_times if start <= x < stop)
        for t in tenants
    }
    # the cumulative weighted difference, sampled once per second
    diffs: list[float] = []
    x = start
    while x < stop:
        a = sum(s for when, s in events[tenants[0]] if when <= x)
        b = sum(s for when, s in events[tenants[1]] if when <= x)
        diffs.append(abs(a - b))
        x += 1.0
    total = sum(served.values())
    return {
        "weighted_service": served,
        "weighted_share": {t: v / total for t, v in served.items()} if total else None,
        "jain_weighted": jain_index(list(served.values())),
        "tokens": tokens,
        "tokens_ratio": tokens[tenants[1]] / tokens[tenants[0]] if tokens[tenants[0]] else None,
        "service_difference_max": max(diffs) if diffs else None,
        "service_difference_end": diffs[-1] if diffs else None,
    }


LONG = ("bucket", "replay", "coding", "prefix", "flood-long")


def _long(scenario: Scenario, records: Sequence[RequestRecord]) -> dict[str, Any]:
    match scenario.key_kind:
        case "bucket":
            return long_cells.bucket(records)
        case "replay":
            targets = scenario.spec.targets[SloClass.INTERACTIVE]
            return long_cells.goodput(records, targets, scenario.ttft_per_token_s)
        case "coding":
            return long_cells.coding(records)
        case "prefix":
            return long_cells.prefix(records)
        case _:
            return long_cells.flood_long(records)


def focus_class(scenario: Scenario) -> SloClass | None:
    flood = scenario.key_kind in ("flood", "flood-long")
    return SloClass.INTERACTIVE if flood else None
