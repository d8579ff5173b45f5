"""Admission answers at once: START, QUEUE, or REJECT with a kind and a retry-after.

Estimates come from the step-cost model's prior (the fake executor reports no timings). The
"honest retry-after" test paces a virtual clock by that same model, as if the engine ran at
exactly the predicted speed.
"""

from __future__ import annotations

import contextlib

import pytest

from quanta_core.clock import VirtualClock
from quanta_core.engine.fake import FakeExecutor
from quanta_core.requests import (
    ChoiceResult,
    FinishReason,
    GenerationRequest,
    RejectionKind,
    SloClass,
)
from quanta_core.scheduler import (
    AdmissionDecision,
    AdmissionVerdict,
    Driver,
    QueueBound,
    Refused,
    Scheduler,
    SchedulerConfig,
    SloConfig,
)
from quanta_core.scheduler.policies.fair import SloPolicy
from tests.scheduler_harness import Harness, prompt

INTER, BATCH = SloClass.INTERACTIVE, SloClass.BATCH
START, QUEUE, REJECT = AdmissionDecision.START, AdmissionDecision.QUEUE, AdmissionDecision.REJECT


def submit(
    h: Harness, rid: str, n: int = 40, max_tokens: int = 20, **kw: object
) -> AdmissionVerdict:
    base = 100 + (sum(map(ord, rid)) % 500)
    req = GenerationRequest(rid, prompt(n, base=base), max_tokens, **kw)  # type: ignore[arg-type]
    verdict = h.sched.submit(req)
    h.events.extend(h.sched.drain_events())
    return verdict


def slo_harness(**slo: object) -> Harness:
    return Harness.make(policy="slo", max_running=1, slo=SloConfig(**slo))  # type: ignore[arg-type]


def test_start_when_a_slot_is_free_else_queue() -> None:
    h = Harness.make(policy="slo", max_running=2)
    assert submit(h, "a").decision is START
    h.cycle()
    assert submit(h, "b").decision is START
    assert submit(h, "c").decision is QUEUE  # both slots taken (a running, b about to)
    assert (
        Harness.make(policy="fcfs").sched.submit(GenerationRequest("x", prompt(4), 1)).decision
        is START
    )


def test_429_only_for_a_tenant_over_its_fair_share_else_503() -> None:
    h = Harness.make(policy="slo", max_running=2, slo=SloConfig(interactive_ttft_s=1.5))
    assert submit(h, "t0", tenant="t0").decision is START
    verdicts = [submit(h, f"hog{k}", tenant="hog") for k in range(4)]
    assert [v.decision for v in verdicts] == [QUEUE, QUEUE, QUEUE, REJECT]
    hog = verdicts[-1]
    # hog holds four requests' work to t0's one: over its share, told 429
    assert hog.rejection is RejectionKind.TENANT_OVER_SHARE
    assert hog.reason is not None and "over its fair share" in hog.reason
    # newcomers find the machine full, which is not their doing: 503, and sooner, since
    # hog's retry also leaves room for one request of each tenant below it
    late = submit(h, "t1", tenant="t1")
    assert (late.decision, late.rejection) == (REJECT, RejectionKind.OVERLOADED)
    assert hog.retry_after_s is not None and late.retry_after_s is not None
    assert hog.retry_after_s > late.retry_after_s
    # the rejected requests finished REJECTED at once, with the same kind and retry-after
    res = h.results()["hog3", 0]
    assert res.finish_reason is FinishReason.REJECTED
    assert (res.rejection, res.retry_after_s) == (hog.rejection, hog.retry_after_s)
    assert res.timings.finished == res.timings.arrival == 0.0


def test_one_tenant_alone_overloading_the_machine_is_told_503() -> None:
    h = slo_harness(interactive_ttft_s=1.0)
    verdicts = [submit(h, f"hog{k}", tenant="hog") for k in range(3)]
    assert [v.decision for v in verdicts] == [START, QUEUE, REJECT]
    assert verdicts[-1].rejection is RejectionKind.OVERLOADED  # its share is the machine


