"""The fair policies: ``vtc`` (tenants share by weight) and ``slo`` (VTC within SLO classes).

``vtc``: one pool of tenants. Start order: the tenant with the lowest virtual counter
first, FCFS within a tenant. Victim: the running request of the tenant with the highest
counter, its newest first. Nothing is rejected for load.

``slo``: a pool per class, and the class rules:

- Interactive first: an interactive request is admitted ahead of every batch request not yet
  promoted. Batch fills the slack: the running slots interactive leaves, but for
  ``interactive_reserve`` kept free at all times (unless that is every slot), so that an
  interactive arrival starts at the next step instead of waiting for a batch job to end.
- While interactive requests run or wait, the running count is capped at the most decoding
  streams whose step the cost model prices at ``interactive_itl_s * itl_headroom``, and the
  step's tokens at what fits beside them (a long prompt is prefilled in ITL-sized chunks,
  and an interactive arrival's first step is short). Decoding streams get their tokens
  before any prefill chunk. While an interactive request prefills, or waits with a slot free,
  the running batch requests (decodes too: batch has no inter-token target) yield the step to
  it: they get what is left after it, as far as the step still fits the target (``room``).
  Alone, batch runs at the configured caps.
- Promises: an admitted interactive request's first token is due at arrival + TTFT target.
  Among queued interactive requests VTC chooses, unless starting its choice first would make
  a promised request late; then the earliest due goes first (``promises``). Fairness still
  holds: the override only reorders requests admission let in, each of which admission
  projected on time behind every earlier promise, and admission lets a tenant over its share
  in only if one request of each tenant below it still fits ahead (``slo_admission``). So a
  tenant gains from the override at most its admitted requests' places (each queued at most
  one TTFT target), and under backlog the counters still decide who is admitted. ``vtc``
  has no promises: its bounds (tests/test_fairness_*.py) are untouched.
- Aging: a batch request waiting ``batch_aging_s`` (since arrival, or since its last
  preemption) is promoted ahead of everything not promoted before it.
- Victims: batch before interactive; within a class, the highest counter's newest request.
- Admission answers at once (``slo_admission``): start, queue, or reject with a kind
  (tenant over its fair share: 429; the machine cannot meet the target: 503) and a
  retry-after; batch is shed for interactive when the shared queue is full; preempted work is
  never shed.

"Interactive first while it meets its targets": interactive precedence is only ever claimed
by requests admission expects to meet their targets (the others are refused at submit), and
the ITL caps stop interactive from batching past its own inter-token target; what that leaves
is batch's slack.

The bound on a batch request's wait (tested in ``tests/test_slo_classes.py``). Promoted
requests are admitted oldest first and nothing overtakes the head of the queue (a head that
does not fit stops admission), so a batch request is first scheduled by

    arrival + batch_aging_s + 1 step + (P + 1) * R steps

where P is the number of batch requests promoted before it (at most the batch queue bound),
R the most steps any running request keeps its slot (its remaining prefill chunks plus its
remaining ``max_tokens``, plus the steps a running batch request yields to interactive
prefills, which admission bounds: each is an admitted request's prompt), and a step is
planned to last under ``interactive_itl_s`` while interactive streams decode. Each promoted
head takes the first slot that frees. This holds in
steps that do not preempt (a preempting step admits nothing) and while its blocks fit once the
running requests end; a preempted batch request ages again from its preemption. With the defaults
(aging 30 s, 0.25 s steps) and 256-token interactive answers, R is ~260 steps (~65 s): a lone
batch request waits at most ~95 s.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from quanta_core.requests import SloClass
from quanta_core.scheduler.admission import AdmissionVerdict
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.config import PolicyName, SchedulerConfig, StepLimits
from quanta_core.scheduler.policies.base import Policy, StartDecision, TenantStats
from quanta_core.scheduler.policies.class_policy import ClassPolicy, prefilling, tenant_rows
from quanta_core.scheduler.policies.slo_admission import AdmissionRules
from quanta_core.scheduler.policies.vtc import FairQueue, VirtualCounters
from quanta_core.scheduler.slo import SloConfig


class VtcPolicy(Policy):
    name = PolicyName.VTC

    def __init__(self, config: SloConfig | None = None) -> None:
        config = config or SloConfig()
        self.counters = VirtualCounters(config.input_cost, config.output_cost)
        self.queue = FairQueue(self.counters)
        self.waiting = self.queue

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> Policy:
        return cls(config.slo)

    def may_start(self, r: Choice, running: Collection[Choice]) -> StartDecision:
        return StartDecision.START

    def on_submit(
        self, choices: Sequence[Choice], running: Collection[Choice], base: StepLimits
    ) -> AdmissionVerdict:
        verdict = super().on_submit(choices, running, base)
        for r in choices:
            self.counters.join(r)
        return verdict

    def pick_victim(self, candidates: Sequence[Choice]) -> Choice:
        return max(candidates, key=lambda r: (self.counters.rank(r.tenant), r.order, r.index))

    def on_started(self, r: Choice) -> None:
        self.counters.reserve(r)

    def on_left_running(self, r: Choice) -> None:
        self.counters.release(r)

    def on_progress(self, r: Choice, input_tokens: int, output_tokens: int) -> None:
        self.counters.charge(r, input_tokens, output_tokens)

    def on_finished(self, r: Choice) -> None:
        self.counters.leave(r)

    def after_warm_up(self, tenant: str) -> None:
        self.counters.forget(tenant)

    def steady_steps(self, running: Collection[Choice], steps: int) -> int:
        # Tokens move the counters, and the counters pick the tenant whose head is next:
        # steady only while at most one tenant waits (its head stays the head).
        return steps if len(self.queue.tenants()) <= 1 else 0

    def tenant_stats(self, running: Collection[Choice]) -> tuple[TenantStats, ...]:
        return tuple(tenant_rows(self.counters, self.queue, running, "all"))


class SloPolicy(ClassPolicy):
    name = PolicyName.SLO

    def __init__(self, config: SloConfig | None = None) -> None:
        config = config or SloConfig()
        super().__init__(config, AdmissionRules())
        self._itl_target = config.interactive_itl_s * config.itl_headroom

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> Policy:
        return cls(config.slo)

    # ---- the cycle ----

    def limits(self, running: Collection[Choice], base: StepLimits) -> StepLimits:
        present = self._interactive_present(running)
        limits = self.interactive_limits(len(running), base, present)
        self._cap = limits.max_running
        starts = len(self.queue.classes[SloClass.INTERACTIVE]) > 0 and len(running) < self._cap
        inter = [r for r in running if r.slo_class is SloClass.INTERACTIVE]
        self._batch_yields = starts or any(prefilling(r) for r in inter)
        if self._batch_yields:
            # The step is priced for the interactive streams (and one arrival): batch goes
            # after them, in what ``room`` leaves.
            n_seqs = min(len(inter) + 1, limits.max_running)
            budget = self.cost.max_tokens(n_seqs, self._itl_target, base.token_budget)
            limits = StepLimits(limits.max_running, budget)
        self._limits = limits
        return limits

    def order_running(self, running: list[Choice]) -> list[Choice]:
        """Decoding streams first, so that no prefill chunk takes their token; then
        interactive prefill before batch prefill."""
        return sorted(running, key=lambda r: (prefilling(r), r.slo_class is SloClass.BATCH))

    def defers(self, r: Choice) -> bool:
        """Batch yields to an interactive prefill: it gets what is left, after it."""
        return self._batch_yields and r.slo_class is SloClass.BATCH

    def room(self, n_seqs: int, n_tokens: int) -> int | None:
        """While interactive streams run or wait, one more slice may carry only what keeps
        the step within the inter-token target."""
        if not self._interactive_present(self._running) or n_seqs == 0:
            return None  # an empty step always takes a slice: else nothing would ever run
        return self.cost.room(n_seqs, n_tokens, self._itl_target)

    def _interactive_present(self, running: Collection[Choice]) -> bool:
        if len(self.queue.classes[SloClass.INTERACTIVE]) > 0:
            return True
        return any(r.slo_class is SloClass.INTERACTIVE for r in running)

    def interactive_limits(self, n_running: int, base: StepLimits, present: bool) -> StepLimits:
        """While interactive requests are ``present`` (running or waiting): the caps that keep
        a step within the inter-token target, headroom included. A long prompt is prefilled
        in ITL-sized chunks then, which costs it little: a step's cost is nearly linear in
        its tokens."""
        if not present:
            return base
        target = self._itl_target
        cap = self.cost.max_seqs(target, base.max_running)
        n_seqs = max(n_running, min(n_running + 1, cap))
        return StepLimits(cap, self.cost.max_tokens(n_seqs, target, base.token_budget))

    def may_start(self, r: Choice, running: Collection[Choice]) -> StartDecision:
        if r.slo_class is SloClass.INTERACTIVE or self.queue.is_promoted(r):
            return StartDecision.START
        if len(running) >= self._batch_slots(self._cap):
            return StartDecision.STOP
        return StartDecision.START

    # ---- admission ----

    def on_submit(
        self, choices: Sequence[Choice], running: Collection[Choice], base: StepLimits
    ) -> AdmissionVerdict:
        cls = choices[0].slo_class
        present = self._interactive_present(running) or cls is SloClass.INTERACTIVE
        caps = self.interactive_limits(len(running), base, present)
        if cls is SloClass.BATCH:
            caps = StepLimits(self._batch_slots(caps.max_running), caps.token_budget)
        verdict = self.admission.decide(choices, running, caps, base)
        if verdict.reason is None:
            self.admitted(choices)
        return verdict
