"""The baselines: one at a time, static batches, and continuous batching first come first
served. The policies worth running are in ``fair``; these are what they are measured against."""

from __future__ import annotations

from collections.abc import Collection

from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.config import PolicyName
from quanta_core.scheduler.policies.base import Policy, StartDecision


class SequentialPolicy(Policy):
    """One request at a time (all its choices), run to completion: the baseline of no policy."""

    name = PolicyName.SEQUENTIAL

    def may_start(self, r: Choice, running: Collection[Choice]) -> StartDecision:
        if all(other.request_id == r.request_id for other in running):
            return StartDecision.START
        return StartDecision.STOP

    def steady_steps(self, running: Collection[Choice], steps: int) -> int:
        return steps  # no state: its answer depends on the running set alone


class StaticPolicy(Policy):
    """Static batching: a batch forms while none of it has produced a token, then runs until
    every member finished; newcomers wait for the next batch."""

    name = PolicyName.STATIC

    def __init__(self) -> None:
        super().__init__()
        self._batch: set[str] = set()
        self._forming = True

    def begin_cycle(self, running: Collection[Choice], now: float) -> None:
        if not running:
            self._batch.clear()
            self._forming = True
        elif any(r.first_token is not None for r in running):
            self._forming = False

    def may_start(self, r: Choice, running: Collection[Choice]) -> StartDecision:
        # Preempted members and late choices (n > 1) of the batch's requests may come back.
        if self._forming or r.request_id in self._batch:
            return StartDecision.START
        return StartDecision.STOP

    def on_started(self, r: Choice) -> None:
        self._batch.add(r.request_id)

    def steady_steps(self, running: Collection[Choice], steps: int) -> int:
        # Once the batch has formed, ``begin_cycle`` changes nothing until it has run out.
        return 0 if self._forming else steps


class FcfsPolicy(Policy):
    """Continuous batching, first come first served: admit in arrival order whenever memory
    allows; a head that does not fit blocks those behind it (no overtaking)."""

    name = PolicyName.FCFS

    def may_start(self, r: Choice, running: Collection[Choice]) -> StartDecision:
        return StartDecision.START

    def steady_steps(self, running: Collection[Choice], steps: int) -> int:
        return steps  # no state: every answer is fixed, the queue's order is arrival