class Paced:
    """The slo scheduler on a virtual clock paced by its own cost model (an engine exactly
    as fast as predicted)."""

    def __init__(self, max_running: int = 1, **slo: object) -> None:
        self.ex, self.clock = FakeExecutor(), VirtualClock()
        config = SchedulerConfig(
            policy="slo",
            max_running=max_running,
            slo=SloConfig(**slo),  # type: ignore[arg-type]
        )
        self.sched = Scheduler(config, self.ex.info, self.clock)
        assert isinstance(self.sched.policy, SloPolicy)
        self.policy = self.sched.policy
        self.results: dict[str, ChoiceResult] = {}

    def cycle(self) -> None:
        plan = self.sched.schedule()
        n = sum(len(s.tokens) for s in plan.slices)
        self.clock.advance(self.policy.cost.estimate(len(plan.slices), n) if n else 0.01)
        self._collect(self.sched.update(plan, self.ex.step(plan)))

    def _collect(self, events: object) -> None:
        for e in events:  # type: ignore[attr-defined]
            if hasattr(e, "result"):
                self.results[e.result.request_id] = e.result

    def ask(self, rid: str, tenant: str, n: int = 8, max_tokens: int = 4) -> AdmissionVerdict:
        req = GenerationRequest(rid, prompt(n, base=100 + len(rid)), max_tokens, tenant=tenant)
        verdict = self.sched.submit(req)
        self._collect(self.sched.drain_events())
        return verdict

    def run(self) -> None:
        while self.sched.has_work:
            self.cycle()

    def ttft(self, rid: str) -> float:
        t = self.results[rid].timings
        assert t.first_token is not None
        return t.first_token - t.arrival


def promised_then_lower_counter_arrival(override: bool) -> tuple[Paced, str]:
    """c runs; a's request is admitted behind it (promised: first token by 0.35 s), and a's
    counter is far above the others'. Then b arrives, as early as admission lets it in."""
    p = Paced(interactive_ttft_s=0.35)
    if not override:
        p.policy.queue.choose = None  # plain VTC order, for comparison
    assert p.ask("c0", "c", max_tokens=10).decision is START
    assert p.ask("a1", "a").decision is QUEUE
    p.policy.counters[INTER].counter["a"] += 1000.0  # a has been served far more
    for k in range(100):
        if p.ask(f"b{k}", "b").decision is not REJECT:
            return p, f"b{k}"
        p.cycle()
    raise AssertionError("b was never admitted")


def test_an_admitted_request_is_not_overtaken_past_its_due_by_a_lower_counter_arrival() -> None:
    p, b = promised_then_lower_counter_arrival(override=True)
    p.run()
    # b's tenant has the lower counter, so VTC alone would start b first; the promise to
    # a1 goes first because b first would make a1 late; both meet the target
    assert p.ttft("a1") <= 0.35 + 1e-9
    assert p.ttft(b) <= 0.35 + 1e-9
    assert p.results["a1"].timings.first_token < p.results[b].timings.first_token  # type: ignore[operator]
    # without the override, VTC's order breaks the promise
    q, b = promised_then_lower_counter_arrival(override=False)
    q.run()
    assert q.ttft("a1") > 0.35
    assert q.results[b].timings.first_token < q.results["a1"].timings.first_token  # type: ignore[operator]


def test_an_arrival_that_would_break_a_promise_is_refused_503_with_an_honest_retry() -> None:
    p = Paced(interactive_ttft_s=0.35)
    assert p.ask("c0", "c", max_tokens=10).decision is START
    assert p.ask("a1", "a").decision is QUEUE
    p.policy.counters[INTER].counter["a"] += 1000.0
    # b's tenant is below a's: VTC would serve it first, which would make a1 late; and
    # after a1 it would be late itself. The machine cannot take it in time: 503.
    now = p.ask("b0", "b")
    assert (now.decision, now.rejection) == (REJECT, RejectionKind.OVERLOADED)
    assert now.retry_after_s is not None
    t0, retry = p.clock.now(), now.retry_after_s
    while p.clock.now() < t0 + retry / 2:
        p.cycle()
    halfway = p.ask("b1", "b")  # not yet; and it names the same moment, within a step
    assert halfway.decision is REJECT and halfway.retry_after_s is not None
    assert abs(p.clock.now() + halfway.retry_after_s - (t0 + retry)) < 0.02
    while p.clock.now() < t0 + retry:
        p.cycle()
    assert p.ask("b2", "b").decision is QUEUE  # at it: admitted
    p.run()
    assert p.ttft("a1") <= 0.35 + 1e-9 and p.ttft("b2") <= 0.35 + 1e-9


