"""The ``quanta`` policy, the server's default: SLO classes, weighted VTC, honest admission and
memory-aware batching, governed by measured step costs instead of a fixed running cap.

It is a composition of the rules below, each one function or class with its settings passed
in; ``ClassPolicy`` keeps the books it shares with ``slo`` (a VTC book and queue per class,
the step-cost model, batch aging). docs/policies.md maps each rule to its tests.

 1. Running set (``running_cap``): as many sequences as the step-cost model (learnt online)
    prices within the interactive inter-token target at ``grow_headroom``; ``max_running``
    is only an upper bound. Batch alone runs at the same size (a CPU is compute bound) and
    leaves ``interactive_reserve`` slots free (``may_start``).
 2. Step budget (``step_budget``): while interactive streams run, a step carries what keeps
    it within that target (a long prompt is chunked); batch yields to interactive prefills
    (``defers``) and a slice after them gets what the target leaves (``room``).
 3. Class isolation (``isolation.batch_victims``, ``may_start``): interactive overtakes
    batch, aged or not; one that lacks a slot or memory preempts running batch, never the
    last one while batch waits.
 4. Prefill order (``prefill_order``): interactive prefills go earliest due first, a
    running one included, and admission projects a new request among them in that order
    (``AdmissionRules.prefill_edf``).
 5. First-token target (``SloAdmission.ttft_target``): the interactive target, or twice the
    prompt's own prefill where that is longer (``long_prompt_slack``).
 6. Honest admission (``admit_interactive`` on ``SloAdmission``): projected behind the
    interactive work only, on no more slots than the KV pool holds (``MemoryGate.slots``);
    the estimate is kept (``ttft_estimate``); a refusal books its retry (``bookings``) and
    its retry-after leaves ``retry_margin`` for the projection to be wrong. A prompt too
    long for the target alone is projected with the prefills in full-budget steps.
 7. Load grace (``load.OfferedLoad``): below capacity (the interactive work admitted over
    ``load_window_s`` under that time, each request's prompt in full passes, priced at the
    line learnt by the time it is read) a request late in the projection is queued.
 8. Calm burst (``burst.CalmBurst``): a burst on a calm machine is queued up to
    ``burst_grace`` targets late, and while it waits for first tokens the set may grow to
    ``burst_itl_s``.
 8b. First tokens first (``first_tokens_owed``, ``first_token_budget``): while an
    interactive request waits for its first token and the machine is not over capacity, a
    step carries the waiting prompts' tokens up to ``first_token_step_s`` (past the token
    budget, up to the engine's pass), the streams' tokens riding along; batch prefill does
    not pad it. Over capacity the inter-token target bounds every step.
 9. Memory (``memory.MemoryGate``): a request starts only if the running set and it, each
    growing to its predicted end, fit the KV pool at every future completion (MC-SF).
10. Weighted shares per step (``shares.sit_out``): within a class, a tenant runs only as
    many decoding streams as keep its counter within ``fair_lag`` of the lowest running
    tenant's, the longest waiting first; the share holds when every stream runs at once.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Collection, Sequence

from quanta_core.predictor import LengthPredictor
from quanta_core.requests import SloClass
from quanta_core.scheduler.admission import AdmissionVerdict
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.config import PolicyName, SchedulerConfig, StepLimits
from quanta_core.scheduler.policies.base import Policy, StartDecision
from quanta_core.scheduler.policies.burst import BurstRule, CalmBurst
from quanta_core.scheduler.policies.class_policy import ClassPolicy, prefilling
from quanta_core.scheduler.policies.isolation import batch_victims
from quanta_core.scheduler.policies.load import OfferedLoad, Work, request_work
from quanta_core.scheduler.policies.memory import MemoryGate
from quanta_core.scheduler.policies.prefill_order import earliest_due, run_order, yields_to_queued
from quanta_core.scheduler.policies.shares import ShareRule, sit_out
from quanta_core.scheduler.policies.slo_admission import AdmissionRules
from quanta_core.scheduler.policies.slo_estimates import mean_context
from quanta_core.scheduler.slo import SloConfig

log = logging.getLogger("quanta.admission")

_INTERACTIVE = SloClass.INTERACTIVE
_BATCH = SloClass.BATCH


def admission_rules(config: SloConfig) -> AdmissionRules:
    """``quanta``'s admission: prefills earliest due first, interactive projected past
    aged batch, refusals booked, a long prompt's target grown to twice its prefill, and
    chunks sized to the inter-token target at ``grow_headroom`` (alone: full steps)."""
    return AdmissionRules(
        prefill_edf=True,
        promoted_ahead=False,
        book_retries=True,
        long_prompt_slack=2.0,
        retry_margin=config.retry_margin,
        itl_target_s=config.interactive_itl_s * config.grow_headroom,
        alone_full_budget=True,
    )


class QuantaPolicy(ClassPolicy):
    name = PolicyName.QUANTA

    def __init__(
        self,
        config: SloConfig | None = None,
        admission_quantile: float = 0.9,
        rules: AdmissionRules | None = None,
    ) -> None:
        config = config or SloConfig()
        super().__init__(config, rules or admission_rules(config), admission_at_mean=True)
        # one bound for the set's size and the steps' tokens: the inter-token target
        self._itl_target = config.interactive_itl_s * config.grow_headroom
        self.admission_quantile = admission_quantile
        self.predictor = LengthPredictor()
        self.gate = MemoryGate(self._projected)
        self.burst = CalmBurst(BurstRule.from_config(config))
        self.load = OfferedLoad(config.load_window_s, config.load_min_s)
        self.shares = ShareRule.from_config(config)
        # (estimated, actual) seconds to the first token of the last finished requests
        self.estimates: deque[tuple[float, float]] = deque(maxlen=1000)
        # this cycle's (``limits``), besides ``ClassPolicy``'s
        self._itl_cap = 1  # the running set the inter-token target allows
        self._ttft_first = False  # first tokens are owed (``first_tokens_owed``)
        self._queued_due = math.inf  # the earliest first-token due among queued interactive

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> Policy:
        return cls(config.slo, config.horizon.admission_quantile)

    # ---- 1, 2: the running set and the step ----

    def running_cap(self, base: StepLimits, burst: bool = False, context: float = 0.0) -> int:
        """The most sequences (at ``context`` cells each) whose decode step the cost model
        prices within the inter-token target; for a calm burst, within its step (the
        model's mean: a typical step within the smooth gap, not the margin)."""
        if burst:
            return self.mean.max_seqs(self.burst.rule.step_s, base.max_running, context)
        return self.cost.max_seqs(self._itl_target, base.max_running, context)

    def limits(self, running: Collection[Choice], base: StepLimits) -> StepLimits:
        self._running = running
        burst = self.burst.waiting()
        context = mean_context(running)
        self._itl_cap = self.running_cap(base, context=context)
        cap = self.running_cap(base, True, context) if burst else self._itl_cap
        self._cap = cap
        queued = self.queue.classes[_INTERACTIVE]
        inter = [r for r in running if r.slo_class is _INTERACTIVE]
        self._ttft_first = self.first_tokens_owed(inter, len(queued) > 0, burst)
        self._batch_yields = len(queued) > 0 or any(prefilling(r) for r in inter)
        budget = base.token_budget
        if inter:
            budget = self.step_budget(running, base, cap, context)
        if self._ttft_first:
            budget = max(budget, self.first_token_budget(running, inter, base, context))
        self._limits = StepLimits(cap, budget, base.pass_tokens)
        self._queued_due = earliest_due(queued, self.admission.dues)
        return self._limits

    def step_budget(
        self, running: Collection[Choice], base: StepLimits, cap: int, context: float
    ) -> int:
        """The tokens of a step that every running stream gets its token in, and one
        arrival its first chunk if it fits, within the inter-token target."""
        n_seqs = max(len(running), min(len(running) + 1, cap))
        start = max((r.num_computed_tokens for r in running if prefilling(r)), default=0)
        return self.cost.max_tokens(n_seqs, self._itl_target, base.token_budget, context, start)

    def first_tokens_owed(self, inter: Sequence[Choice], queued: bool, burst: bool) -> bool:
        """First tokens first: an interactive request waits for its first token (queued, or
        its prompt in progress) and the machine is not over capacity (a calm ``burst``
        member waits, or the interactive work admitted lately is below what the engine
        serves and nothing was refused in the last ``burst_quiet_s``)."""
        if not queued and not any(r.first_token is None for r in inter):
            return False
        if burst:
            return True
        if self._now - self.burst.refused_at < self.burst.rule.quiet_s:
            return False
        return self.load.load(self._now, self.mean.model.theta) < 1.0

    def first_token_budget(
        self,
        running: Collection[Choice],
        inter: Sequence[Choice],
        base: StepLimits,
        context: float,
    ) -> int:
        """The tokens of a step while first tokens are owed: the running sequences' tokens
        and the interactive prompts still to compute (running and queued), up to what a
        step of ``first_token_step_s`` holds at the mean step price, or the engine's pass
        (``pass_tokens``). Batch prefill does not pad such a step: it is what the waiting
        prompts need. The mean, not the margin: the margin is a high quantile of the model's
        error, a bound for the inter-token target's steps; sized by it, the first-token
        steps came out at under half their length, every one carrying the decode pass that
        rides along, and the last prompt of a burst waited for the extra passes.

        Why: on a CPU a prompt of 1,000 tokens takes seconds, so a prefill paced for the
        running streams' inter-token target (chunks between decode steps) leaves the later
        prompts of a burst crawling once the first decode. In the stream layout every step
        that carries a chunk beside decodes costs one pass more, and a decode-only step
        moves no prompt forward: the prompts waiting are best served by long steps that
        carry them, the decodes riding along (each stream still a token a step, a gap no
        longer than ``first_token_step_s``), earliest due first (``prefill_order``). Where a
        waiting prompt is longer than such a step holds, it is cut into chunks anyway: then
        a step lasts up to ``first_token_long_step_s``, so that each chunk fills the engine's
        pass and the decodes' pass is paid once per pass, not once per ~280 tokens."""
        n_seqs = max(len(running), 1)
        need = sum(r.num_tokens - r.num_computed_tokens for r in inter if prefilling(r))
        need += sum(r.num_tokens for r in self.queue.classes[_INTERACTIVE])
        need += sum(1 for r in running if not prefilling(r))
        start = max((r.num_computed_tokens for r in inter if prefilling(r)), default=0)
        longest = max(
            [r.num_tokens - r.num_computed_tokens for r in inter if prefilling(r)]
            + [r.num_tokens for r in self.queue.classes[_INTERACTIVE]],
            default=0,
        )
        cfg = self.config
        most = 0
        for step_s in (cfg.first_token_step_s, cfg.first_token_long_step_s):
            most = self.cost.max_tokens(
                n_seqs, step_s, base.most_tokens, context, start, at_mean=True
            )
            if longest <= most:
                break  # every waiting prompt fits a short step: keep the streams' gaps short
        return min(need, most)

    def room(self, n_seqs: int, n_tokens: int) -> int | None:
        if self._ttft_first or not any(r.slo_class is _INTERACTIVE for r in self._running):
            return None
        if n_seqs == 0:
            return None  # an empty step always takes a slice: else nothing would ever run
        return self.cost.room(n_seqs, n_tokens, self._itl_target)

    def defers(self, r: Choice) -> bool:
        """Batch yields to interactive prefills; a running interactive prefill yields to a
        queued interactive request due before it, which starts first (4)."""
        if r.slo_class is _BATCH:
            return self._batch_yields
        return yields_to_queued(r, self._queued_due, self.admission.dues)

    def full_budget_prefill(self) -> bool:
        return bool(self.burst.members)  # a calm burst's, as admission priced it

    # ---- 4, 10: who of the running gets tokens first, who sits out ----

    def order_running(self, running: list[Choice]) -> list[Choice]:
        dues = self.admission.dues
        ordered = sorted(running, key=lambda r: run_order(r, dues))
        held = self._held_back(ordered)
        return [r for r in ordered if r not in held] if held else ordered

    def _held_back(self, running: Sequence[Choice]) -> set[Choice]:
        """Decoding streams of tenants ahead of their weighted share in their class
        (``shares``): they sit out this step, each in turn."""
        held: set[Choice] = set()
        for cls in (_BATCH, _INTERACTIVE):
            mine = [r for r in running if r.slo_class is cls]
            held |= sit_out(mine, self.counters[cls].counter, self.shares)
        return held

    # ---- 1, 3, 9: who starts, who makes room ----

    def may_start(self, r: Choice, running: Collection[Choice]) -> StartDecision:
        if r.slo_class is _BATCH:
            if len(self.queue.classes[_INTERACTIVE]) > 0:
                return StartDecision.SKIP  # interactive overtakes batch, aged or not
            if len(running) >= self._batch_slots(self._cap):
                return StartDecision.STOP
        if not self.fits(r, running):
            return StartDecision.STOP  # no overtaking: the head waits for memory
        return StartDecision.START

    def make_room(self, running: Collection[Choice], limits: StepLimits) -> list[Choice]:
        """Preempt batch for queued interactive requests that lack a slot or memory."""
        batch_waits = len(self.queue.classes[_BATCH]) + len(self.queue.promoted) > 0
        waiting = list(self.queue.classes[_INTERACTIVE])
        return batch_victims(
            waiting, running, limits.max_running, batch_waits, self.fits, self._victim_key
        )

    def _victim_key(self, r: Choice) -> tuple[float, int, int]:
        return (self.counters[r.slo_class].rank(r.tenant), r.order, r.index)

    def set_pool(self, num_blocks: int, block_size: int) -> None:
        self.gate.set_pool(num_blocks, block_size)

    def set_predictor(self, predictor: LengthPredictor) -> None:
        self.predictor = predictor

    def _projected(self, r: Choice) -> int:
        return self.predictor.remaining(r, self.admission_quantile)

    def fits(self, r: Choice, running: Collection[Choice]) -> bool:
        return self.gate.admits(r, [o for o in running if o is not r])

    # ---- 5-8: admission ----

    def on_submit(
        self, choices: Sequence[Choice], running: Collection[Choice], base: StepLimits
    ) -> AdmissionVerdict:
        x = choices[0]
        context = mean_context(running)
        cap = self._itl_cap = self.running_cap(base, context=context)
        if x.slo_class is _BATCH:
            caps = StepLimits(self._batch_slots(cap), base.token_budget)
            verdict = self.admission.decide(choices, running, caps, base)
            if verdict.reason is None:
                self._admitted(choices)
            return verdict
        return self.admit_interactive(choices, running, base, cap, context)

    def admit_interactive(
        self,
        choices: Sequence[Choice],
        running: Collection[Choice],
        base: StepLimits,
        cap: int,
        context: float,
    ) -> AdmissionVerdict:
        """Projected behind the running interactive work only (batch yields or is
        preempted), on the slots the step and the KV pool allow; queued late where the
        machine is below capacity or the request is in a calm burst."""
        x = choices[0]
        queued = self.queue.classes[_INTERACTIVE]
        ahead = [r for r in running if r.slo_class is _INTERACTIVE]
        self.burst.note(x.arrival, len(queued), ahead, self._itl_cap)
        burst = self.burst.is_burst(x.arrival)
        work = self._work(choices, base)
        below = self.load.load(x.arrival, self.mean.model.theta, work) < 1.0
        grace = self.burst.rule.grace_s if burst or below else 0.0
        slots = self.running_cap(base, True, context) if burst else cap
        held = self.gate.slots([*ahead, *queued, x])
        if held is not None:
            slots = min(slots, held)
        caps = StepLimits(slots, base.token_budget)
        # A prompt too long for the target even alone (its target its own prefill, doubled)
        # is projected with the prefills in full-budget steps: its first token is seconds
        # away, and over seconds the machine does not stay over capacity (the load reading
        # falls below 1 as the work is served, and first tokens are owed again). Priced in
        # steps sized to the inter-token target beside the streams (a token a step where
        # their decodes fill it), its estimate ran 2-3x its first token.
        long = (self.admission.ttft_target(x, base) or 0.0) > self.config.interactive_ttft_s
        verdict = self.admission.decide(choices, ahead, caps, base, grace, full=burst or long)
        if verdict.reason is not None:
            self.burst.refused(x.arrival)
            return verdict
        self.load.add(x.arrival, work)
        self._admitted(choices)
        if burst:
            for r in choices:
                self.burst.join(r)
        return verdict

    def _admitted(self, choices: Sequence[Choice]) -> None:
        self.admitted(choices)
        for r in choices:
            r.ttft_estimate = self.admission.last_estimate

    def _work(self, choices: Sequence[Choice], base: StepLimits) -> Work:
        """The work ``choices`` add to the interactive load (``load``), each priced alone:
        its prompt in full passes, and its expected tokens at what a stream adds to a
        decode step (the step's own cost is shared)."""
        x = choices[0]
        left = self.admission.est.outputs_left(x)
        work = request_work(x.num_tokens, x.num_computed_tokens, left, base.most_tokens)
        return work.times(len(choices))

    # ---- bookkeeping ----

    def begin_cycle(self, running: Collection[Choice], now: float) -> None:
        super().begin_cycle(running, now)
        queued = len(self.queue.classes[_INTERACTIVE])
        self.burst.note(now, queued, running, self._itl_cap)

    def on_finished(self, r: Choice) -> None:
        super().on_finished(r)
        if r.first_token is not None and r.ttft_estimate is not None and r.index == 0:
            actual = r.first_token - r.arrival
            self.estimates.append((r.ttft_estimate, actual))
            log.debug(
                "%s: first token estimated at %.3f s, came at %.3f s",
                r.request_id,
                r.ttft_estimate,
                actual,
            )
