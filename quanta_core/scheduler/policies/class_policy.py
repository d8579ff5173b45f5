"""What the SLO-class policies (``slo``, ``quanta``) share: their books, not their rules.

A VTC book and a fair queue per class (``ClassQueue``), the step-cost model learnt from
every step, and the admission built once from its rules (``AdmissionRules``). The hooks here
keep those books (who started, ran, finished; each step's cost; batch's aging and its
measured drain); each policy says its own rules (``limits``, ``may_start``, ``on_submit``,
...) on top.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from quanta_core.engine.types import StepPlan, StepResult
from quanta_core.requests import FinishReason, SloClass
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.config import StepLimits
from quanta_core.scheduler.policies.base import Policy, TenantStats
from quanta_core.scheduler.policies.class_queue import ClassQueue
from quanta_core.scheduler.policies.slo_admission import AdmissionRules, SloAdmission
from quanta_core.scheduler.policies.vtc import VirtualCounters
from quanta_core.scheduler.slo import SloConfig
from quanta_core.scheduler.step_cost import StepCostModel, attended_k

_SERVED = frozenset({FinishReason.STOP, FinishReason.LENGTH})


def count_by_tenant(requests: Iterable[Choice]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in requests:
        out[r.tenant] = out.get(r.tenant, 0) + 1
    return out


def tenant_rows(
    counters: VirtualCounters,
    waiting_requests: Iterable[Choice],
    running: Iterable[Choice],
    slo_class: str,
) -> list[TenantStats]:
    waiting, on_engine = count_by_tenant(waiting_requests), count_by_tenant(running)
    return [
        TenantStats(t, slo_class, c, waiting.get(t, 0), on_engine.get(t, 0))
        for t, c in sorted(counters.counter.items())
    ]


def prefilling(r: Choice) -> bool:
    return r.num_tokens - r.num_computed_tokens > 1


class ClassPolicy(Policy):
    """The books of an SLO-class policy; ``rules`` and ``admission_at_mean`` (projections
    priced at the cost model's mean, not its margin) build its admission."""

    def __init__(
        self, config: SloConfig, rules: AdmissionRules, admission_at_mean: bool = False
    ) -> None:
        self.config = config
        self.counters = {
            c: VirtualCounters(config.input_cost, config.output_cost) for c in SloClass
        }
        self.queue = ClassQueue(self.counters, self._choose_interactive)
        self.waiting = self.queue
        self.cost = StepCostModel(config)
        self.mean = self.cost.at_mean()  # the same model priced at its mean (projections)
        admission_cost = self.mean if admission_at_mean else self.cost
        self.admission = SloAdmission(config, admission_cost, self.queue, self.counters, rules)
        # this cycle's, set by ``begin_cycle`` and ``limits``
        self._now = 0.0
        self._running: Collection[Choice] = ()  # the scheduler's live running set
        self._cap = 1  # the running set's size this cycle
        self._limits = StepLimits(1, 1)
        self._batch_yields = False  # an interactive prefill is on, or starts now

    # ---- the cycle ----

    def begin_cycle(self, running: Collection[Choice], now: float) -> None:
        """Aging: a batch request waiting ``batch_aging_s`` (since arrival, or since its
        last preemption) is promoted ahead of everything not promoted before it."""
        self._now, self._running = now, running
        aging = self.config.batch_aging_s
        batch = self.queue.classes[SloClass.BATCH]
        for r in list(batch):
            since = r.preempted_at[-1] if r.preempted_at else r.arrival
            if now - since >= aging:
                self.queue.promote(r)
        self.admission.drain.note(now, len(batch) + len(self.queue.promoted) > 0)

    def _choose_interactive(self, vtc_head: Choice) -> Choice:
        return self.admission.next_interactive(
            vtc_head, self._now, self._running, self._limits, self.full_budget_prefill()
        )

    def full_budget_prefill(self) -> bool:
        """Whether queued interactive prompts are now prefilled in full-budget steps (for
        the projections); by default they run in chunks sized to the inter-token target."""
        return False

    def _batch_slots(self, cap: int) -> int:
        """The running slots batch may fill: all but the reserve (one at least)."""
        return max(cap - self.config.interactive_reserve, 1)

    def pick_victim(self, candidates: Sequence[Choice]) -> Choice:
        """Batch before interactive; within a class, the highest counter's newest."""

        def key(r: Choice) -> tuple[bool, float, int, int]:
            rank = self.counters[r.slo_class].rank(r.tenant)
            return (r.slo_class is SloClass.BATCH, rank, r.order, r.index)

        return max(candidates, key=key)

    def admitted(self, choices: Sequence[Choice]) -> None:
        """``choices`` were admitted: their tenant joins its class's book."""
        for r in choices:
            self.counters[r.slo_class].join(r)

    # ---- bookkeeping ----

    def on_started(self, r: Choice) -> None:
        self.admission.forget(r)
        self.counters[r.slo_class].reserve(r)

    def on_left_running(self, r: Choice) -> None:
        self.counters[r.slo_class].release(r)

    def on_progress(self, r: Choice, input_tokens: int, output_tokens: int) -> None:
        self.counters[r.slo_class].charge(r, input_tokens, output_tokens)

    def on_finished(self, r: Choice) -> None:
        self.admission.finished(r)
        self.counters[r.slo_class].leave(r)
        if r.finish_reason in _SERVED and r.index == 0:
            self.admission.observe_output(r.num_output + r.eog_tokens)

    def after_warm_up(self, tenant: str) -> None:
        self.admission.est.expected_output = float(self.config.expected_output_tokens)
        for counters in self.counters.values():
            counters.forget(tenant)

    def on_step(self, plan: StepPlan, result: StepResult) -> None:
        seconds = result.timings.total_s or result.timings.engine_s
        n_tokens = sum(len(s.tokens) for s in plan.slices)
        pairs = sum(attended_k(s.start_pos, len(s.tokens)) for s in plan.slices)
        self.cost.observe(len(plan.slices), n_tokens, seconds, pairs)
        if self.admission.drain.backlogged:
            batch = {r.owner for r in self._running if r.slo_class is SloClass.BATCH}
            n_batch = sum(len(s.tokens) for s in plan.slices if s.owner in batch)
            self.admission.drain.served(self._now + seconds, n_batch)

    def tenant_stats(self, running: Collection[Choice]) -> tuple[TenantStats, ...]:
        out: list[TenantStats] = []
        for c in SloClass:
            waiting = [r for r in self.queue if r.slo_class is c]
            mine = [r for r in running if r.slo_class is c]
            out += tenant_rows(self.counters[c], waiting, mine, c.value)
        return tuple(out)
