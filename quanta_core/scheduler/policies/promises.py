"""Promises to admitted interactive requests, and the projection that keeps them.

Admitting an interactive request is a promise: its first token by ``arrival +
interactive_ttft_s`` (its due time). A promise is kept while the request waits; it ends when
the request is admitted onto the engine (or finishes). Two things could break it:

- a later arrival admitted in front of it. VTC serves the tenant with the lowest counter
  first, so every later arrival of a lower-counter tenant would overtake it;
- the estimate it was admitted on being optimistic (the step-cost model's job, not this one's).

The projection plays the queue forward on the running slots, as the scheduler will run it:

    slot k frees at free_at[k]        (the running requests' remaining prefill + outputs)
    a job starts at the earliest free slot, and its prefill runs after the prefill before it
    (interactive prefills go one after the other: the policy gives the step's budget to the
    oldest one first), so its first token is at

        first = max(start, lane) + prefill_s        lane = first      slot busy until
                                                                     first + hold_s

Jobs are projected in due order (earliest first): with one prefill lane that order minimises
the worst lateness (Jackson's rule). Where every interactive request has the same target it
is also arrival order, so a new arrival, the last due, can never make a promised request
late in it; it is admitted if it is itself on time there. Where targets grow with the
prompt (``edf_first``), a short arrival may go ahead of a long prefill, running or queued,
if that makes none of them late. At run time the scheduler serves
VTC's choice unless that would make a promised request late in the projection (its slack is
gone); then the earliest due goes first (``next_up``). Either way the promises projected on
time stay on time, up to the cost model's error.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Job:
    """A queued request as the projection sees it."""

    prefill_s: float
    hold_s: float  # how long it keeps its slot after its first token
    due: float = math.inf  # its first token's due time; inf: no promise
    ready: float = -math.inf  # it cannot start before this (a booked retry: its time)
    holds_slot: bool = False  # running already (a prefill in progress): it takes no slot


@dataclass(frozen=True, slots=True)
class Slots:
    """When each running slot frees, and when the prefill in progress ends."""

    free_at: tuple[float, ...]
    lane_free: float


def project(now: float, slots: Slots, jobs: Sequence[Job]) -> list[float]:
    """The first-token time of each job, started in the given order."""
    free = [max(t, now) for t in slots.free_at] or [math.inf]
    heapq.heapify(free)
    lane = max(slots.lane_free, now)
    out: list[float] = []
    for job in jobs:
        if job.holds_slot:  # its slot's end is among ``free_at`` already
            first = lane = lane + job.prefill_s
            out.append(first)
            continue
        start = max(heapq.heappop(free), job.ready)
        first = max(start, lane) + job.prefill_s
        lane = first
        heapq.heappush(free, first + job.hold_s)
        out.append(first)
    return out


def edf_first(now: float, slots: Slots, jobs: Sequence[Job], mine: Job) -> float | None:
    """``mine``'s first-token time with ``jobs`` and it in due order (earliest deadline
    first: the prefill lane goes to the earliest due, a running prefill included), or None
    if it is late there or makes late a job that is on time without it.

    Why due order: prompts of every length share one prefill lane, and a first-token target
    grows with the prompt's own prefill. Served in arrival order, a short prompt behind a
    long prefill waits out all of it and misses a target the long one did not need; in due
    order it goes first and the long one, whose due is far, still makes its own."""
    ordered = sorted(jobs, key=lambda j: j.due)
    merged = sorted([*ordered, mine], key=lambda j: j.due)  # stable: ties keep ``mine`` last
    k = next(i for i, j in enumerate(merged) if j is mine)
    firsts = project(now, slots, merged)
    if firsts[k] > mine.due + _EPS:
        return None
    before = late(ordered, project(now, slots, ordered))
    after = {i if i < k else i - 1 for i in late(merged, firsts)}
    return firsts[k] if after <= before else None


def late(jobs: Sequence[Job], firsts: Sequence[float]) -> set[int]:
    """Indices of the jobs whose first token comes after their due time."""
    return {i for i, (j, f) in enumerate(zip(jobs, firsts, strict=True)) if f > j.due + _EPS}


def due_order(jobs: Sequence[Job]) -> list[int]:
    """Indices by due time (promised first, then the rest in their given order)."""
    return sorted(range(len(jobs)), key=lambda i: jobs[i].due)


def next_up(now: float, slots: Slots, jobs: Sequence[Job], preferred: int) -> int:
    """Which job to start next: ``preferred`` (VTC's choice) unless starting it first makes
    a job late that the due order keeps on time; then the earliest due."""
    order = due_order(jobs)
    if order[0] == preferred or math.isinf(jobs[order[0]].due):
        return preferred
    kept = _late_ids(now, slots, jobs, order)
    trial = [preferred] + [i for i in order if i != preferred]
    if _late_ids(now, slots, jobs, trial) <= kept:
        return preferred
    return order[0]


def _late_ids(now: float, slots: Slots, jobs: Sequence[Job], order: list[int]) -> set[int]:
    ordered = [jobs[i] for i in order]
    return {order[k] for k in late(ordered, project(now, slots, ordered))}
