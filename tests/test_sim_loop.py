"""The event queue's order, and the loop's timing against a cost model one can add up by hand."""

from __future__ import annotations

import math

import pytest

from quanta_core.engine.types import StepPlan, StepResult
from quanta_core.requests import GenerationRequest, SloClass
from quanta_core.scheduler import SchedulerConfig
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.events import Arrival, EventQueue, StepDone, StepStart, Wake
from quanta_core.sim.run import sim_engine_info, simulate
from quanta_core.sim.server_cost import ServerCost
from quanta_core.workload import PlannedRequest, TenantSpec, WorkloadSpec, fixed

TEN_MS = CostModel(per_pass=0.010)  # every step that runs tokens takes 10 ms
ENGINE = sim_engine_info(n_ctx=4096, n_seq_max=16, n_batch=512)


def test_events_come_out_by_time_then_in_insertion_order() -> None:
    q = EventQueue()
    a = Arrival(GenerationRequest("a", (1,), 1))
    b = Arrival(GenerationRequest("b", (1,), 1))
    start = StepStart()
    done = StepDone(StepPlan(), StepResult())
    wake = Wake(lambda now: None)
    q.push(2.0, done)
    q.push(1.0, a)
    q.push(1.0, start)  # same time as a, pushed later: after it
    q.push(0.5, wake)
    q.push(1.0, b)  # same time again: last of the three
    out = [q.pop() for _ in range(len(q))]
    assert out == [(0.5, wake), (1.0, a), (1.0, start), (1.0, b), (2.0, done)]


def test_equal_events_at_equal_times_never_compare() -> None:
    # Two identical events: the heap must not fall back on comparing them.
    q = EventQueue()
    for _ in range(100):
        q.push(0.0, StepStart())
    assert len([q.pop() for _ in range(100)]) == 100


def _spec(**kw: object) -> WorkloadSpec:
    tenant = TenantSpec(name="t", prompt=fixed(8), output=fixed(5))
    return WorkloadSpec(name="w", tenants=(tenant,), **kw)  # type: ignore[arg-type]


def _planned(index: int, arrival: float | None, prompt: int = 8, output: int = 5) -> PlannedRequest:
    return PlannedRequest(index, arrival, "t", SloClass.INTERACTIVE, prompt, output)


def test_one_request_alone_takes_one_step_per_token() -> None:
    # Step 1 (0.00-0.01) prefills 8 tokens and samples token 0; steps 2-5 decode one each.
    outcome = simulate(_spec(), [_planned(0, 0.0)], SchedulerConfig(), ENGINE, TEN_MS)
    (r,) = outcome.records
    assert r.ok and r.status == 200 and r.output_tokens == 5
    assert r.token_times == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
    assert r.ttft == pytest.approx(0.01)
    assert r.finished == pytest.approx(0.05)
    assert r.server_queue_s == 0.0
    assert r.server_prefill_s == pytest.approx(0.01)
    assert outcome.steps == 5
    assert outcome.busy_s == pytest.approx(0.05)


def test_a_request_arriving_during_a_step_starts_at_the_next_one() -> None:
    # r1 arrives at 0.015, inside step 2 (0.01-0.02): planned at 0.02, first token at 0.03.
    plan = [_planned(0, 0.0), _planned(1, 0.015)]
    outcome = simulate(_spec(), plan, SchedulerConfig(), ENGINE, TEN_MS)
    r0, r1 = outcome.records
    assert r0.token_times == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
    assert r1.sent == 0.015
    assert r1.server_queue_s == pytest.approx(0.005)
    assert r1.token_times == pytest.approx([0.03, 0.04, 0.05, 0.06, 0.07])


