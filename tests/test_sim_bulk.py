"""Steady decode steps taken in bulk give the same simulation as steps one by one.

The simulator takes the steps in which every running request only decodes (and one prompt is
prefilled in chunks beside them) in runs (``quanta_core.sim.steady``, ``SimLoop``); these
workloads are run both ways, under the policies that take runs (``fcfs``, ``vtc``,
``sequential``, ``static``) and those that always step (``quanta``, ``horizon``, ``slo``), and
every request's record (token times, first token, finish, tokens, preemptions), the run's
counts and the fair counters must be equal, not close.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from quanta_core.engine.types import SeqSlice, StepPlan
from quanta_core.requests import SloClass
from quanta_core.scheduler import SchedulerConfig
from quanta_core.scheduler.config import PolicyName
from quanta_core.sim.cost_model import (
    COEFFICIENTS,
    CostModel,
    attended_pairs,
    features_of,
    steady_features,
)
from quanta_core.sim.run import SimOutcome, sim_engine_info, simulate
from quanta_core.sim.server_cost import ServerCost
from quanta_core.workload import TenantSpec, WorkloadSpec, build_plan
from quanta_core.workload.lengths import DistKind, LengthDist

# Every term non-zero: the context lengths, the batch and the idle (cached) cells all count.
MODEL = CostModel(
    per_pass=0.006,
    per_batched_pass=0.004,
    per_decode=0.003,
    per_prefill=0.002,
    per_attended=0.0004,
    per_batch_kv=0.011,
    per_kv_held=0.0013,
    per_stash=1e-5,
    per_restore=2e-5,
    per_idle_kv=0.0007,
    per_batch_idle=0.0021,
)


def _uniform(lo: int, hi: int) -> LengthDist:
    return LengthDist(kind=DistKind.UNIFORM, min=lo, max=hi)


def _burst() -> WorkloadSpec:
    """Issue 22's KV-bound burst: 24 at once, prompts 50-100, answers 150-300."""
    tenant = TenantSpec(name="t", prompt=_uniform(50, 100), output=_uniform(150, 300))
    return WorkloadSpec(name="burst", tenants=(tenant,), requests=24, rate=float("inf"))


def _two_tenants() -> WorkloadSpec:
    """Open loop, arrivals during the runs, weighted tenants and a shared system prompt."""
    tenants = (
        TenantSpec(
            name="a",
            weight=2.0,
            prompt=_uniform(20, 90),
            output=_uniform(20, 160),
            prefix_tokens=32,
        ),
        TenantSpec(
            name="b", slo_class=SloClass.BATCH, prompt=_uniform(10, 200), output=_uniform(5, 220)
        ),
    )
    return WorkloadSpec(name="two", tenants=tenants, requests=60, rate=4.0, seed=7)


def _long_prompts() -> WorkloadSpec:
    """Prompts of several chunks, prefilled beside running streams; two tenants (their
    counters charged by the chunks decide who starts when both wait)."""
    tenants = tuple(
        TenantSpec(name=name, weight=w, prompt=_uniform(150, 600), output=_uniform(20, 120))
        for name, w in (("a", 1.0), ("b", 3.0))
    )
    return WorkloadSpec(name="long", tenants=tenants, requests=40, rate=1.5, seed=3)


def _long_shared_prefix() -> WorkloadSpec:
    """A 400-token prefix both tenants share, prefilled in chunks in a pool of 40 blocks: a
    chunk's full block may carry the hash of a cached block that a later step of the same run
    evicts (one by one the cache still held it when the chunk's block was hashed)."""
    tenants = tuple(
        TenantSpec(name=name, prompt=_uniform(420, 700), output=_uniform(5, 80), prefix_tokens=400)
        for name in ("a", "b")
    )
    return WorkloadSpec(name="shared", tenants=tenants, requests=40, rate=2.0, seed=11)


def _run(spec: WorkloadSpec, config: SchedulerConfig, bulk: bool) -> SimOutcome:
    engine = sim_engine_info(n_ctx=2048, n_seq_max=16, n_batch=512)
    server = ServerCost(per_cycle_s=0.0007, per_token_s=0.0001)
    return simulate(spec, build_plan(spec), config, engine, MODEL, server, bulk=bulk)


def _same(spec: WorkloadSpec, config: SchedulerConfig) -> tuple[SimOutcome, SimOutcome]:
    bulk, one_by_one = _run(spec, config, True), _run(spec, config, False)
    assert one_by_one.bulk_steps == 0
    assert bulk.records == one_by_one.records
    assert bulk.tenants == one_by_one.tenants  # the fair counters, to the last bit
    ignore = {"wall_s": None, "bulk_steps": None, "bulk_evictions": None}
    assert {**bulk.counts(), **ignore} == {**one_by_one.counts(), **ignore}
    return bulk, one_by_one


