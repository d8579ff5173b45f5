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
from quanta_core.workload import build_plan
from quanta_core.workload.loader import preset


@pytest.mark.parametrize("slower", [1.6, 2.0])
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
