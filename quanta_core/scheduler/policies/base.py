"""Scheduling policies: a name, a small ordering class, and a factory.

A policy decides the waiting queue's order, whether the next request may be admitted now, and
whom to evict when memory runs out. It never touches KV memory; the scheduler does, with the
same code for every policy. ``baselines`` holds ``sequential``, ``static`` and ``fcfs``;
``fair`` holds ``vtc`` and ``slo`` (their counters in ``vtc``); ``horizon`` and ``quanta``
have a module each (``quanta``'s rules: docs/policies.md); all are made by name in the
package's ``make_policy``.

The decisions, in the order of a cycle (each a no-op or the configured value here):

    on_submit       START / QUEUE / REJECT a new request (and shed queued ones)
    begin_cycle     first in each cycle (aging, the calm-burst clock)
    limits          this cycle's running-count and token caps
    make_room       running requests to preempt now, for waiting ones that go first
    order_running / defers     who of the running gets tokens first; who goes after admission
    may_start       whether the waiting head starts now (abstract)
    room            how many tokens one more slice may take (after the running ones)
    pick_victim     whom to evict when a block is short

The books (what happened): on_started, on_progress, on_left_running, on_finished, on_step;
set-up: set_pool, set_predictor (once), after_warm_up; reports: tenant_stats;
steady_steps: how many of the next decode-only steps leave its answers as they are (the
simulator takes those in bulk).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from quanta_core.engine.types import StepPlan, StepResult
from quanta_core.predictor import LengthPredictor
from quanta_core.scheduler.admission import AdmissionDecision, AdmissionVerdict
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.config import PolicyName, SchedulerConfig, StepLimits
from quanta_core.scheduler.queue import ChoiceQueue, SortKey, WaitingQueue, arrival_order


class StartDecision(Enum):
    START = "start"  # try to start this request (memory permitting)
    SKIP = "skip"  # not this one; look at the next
    STOP = "stop"  # start nothing more this cycle


@dataclass(frozen=True, slots=True)
class TenantStats:
    """One tenant of one class, for ``/metrics``."""

    tenant: str
    slo_class: str
    counter: float  # virtual tokens of service received (weighted)
    waiting: int
    running: int


class Policy(ABC):
    name: ClassVar[PolicyName]

    def __init__(self) -> None:
        self.waiting: ChoiceQueue = WaitingQueue(self.sort_key)

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> Policy:
        return cls()

    def sort_key(self, r: Choice) -> SortKey:
        """The waiting order: first come, first served."""
        return arrival_order(r)

    def set_pool(self, num_blocks: int, block_size: int) -> None:  # noqa: B027
        """The KV pool's size, told once by the scheduler (for memory-aware admission)."""

    def set_predictor(self, predictor: LengthPredictor) -> None:  # noqa: B027
        """The scheduler's length predictor (which it teaches every finished choice)."""

    def begin_cycle(self, running: Collection[Choice], now: float) -> None:  # noqa: B027
        """Called first in each cycle; a policy lifts its starved requests here."""

    @abstractmethod
    def may_start(self, r: Choice, running: Collection[Choice]) -> StartDecision: ...

    def on_started(self, r: Choice) -> None:  # noqa: B027
        """``r`` got a sequence id and blocks."""

    def pick_victim(self, candidates: Sequence[Choice]) -> Choice:
        """Whom to evict when memory runs out: by default the newest (vLLM's default)."""
        return max(candidates, key=self.sort_key)

    def on_submit(
        self, choices: Sequence[Choice], running: Collection[Choice], base: StepLimits
    ) -> AdmissionVerdict:
        """A new request (its choices, not queued yet): start, queue, or reject it."""
        free = len(running) < base.max_running
        start = free and len(self.waiting) == 0
        return AdmissionVerdict(AdmissionDecision.START if start else AdmissionDecision.QUEUE)

    def limits(self, running: Collection[Choice], base: StepLimits) -> StepLimits:
        """This cycle's caps (after ``begin_cycle``); by default the configured ones."""
        return base

    def make_room(self, running: Collection[Choice], limits: StepLimits) -> list[Choice]:
        """Running requests to preempt before this cycle's step, so that waiting ones that
        go first can start (after ``limits``); by default none."""
        return []

    def order_running(self, running: list[Choice]) -> list[Choice]:
        """The order running requests get their tokens in (and may be evicted after the one
        that needs a block); by default admission order. One left out gets no token this
        step (it keeps its sequence)."""
        return running

    def defers(self, r: Choice) -> bool:
        """Running ``r`` gets what admission leaves of this step's budget, after it."""
        return False

    def room(self, n_seqs: int, n_tokens: int) -> int | None:
        """The most tokens a slice admitted or deferred may add to a step that already holds
        ``n_seqs`` slices of ``n_tokens`` tokens; None: only the token budget limits it."""
        return None

    def on_progress(self, r: Choice, input_tokens: int, output_tokens: int) -> None:  # noqa: B027
        """A step computed ``input_tokens`` prompt tokens of ``r`` for the first time and
        sampled ``output_tokens`` for it."""

    def on_left_running(self, r: Choice) -> None:  # noqa: B027
        """``r`` gave up its sequence (finished, preempted, or the engine lost it)."""

    def on_finished(self, r: Choice) -> None:  # noqa: B027
        """``r`` ended, for any reason (after it left running)."""

    def on_step(self, plan: StepPlan, result: StepResult) -> None:  # noqa: B027
        """A step ran (for cost models)."""

    def steady_steps(self, running: Collection[Choice], steps: int) -> int:
        """Of the next ``steps`` cycles in which ``running`` only decodes (every running
        request gets one token a step; no arrival, start, finish, preemption or cancel),
        how many certainly leave this policy's answers as they are: ``begin_cycle``,
        ``limits``, ``make_room``, ``order_running``, ``defers``, ``room`` and ``may_start``
        (of the queue's head, which stays the head) give the same answers and change
        nothing, and its only bookkeeping is ``on_progress`` and ``on_step``. The simulator
        takes those steps in bulk (``quanta_core.sim.steady``). By default none: a policy
        whose order moves with every token runs step by step."""
        return 0

    def after_warm_up(self, tenant: str) -> None:  # noqa: B027
        """The warm-up workload (``tenant``'s) is done: keep what it taught of step costs,
        forget what it says about answers and service."""

    def tenant_stats(self, running: Collection[Choice]) -> tuple[TenantStats, ...]:
        return ()
