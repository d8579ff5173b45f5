"""A run's figures from its per-request rows: per tenant, per class and overall.

    summary = summarize(records, targets, window_s=5.0)
    summary.as_dict()          # what ``quanta bench`` (and later ``quanta sim``) writes

Throughputs divide by the run's duration (first request sent → last request finished), the
same denominator for every group, so tenants' figures add up to the overall one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from quanta_core.metrics.fairness import Fairness, fairness
from quanta_core.metrics.histogram import Distribution, distribution
from quanta_core.metrics.records import RequestRecord
from quanta_core.metrics.slo import (
    SloTargets,
    default_targets,
    meets_slo,
    meets_smooth_slo,
    tokens_on_time,
)
from quanta_core.requests import SloClass

REJECTED_STATUSES = (429, 503)


@dataclass(frozen=True, slots=True)
class GroupSummary:
    requests: int
    completed: int
    failed: int
    rejected: int  # of the failed: refused by admission (HTTP 429 or 503)
    input_tokens: int
    output_tokens: int
    requests_per_s: float
    output_tokens_per_s: float
    good: int  # met every target of its class
    goodput_per_s: float
    smooth_good: int  # every token by its deadline
    smooth_goodput_per_s: float
    tokens_on_time: int
    preemptions: int
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    queue: Distribution  # server-side; empty on servers that do not report it
    prefill: Distribution

    @property
    def goodput_fraction(self) -> float | None:
        return self.good / self.requests if self.requests else None

    @property
    def smooth_goodput_fraction(self) -> float | None:
        return self.smooth_good / self.requests if self.requests else None

    def as_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "rejected": self.rejected,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "good": self.good,
            "goodput_per_s": self.goodput_per_s,
            "goodput_fraction": self.goodput_fraction,
            "smooth_good": self.smooth_good,
            "smooth_goodput_per_s": self.smooth_goodput_per_s,
            "smooth_goodput_fraction": self.smooth_goodput_fraction,
            "tokens_on_time": self.tokens_on_time,
            "preemptions": self.preemptions,
            "ttft": self.ttft.as_dict(),
            "tpot": self.tpot.as_dict(),
            "itl": self.itl.as_dict(),
            "e2e": self.e2e.as_dict(),
            "queue": self.queue.as_dict(),
            "prefill": self.prefill.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class RunSummary:
    duration_s: float
    overall: GroupSummary
    classes: dict[str, GroupSummary]
    tenants: dict[str, GroupSummary]
    fairness: dict[str, Fairness]  # per class, between its tenants
    targets: dict[str, SloTargets]
    ttft_ranks: dict[int, float] = field(default_factory=dict)  # k-th first word, seconds
    timeline_bin_s: float = 1.0
    tokens_per_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "duration_s": self.duration_s,
            "overall": self.overall.as_dict(),
            "classes": {k: v.as_dict() for k, v in self.classes.items()},
            "tenants": {k: v.as_dict() for k, v in self.tenants.items()},
            "fairness": {k: v.as_dict() for k, v in self.fairness.items()},
            "targets": {k: v.as_dict() for k, v in self.targets.items()},
            "ttft_ranks": {str(k): v for k, v in self.ttft_ranks.items()},
            "timeline": {"bin_s": self.timeline_bin_s, "tokens_per_s": self.tokens_per_s},
        }


def run_span(records: Sequence[RequestRecord]) -> tuple[float, float]:
    """(first sent, last finished or last token): the run's extent."""
    if not records:
        return 0.0, 0.0
    start = min(r.sent for r in records)
    ends = [r.finished if r.finished is not None else r.sent for r in records]
    ends += [r.token_times[-1] for r in records if r.token_times]
    return start, max(ends)