def test_the_servers_own_time_follows_every_step_the_engine_idle_meanwhile() -> None:
    # 10 ms per step + 2 ms per cycle + 1 ms per streamed token: two streams, 14 ms a step.
    plan = [_planned(0, 0.0), _planned(1, 0.0)]
    spec = _spec(requests=2, rate=math.inf)
    server = ServerCost(per_cycle_s=0.002, per_token_s=0.001)
    outcome = simulate(spec, plan, SchedulerConfig(), ENGINE, TEN_MS, server)
    for r in outcome.records:
        assert r.token_times == pytest.approx([0.014, 0.028, 0.042, 0.056, 0.070])
    assert outcome.busy_s == pytest.approx(0.05)  # the engine's own time only
    with pytest.raises(ValueError, match="negative"):
        ServerCost(per_cycle_s=-0.001)


def test_the_servers_intake_takes_a_burst_in_one_request_at_a_time() -> None:
    # 4 ms of intake each: the burst of three is submitted at 4, 8 and 12 ms; r0's prefill
    # starts at once (4-14 ms), r1 and r2 share the next step (14-24 ms). r3, sent when the
    # intake is idle again, waits only its own 4 ms.
    plan = [_planned(0, 0.0), _planned(1, 0.0), _planned(2, 0.0), _planned(3, 0.1)]
    server = ServerCost(per_request_s=0.004)
    outcome = simulate(_spec(requests=4), plan, SchedulerConfig(), ENGINE, TEN_MS, server)
    r0, r1, r2, r3 = outcome.records
    assert [r.sent for r in outcome.records] == [0.0, 0.0, 0.0, 0.1]
    assert r0.ttft == pytest.approx(0.014)
    assert r1.ttft == pytest.approx(0.024) and r2.ttft == pytest.approx(0.024)
    assert r1.server_queue_s == pytest.approx(0.006)  # submitted at 8 ms, planned at 14
    assert r3.ttft == pytest.approx(0.014)
    # No intake cost: the burst is submitted when it is sent, its prompts in one step.
    alone = simulate(_spec(requests=4), plan, SchedulerConfig(), ENGINE, TEN_MS)
    assert [r.ttft for r in alone.records] == pytest.approx([0.01] * 4)  # one step for all
    with pytest.raises(ValueError, match="negative"):
        ServerCost(per_request_s=-0.001)


def test_an_idle_engine_waits_for_the_next_arrival() -> None:
    plan = [_planned(0, 0.0), _planned(1, 10.0)]
    outcome = simulate(_spec(), plan, SchedulerConfig(), ENGINE, TEN_MS)
    r1 = outcome.records[1]
    assert r1.token_times[0] == pytest.approx(10.01)
    assert outcome.virtual_s == pytest.approx(10.05)
    assert outcome.busy_s == pytest.approx(0.10)


def test_same_inputs_same_records() -> None:
    tenants = (
        TenantSpec(name="a", prompt=fixed(40), output=fixed(20), prefix_tokens=16),
        TenantSpec(name="b", prompt=fixed(90), output=fixed(30), weight=2.0),
    )
    spec = WorkloadSpec(name="w", tenants=tenants, requests=60, rate=20.0, seed=5)
    from quanta_core.workload import build_plan

    model = CostModel(per_pass=0.01, per_decode=0.002, per_prefill=0.001, per_attended=1e-4)
    config = SchedulerConfig(max_running=4, token_budget=64, num_kv_blocks=24)
    first = simulate(spec, build_plan(spec), config, ENGINE, model)
    second = simulate(spec, build_plan(spec), config, ENGINE, model)
    assert [r.to_row() for r in first.records] == [r.to_row() for r in second.records]
    assert first.steps == second.steps and first.virtual_s == second.virtual_s
    assert len(first.records) == 60 and all(r.ok for r in first.records)
    assert first.preemptions > 0  # the small pool made it preempt: that path is deterministic too
    # The tenant's shared prefix was served from the prefix cache after its first request.
    assert any((r.server_cached_tokens or 0) >= 16 for r in first.records if r.tenant == "a")


def test_all_at_once_are_all_submitted_before_the_first_step() -> None:
    spec = _spec(requests=4, rate=math.inf)
    plan = [_planned(k, 0.0) for k in range(4)]
    outcome = simulate(spec, plan, SchedulerConfig(), ENGINE, TEN_MS)
    assert all(r.token_times[0] == pytest.approx(0.01) for r in outcome.records)
