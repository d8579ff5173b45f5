"""The ``slo`` policy's admission: answer at once, from the step-cost model.

A new request passes three checks, in this order:

1. Its class queue's bound (requests, prompt tokens). Full: rejected; 429 if its tenant holds
   more than its weighted share of that queue, else 503.
2. Its class target given the work ahead of it: interactive must see its first token within
   ``interactive_ttft_s``, batch must finish within ``batch_deadline_s``. The estimate plays
   the running and queued requests ahead of it onto the running slots (each holds its slot
   for its prefill chunks, then one step per expected output token), then adds its own
   prefill (and, for batch, its outputs). Ahead of it: promoted batch, interactive (for
   batch), its tenant's queue, and of each other tenant of its class as many plus one (VTC
   takes turns). Missed: rejected; 429 if it would be met without its own tenant's queued
   requests (the tenant's backlog is what is in the way), else 503.
3. The shared bound of all queues. Full: a batch arrival is rejected (503); an interactive one
   sheds queued batch requests, newest first, that never ran, were never preempted and were
   not promoted by aging, until it fits (else 503).

Retry-after is the estimate's excess over the target (the queue ahead drains one second per
second), or, for a full queue, the time the running slots take to serve the excess requests.
Output lengths are unknown: a request is expected to produce ``min(max_tokens, E)`` tokens,
E the running mean of finished answers (``expected_output_tokens`` before the first).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Sequence

from quanta_core.requests import RejectionKind, SloClass
from quanta_core.scheduler.admission import AdmissionDecision, AdmissionVerdict
from quanta_core.scheduler.class_queue import ClassQueue
from quanta_core.scheduler.config import StepLimits
from quanta_core.scheduler.queue import arrival_order
from quanta_core.scheduler.request import Request
from quanta_core.scheduler.slo import QueueBound, SloConfig
from quanta_core.scheduler.step_cost import StepCostModel


def _tokens(requests: Iterable[Request]) -> int:
    return sum(r.prompt_len for r in requests)


class SloAdmission:
    def __init__(
        self,
        config: SloConfig,
        cost: StepCostModel,
        queue: ClassQueue,
    ) -> None:
        self.config = config
        self.cost = cost
        self.queue = queue
        self.expected_output = float(config.expected_output_tokens)

    # ---- the decision ----

    def decide(
        self,
        choices: Sequence[Request],
        running: Collection[Request],
        caps: StepLimits,
        alone: StepLimits,
    ) -> AdmissionVerdict:
        """``caps``: the steps it will run in; ``alone``: those of an idle machine."""
        x = choices[0]
        cls = x.slo_class
        n = len(choices)
        queue = self.queue.classes[cls]
        bound = self.config.queue_bound(cls)
        excess = self._excess(list(queue), n, x.prompt_len * n, bound)
        if excess > 0:
            kind = (
                RejectionKind.TENANT_OVER_SHARE
                if self._over_share(x, bound)
                else RejectionKind.OVERLOADED
            )
            return AdmissionVerdict.reject(
                f"the {cls.value} queue is full ({len(queue)} requests waiting)",
                kind,
                self.drain_s(excess, caps),
            )
        target = self.target(cls)
        est = self.estimate(x, running, self._ahead(x, without_own=False), caps)
        # A request that misses its target even on an idle machine is served best effort:
        # no queue is in its way, and no retry would help.
        if est > target and self.estimate(x, (), [], alone) <= target:
            without_own = self.estimate(x, running, self._ahead(x, without_own=True), caps)
            kind = (
                RejectionKind.TENANT_OVER_SHARE
                if without_own <= target
                else RejectionKind.OVERLOADED
            )
            what = "first token" if cls is SloClass.INTERACTIVE else "completion"
            return AdmissionVerdict.reject(
                f"expected {what} in {est:.1f} s, over the {cls.value} target of {target:g} s",
                kind,
                max(est - target, self.cost.decode_step_s(1)),
            )
        shed: tuple[Request, ...] = ()
        total_excess = self._excess(list(self.queue), n, x.prompt_len * n, self.config.total_queue)
        if total_excess > 0:
            found = self._shed(n, x.prompt_len * n) if cls is SloClass.INTERACTIVE else None
            if found is None:
                return AdmissionVerdict.reject(
                    f"the server's queue is full ({len(self.queue)} requests waiting)",
                    RejectionKind.OVERLOADED,
                    self.drain_s(total_excess, caps),
                )
            shed = found
        ahead = self.queue.promoted.peek() is not None or len(queue) > 0
        if cls is SloClass.BATCH:
            ahead = ahead or len(self.queue) > 0
        start = not ahead and len(running) + n <= caps.max_running
        decision = AdmissionDecision.START if start else AdmissionDecision.QUEUE
        shed_retry = self.drain_s(len(shed), caps) if shed else None
        return AdmissionVerdict(decision, shed=shed, shed_retry_after_s=shed_retry)

    def target(self, cls: SloClass) -> float:
        if cls is SloClass.INTERACTIVE:
            return self.config.interactive_ttft_s
        return self.config.batch_deadline_s

    def observe_output(self, n_tokens: int) -> None:
        """A request finished with ``n_tokens`` output tokens (STOP or LENGTH)."""
        self.expected_output += 0.1 * (n_tokens - self.expected_output)

    # ---- the estimate ----

    def estimate(
        self,
        x: Request,
        running: Collection[Request],
        ahead: Sequence[Request],
        caps: StepLimits,
    ) -> float:
        """Seconds from now to ``x``'s first token (interactive) or its end (batch), with
        ``running`` on the engine and ``ahead`` to be admitted before it."""
        interactive = x.slo_class is SloClass.INTERACTIVE
        cap = caps.max_running
        busy = max(min(cap, len(running) + len(ahead) + 1), 1)  # streams in a busy step
        decode_step_s = self.cost.decode_step_s(busy)

        def prefill_s(n_tokens: int) -> float:
            return self.cost.prefill_s(n_tokens, busy - 1, caps.token_budget)

        def service_s(r: Request) -> float:
            todo = max(r.prompt_len - r.num_computed_tokens, 0)
            outputs = max(min(r.max_tokens, self._expected()) - r.num_output, 1)
            return prefill_s(todo) + outputs * decode_step_s

        finish = sorted(service_s(r) for r in running)[-cap:] if cap else []
        slots = [0.0] * max(cap - len(finish), 0) + finish
        heapq.heapify(slots)
        for r in ahead:
            heapq.heappush(slots, heapq.heappop(slots) + service_s(r))
        wait = slots[0]
        own_prefill = prefill_s(x.prompt_len)
        if interactive:
            return wait + own_prefill
        return wait + own_prefill + min(x.max_tokens, self._expected()) * decode_step_s

    def _ahead(self, x: Request, without_own: bool) -> list[Request]:
        """The queued requests admitted before ``x``: promoted batch, a higher class, and in
        its own class its tenant's queue plus, VTC taking turns, as many of each other
        tenant's plus one. ``without_own``: as if its tenant had nothing queued."""
        ahead = list(self.queue.promoted)
        if x.slo_class is SloClass.BATCH:
            ahead += self.queue.classes[SloClass.INTERACTIVE]
        fair = self.queue.classes[x.slo_class]
        own = [] if without_own else fair.waiting_of(x.tenant)
        ahead += own
        for tenant in fair.tenants():
            if tenant != x.tenant:
                ahead += sorted(fair.waiting_of(tenant), key=arrival_order)[: len(own) + 1]
        return sorted(ahead, key=arrival_order)

    def drain_s(self, n_requests: int, caps: StepLimits) -> float:
        """How long the running slots take to serve ``n_requests`` typical requests."""
        per_request = self._expected() * self.cost.decode_step_s(caps.max_running)
        return max(n_requests * per_request / caps.max_running, self.cost.decode_step_s(1))

    def _expected(self) -> int:
        return max(round(self.expected_output), 1)

    # ---- bounds and shedding ----

    @staticmethod
    def _excess(waiting: list[Request], n: int, tokens: int, bound: QueueBound) -> int:
        """How many requests too many the queue would hold with this one (0: it fits)."""
        over_requests = len(waiting) + n - bound.max_requests
        over_tokens = _tokens(waiting) + tokens - bound.max_tokens
        if over_tokens > 0:
            mean = max(_tokens(waiting) // max(len(waiting), 1), 1)
            over_requests = max(over_requests, -(-over_tokens // mean))
        return max(over_requests, 0)

    def _over_share(self, x: Request, bound: QueueBound) -> bool:
        """Does ``x``'s tenant hold more than its weighted share of its class queue?"""
        queue = self.queue.classes[x.slo_class]
        waiting = queue.tenants()
        weights = {r.tenant: r.weight for r in queue}
        weights[x.tenant] = x.weight
        total = sum(max(w, 1e-6) for w in weights.values())
        share = bound.max_requests * max(x.weight, 1e-6) / total
        return waiting.get(x.tenant, 0) >= share

    def _shed(self, n: int, tokens: int) -> tuple[Request, ...] | None:
        """Queued batch requests (choice 0 of each) whose rejection makes room, or None."""
        bound = self.config.total_queue
        waiting = list(self.queue)
        candidates = sorted(
            (r for r in self.queue.classes[SloClass.BATCH] if _sheddable(r)),
            key=arrival_order,
            reverse=True,
        )
        shed: list[Request] = []
        gone: set[Request] = set()
        for r in candidates:
            if self._excess([w for w in waiting if w not in gone], n, tokens, bound) == 0:
                break
            shed.append(r)
            gone.update(c for c in waiting if c.request_id == r.request_id)
        if self._excess([w for w in waiting if w not in gone], n, tokens, bound) > 0:
            return None
        return tuple(shed)


def _sheddable(r: Request) -> bool:
    """Never ran, never preempted: shedding it throws away no work."""
    return r.index == 0 and r.first_scheduled is None and r.preemptions == 0
