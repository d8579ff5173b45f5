"""The warm-up before ready teaches step costs and leaves no tenant behind, whatever the policy."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from quanta_core.clock import VirtualClock
from quanta_core.engine.fake import FakeExecutor
from quanta_core.scheduler import POLICIES, PolicyName, Scheduler, SchedulerConfig, SloConfig
from quanta_core.scheduler.step_cost import StepCostModel
from quanta_core.scheduler.warmup import warm_up
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.executor import SimExecutor


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_warm_up_tenant_is_forgotten(policy: str) -> None:
    ex = FakeExecutor()
    sched = Scheduler(SchedulerConfig(policy=policy), ex.info, VirtualClock())  # type: ignore[arg-type]
    assert warm_up(sched, ex) > 0
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting, stats.tenants) == (0, 0, ())


COST_MODELS = Path(__file__).resolve().parents[1] / "config" / "cost_models"


def _warmed(cost_model: str, n_ctx: int, n_seq_max: int, n_batch: int) -> StepCostModel:
    model = CostModel.load(COST_MODELS / cost_model)
    info = msgspec.structs.replace(
        FakeExecutor().info, n_ctx=n_ctx, n_seq_max=n_seq_max, n_batch=n_batch, kv_unified=False
    )
    ex = SimExecutor(info, model)
    config = SchedulerConfig(policy=PolicyName.QUANTA, token_budget=n_batch, max_running=n_seq_max)
    sched = Scheduler(config, ex.info, VirtualClock())
    warm_up(sched, ex)
    cost = sched.policy.cost  # type: ignore[attr-defined]
    assert isinstance(cost, StepCostModel)
    return cost


def test_a_fast_engine_replaces_the_cpu_prior_with_its_own_costs() -> None:
    """On the H200's cost model (a GPU: a 2,048-token prompt in ~0.2 s) the warm-up probes
    long prompts and the model prices this machine's steps, not the reference CPU's."""
    name = "synthetic-llama3-8b.Q4_0__16cpu-intel-xeon-processor__streams.json"
    cost = _warmed(name, n_ctx=64 * 8192, n_seq_max=64, n_batch=2048)
    assert cost.prior_theta != StepCostModel(SloConfig()).prior_theta
    # a 2,000-token prompt alone, and a decode step of 64 streams at 2k cells: that
    # machine's (~0.2 s and ~20 ms), not the CPU's
    prefill = cost.prefill_s(2000, 0, 2048)
    assert 0.05 < prefill < 1.0  # the CPU prior: ~15 s
    decode = cost.decode_step_s(64, 2256)
    assert 0.005 < decode < 0.1  # the CPU prior: ~0.9 s


def test_a_cpu_keeps_the_reference_prior() -> None:
    """Where a long prompt costs seconds (the reference CPU), no probe runs and the prior
    stays the calibrated reference's (learnt online from there, as before)."""
    name = "SmolLM2-135M-Instruct.Q4_1__2cpu-intel-xeon-processor__streams.json"
    cost = _warmed(name, n_ctx=32 * 4096, n_seq_max=32, n_batch=128)
    assert cost.prior_theta == StepCostModel(SloConfig()).prior_theta
