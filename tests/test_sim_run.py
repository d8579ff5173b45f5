"""``simulate``: the client's side (closed loop, a concurrency cap), rejections, prompts."""

from __future__ import annotations

import math

import pytest

from quanta_core.requests import SloClass
from quanta_core.scheduler import SchedulerConfig
from quanta_core.scheduler.config import PolicyName
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.prompts import CHAT_HEAD_TOKENS, CHAT_TAIL_TOKENS, prompt_ids
from quanta_core.sim.run import sim_engine_info, simulate
from quanta_core.workload import (
    Endpoint,
    PlannedRequest,
    TenantSpec,
    WorkloadSpec,
    build_plan,
    fixed,
)

TEN_MS = CostModel(per_pass=0.010)
ENGINE = sim_engine_info(n_ctx=4096, n_seq_max=16, n_batch=512)


def _tenant(prompt: int = 8, output: int = 5, **kw: object) -> TenantSpec:
    return TenantSpec(name="t", prompt=fixed(prompt), output=fixed(output), **kw)  # type: ignore[arg-type]


def test_closed_loop_users_send_the_next_request_when_the_last_one_finished() -> None:
    # One user, think 1 s: r0 runs 0.00-0.05, r1 is sent at 1.05, r2 at 2.10.
    spec = WorkloadSpec(name="w", tenants=(_tenant(),), requests=3, users=1, think_s=1.0)
    outcome = simulate(spec, build_plan(spec), SchedulerConfig(), ENGINE, TEN_MS)
    sent = [r.sent for r in outcome.records]
    assert sent == pytest.approx([0.0, 1.05, 2.10])
    assert [r.scheduled for r in outcome.records] == [None, None, None]
    assert all(r.finished == pytest.approx(r.sent + 0.05) for r in outcome.records)


def test_closed_loop_users_run_side_by_side_and_stop_at_the_duration() -> None:
    spec = WorkloadSpec(
        name="w", tenants=(_tenant(),), requests=100, users=2, duration_s=0.2, think_s=0.0
    )
    outcome = simulate(spec, build_plan(spec), SchedulerConfig(), ENGINE, TEN_MS)
    # Two users, each request 5 steps of 10 ms in a shared batch: 0, 0.05, 0.10, 0.15 each.
    assert len(outcome.records) == 8
    assert max(r.sent for r in outcome.records) < 0.2


def test_a_concurrency_cap_delays_the_send_not_the_schedule() -> None:
    spec = WorkloadSpec(name="w", tenants=(_tenant(),), requests=3, rate=math.inf, concurrency=1)
    outcome = simulate(spec, build_plan(spec), SchedulerConfig(), ENGINE, TEN_MS)
    assert [r.scheduled for r in outcome.records] == [0.0, 0.0, 0.0]
    assert [r.sent for r in outcome.records] == pytest.approx([0.0, 0.05, 0.10])


def test_rejected_requests_are_records_with_the_servers_status() -> None:
    # 40 at once on an engine slow enough that the slo policy cannot meet a 2 s first token.
    slow = CostModel(per_pass=0.05, per_decode=0.02, per_prefill=0.005)
    spec = WorkloadSpec(name="w", tenants=(_tenant(64, 64),), requests=40, rate=math.inf)
    outcome = simulate(spec, build_plan(spec), SchedulerConfig(policy=PolicyName.SLO), ENGINE, slow)
    rejected = [r for r in outcome.records if not r.ok]
    assert len(outcome.records) == 40
    assert rejected and len(rejected) < 40
    for r in rejected:
        assert r.status in (429, 503)
        assert r.finished == r.sent == 0.0
        assert r.token_times == () and r.error and r.server_queue_s is None
    served = [r for r in outcome.records if r.ok]
    assert all(r.status == 200 and r.n_output == 64 for r in served)


