"""The default policy on the simulator, with the server's default settings and the committed
cost model of the reference machine, made slower: a loaded or slower CPU, on which decode
steps of the running set alone come near the inter-token target (the policy learns that from
the steps it runs, as on the real server)."""

from __future__ import annotations

import pytest

from app.lab.sim.command import default_cost_model_path, sim_setup
from app.server.settings import Settings
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.run import simulate
from quanta_core.workload import TenantSpec, WorkloadSpec, build_plan
from quanta_core.workload.lengths import DistKind, LengthDist
from quanta_core.workload.loader import preset


@pytest.mark.parametrize("slower", [1.6, 2.0, 2.5, 3.0])
def test_twenty_at_once_on_a_slower_machine_nobody_waits_for_a_free_slot(slower: float) -> None:
    # Twenty people at once (32-token prompts, 128-token answers): the last first token comes
    # while the first answers are still far from done, not once they end and free a slot.
    model = CostModel.load(default_cost_model_path()).scaled(slower)
    config, info = sim_setup(Settings(), model)
    spec = preset("twenty-at-once")
    records = simulate(spec, build_plan(spec), config, info, model).records
    assert len(records) == 20 and all(r.ok for r in records)
    last_first = max(r.token_times[0] for r in records)
    first_done = min(r.token_times[-1] for r in records)
    assert last_first < 0.5 * first_done


def test_a_coding_stream_at_three_quarters_of_capacity_is_served_whole() -> None:
    # 24 prompts of 36-2,236 tokens (median ~480), answers 6-94, Poisson at 0.17/s: the
    # engine (this CPU's stream-layout cost model) busy about three quarters of the time.
    # Long prompts come in clumps that project past their targets for a while; below
    # capacity they are queued, and a short prompt is prefilled ahead of a long one, so
    # nobody is refused.
    model = CostModel.load(default_cost_model_path())
    settings = Settings(n_ctx=4096, n_seq_max=16, kv_unified=False)
    config, info = sim_setup(settings, model)
    dev = TenantSpec(
        "dev",
        prompt=LengthDist(DistKind.LOGNORMAL, mean=600.0, std=750.0, min=33, max=3718),
        output=LengthDist(DistKind.UNIFORM, min=6, max=94),
        requests=24,
    )
    spec = WorkloadSpec("coding", (dev,), seed=38, requests=None, rate=0.17)
    out = simulate(spec, build_plan(spec), config, info, model)
    assert len(out.records) == 24 and all(r.ok for r in out.records)
    assert 0.6 < out.busy_s / out.virtual_s < 0.9