def summarize_group(
    records: Sequence[RequestRecord],
    targets: Mapping[SloClass, SloTargets],
    duration_s: float,
) -> GroupSummary:
    done = [r for r in records if r.ok and r.finished is not None]
    good = [r for r in records if meets_slo(r, targets[r.slo_class])]
    smooth = [r for r in records if meets_smooth_slo(r, targets[r.slo_class])]
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    out_tokens = sum(r.n_output for r in records)
    return GroupSummary(
        requests=len(records),
        completed=len(done),
        failed=len(records) - len(done),
        rejected=sum(1 for r in records if not r.ok and r.status in REJECTED_STATUSES),
        input_tokens=sum(r.prompt_tokens for r in done),
        output_tokens=out_tokens,
        requests_per_s=len(done) * per_s,
        output_tokens_per_s=out_tokens * per_s,
        good=len(good),
        goodput_per_s=len(good) * per_s,
        smooth_good=len(smooth),
        smooth_goodput_per_s=len(smooth) * per_s,
        tokens_on_time=sum(tokens_on_time(r, targets[r.slo_class]) for r in records),
        preemptions=sum(r.server_preemptions or 0 for r in records),
        ttft=distribution(_present(r.ttft for r in done)),
        tpot=distribution(_present(r.tpot for r in done)),
        itl=distribution(_gaps(done)),
        e2e=distribution(_present(r.e2e for r in done)),
        queue=distribution(_present(r.server_queue_s for r in done)),
        prefill=distribution(_present(r.server_prefill_s for r in done)),
    )


def ttft_ranks(records: Sequence[RequestRecord]) -> dict[int, float]:
    """When the 1st, the middle and the last person saw their first word (seconds)."""
    ttfts = sorted(t for r in records if (t := r.ttft) is not None)
    if not ttfts:
        return {}
    n = len(ttfts)
    return {k: ttfts[k - 1] for k in sorted({1, math.ceil(n / 2), n})}


def tokens_per_second(records: Sequence[RequestRecord], bin_s: float, origin: float) -> list[float]:
    """Output tokens delivered per second, in bins of ``bin_s`` from ``origin``."""
    parts = [np.asarray(r.token_times, dtype=np.float64) for r in records if r.token_times]
    if not parts:
        return []
    times = np.concatenate(parts)
    bins = ((times - origin) / bin_s).astype(np.int64)  # int(): toward zero, as before
    n_bins = int((times.max() - origin) / bin_s) + 1
    # bincount adds in input order, as a loop would: the same sums to the last bit
    weights = np.full(len(times), 1.0 / bin_s)
    return [float(v) for v in np.bincount(bins, weights=weights, minlength=n_bins)]


def summarize(
    records: Sequence[RequestRecord],
    targets: Mapping[SloClass, SloTargets] | None = None,
    *,
    window_s: float = 5.0,
    bin_s: float = 1.0,
    duration_s: float | None = None,
) -> RunSummary:
    all_targets = {**default_targets(), **(targets or {})}
    start, end = run_span(records)
    duration = duration_s if duration_s is not None else end - start
    classes = sorted({r.slo_class for r in records})
    tenants = sorted({r.tenant for r in records})
    overall = summarize_group(records, all_targets, duration)

    def group(members: list[RequestRecord]) -> GroupSummary:
        # A class or tenant that is the whole run (one tenant, say) has the run's figures.
        if len(members) == len(records):
            return overall
        return summarize_group(members, all_targets, duration)

    return RunSummary(
        duration_s=duration,
        overall=overall,
        classes={c.value: group([r for r in records if r.slo_class is c]) for c in classes},
        tenants={t: group([r for r in records if r.tenant == t]) for t in tenants},
        fairness={
            c.value: fairness([r for r in records if r.slo_class is c], window_s) for c in classes
        },
        targets={c.value: t for c, t in all_targets.items()},
        ttft_ranks=ttft_ranks(records),
        timeline_bin_s=bin_s,
        tokens_per_s=tokens_per_second(records, bin_s, start),
    )


def _gaps(records: Sequence[RequestRecord]) -> np.ndarray:
    """Every inter-token gap of ``records``, in order (``RequestRecord.itls``, as arrays)."""
    parts = [np.diff(np.asarray(r.token_times, dtype=np.float64)) for r in records]
    return np.concatenate(parts) if parts else np.empty(0)


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]