def test_admitted_records_carry_the_first_token_estimate_as_the_server_reports_it() -> None:
    spec = WorkloadSpec(name="w", tenants=(_tenant(32, 16),), requests=20, rate=math.inf)
    config = SchedulerConfig(policy=PolicyName.QUANTA)
    outcome = simulate(spec, build_plan(spec), config, ENGINE, TEN_MS)
    assert all(r.ok for r in outcome.records)
    estimates = [r.server_ttft_estimate_s for r in outcome.records]
    assert all(e is not None and e > 0 for e in estimates)


def test_a_refused_request_is_sent_again_at_its_retry_after() -> None:
    # Sustained overload (8/s for 25 s on a slow engine) under the server's default policy,
    # as the bench's retries: each attempt is a record; a retry leaves at its retry-after.
    slow = CostModel(per_pass=0.05, per_decode=0.02, per_prefill=0.005)
    spec = WorkloadSpec(name="w", tenants=(_tenant(64, 64),), requests=200, rate=8.0)
    config = SchedulerConfig(policy=PolicyName.QUANTA)
    records = simulate(spec, build_plan(spec), config, ENGINE, slow, retries=1).records
    first = {r.request_id: r for r in records if r.attempt == 0}
    again = [r for r in records if r.attempt == 1]
    assert len(first) == 200 and again
    assert {r.request_id for r in again} == {k for k, r in first.items() if not r.ok}
    for r in again:
        told = first[r.request_id].retry_after_s
        assert told is not None and r.sent == pytest.approx(first[r.request_id].sent + told)
    assert any(r.ok for r in again)  # the queue drained meanwhile: some are admitted


def test_a_prompt_longer_than_the_context_is_refused() -> None:
    spec = WorkloadSpec(name="w", tenants=(_tenant(),), requests=1)
    planned = [PlannedRequest(0, 0.0, "t", SloClass.INTERACTIVE, 5000, 5)]
    (r,) = simulate(spec, planned, SchedulerConfig(), ENGINE, TEN_MS).records
    assert not r.ok and r.status == 503 and "context" in (r.error or "")


def test_tenant_weight_and_class_come_from_the_spec() -> None:
    tenants = (
        TenantSpec(name="a", weight=2.0, prompt=fixed(8), output=fixed(3)),
        TenantSpec(name="b", slo_class=SloClass.BATCH, prompt=fixed(8), output=fixed(3)),
    )
    spec = WorkloadSpec(name="w", tenants=tenants, requests=10, rate=50.0)
    outcome = simulate(
        spec, build_plan(spec), SchedulerConfig(policy=PolicyName.SLO), ENGINE, TEN_MS
    )
    by_tenant = {r.tenant: r for r in outcome.records}
    assert by_tenant["a"].weight == 2.0 and by_tenant["a"].slo_class is SloClass.INTERACTIVE
    assert by_tenant["b"].weight == 1.0 and by_tenant["b"].slo_class is SloClass.BATCH


def test_prompts_have_the_servers_length_and_share_only_what_is_shared() -> None:
    def planned(index: int, tenant: str) -> PlannedRequest:
        return PlannedRequest(index, 0.0, tenant, SloClass.INTERACTIVE, 40, 5, prefix_tokens=20)

    a0, a1, b0 = planned(0, "a"), planned(1, "a"), planned(2, "b")
    ids = {p.index: prompt_ids(7, p, Endpoint.COMPLETIONS, 49152) for p in (a0, a1, b0)}
    assert all(len(v) == 40 for v in ids.values())
    assert ids[0][:20] == ids[1][:20] != ids[2][:20]  # the tenant's prefix
    assert ids[0][20:22] != ids[1][20:22]  # own tokens start with the request's index
    assert prompt_ids(7, a0, Endpoint.COMPLETIONS, 49152) == ids[0]  # deterministic
    chat = prompt_ids(7, a0, Endpoint.CHAT, 49152)
    assert len(chat) == 40 + CHAT_HEAD_TOKENS + CHAT_TAIL_TOKENS
    assert chat[:CHAT_HEAD_TOKENS] == prompt_ids(7, b0, Endpoint.CHAT, 49152)[:CHAT_HEAD_TOKENS]
