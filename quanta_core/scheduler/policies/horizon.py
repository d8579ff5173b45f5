"""``horizon``: VTC between tenants; within a tenant, predicted lengths decide.

- Admission is memory-aware (``memory.MemoryGate``, the MC-SF rule): the head starts only if
  the running set and it, growing a token a step to their predicted ends (the
  ``admission_quantile`` of each one's remaining length, ``quanta_core.predictor``), fit the
  KV pool at every future completion. Otherwise admission stops for this cycle: the request
  waits (it is not refused), and the pool is never over-committed for what is foreseen. What
  was not foreseen (a request outliving its projection) meets the scheduler's preemption as
  under any policy: the cheapest victim, stashed or recomputed by cost.
- Order within a tenant: shortest predicted work first (uncomputed tokens plus the median
  remaining output), with aging. The queue key is

      arrival + aging_s_per_token * work          (work <= prompt_len + max_tokens)

  so a request ``r`` is never overtaken by a request of its tenant that arrived more than
  ``aging_s_per_token * (prompt_len_r + max_tokens_r)`` seconds after it: its wait is at most
  what FCFS would give it behind everything that arrives within that window (a key is at
  least its arrival, and ``r``'s is at most the window's end). With the default 0.02 s per
  token a request of 100 + 300 tokens may be overtaken by arrivals of the next 8 s only.
- Steps stay short while streams decode: decodes get their tokens first, and a prefill (a
  new request's, or a running one's next chunk) only what keeps the step within
  ``step_target_s`` by the step-cost model learnt online (``step_cost``): an admission
  lengthens the running streams' step to about the target, not to a whole prompt's prefill.
  (If decodes alone exceed the target, nothing is admitted beside them until one ends.)
- Between tenants: the fair queue of ``vtc`` (the lowest virtual counter's head first) and its
  victim rule, unchanged; only the order inside each tenant's queue differs.
- The scheduler's length predictor learns every finished choice's length (any policy); here it
  is read.
"""

from __future__ import annotations

from collections.abc import Collection

from quanta_core.engine.types import StepPlan, StepResult
from quanta_core.predictor import LengthPredictor
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.config import HorizonConfig, PolicyName, SchedulerConfig, StepLimits
from quanta_core.scheduler.policies.base import Policy, StartDecision
from quanta_core.scheduler.policies.fair import VtcPolicy
from quanta_core.scheduler.policies.memory import MemoryGate, peak_blocks_of
from quanta_core.scheduler.policies.vtc import FairQueue
from quanta_core.scheduler.queue import SortKey
from quanta_core.scheduler.slo import SloConfig
from quanta_core.scheduler.step_cost import StepCostModel, attended_k


def _prefilling(r: Choice) -> bool:
    return r.num_tokens - r.num_computed_tokens > 1


class HorizonPolicy(VtcPolicy):
    name = PolicyName.HORIZON

    def __init__(self, config: HorizonConfig | None = None, slo: SloConfig | None = None) -> None:
        super().__init__(slo)
        self.config = config or HorizonConfig()
        self.predictor = LengthPredictor()
        self.queue = FairQueue(self.counters, self.sort_key)
        self.waiting = self.queue
        self.gate = MemoryGate(self._projected)
        self.cost = StepCostModel(slo or SloConfig())
        self._decoding = False  # a running stream decodes this cycle

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> Policy:
        return cls(config.horizon, config.slo)

    def set_pool(self, num_blocks: int, block_size: int) -> None:
        self.gate.set_pool(num_blocks, block_size)

    def set_predictor(self, predictor: LengthPredictor) -> None:
        self.predictor = predictor

    def _projected(self, r: Choice) -> int:
        return self.predictor.remaining(r, self.config.admission_quantile)

    def work(self, r: Choice) -> int:
        """Predicted tokens still to run: the uncomputed ones and the median remaining output."""
        return r.num_tokens - r.num_computed_tokens + self.predictor.remaining(r, 0.5)

    def sort_key(self, r: Choice) -> SortKey:
        return (r.arrival + self.config.aging_s_per_token * self.work(r), r.order, r.index)

    def may_start(self, r: Choice, running: Collection[Choice]) -> StartDecision:
        return StartDecision.START if self.gate.admits(r, running) else StartDecision.STOP

    # ---- short steps while streams decode ----

    def limits(self, running: Collection[Choice], base: StepLimits) -> StepLimits:
        n_decoding = sum(1 for r in running if not _prefilling(r))
        self._decoding = n_decoding > 0
        if not self._decoding:
            return base
        target = self.config.step_target_s
        budget = self.cost.max_tokens(n_decoding + 1, target, base.token_budget)
        return StepLimits(base.max_running, max(budget, len(running)))

    def order_running(self, running: list[Choice]) -> list[Choice]:
        """Decoding streams first: no prefill chunk takes their token."""
        return sorted(running, key=_prefilling)

    def room(self, n_seqs: int, n_tokens: int) -> int | None:
        if not self._decoding:
            return None
        return self.cost.room(n_seqs, n_tokens, self.config.step_target_s)

    # ---- steps in bulk (the simulator) ----

    def steady_steps(self, running: Collection[Choice], steps: int) -> int:
        """While every running stream decodes, each gets its token whatever the step-cost
        model learns (the budget is never below the running set); a prompt's chunk is sized
        by it, so a prefill runs step by step. Waiting requests' keys stay put (they have
        generated nothing); VTC's rule: one tenant waiting at most. And the gate's answer for
        the queue's head after each step: the first cycle at which it would admit it ends
        the run (the running set nearer its projected ends, the same predictor looked
        ahead)."""
        if any(_prefilling(r) for r in running):
            return 0
        steps = super().steady_steps(running, steps)
        head = self.queue.peek()
        if head is None:
            return steps
        predictor, q = self.predictor, self.config.admission_quantile
        gate = self.gate
        candidate = (len(head.tokens), predictor.remaining(head, q))
        for j in range(1, steps):
            demands = [(len(o.tokens) + j, predictor.remaining(o, q, j)) for o in running]
            demands.append(candidate)
            if peak_blocks_of(demands, gate.block_size) <= gate.capacity_blocks:
                return j
        return steps

    def on_step(self, plan: StepPlan, result: StepResult) -> None:
        seconds = result.timings.total_s or result.timings.engine_s
        n_tokens = sum(len(s.tokens) for s in plan.slices)
        pairs = sum(attended_k(s.start_pos, len(s.tokens)) for s in plan.slices)
        self.cost.observe(len(plan.slices), n_tokens, seconds, pairs)
