"""Prefill order (``quanta``): interactive prefills go earliest due first.

Admission promises each interactive request its first token at a due time and projects a
new one among the prefills in that order (``promises.edf_first``); the step gives its
prefill budget in the same order, a running prefill included: a short prompt goes ahead of
a long one in progress where that makes neither late, instead of being refused behind all
of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from quanta_core.requests import SloClass
from quanta_core.scheduler.choice import Choice


def _prefilling(r: Choice) -> bool:
    return r.num_tokens - r.num_computed_tokens > 1


def run_order(r: Choice, dues: Mapping[Choice, float]) -> tuple[bool, bool, float]:
    """The key running requests get their tokens in: decoding streams first (no prefill
    chunk takes their token), then interactive prefills earliest due first, then batch."""
    prefilling = _prefilling(r)
    batch = r.slo_class is SloClass.BATCH
    due = dues.get(r, -math.inf) if prefilling and not batch else 0.0
    return (prefilling, batch, due)


def earliest_due(queued: Iterable[Choice], dues: Mapping[Choice, float]) -> float:
    """The earliest first-token due among ``queued`` (inf: none)."""
    return min((dues.get(r, math.inf) for r in queued), default=math.inf)


def yields_to_queued(r: Choice, queued_due: float, dues: Mapping[Choice, float]) -> bool:
    """Whether running ``r``, an interactive prefill, yields the step to a queued
    interactive request due (``queued_due``) before it: that one starts first."""
    if r.slo_class is not SloClass.INTERACTIVE or not _prefilling(r):
        return False
    return queued_due < dues.get(r, -math.inf)