POLICIES = [
    PolicyName.FCFS,
    PolicyName.VTC,
    PolicyName.QUANTA,
    PolicyName.HORIZON,
    PolicyName.SLO,
    PolicyName.SEQUENTIAL,
    PolicyName.STATIC,
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("blocks", [40, 128])
def test_a_kv_bound_burst_is_the_same_in_bulk(policy: PolicyName, blocks: int) -> None:
    config = SchedulerConfig(
        policy=policy, num_kv_blocks=blocks, token_budget=128, check_integrity=True
    )
    bulk, _ = _same(_burst(), config)
    assert any(r.ok and r.n_output > 0 for r in bulk.records)
    if policy is PolicyName.FCFS and blocks == 40:
        assert bulk.preemptions > 0  # memory pressure was exercised
        assert bulk.bulk_evictions > 0  # runs whose steps evict cached blocks, too
    if policy in (PolicyName.FCFS, PolicyName.VTC, PolicyName.HORIZON):
        assert bulk.bulk_steps > bulk.steps // 2  # and most steps were taken in runs
    if policy in (PolicyName.SEQUENTIAL, PolicyName.STATIC):
        assert bulk.bulk_steps > 0


@pytest.mark.parametrize("policy", POLICIES)
def test_arrivals_tenants_and_a_shared_prefix_are_the_same_in_bulk(policy: PolicyName) -> None:
    config = SchedulerConfig(
        policy=policy,
        num_kv_blocks=64,
        token_budget=64,
        prefix_cache_tokens=256,
        check_integrity=True,
    )
    bulk, _ = _same(_two_tenants(), config)
    if policy is PolicyName.FCFS:
        assert bulk.bulk_steps > 0 and bulk.preemptions > 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("blocks", [48, 256])
def test_prompts_prefilled_in_chunks_are_the_same_in_bulk(policy: PolicyName, blocks: int) -> None:
    config = SchedulerConfig(
        policy=policy, num_kv_blocks=blocks, token_budget=48, check_integrity=True
    )
    bulk, _ = _same(_long_prompts(), config)
    if policy in (PolicyName.FCFS, PolicyName.VTC):
        assert bulk.bulk_steps > bulk.steps // 5


@pytest.mark.parametrize("policy", [PolicyName.FCFS, PolicyName.VTC])
@pytest.mark.parametrize("budget", [32, 48])
def test_runs_that_evict_beside_a_shared_prompt_are_the_same_in_bulk(
    policy: PolicyName, budget: int
) -> None:
    config = SchedulerConfig(
        policy=policy,
        num_kv_blocks=40,
        token_budget=budget,
        prefix_cache_tokens=4096,
        check_integrity=True,
    )
    bulk, _ = _same(_long_shared_prefix(), config)
    assert bulk.bulk_evictions > 0


def test_recompute_only_preemptions_are_the_same_in_bulk() -> None:
    # No host RAM for stashes: every preemption drops its KV and recomputes (replays).
    config = SchedulerConfig(
        policy=PolicyName.FCFS, num_kv_blocks=40, stash_budget_bytes=0, check_integrity=True
    )
    bulk, _ = _same(_burst(), config)
    assert bulk.preemptions > 0 and bulk.bulk_steps > 0


def test_steady_features_are_those_of_the_plan() -> None:
    lengths = {0: 40, 1: 17, 2: 300, 5: 64}  # 5 and 2 hold cells outside the batch
    decodes = (
        SeqSlice(seq=0, tokens=(7,), start_pos=40, sample=True),
        SeqSlice(seq=1, tokens=(9,), start_pos=17, sample=True),
    )
    held, idle = 40 + 1 + 17 + 1, 300 + 64
    plan = StepPlan((), decodes, ())
    assert steady_features(2, 1, held, held, idle) == features_of(plan, lengths, {})
    # and with a prompt's chunk of 6 tokens from position 64 (sequence 5, now in the batch)
    chunk = SeqSlice(seq=5, tokens=(3,) * 6, start_pos=64)
    plan = StepPlan((), (*decodes, chunk), ())
    pairs = held + attended_pairs(64, 6)
    expected = features_of(plan, lengths, {})
    assert steady_features(2, 6, pairs, held + 64 + 6, 300) == expected


def test_a_steady_pricer_prices_as_predict_of_the_steady_features() -> None:
    rng = random.Random(11)
    for _ in range(300):
        # signed coefficients too: a fit may leave one below 0 (and a step at 0 s)
        model = CostModel(**{k: rng.uniform(-0.01, 0.05) for k in COEFFICIENTS})
        n, chunk = rng.randrange(0, 40), rng.choice((1, 1, 2, 17, 128))
        price = model.steady_pricer(n, chunk)
        for _ in range(20):
            pairs, held, idle = (rng.randrange(0, 10**6) for _ in range(3))
            want = model.predict(steady_features(n, chunk, pairs, held, idle))
            assert price(pairs, held, idle).hex() == want.hex()


def test_a_speed_profile_steps_one_by_one() -> None:
    # The machine's speed is read at each step's start: no bulk runs.
    spec = dataclasses.replace(_burst(), requests=4)
    config = SchedulerConfig(policy=PolicyName.FCFS)
    engine = sim_engine_info(n_ctx=2048, n_seq_max=16, n_batch=512)
    from quanta_core.sim.step_trace import SpeedProfile

    profile = SpeedProfile(bin_s=1.0, factors=(1.0, 2.0))
    outcome = simulate(spec, build_plan(spec), config, engine, MODEL, speed=profile)
    assert outcome.bulk_steps == 0 and outcome.steps > 0