def test_a_full_class_queue_rejects_429_for_its_biggest_user_503_for_others() -> None:
    h = slo_harness(interactive_queue=QueueBound(2, 10_000))
    assert [submit(h, f"a{k}", n=4, max_tokens=2, tenant="a").decision for k in range(2)] == [
        START,
        QUEUE,
    ]
    full = submit(h, "a2", n=4, max_tokens=2, tenant="a")
    assert (full.decision, full.rejection) == (REJECT, RejectionKind.TENANT_OVER_SHARE)
    assert full.reason == "the interactive queue is full (2 requests waiting)"
    assert full.retry_after_s is not None and full.retry_after_s > 0
    other = submit(h, "b0", n=4, max_tokens=2, tenant="b")
    assert (other.decision, other.rejection) == (REJECT, RejectionKind.OVERLOADED)


def test_a_full_token_bound_rejects_too() -> None:
    h = slo_harness(interactive_queue=QueueBound(100, 50))
    assert submit(h, "a0", n=30, max_tokens=2).decision is START
    assert submit(h, "a1", n=30, max_tokens=2).decision is REJECT


def test_batch_is_shed_newest_first_to_make_room_for_interactive() -> None:
    h = slo_harness(total_queue=QueueBound(3, 100_000))
    for k in range(3):
        assert submit(h, f"b{k}", n=8, max_tokens=2, slo_class=BATCH).decision is not REJECT
    assert submit(h, "b3", n=8, max_tokens=2, slo_class=BATCH).decision is REJECT  # batch: no room
    verdict = submit(h, "i0", n=8, max_tokens=2, slo_class=INTER)
    assert verdict.decision is START  # interactive goes first; the slot is free
    assert [r.request_id for r in verdict.shed] == ["b2"]
    shed = h.results()["b2", 0]
    assert (shed.finish_reason, shed.rejection) == (FinishReason.REJECTED, RejectionKind.OVERLOADED)
    assert shed.retry_after_s is not None and shed.retry_after_s > 0
    assert shed.error is not None and "shed" in shed.error
    h.run()
    finished = {
        rid for (rid, _), r in h.results().items() if r.finish_reason is FinishReason.LENGTH
    }
    assert finished == {"b0", "b1", "i0"}


def test_interactive_is_never_shed() -> None:
    h = slo_harness(total_queue=QueueBound(2, 100_000))
    assert submit(h, "b0", n=8, max_tokens=2, slo_class=BATCH).decision is START
    assert submit(h, "i0", n=8, max_tokens=2, slo_class=INTER, tenant="x").decision is START
    # the shared queue is full: the newest request is interactive, but only batch is shed
    verdict = submit(h, "i1", n=8, max_tokens=2, slo_class=INTER, tenant="y")
    assert [r.request_id for r in verdict.shed] == ["b0"]
    full = submit(h, "i2", n=8, max_tokens=2, slo_class=INTER, tenant="z")
    assert (full.decision, full.rejection, full.shed) == (REJECT, RejectionKind.OVERLOADED, ())


def test_preempted_work_is_never_shed() -> None:
    h = Harness.make(
        FakeExecutor(n_ctx=64),
        policy="slo",
        enable_prefix_cache=False,
        slo=SloConfig(total_queue=QueueBound(1, 100_000)),
    )
    assert submit(h, "b0", n=16, max_tokens=20, slo_class=BATCH).decision is START
    h.cycle()  # b0's prompt: 1 of the 4 blocks
    assert submit(h, "b1", n=32, max_tokens=20, slo_class=BATCH).decision is START
    h.cycle()  # b0 decodes (2 blocks), b1's prompt (2 blocks): the pool is full
    h.cycle()  # b1's first decode needs a fifth block: b1 is preempted (stashed)
    policy = h.sched.policy
    assert isinstance(policy, SloPolicy)
    [queued] = list(policy.queue)
    assert queued.preemptions == 1
    # the shared queue is full with preempted work: the interactive arrival is refused
    verdict = submit(h, "i0", n=8, max_tokens=2, slo_class=INTER)
    assert (verdict.decision, verdict.rejection) == (REJECT, RejectionKind.OVERLOADED)
    assert verdict.shed == ()
    h.run()
    assert h.results()[queued.request_id, 0].finish_reason is FinishReason.LENGTH


