"""Scheduling policies: a name, a small ordering class, and a factory.

A policy decides the waiting queue's order, whether the next request may be admitted now, and
whom to evict when memory runs out. It never touches KV memory; the scheduler does, with the
same code for every policy. Later policies (VTC fairness per tenant, SLO classes, predictive)
subclass ``Policy`` and register in ``POLICIES``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from enum import Enum
from typing import ClassVar

from quanta_core.scheduler.config import PolicyName
from quanta_core.scheduler.queue import SortKey, WaitingQueue
from quanta_core.scheduler.request import Request


class AdmitDecision(Enum):
    ADMIT = "admit"  # try to admit this request (memory permitting)
    SKIP = "skip"  # not this one; look at the next
    STOP = "stop"  # admit nothing more this cycle


class Policy(ABC):
    name: ClassVar[PolicyName]

    def __init__(self) -> None:
        self.waiting = WaitingQueue(self.sort_key)

    def sort_key(self, r: Request) -> SortKey:
        """The waiting order: first come, first served; choices of a request in index order."""
        return (r.order, r.index)

    def begin_cycle(self, running: Collection[Request], now: float) -> None:  # noqa: B027
        """Called first in each cycle; a policy lifts its starved requests here."""

    @abstractmethod
    def may_admit(self, r: Request, running: Collection[Request]) -> AdmitDecision: ...

    def on_admitted(self, r: Request) -> None:  # noqa: B027
        """``r`` got a sequence id and blocks."""

    def pick_victim(self, candidates: Sequence[Request]) -> Request:
        """Whom to evict when memory runs out: by default the newest (vLLM's default)."""
        return max(candidates, key=self.sort_key)


class SequentialPolicy(Policy):
    """One request at a time (all its choices), run to completion: the baseline of no policy."""

    name = PolicyName.SEQUENTIAL

    def may_admit(self, r: Request, running: Collection[Request]) -> AdmitDecision:
        if all(other.request_id == r.request_id for other in running):
            return AdmitDecision.ADMIT
        return AdmitDecision.STOP


class StaticPolicy(Policy):
    """Static batching: a batch forms while none of it has produced a token, then runs until
    every member finished; newcomers wait for the next batch."""

    name = PolicyName.STATIC

    def __init__(self) -> None:
        super().__init__()
        self._batch: set[str] = set()
        self._forming = True

    def begin_cycle(self, running: Collection[Request], now: float) -> None:
        if not running:
            self._batch.clear()
            self._forming = True
        elif any(r.first_token is not None for r in running):
            self._forming = False

    def may_admit(self, r: Request, running: Collection[Request]) -> AdmitDecision:
        # Preempted members and late choices (n > 1) of the batch's requests may come back.
        if self._forming or r.request_id in self._batch:
            return AdmitDecision.ADMIT
        return AdmitDecision.STOP

    def on_admitted(self, r: Request) -> None:
        self._batch.add(r.request_id)


class FcfsPolicy(Policy):
    """Continuous batching, first come first served: admit in arrival order whenever memory
    allows; a head that does not fit blocks those behind it (no overtaking)."""

    name = PolicyName.FCFS

    def may_admit(self, r: Request, running: Collection[Request]) -> AdmitDecision:
        return AdmitDecision.ADMIT


POLICIES: dict[PolicyName, type[Policy]] = {
    cls.name: cls for cls in (SequentialPolicy, StaticPolicy, FcfsPolicy)
}


def make_policy(name: PolicyName | str) -> Policy:
    try:
        return POLICIES[PolicyName(name)]()
    except ValueError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown scheduling policy {name!r} (known: {known})") from None
