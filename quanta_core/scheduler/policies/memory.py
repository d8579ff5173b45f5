"""Memory-aware admission: start a request only if KV memory holds it at every future moment.

The rule is MC-SF's (Jaillet et al. 2025, arXiv 2502.07115). Every running sequence grows by
one cell per step until it ends, then frees all it held. With ``held`` cells now and
``remaining`` more tokens to come (a predicted quantile), sequence ``i`` holds at ``t`` steps
from now

    cells_i(t) = held_i + t    while t <= remaining_i,   0 after

so the pool's use is a sum of rising lines that drop at completions, and its peaks are just
before a completion. Admitting a candidate is safe iff at ``t = 0`` and at every completion
time ``t = remaining_j`` (the candidate's included)

    sum over i with remaining_i >= t of  ceil(cells_i(t) / block_size)   <=   capacity_blocks

    blocks ^        .|                         running: a (held 4, rem 2), b (held 2, rem 5)
           |      .' |        .|               candidate c (held 3, rem 4)
           |    .'   |      .' |  .|           peaks checked at t = 0, 2, 4, 5
           |  .'     |____.'   |.' |
           +------------------------------> t

Counting whole blocks per sequence matches the block manager; a prompt shared between the
choices of one request is counted once per choice (safe: it overestimates). Prefix-cache
blocks do not count: they are reclaimed on demand. A request is admitted onto an idle engine
whatever its projection (nothing would ever free room for it; the context bound caps it).

``MemoryGate`` is the piece a policy calls from ``may_start``; ``fits`` / ``peak_blocks``
are the pure rule. A wrong prediction is paid for by the scheduler's preemption (the cheapest
victim, stash or recompute); the quantile chooses how often: p90 means about one running
request in ten outlives its projection.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from quanta_core.scheduler.choice import Choice


@dataclass(frozen=True, slots=True)
class KvDemand:
    """One sequence's KV over time: ``held`` cells now, ``remaining`` more tokens to come."""

    held: int
    remaining: int


def peak_blocks(demands: Sequence[KvDemand], block_size: int) -> int:
    """The most blocks ``demands`` hold at once from now until the last of them ends."""
    return peak_blocks_of([(d.held, d.remaining) for d in demands], block_size)


def peak_blocks_of(demands: list[tuple[int, int]], block_size: int) -> int:
    """``peak_blocks`` of ``(held, remaining)`` pairs, sorted in place. Sorted by
    ``remaining``, longest first, the sequences still running at ``t`` are a prefix: each
    time's sum stops at the first that has ended. (The gate asks this every step: plain
    tuples, the ceiling inline.)"""
    demands.sort(key=lambda d: d[1], reverse=True)
    bs = block_size
    peak = 0
    for t in {0, *(rem for _, rem in demands)}:
        used = 0
        for held, rem in demands:
            if rem < t:
                break
            used -= (-held - t) // bs  # ceil((held + t) / bs)
        if used > peak:
            peak = used
    return peak


def fits(
    running: Sequence[KvDemand], candidate: KvDemand, capacity_blocks: int, block_size: int
) -> bool:
    """Whether ``candidate`` may start beside ``running`` (always, when nothing runs)."""
    if not running:
        return True
    return peak_blocks([*running, candidate], block_size) <= capacity_blocks


def max_tokens_remaining(r: Choice) -> int:
    """The safe projection with no predictor: every request runs to its ``max_tokens``."""
    return max(r.max_tokens - r.num_output, 0)


class MemoryGate:
    """``admits(r, running)``: the MC-SF rule over the scheduler's live choices.

    ``remaining(r)`` projects how many more tokens ``r`` will generate: a quantile of a
    length predictor, or ``max_tokens_remaining`` (exact under ``ignore_eos``, pessimistic
    otherwise). A choice holds ``len(r.tokens)`` cells at its projection's start, its prompt
    counted whole even while it is prefilled in chunks. The policy must learn the pool's size
    (``set_pool``) before the first ``admits``; the scheduler calls ``Policy.set_pool``.

        gate = MemoryGate(remaining=max_tokens_remaining)
        gate.set_pool(num_blocks=128, block_size=16)
        if not gate.admits(r, running):
            return StartDecision.STOP          # wait: a burst, not overload
    """

    def __init__(self, remaining: Callable[[Choice], int] = max_tokens_remaining) -> None:
        self.remaining = remaining
        self.capacity_blocks = 0
        self.block_size = 1
        self.holds = 0  # admissions the rule deferred, asked cycle by cycle (for tests)

    def set_pool(self, num_blocks: int, block_size: int) -> None:
        self.capacity_blocks, self.block_size = num_blocks, block_size

    def demand(self, r: Choice) -> KvDemand:
        return KvDemand(len(r.tokens), self.remaining(r))

    def admits(self, r: Choice, running: Collection[Choice]) -> bool:
        if not running:
            return True
        if self.capacity_blocks <= 0:
            raise RuntimeError("MemoryGate.admits before set_pool")
        remaining = self.remaining
        demands = [(len(o.tokens), remaining(o)) for o in running]  # ``demand``, as pairs
        demands.append((len(r.tokens), remaining(r)))
        ok = peak_blocks_of(demands, self.block_size) <= self.capacity_blocks
        if not ok:
            self.holds += 1
        return ok

    def slots(self, requests: Collection[Choice]) -> int | None:
        """How many requests like ``requests`` the pool holds at once: the pool over their
        mean projected size (held cells and the projected remaining, in whole blocks), at
        least 1; None before ``set_pool``. What the gate lets run at once, for admission's
        projection: a KV-bound burst is served that many at a time, not as many as the
        step time allows."""
        if self.capacity_blocks <= 0 or not requests:
            return None
        bs, remaining = self.block_size, self.remaining
        sizes = [-(-(len(r.tokens) + remaining(r)) // bs) for r in requests]
        return max(1, int(self.capacity_blocks * len(sizes) // sum(sizes)))