def test_promoted_batch_is_not_shed_either() -> None:
    h = Harness.make(
        policy="slo",
        max_running=1,
        slo=SloConfig(total_queue=QueueBound(2, 100_000), batch_aging_s=0.02),
    )
    submit(h, "b0", n=8, max_tokens=30, slo_class=BATCH)
    submit(h, "b1", n=8, max_tokens=30, slo_class=BATCH)
    for _ in range(3):
        h.cycle()  # b1 waits 0.03 s: promoted
    policy = h.sched.policy
    assert isinstance(policy, SloPolicy)
    assert [r.request_id for r in policy.queue.promoted] == ["b1"]
    submit(h, "b2", n=8, max_tokens=30, slo_class=BATCH)
    verdict = submit(h, "i0", n=8, max_tokens=2, slo_class=INTER)
    assert [r.request_id for r in verdict.shed] == ["b2"]


def test_vtc_and_fcfs_never_reject_for_load() -> None:
    for policy in ("vtc", "fcfs"):
        h = Harness.make(policy=policy, max_running=1)
        verdicts = [submit(h, f"r{k}", tenant="hog") for k in range(50)]
        assert [v.decision for v in verdicts] == [START] + [QUEUE] * 49


async def test_the_driver_hands_back_the_rejection_at_once() -> None:
    ex, clock = FakeExecutor(), VirtualClock()
    config = SchedulerConfig(policy="slo", slo=SloConfig(interactive_queue=QueueBound(1, 100)))
    driver = Driver(Scheduler(config, ex.info, clock), ex, clock)
    driver.submit(GenerationRequest("a", prompt(8), 4))
    with pytest.raises(Refused) as refused:  # no cycle ran: answered at submit
        driver.submit(GenerationRequest("b", prompt(8), 4))
    assert refused.value.rejection is RejectionKind.TENANT_OVER_SHARE
    assert refused.value.retry_after_s is not None


async def test_mixed_classes_and_tenants_run_to_the_end_through_the_driver() -> None:
    ex, clock = FakeExecutor(n_ctx=1024, n_seq_max=6), VirtualClock()
    config = SchedulerConfig(policy="slo", max_running=4, token_budget=64, check_integrity=True)
    driver = Driver(Scheduler(config, ex.info, clock), ex, clock)
    await driver.start()
    handles = []
    for k in range(12):
        request = GenerationRequest(
            f"r{k}",
            prompt(10 + 7 * k, base=40 * k),
            6,
            n=1 + k % 2,
            tenant=f"t{k % 3}",
            slo_class=INTER if k % 2 else BATCH,
        )
        with contextlib.suppress(Refused):  # refused at once: nothing of it runs
            handles.append(driver.submit(request))
    reasons = {r.finish_reason for h in handles for r in await h.results()}
    assert reasons <= {FinishReason.LENGTH, FinishReason.REJECTED}
    await driver.stop(grace_s=1.0)
    stats = driver.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (0, 0, 0.0)
    assert {t.tenant for t in stats.tenants} == {"t0", "t1", "t2"}


def test_batch_behind_a_backlog_served_slower_than_projected_is_refused() -> None:
    """Interactive traffic keeps both slots: the batch queue is not served at all. At first
    (no history) a batch arrival is projected on the slots and queued; once the backlog has
    stood unserved a while, the measured rate says it cannot end by its deadline."""
    h = Harness.make(policy="slo", max_running=2, slo=SloConfig(batch_deadline_s=60.0))
    for k in range(2):
        assert submit(h, f"chat{k}", max_tokens=1000, tenant="chat").decision is not REJECT
        h.cycle()
    assert submit(h, "early", tenant="etl", slo_class=BATCH).decision is QUEUE
    for _ in range(300):  # 3 s of steps, none of them batch's
        h.cycle()
    late = submit(h, "late", tenant="etl", slo_class=BATCH)
    assert (late.decision, late.rejection) == (REJECT, RejectionKind.OVERLOADED)
    assert late.reason is not None and "batch target" in late.reason
    assert late.retry_after_s is not None and late.retry_after_s > 0


def test_a_prompt_over_the_target_alone_waits_no_longer_than_the_target() -> None:
    """Its own prefill cannot be waited out, a queue can: on an idle machine it is admitted;
    behind a prefill that would delay it past the target, refused with a retry-after."""
    config = SloConfig(interactive_ttft_s=0.05)  # under any prompt's prefill alone
    idle = Harness.make(policy="slo", max_running=4, slo=config)
    assert submit(idle, "long", n=400).decision is START
    busy = Harness.make(policy="slo", max_running=4, slo=config)
    assert submit(busy, "first", n=400).decision is START
    v = submit(busy, "long", n=400)
    assert (v.decision, v.rejection) == (REJECT, RejectionKind.OVERLOADED)
    assert v.retry_after_s is not None and v.retry_after_s > 0
