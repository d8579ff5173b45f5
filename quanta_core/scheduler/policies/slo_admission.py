"""The ``slo`` policy's admission: answer at once, from the step-cost model.

A new request passes three checks, in this order:

1. Its class queue's bound (requests, prompt tokens). Full: rejected; 429 if its tenant holds
   more than its weighted share of that queue, else 503.
2. Its class target given the work ahead of it.
   - Interactive: its first token within ``interactive_ttft_s``, without breaking a promise
     made to an interactive request admitted before it (``promises``). It is projected last
     in due order after the queued requests (promoted batch first), on the running slots; on
     time there, it is admitted with a promise (its first token due at arrival + target).
     A tenant over its share must also leave room for the others: one request like it per
     tenant below it is projected ahead of it. This is what keeps the deadline override fair:
     a tenant gains from it only for requests admission let in, and it lets a tenant over its
     share in only into capacity the others are not claiming.
   - Batch: its completion within ``batch_deadline_s``, playing the running and queued
     requests ahead of it (promoted batch, interactive, its tenant's queue and, VTC taking
     turns, as many plus one of each other tenant's) onto the running slots, and never
     sooner than the batch work among them and its own take at the rate a standing batch
     backlog has been served (``drain``: interactive overtaking batch slows it below the
     projection).
   Missed: rejected; 429 if its tenant is over its fair share, else 503 (the machine as a
   whole cannot meet the target). A batch request that misses its target even on an idle
   machine is served best effort (no queue is in its way, no retry would help); so is an
   interactive one, unless the policy's rules set ``long_prompt_slack``: then a prompt too long
   for the target even alone is promised that many times its own prefill instead.
3. The shared bound of all queues. Full: a batch arrival is rejected (503); an interactive one
   sheds queued batch requests, newest first, that never ran, were never preempted and were
   not promoted by aging, until it fits (else 503).

Over its fair share: the tenant's claim (its weighted counter, plus the uncharged work of its
queued and running requests) exceeds the mean claim of the other tenants with live requests
in the class by more than this request's own worth. Under plain overload, with equal loads,
nobody is: the answer is 503.

Retry-after is when the same request would be admitted if nothing else arrived: for an
interactive one, when its projected first token (after everything admitted, and the others'
room if over share) falls within its target; for batch, the estimate's excess over the target;
for a full queue, the time the running slots take to serve the excess requests.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from quanta_core.requests import RejectionKind, SloClass
from quanta_core.scheduler.admission import AdmissionDecision, AdmissionVerdict
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.config import StepLimits
from quanta_core.scheduler.policies.bookings import Bookings
from quanta_core.scheduler.policies.class_queue import ClassQueue
from quanta_core.scheduler.policies.drain import BacklogDrain
from quanta_core.scheduler.policies.promises import (
    Job,
    Slots,
    edf_first,
    late,
    next_up,
    project,
)
from quanta_core.scheduler.policies.slo_estimates import SloEstimates, prefill_left
from quanta_core.scheduler.policies.vtc import VirtualCounters
from quanta_core.scheduler.queue import arrival_order
from quanta_core.scheduler.slo import QueueBound, SloConfig
from quanta_core.scheduler.step_cost import StepCosts

_MIN_WEIGHT = 1e-6


def _tokens(requests: Iterable[Choice]) -> int:
    return sum(r.prompt_len for r in requests)


@dataclass(frozen=True, slots=True)
class AdmissionRules:
    """How a policy's admission projects and answers; the ``slo`` policy's by default
    (``QuantaPolicy`` passes its own)."""

    # Interactive prefills are served earliest due first, a running one included
    # (``promises.edf_first``): a new request is projected among them in due order. Else
    # the running ones hold the lane and the new one goes after every promise.
    prefill_edf: bool = False
    # Promoted (aged) batch goes ahead of a new interactive request in the projection;
    # False where the policy lets interactive overtake aged batch.
    promoted_ahead: bool = True
    # A refused interactive request's retry keeps its place (``bookings``).
    book_retries: bool = False
    # A prompt too long for the first-token target even alone is promised this many times
    # its own prefill (2: it may wait as long as it computes); None: best effort.
    long_prompt_slack: float | None = None
    # A refusal's retry-after is when the projected first token, this fraction later, is
    # within the target (0: the projection's own moment).
    retry_margin: float = 0.0
    # The step an interactive prefill chunk is sized to (None: ``interactive_itl_s *
    # itl_headroom``), and whether a prompt alone runs in full-budget steps instead.
    itl_target_s: float | None = None
    alone_full_budget: bool = False


class SloAdmission:
    def __init__(
        self,
        config: SloConfig,
        cost: StepCosts,
        queue: ClassQueue,
        counters: Mapping[SloClass, VirtualCounters],
        rules: AdmissionRules | None = None,
    ) -> None:
        self.config = config
        self.rules = rules = rules or AdmissionRules()
        # Every admitted interactive request's first token's due time, until it ends (the
        # policy orders prefills by it).
        self.dues: dict[Choice, float] = {}
        self._due: float | None = None  # the request being decided's, once on time
        self.cost = cost
        self.queue = queue
        self.counters = counters
        self.est = SloEstimates(config, cost, rules.itl_target_s, rules.alone_full_budget)
        self.promises: dict[Choice, float] = {}  # queued interactive -> first token due
        # The last accepted request's projected seconds to its first token (None: no
        # projection), for checking the estimate against what happens.
        self.last_estimate: float | None = None
        self.first_token_s = 0.0  # ``estimate``'s wait and prefill, of its last call
        self.bookings: Bookings | None = Bookings() if rules.book_retries else None
        self.drain = BacklogDrain()  # batch's measured service rate (the policy feeds it)

    # ---- the decision ----

    def decide(
        self,
        choices: Sequence[Choice],
        running: Collection[Choice],
        caps: StepLimits,
        base: StepLimits,
        grace_s: float = 0.0,
        full: bool = False,
    ) -> AdmissionVerdict:
        """``caps``: the steps it will run in; ``base``: the configured limits. An
        interactive request only: ``grace_s`` past its first-token target it may still be
        admitted (0: the target is the bound); ``full``: interactive prefills are priced in
        full-budget steps (``SloEstimates.interactive_prefill_s``)."""
        self.last_estimate = None
        self._due = None
        x = choices[0]
        cls = x.slo_class
        n = len(choices)
        queue = self.queue.classes[cls]
        bound = self.config.queue_bound(cls)
        excess = self._excess(list(queue), n, x.prompt_len * n, bound)
        if excess > 0:
            kind = (
                RejectionKind.TENANT_OVER_SHARE
                if self._over_queue_share(x, bound)
                else RejectionKind.OVERLOADED
            )
            return AdmissionVerdict.reject(
                f"the {cls.value} queue is full ({len(queue)} requests waiting)",
                kind,
                self.drain_s(excess, caps),
            )
        if cls is SloClass.INTERACTIVE:
            missed = self._interactive_target(x, running, caps, base, grace_s, full)
        else:
            missed = self._batch_target(x, running, caps)
        if isinstance(missed, AdmissionVerdict):
            return missed
        verdict = self._accept(choices, running, caps, promise=missed)
        if cls is SloClass.INTERACTIVE and verdict.reason is None and self._due is not None:
            for r in choices:
                self.dues[r] = self._due
        return verdict

    def _interactive_target(
        self,
        x: Choice,
        running: Collection[Choice],
        caps: StepLimits,
        base: StepLimits,
        grace_s: float,
        full: bool,
    ) -> AdmissionVerdict | float | None:
        """A rejection, or the promise to make (its due time; None: best effort)."""
        now = x.arrival
        target = self.ttft_target(x, base)
        if target is None:
            return None
        over = self.over_share(x, running)
        queued = self._projected_queue()
        edf = self.rules.prefill_edf
        budget = base.token_budget
        slots, decode_s, streams = self.est.view(
            now, running, queued, caps.max_running, budget, lane=not edf, full=full
        )

        def job(r: Choice, due: float | None) -> Job:
            return self.est.job(r, due, decode_s, streams, budget, full)

        # Every promise is due before x's would be (same target, earlier arrival): x goes
        # after them all, so admitting it can delay none of them. Their due times order
        # them (``_projected_queue``) but play no part below: only the booked retries' and
        # x's own are checked.
        unpromised = self._unpromised()
        promised = [r for r in queued if r not in unpromised]
        dues = self.dues if edf else {}  # due order: by their targets
        ordered = self.est.jobs(promised, dues, decode_s, streams, budget, full)
        own = self.bookings.claim(x) if self.bookings is not None else None
        booked: list[Job] = []
        if self.bookings is not None:
            # One job per size: under a flood the bookings number hundreds, of a few sizes,
            # and pricing each on the cost model made every decision cost milliseconds.
            sized: dict[tuple[int, int], Job] = {}
            for b in self.bookings.ahead_of(own, now):
                if b.at + self.bookings.keep_s < now:
                    continue  # its retry did not come when told: no room is kept for it
                size = (b.prompt_len, b.max_tokens)
                if size not in sized:
                    sized[size] = self.est.job_of(*size, decode_s, streams, budget, full)
                booked.append(replace(sized[size], due=b.at + target))
        if over:
            # the others' room goes ahead of it (in due order: due with it, before it)
            room = job(x, now + target if edf else None)
            ordered += [room] * len(self._tenants_below(x, running))
        mine = job(x, now + target + grace_s)
        first: float | None
        if edf:
            first, est = self._edf_first(
                x, running, slots, ordered, booked, mine, target, streams, budget, full
            )
        else:
            # Behind every booked retry as if each were back now; else in due order with
            # them, at their times, if that makes none of them late (room they will not
            # need yet).
            est = project(now, slots, [*ordered, *booked, mine])[-1] - now
            if est + now <= mine.due:
                first = est
            else:
                at_times = [replace(b, ready=b.due - target) for b in booked]  # due: time + target
                first = _before_retries(now, slots, ordered, at_times, mine)
        if first is not None:
            self.last_estimate = first
            self._due = now + target
            return mine.due
        kind = RejectionKind.TENANT_OVER_SHARE if over else RejectionKind.OVERLOADED
        why = " (its tenant is over its fair share)" if over else ""
        retry = max(est * (1 + self.rules.retry_margin) - target, self.cost.decode_step_s(1))
        if self.bookings is not None:
            self.bookings.book(x, now + retry)
        return AdmissionVerdict.reject(
            f"expected first token in {est:.1f} s, over its first-token target of "
            f"{target:.3g} s{why}",
            kind,
            retry,
        )

    def _edf_first(
        self,
        x: Choice,
        running: Collection[Choice],
        slots: Slots,
        ordered: list[Job],
        booked: list[Job],
        mine: Job,
        target: float,
        streams: int,
        budget: int,
        full: bool,
    ) -> tuple[float | None, float]:
        """``x``'s seconds to its first token where prefills go earliest due first, running
        ones too (None: late, or it would make another late), and the projection's own
        figure for a retry-after. Booked retries are projected as if back now, else at
        their times; a grace (``mine.due`` past the target: a calm burst, or a machine
        below capacity) lets it in where the due order puts it, late or making late."""
        now = x.arrival
        ahead = self.est.running_prefills(running, self.dues, streams, budget, full)
        ahead += ordered
        own = replace(mine, due=now + target)
        # the retry-after's projection: behind every booked retry (refused before it)
        merged = sorted([*ahead, own], key=lambda j: j.due)
        k = next(i for i, j in enumerate(merged) if j is own)
        est = project(now, slots, [*merged[:k], *booked, own, *merged[k + 1 :]])[k + len(booked)]
        at = edf_first(now, slots, [*ahead, *booked], own)
        if at is None and booked:
            at_times = [replace(b, ready=b.due - target) for b in booked]
            at = edf_first(now, slots, [*ahead, *at_times], own)
        if at is None and est <= mine.due:  # a grace: queued where the due order puts it
            at = est
        return (None if at is None else at - now), est - now

    def _batch_target(
        self, x: Choice, running: Collection[Choice], caps: StepLimits
    ) -> AdmissionVerdict | None:
        target = self.config.batch_deadline_s
        ahead = self._ahead(x)
        est = self.estimate(x, running, ahead, caps)
        # Never sooner than batch's standing backlog has really been served: the batch work
        # running and ahead of it, and its own.
        work = [r for r in (*running, *ahead) if r.slo_class is SloClass.BATCH]
        tokens = sum(prefill_left(r) + 1 + self.est.outputs_left(r) for r in [*work, x])
        drained = self.drain.seconds_for(tokens, x.arrival)
        if drained is not None:
            est = max(est, drained)
        if est <= target or self.estimate(x, (), [], caps) > target:
            self.last_estimate = self.first_token_s
            return None
        kind = (
            RejectionKind.TENANT_OVER_SHARE
            if self.over_share(x, running)
            else RejectionKind.OVERLOADED
        )
        return AdmissionVerdict.reject(
            f"expected completion in {est:.1f} s, over the batch target of {target:g} s",
            kind,
            max(est - target, self.cost.decode_step_s(1)),
        )

    def _accept(
        self,
        choices: Sequence[Choice],
        running: Collection[Choice],
        caps: StepLimits,
        promise: float | None,
    ) -> AdmissionVerdict:
        x = choices[0]
        cls = x.slo_class
        n = len(choices)
        shed: tuple[Choice, ...] = ()
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
        ahead = self.queue.promoted.peek() is not None or len(self.queue.classes[cls]) > 0
        if cls is SloClass.BATCH:
            ahead = ahead or len(self.queue) > 0
        start = not ahead and len(running) + n <= caps.max_running
        if promise is not None:
            self.promises[x] = promise
            self.dues[x] = promise
        decision = AdmissionDecision.START if start else AdmissionDecision.QUEUE
        shed_retry = self.drain_s(len(shed), caps) if shed else None
        return AdmissionVerdict(decision, shed=shed, shed_retry_after_s=shed_retry)

    def ttft_target(self, x: Choice, base: StepLimits) -> float | None:
        """Seconds to ``x``'s first token it is promised: the interactive target, or, with
        ``long_prompt_slack``, that many times its own prefill where that is longer (the
        target grows with the prompt, without a step where the prompt outgrows it: a prompt
        whose prefill alone nearly fills the target would else be refused behind any
        queue); without it, a prompt too long for the target even alone gets none (None:
        best effort)."""
        target = self.config.interactive_ttft_s
        alone = self.est.alone_prefill_s(x, base.token_budget)
        slack = self.rules.long_prompt_slack
        if slack is not None:
            return max(target, slack * alone)
        return target if alone <= target else None

    def target(self, cls: SloClass) -> float:
        if cls is SloClass.INTERACTIVE:
            return self.config.interactive_ttft_s
        return self.config.batch_deadline_s

    def observe_output(self, n_tokens: int) -> None:
        self.est.observe_output(n_tokens)

    # ---- keeping the promises ----

    def next_interactive(
        self,
        vtc_head: Choice,
        now: float,
        running: Collection[Choice],
        caps: StepLimits,
        full: bool = False,
    ) -> Choice:
        """The queued interactive request to start next: VTC's head unless starting it first
        would make a promised request late in the projection (``promises.next_up``);
        ``full`` as ``decide``'s."""
        queued = list(self.queue.classes[SloClass.INTERACTIVE])
        if _earliest_due(queued, self.promises) in (None, vtc_head):
            return vtc_head  # ``next_up``'s own first answer, without pricing the queue
        slots, decode_s, streams = self.est.view(
            now, running, queued, caps.max_running, caps.token_budget, full=full
        )
        jobs = self.est.jobs(queued, self.promises, decode_s, streams, caps.token_budget, full)
        return queued[next_up(now, slots, jobs, queued.index(vtc_head))]

    def forget(self, r: Choice) -> None:
        """``r`` started (or ended): its promise is kept or moot."""
        self.promises.pop(r, None)

    def finished(self, r: Choice) -> None:
        """``r`` ended: its due time orders nothing any more."""
        self.promises.pop(r, None)
        self.dues.pop(r, None)

    # ---- fair shares ----

    def _claims(self, cls: SloClass, running: Collection[Choice]) -> dict[str, float]:
        """Each live tenant's weighted service received, reserved and still owed."""
        counters = self.counters[cls]
        claims = {t: counters.rank(t) for t in counters.backlogged()}
        queued = list(self.queue.classes[cls])
        if cls is SloClass.BATCH:
            queued += [r for r in self.queue.promoted]
        worth: dict[tuple[float, int, int], float] = {}  # one per size: a burst has few
        for r in queued:
            size = (r.weight, prefill_left(r), self.est.outputs_left(r))
            w = worth.get(size)
            if w is None:
                w = worth[size] = self._worth(r)
            claims[r.tenant] = claims.get(r.tenant, counters.rank(r.tenant)) + w
        for r in running:
            if r.slo_class is cls:
                left = counters.output_cost * self.est.outputs_left(r)
                claims[r.tenant] = claims.get(r.tenant, counters.rank(r.tenant)) + left / max(
                    r.weight, _MIN_WEIGHT
                )
        return claims

    def _worth(self, r: Choice) -> float:
        """A queued request's weighted work: its uncomputed prompt and expected outputs."""
        c = self.counters[r.slo_class]
        work = c.input_cost * (prefill_left(r) + 1) + c.output_cost * self.est.outputs_left(r)
        return work / max(r.weight, _MIN_WEIGHT)

    def over_share(self, x: Choice, running: Collection[Choice]) -> bool:
        """Is ``x``'s tenant's claim above the other live tenants' mean by more than ``x``?"""
        if self._alone(x, running):
            return False  # no other tenant's claim to weigh it against
        claims = self._claims(x.slo_class, running)
        others = [c for t, c in claims.items() if t != x.tenant]
        if not others:
            return False  # alone, its fair share is the whole machine
        own = claims.get(x.tenant, max(self.counters[x.slo_class].rank(x.tenant), min(others)))
        return own - sum(others) / len(others) > self._worth(x)

    def _alone(self, x: Choice, running: Collection[Choice]) -> bool:
        """Is ``x``'s tenant the only one live in its class (``_claims``'s keys, without
        pricing them: a one-tenant burst asks at every arrival)?"""
        cls, tenant = x.slo_class, x.tenant
        if any(t != tenant for t in self.counters[cls].backlogged()):
            return False
        if any(t != tenant for t in self.queue.classes[cls].tenants()):
            return False
        if cls is SloClass.BATCH and any(r.tenant != tenant for r in self.queue.promoted):
            return False
        return all(r.tenant == tenant for r in running if r.slo_class is cls)

    def _tenants_below(self, x: Choice, running: Collection[Choice]) -> list[str]:
        claims = self._claims(x.slo_class, running)
        own = claims.get(x.tenant, self.counters[x.slo_class].rank(x.tenant))
        return [t for t, c in claims.items() if t != x.tenant and c < own]

    # ---- the projection ----

    def _projected_queue(self) -> list[Choice]:
        """What goes ahead of a new interactive request: promoted batch (oldest first),
        then the queued interactive requests by due time."""
        promoted: list[Choice] = []
        if self.rules.promoted_ahead:
            promoted = sorted(self.queue.promoted, key=arrival_order)
        interactive = sorted(
            self.queue.classes[SloClass.INTERACTIVE],
            key=lambda r: (self.promises.get(r, float("inf")), arrival_order(r)),
        )
        return [*promoted, *interactive]

    def _unpromised(self) -> set[Choice]:
        """Queued interactive requests with no promise (best effort, or back from a
        preemption): VTC places them, only where they delay no promise."""
        queue = self.queue.classes[SloClass.INTERACTIVE]
        return {r for r in queue if r not in self.promises}

    def estimate(
        self,
        x: Choice,
        running: Collection[Choice],
        ahead: Sequence[Choice],
        caps: StepLimits,
    ) -> float:
        """Seconds from now to a batch request's end, with ``running`` on the engine and
        ``ahead`` to be admitted before it."""
        cap = caps.max_running
        busy = max(min(cap, len(running) + len(ahead) + 1), 1)  # streams in a busy step
        decode_step_s = self.cost.decode_step_s(busy)

        def prefill_s(n_tokens: int) -> float:
            return self.cost.prefill_s(n_tokens, busy - 1, caps.token_budget)

        def service_s(r: Choice) -> float:
            return prefill_s(prefill_left(r) + 1) + self.est.outputs_left(r) * decode_step_s

        finish = sorted(service_s(r) for r in running)[-cap:] if cap else []
        slots = [0.0] * max(cap - len(finish), 0) + finish
        heapq.heapify(slots)
        for r in ahead:
            heapq.heappush(slots, heapq.heappop(slots) + service_s(r))
        wait = slots[0]
        self.first_token_s = wait + prefill_s(x.prompt_len)
        return self.first_token_s + min(x.max_tokens, self._expected()) * decode_step_s

    def _ahead(self, x: Choice) -> list[Choice]:
        """The queued requests admitted before batch ``x``: promoted batch, interactive, and
        of batch its tenant's queue plus, VTC taking turns, as many of each other tenant's
        plus one."""
        ahead = list(self.queue.promoted)
        ahead += self.queue.classes[SloClass.INTERACTIVE]
        fair = self.queue.classes[x.slo_class]
        own = fair.waiting_of(x.tenant)
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
        return self.est.expected()

    # ---- bounds and shedding ----

    @staticmethod
    def _excess(waiting: list[Choice], n: int, tokens: int, bound: QueueBound) -> int:
        """How many requests too many the queue would hold with this one (0: it fits)."""
        over_requests = len(waiting) + n - bound.max_requests
        over_tokens = _tokens(waiting) + tokens - bound.max_tokens
        if over_tokens > 0:
            mean = max(_tokens(waiting) // max(len(waiting), 1), 1)
            over_requests = max(over_requests, -(-over_tokens // mean))
        return max(over_requests, 0)

    def _over_queue_share(self, x: Choice, bound: QueueBound) -> bool:
        """Does ``x``'s tenant hold more than its weighted share of its class queue?"""
        queue = self.queue.classes[x.slo_class]
        waiting = queue.tenants()
        weights = {r.tenant: r.weight for r in queue}
        weights[x.tenant] = x.weight
        total = sum(max(w, 1e-6) for w in weights.values())
        share = bound.max_requests * max(x.weight, 1e-6) / total
        return waiting.get(x.tenant, 0) >= share

    def _shed(self, n: int, tokens: int) -> tuple[Choice, ...] | None:
        """Queued batch requests (choice 0 of each) whose rejection makes room, or None."""
        bound = self.config.total_queue
        waiting = list(self.queue)
        candidates = sorted(
            (r for r in self.queue.classes[SloClass.BATCH] if _sheddable(r)),
            key=arrival_order,
            reverse=True,
        )
        shed: list[Choice] = []
        gone: set[Choice] = set()
        for r in candidates:
            if self._excess([w for w in waiting if w not in gone], n, tokens, bound) == 0:
                break
            shed.append(r)
            gone.update(c for c in waiting if c.request_id == r.request_id)
        if self._excess([w for w in waiting if w not in gone], n, tokens, bound) > 0:
            return None
        return tuple(shed)


def _before_retries(
    now: float, slots: Slots, ahead: list[Job], booked: list[Job], mine: Job
) -> float | None:
    """``mine``'s seconds to its first token projected among the booked retries in due
    order, each no sooner than its time; None if it is late there or makes one of them late
    that was not."""
    if not booked:
        return None
    booked = sorted(booked, key=lambda j: j.due)
    merged = sorted([*booked, mine], key=lambda j: j.due)
    k = merged.index(mine)
    before = late(booked, project(now, slots, [*ahead, *booked])[len(ahead) :])
    firsts = project(now, slots, [*ahead, *merged])[len(ahead) :]
    if firsts[k] > mine.due:
        return None
    after = late(merged[:k] + merged[k + 1 :], firsts[:k] + firsts[k + 1 :])
    return firsts[k] - now if len(after) <= len(before) else None


def _earliest_due(queued: Sequence[Choice], promises: Mapping[Choice, float]) -> Choice | None:
    """The first of ``queued`` with the earliest promise, as ``promises.due_order`` ranks
    them; None if none has one."""
    best: Choice | None = None
    best_due = float("inf")
    for r in queued:
        due = promises.get(r)
        if due is not None and due < best_due:
            best, best_due = r, due
    return best


def _sheddable(r: Choice) -> bool:
    """Never ran, never preempted: shedding it throws away no work."""
    return r.index == 0 and r.first_scheduled is None and r.preemptions == 0
