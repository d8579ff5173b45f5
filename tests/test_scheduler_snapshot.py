"""The scheduler's snapshot for the live view: plain data that agrees with its stats."""

from __future__ import annotations

from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import StepPlan, StepResult, StepTimings
from quanta_core.requests import SloClass
from quanta_core.scheduler.snapshot import step_rates
from tests.scheduler_harness import Harness, prompt


def test_snapshot_shows_queues_progress_blocks_and_decisions() -> None:
    h = Harness.make(FakeExecutor(n_ctx=256), max_running=2, block_size=16)
    h.submit("a", prompt(40), 8, tenant="t1")
    h.submit("b", prompt(20, base=300), 8, tenant="t2", slo_class=SloClass.BATCH)
    h.submit("c", prompt(20, base=500), 8, tenant="t1")
    h.cycle()
    h.cycle()
    snap = h.sched.snapshot()
    stats = h.sched.stats()
    assert [(v.request_id, v.status) for v in snap.running] == [("a", "running"), ("b", "running")]
    assert [(v.request_id, v.tenant, v.status) for v in snap.waiting] == [("c", "t1", "waiting")]
    a = snap.running[0]
    assert (a.prompt_tokens, a.max_tokens, a.output_tokens) == (40, 8, 2)
    assert a.computed_tokens == 41 and snap.running[1].slo_class == "batch"
    assert len(snap.running) == stats.num_running and len(snap.waiting) == stats.num_waiting
    # 41 + 21 computed tokens with room for the next one: 3 + 2 blocks of 16, of 16 in all
    assert len(snap.blocks) == 16 and snap.blocks.count("a") == 5
    assert snap.blocks.count("a") / len(snap.blocks) == stats.kv_usage
    assert [(d.request_id, d.decision) for d in snap.decisions] == [
        ("a", "start"),
        ("b", "queue"),  # behind a, which has not started yet
        ("c", "queue"),
    ]
    assert snap.decisions[2].reason == "queued behind 2 waiting"
    h.run()
    done = h.sched.snapshot()
    assert done.running == () and done.waiting == ()
    assert set(done.blocks) <= {"c", "f"} and "c" in done.blocks  # prefixes stay cached


def test_snapshot_records_a_rejection_with_its_reason() -> None:
    h = Harness.make(FakeExecutor(n_ctx=64))
    h.submit("long", prompt(80), 4)
    (decision,) = h.sched.snapshot().decisions
    assert decision.decision == "reject" and "80 tokens" in decision.reason


def test_step_rates_count_the_recent_steps_only() -> None:
    plan = StepPlan.make_empty()
    result = StepResult(timings=StepTimings(total_s=0.02))
    old = [(1.0, plan, result)]
    assert step_rates(old, now=10.0).steps == 0
    h = Harness.make()
    h.submit("a", prompt(10), 3)
    h.cycle()
    recent = [(10.0, h.plans[-1], result), (9.0, h.plans[-1], result)]
    rates = step_rates(old + recent, now=10.0, window_s=5.0)
    assert rates.steps == 2 and rates.mean_step_s == 0.02
    assert rates.tokens_per_s == 2 * 10 / 5.0
