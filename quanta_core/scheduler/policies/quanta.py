"""The ``quanta`` policy, the server's default: SLO classes, weighted VTC, honest admission and
memory-aware batching, governed by measured step costs instead of a fixed running cap.

It is the ``slo`` policy (``fair.py``: a VTC pool per class, interactive first, promises,
admission that answers at once) with these rules changed or added:

- The running set: as many sequences as the step-cost model (learnt online from every step)
  prices within the interactive inter-token target, at ``grow_headroom`` of it; the
  configured ``max_running`` is only an upper bound. Batch alone runs at the same size (a CPU
  is compute bound: more streams buy almost no throughput, and an interactive arrival then
  finds the step already short). Batch leaves ``interactive_reserve`` slots free.
- Class isolation: an interactive request that cannot start for want of a slot or of memory
  takes them from running batch requests, which are preempted (stashed: cheap, 22.5 KiB per
  token) and resume later. The last running batch request is never taken while batch waits:
  batch always progresses. Aged batch goes ahead of other batch, never ahead of interactive.
- A prompt's first-token target grows with its own prefill: the interactive target, or
  twice its prefill alone where that is longer (it waits no longer than it computes).
  Interactive prefills go earliest due first, a running one included (``_run_order``,
  ``defers``), and admission projects a new request among them in that order
  (``promises.edf_first``): a short prompt goes ahead of a long prefill in progress where
  that makes neither late, instead of being refused behind all of it.
- Refusal on the target holds only over capacity: while the interactive work admitted over
  the last ``load_window_s`` (each arrival priced alone, ``load``) is under what the engine
  serves in that time, a request late in the projection is queued as a calm burst is
  (``burst_grace``). Traffic of mixed lengths comes in clumps that project late and drain
  a minute later; refusing them turned away most of a stream at 3/4 of capacity.
- Admission projects an interactive request behind the interactive work only (batch can be
  overtaken or preempted), so it is refused only when interactive work alone keeps it past
  its target; it is projected on no more slots than the KV pool holds requests of its and
  their sizes at once (``memory_slots``: a KV-bound burst is served in rounds); the
  estimate is kept on the request (``ttft_estimate``) and reported. A
  refusal books the retry it asks for (``bookings``): later arrivals are projected behind
  it, so that a retry at retry-after finds the room it was told of; the retry-after leaves
  ``retry_margin`` of the estimate for the projection to be wrong.
- A burst that reaches a calm machine (no interactive request waiting for a first token,
  fewer interactive streams than the inter-token-sized set) is queued, not refused: up to
  ``burst_grace`` targets late, by default bounded only by the queue (once it is served
  nobody waits behind it, so a refusal buys nothing). While any of it waits for a first
  token the running set may grow to what the cost model's mean prices within
  ``burst_itl_s`` (still smooth: a token per such gap), so that the twentieth person is not
  left behind a cap. A machine that refused interactive work in the last ``burst_quiet_s``
  is not calm: under sustained load the target is the bound, the set keeps its inter-token
  size and prefill chunks fit the inter-token target.
- First tokens first (``_first_token_budget``): while an interactive request waits for its
  first token and the machine is not over capacity (a calm burst, or the admitted
  interactive load below 1 and no refusal lately), a step carries the waiting prompts' tokens
  up to ``first_token_step_s`` (past the token budget, up to the engine's pass), the
  running streams' tokens riding along, earliest due first. A prompt of 1,000 tokens is
  seconds of prefill on a CPU: paced for the running streams' inter-token average (small
  chunks between decode-only steps) the later prompts of a burst crawled once the first
  decoded, the last first token far behind a plain server's. Each step that carries a
  chunk beside decodes is a pass more in the stream layout, so fewer, longer steps move the
  prompts at nearly the engine's prefill rate;
  the streams' gaps stay within ``first_token_step_s`` (smooth), not the inter-token
  target, until the last waiting prompt has its first token. Batch prefill does not pad
  such a step. Over capacity the inter-token target bounds every step.
- Memory: a request starts only if the running set and it, each growing a token a step to
  its predicted end (the ``admission_quantile`` of its remaining length from the scheduler's
  length predictor), fit the KV pool at every future completion: ``horizon``'s MC-SF gate
  (``memory.MemoryGate``). A burst queues instead of thrashing; an interactive request that
  does not fit takes the memory of running batch (``make_room``).
- Weighted fairness per step (``shares``): a tenant whose counter leads the lowest counter
  among its class's tenants running by more than ``fair_lag`` (weighted tokens) gets no
  token in that step, so that tenants sharing the running set still share service by weight
  (VTC at admission alone cannot: once everyone runs, everyone gets a token per step,
  whatever the weights). Batch always; an interactive stream only where its next token,
  one step later, still comes within the inter-token target (that target comes first).
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
from quanta_core.scheduler.policies.bookings import Bookings
from quanta_core.scheduler.policies.fair import SloPolicy
from quanta_core.scheduler.policies.load import OfferedLoad
from quanta_core.scheduler.policies.memory import MemoryGate
from quanta_core.scheduler.policies.shares import held_back
from quanta_core.scheduler.policies.slo_admission import SloAdmission
from quanta_core.scheduler.policies.slo_estimates import mean_context
from quanta_core.scheduler.slo import SloConfig

log = logging.getLogger("quanta.admission")

_INTERACTIVE = SloClass.INTERACTIVE
_BATCH = SloClass.BATCH


def _prefilling(r: Choice) -> bool:
    return r.num_tokens - r.num_computed_tokens > 1


class QuantaPolicy(SloPolicy):
    name = PolicyName.QUANTA

    def __init__(self, config: SloConfig | None = None, admission_quantile: float = 0.9) -> None:
        super().__init__(config)
        cfg = self.config
        # one bound for the set's size and the steps' tokens: the inter-token target
        self._itl_target = cfg.interactive_itl_s * cfg.grow_headroom
        # Projections over many steps are priced at the model's mean (``MeanCosts``).
        self._mean = self.cost.at_mean()
        self.admission = SloAdmission(cfg, self._mean, self.queue, self.counters, prefill_edf=True)
        self.admission.promoted_ahead = False
        self.admission.bookings = Bookings()
        self.admission.long_prompt_slack = 2.0
        self.admission.retry_margin = cfg.retry_margin
        self.admission.est.itl_target_s = self._itl_target
        self.admission.est.alone_full_budget = True  # alone, a prompt takes whole steps
        self.admission_quantile = admission_quantile
        self.predictor = LengthPredictor()
        self.gate = MemoryGate(self._projected)
        self._ttft_first = False
        self._calm_at = -math.inf  # when the machine was last calm (``_note_calm``)
        self._refused_at = -math.inf  # when an interactive request was last refused
        self._itl_cap = 1  # the running set the inter-token target allows, last computed
        self._burst: set[Choice] = set()  # admitted in a calm burst, before the first token
        self._queued_due = math.inf  # the earliest first-token due among queued interactive
        self._context = 0.0  # the running sequences' mean length, this cycle
        self.load = OfferedLoad(cfg.load_window_s, cfg.load_min_s)
        self._limits_base = StepLimits(1, 1)
        # (estimated, actual) seconds to the first token of the last finished requests
        self.estimates: deque[tuple[float, float]] = deque(maxlen=1000)

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> Policy:
        return cls(config.slo, config.horizon.admission_quantile)

    # ---- the running set and the step ----

    def running_cap(self, base: StepLimits, burst: bool = False, context: float = 0.0) -> int:
        """The most sequences (at ``context`` cells each) whose decode step the cost model
        prices within the inter-token target; for a burst on a calm machine, within
        ``burst_itl_s``."""
        if burst:  # a typical step within the smooth gap: the mean, not the margin
            target = self.config.burst_itl_s * self.config.grow_headroom
            return self._mean.max_seqs(target, base.max_running, context)
        return self.cost.max_seqs(self._itl_target, base.max_running, context)

    def limits(self, running: Collection[Choice], base: StepLimits) -> StepLimits:
        self._running = running
        self._burst = {r for r in self._burst if r.first_token is None and not r.is_finished}
        context = self._context = mean_context(running)
        self._itl_cap = self.running_cap(base, context=context)
        cap = self.running_cap(base, True, context) if self._burst else self._itl_cap
        self._cap = cap
        inter = [r for r in running if r.slo_class is _INTERACTIVE]
        queued = len(self.queue.classes[_INTERACTIVE]) > 0
        self._ttft_first = self._first_tokens_owed(inter, queued)
        self._batch_yields = queued or any(_prefilling(r) for r in inter)
        budget = base.token_budget
        if inter:
            # every running stream gets its token, and one arrival its first chunk if it fits
            n_seqs = max(len(running), min(len(running) + 1, cap))
            start = max((r.num_computed_tokens for r in running if _prefilling(r)), default=0)
            budget = self.cost.max_tokens(
                n_seqs, self._itl_target, base.token_budget, context, start
            )
        if self._ttft_first:
            budget = max(budget, self._first_token_budget(running, inter, base, context))
        self._limits = StepLimits(cap, budget, base.pass_tokens)
        dues = self.admission.dues
        self._queued_due = min(
            (dues.get(r, math.inf) for r in self.queue.classes[_INTERACTIVE]), default=math.inf
        )
        return self._limits

    def _first_tokens_owed(self, inter: Sequence[Choice], queued: bool) -> bool:
        """First tokens first: an interactive request waits for its first token (queued, or
        its prompt in progress) and the machine is not over capacity (a calm burst, or the
        interactive work admitted lately below what the engine serves, and no refusal in
        the last ``burst_quiet_s``)."""
        if not queued and not any(r.first_token is None for r in inter):
            return False
        if self._burst:
            return True
        if self._now - self._refused_at < self.config.burst_quiet_s:
            return False
        return self.load.load(self._now) < 1.0

    def _first_token_budget(
        self,
        running: Collection[Choice],
        inter: Sequence[Choice],
        base: StepLimits,
        context: float,
    ) -> int:
        """The tokens of a step while first tokens are owed: the running sequences' tokens
        and the interactive prompts still to compute (running and queued), up to what a
        step of ``first_token_step_s`` holds, or the engine's pass (``pass_tokens``). Batch
        prefill does not pad such a step: it is what the waiting prompts need.

        Why: on a CPU a prompt of 1,000 tokens takes seconds, so a prefill paced for the
        running streams' inter-token target (chunks between decode steps) leaves the later
        prompts of a burst crawling once the first decode. In the stream layout every step
        that carries a chunk beside decodes costs one pass more, and a decode-only step
        moves no prompt forward: the prompts waiting are best served by long steps that
        carry them, the decodes riding along (each stream still a token a step, a gap no
        longer than ``first_token_step_s``), earliest due first (``_run_order``)."""
        n_seqs = max(len(running), 1)
        need = sum(r.num_tokens - r.num_computed_tokens for r in inter if _prefilling(r))
        need += sum(r.num_tokens for r in self.queue.classes[_INTERACTIVE])
        need += sum(1 for r in running if not _prefilling(r))
        start = max((r.num_computed_tokens for r in inter if _prefilling(r)), default=0)
        most = self.cost.max_tokens(
            n_seqs, self.config.first_token_step_s, base.most_tokens, context, start
        )
        return min(need, most)

    def room(self, n_seqs: int, n_tokens: int) -> int | None:
        if self._ttft_first or not any(r.slo_class is _INTERACTIVE for r in self._running):
            return None
        if n_seqs == 0:
            return None  # an empty step always takes a slice: else nothing would ever run
        return self.cost.room(n_seqs, n_tokens, self._itl_target)

    def order_running(self, running: list[Choice]) -> list[Choice]:
        ordered = sorted(running, key=self._run_order)
        held = self._held_back(ordered)
        return [r for r in ordered if r not in held] if held else ordered

    def _run_order(self, r: Choice) -> tuple[bool, bool, float]:
        """Decoding streams first (no prefill chunk takes their token), then interactive
        prefills earliest due first, then batch: the step's prefill budget goes to the
        prompt whose first token is due soonest, as admission projected it
        (``promises.edf_first``): a short prompt is not queued behind a long one."""
        prefilling = _prefilling(r)
        batch = r.slo_class is _BATCH
        due = self.admission.dues.get(r, -math.inf) if prefilling and not batch else 0.0
        return (prefilling, batch, due)

    def defers(self, r: Choice) -> bool:
        """Batch yields to interactive prefills (``SloPolicy``); a running interactive
        prefill yields to a queued interactive request due before it, which starts first."""
        if super().defers(r):
            return True
        if r.slo_class is not _INTERACTIVE or not _prefilling(r):
            return False
        return self._queued_due < self.admission.dues.get(r, -math.inf)

    def _held_back(self, running: Sequence[Choice]) -> set[Choice]:
        """Running requests of tenants too far ahead of the lowest counter among their
        class's tenants running now (``shares``): batch always, interactive streams only
        where they still meet the inter-token target, and only between prefills: a step
        that may carry a prefill chunk may last the whole target, and a stream that sat
        out the one before it would miss it."""
        held: set[Choice] = set()
        step_s = self.cost.decode_step_s(max(len(running), 1), mean_context(running))
        decode_only = len(self.queue) == 0 and not any(_prefilling(r) for r in running)
        for cls, itl in ((_BATCH, None), (_INTERACTIVE, self._itl_target)):
            if cls is _INTERACTIVE and not decode_only:
                break
            mine = [r for r in running if r.slo_class is cls]
            counter = self.counters[cls].counter
            ranks = {r.tenant: counter.get(r.tenant, 0.0) for r in mine}
            held |= held_back(mine, ranks, self.config.fair_lag, self._now, step_s, itl)
        return held

    # ---- who starts, who makes room ----

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
        waiting = list(self.queue.classes[_INTERACTIVE])
        if not waiting:
            return []
        batch = sorted(
            (r for r in running if r.slo_class is _BATCH), key=self._victim_key, reverse=True
        )
        if len(self.queue.classes[_BATCH]) + len(self.queue.promoted) > 0:
            batch = batch[:-1]  # batch waits: its last running request stays
        staying = list(running)
        victims: list[Choice] = []
        for x in sorted(waiting, key=lambda r: (r.order, r.index)):
            if not batch:
                break  # no victim left: whether the rest start is ``may_start``'s to say
            need_slot = len(staying) + 1 > limits.max_running
            while batch and (need_slot or not self.fits(x, staying)):
                v = batch.pop(0)
                victims.append(v)
                staying.remove(v)
                need_slot = False
            if need_slot or not self.fits(x, staying):
                break
            staying.append(x)
        return victims

    def _victim_key(self, r: Choice) -> tuple[float, int, int]:
        return (self.counters[r.slo_class].rank(r.tenant), r.order, r.index)

    # ---- memory (horizon's MC-SF gate, on the scheduler's length predictor) ----

    def set_pool(self, num_blocks: int, block_size: int) -> None:
        self.gate.set_pool(num_blocks, block_size)

    def set_predictor(self, predictor: LengthPredictor) -> None:
        self.predictor = predictor

    def _projected(self, r: Choice) -> int:
        return self.predictor.remaining(r, self.admission_quantile)

    def fits(self, r: Choice, running: Collection[Choice]) -> bool:
        return self.gate.admits(r, [o for o in running if o is not r])

    def memory_slots(self, x: Choice, ahead: Collection[Choice]) -> int | None:
        """How many requests like ``x`` and those ``ahead`` of it (running and queued) the
        KV pool holds at once: the pool over their mean projected size (held cells and the
        predicted remaining, in whole blocks), at least 1; None before ``set_pool``. What the
        gate will let run at once, for admission's projection: a KV-bound burst is served
        that many at a time, not as many as the step time allows."""
        gate = self.gate
        if gate.capacity_blocks <= 0:
            return None
        bs, projected = gate.block_size, self._projected
        sizes = [-(-(len(r.tokens) + projected(r)) // bs) for r in (*ahead, x)]
        return max(1, int(gate.capacity_blocks * len(sizes) // sum(sizes)))

    # ---- admission ----

    def on_submit(
        self, choices: Sequence[Choice], running: Collection[Choice], base: StepLimits
    ) -> AdmissionVerdict:
        x = choices[0]
        cls = x.slo_class
        work = 0.0
        context = mean_context(running)
        cap = self._itl_cap = self.running_cap(base, context=context)
        self._limits_base = base
        caps = StepLimits(cap, base.token_budget)
        burst = False
        if cls is _BATCH:
            caps = StepLimits(self._batch_slots(cap), base.token_budget)
            ahead: Collection[Choice] = running
        else:
            ahead = [r for r in running if r.slo_class is _INTERACTIVE]  # batch yields
            self._note_calm(x.arrival, ahead)
            burst = x.arrival - self._calm_at < self.config.burst_window_s
            work = self._work_s(choices)
            below = self.load.load(x.arrival, work) < 1.0
            grace = self.config.burst_grace * self.config.interactive_ttft_s
            self.admission.ttft_grace_s = grace if burst or below else 0.0
            self.admission.est.full_budget_prefill = burst
            if burst:
                caps = StepLimits(self.running_cap(base, True, context), base.token_budget)
            held = self.memory_slots(x, [*ahead, *self.queue.classes[_INTERACTIVE]])
            if held is not None and held < caps.max_running:
                caps = StepLimits(held, caps.token_budget)
        verdict = self.admission.decide(choices, ahead, caps, base)
        if verdict.reason is not None and cls is _INTERACTIVE:
            self._refused_at = x.arrival
        if verdict.reason is None:
            if cls is _INTERACTIVE:
                self.load.add(x.arrival, work)
            for r in choices:
                self.counters[cls].join(r)
                r.ttft_estimate = self.admission.last_estimate
                if cls is _INTERACTIVE and burst:
                    self._burst.add(r)
        return verdict

    def _work_s(self, choices: Sequence[Choice]) -> float:
        """The engine-seconds ``choices`` add to the interactive load (``load``), each
        priced alone: its prefill, and its expected tokens at what a stream adds to a
        decode step (the step's own cost is shared)."""
        x = choices[0]
        _, per_seq, _, per_pair = self._mean.model.theta
        left = self.admission.est.outputs_left(x)
        work = self.admission.est.alone_prefill_s(x, self._limits_base.token_budget)
        work += left * (per_seq + per_pair * (x.num_tokens + left / 2) / 1000)
        return work * len(choices)

    def begin_cycle(self, running: Collection[Choice], now: float) -> None:
        super().begin_cycle(running, now)
        self._note_calm(now, running)

    def _note_calm(self, now: float, running: Collection[Choice]) -> None:
        """Remember when the machine was last calm: no interactive request waiting for its
        first token, and interactive streams short of the inter-token-sized set (batch
        does not count: it yields or is preempted), and no interactive refusal lately."""
        if len(self.queue.classes[_INTERACTIVE]) > 0:
            return
        if now - self._refused_at < self.config.burst_quiet_s:
            return
        inter = [r for r in running if r.slo_class is _INTERACTIVE]
        if any(r.first_token is None for r in inter) or len(inter) >= self._itl_cap:
            return
        self._calm_at = now

    def on_finished(self, r: Choice) -> None:
        super().on_finished(r)
        self.admission.finished(r)
        if r.first_token is not None and r.ttft_estimate is not None and r.index == 0:
            actual = r.first_token - r.arrival
            self.estimates.append((r.ttft_estimate, actual))
            log.debug(
                "%s: first token estimated at %.3f s, came at %.3f s",
                r.request_id,
                r.ttft_estimate,
                actual,
            )
