"""SLO targets per class, and whether a request met them.

Interactive requests have a time-to-first-token target and a per-token target; batch requests
have a completion deadline. Defaults are sized for the reference machine (2 CPU cores,
SmolLM2-135M; its figures in ``quanta_core/scheduler/slo.py``: one sequence decodes at ~18 ms
a token, a batched step of 16 takes ~190 ms, prefill runs at ~155 tokens/s): a 128-token
prompt alone prefills in ~0.85 s, so 2 s to the first token leaves room for a short queue,
and 250 ms per token is slower than a busy batched step but still faster than anyone reads.
A workload file overrides them per class.

Two views of "met":

- goodput: the request met every target of its class (TTFT ≤ target and TPOT ≤ target, or
  end-to-end ≤ deadline).
- never stalls: every gap between two streamed tokens at most a cap (1 s by default), however
  late the stream started (``never_stalls``; issue 22's "smooth" of a KV-bound burst).
- smooth goodput: every token arrived by its own deadline,
  ``sent + ttft_s + i × itl_s`` for token i (0 = the first), so a fast start cannot buy a
  stall in the middle; for a deadline class every token arrived by ``sent + deadline_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from quanta_core.metrics.records import RequestRecord
from quanta_core.requests import SloClass


@dataclass(frozen=True, slots=True)
class SloTargets:
    """Seconds; ``None``: no target of that kind."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: float | None = None  # the smooth-goodput pace; defaults to tpot_s
    deadline_s: float | None = None  # end-to-end

    @property
    def pace_s(self) -> float | None:
        return self.itl_s if self.itl_s is not None else self.tpot_s

    def as_dict(self) -> dict[str, float | None]:
        return {
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "itl_s": self.itl_s,
            "deadline_s": self.deadline_s,
        }


INTERACTIVE_DEFAULT = SloTargets(ttft_s=2.0, tpot_s=0.25, itl_s=0.25)
BATCH_DEFAULT = SloTargets(deadline_s=120.0)


def default_targets() -> dict[SloClass, SloTargets]:
    return {SloClass.INTERACTIVE: INTERACTIVE_DEFAULT, SloClass.BATCH: BATCH_DEFAULT}


def meets_slo(record: RequestRecord, targets: SloTargets) -> bool:
    """Goodput: a finished request that met every target of its class."""
    if not record.ok or record.finished is None:
        return False
    ttft, tpot, e2e = record.ttft, record.tpot, record.e2e
    if targets.ttft_s is not None and (ttft is None or ttft > targets.ttft_s):
        return False
    # A one-token answer has no TPOT: nothing to miss.
    if targets.tpot_s is not None and tpot is not None and tpot > targets.tpot_s:
        return False
    return not (targets.deadline_s is not None and (e2e is None or e2e > targets.deadline_s))


def token_deadlines(record: RequestRecord, targets: SloTargets) -> list[float | None]:
    """Each streamed token's deadline (``None``: it has none)."""
    n = len(record.token_times)
    hard = None if targets.deadline_s is None else record.sent + targets.deadline_s
    if targets.ttft_s is None:
        return [hard] * n
    first, pace = record.sent + targets.ttft_s, targets.pace_s or 0.0
    if hard is None:
        return [first + i * pace for i in range(n)]
    return [min(first + i * pace, hard) for i in range(n)]


def tokens_on_time(record: RequestRecord, targets: SloTargets) -> int:
    """How many streamed tokens arrived by their deadline (``token_deadlines``), counted in
    one array pass: the same float operations, token by token."""
    n = len(record.token_times)
    if n == 0:
        return 0
    hard = None if targets.deadline_s is None else record.sent + targets.deadline_s
    times = np.asarray(record.token_times, dtype=np.float64)
    if targets.ttft_s is None:
        return n if hard is None else int(np.count_nonzero(times <= hard))
    first, pace = record.sent + targets.ttft_s, targets.pace_s or 0.0
    deadlines = first + np.arange(n, dtype=np.float64) * pace
    if hard is not None:
        deadlines = np.minimum(deadlines, hard)
    return int(np.count_nonzero(times <= deadlines))


def meets_smooth_slo(record: RequestRecord, targets: SloTargets) -> bool:
    """Smooth goodput: a finished request whose every token arrived by its deadline."""
    if not record.ok or record.finished is None or not record.token_times:
        return False
    if targets.deadline_s is not None and record.finished - record.sent > targets.deadline_s:
        return False
    return tokens_on_time(record, targets) == len(record.token_times)


def never_stalls(record: RequestRecord, max_gap_s: float = 1.0) -> bool:
    """A finished request none of whose gaps between two streamed tokens exceeds
    ``max_gap_s`` (the wait for the first token does not count): a stream that never stalls,
    however late it started."""
    if not record.ok or record.finished is None:
        return False
    t = record.token_times
    return all(b - a <= max_gap_s for a, b in pairwise(t))
