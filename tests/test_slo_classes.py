"""The ``slo`` policy's class rules: interactive first, batch in the slack, aging, victims.

The harness's virtual clock moves 10 ms per cycle; no timing is measured.
"""

from __future__ import annotations

from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import Stash
from quanta_core.requests import SloClass
from quanta_core.scheduler import SloConfig, make_policy
from quanta_core.scheduler.policies.fair import SloPolicy
from tests.fairness_sim import Load, Simulation
from tests.scheduler_harness import Harness, prompt
from tests.test_fairness_vtc import first_owners

CYCLE_S = 0.01
INTER, BATCH = SloClass.INTERACTIVE, SloClass.BATCH


def test_slo_is_chosen_by_name() -> None:
    assert isinstance(make_policy("slo"), SloPolicy)


def test_interactive_goes_before_batch_that_came_first() -> None:
    h = Harness.make(policy="slo", max_running=1)
    h.submit("b0", prompt(8), max_tokens=2, slo_class=BATCH)
    h.submit("b1", prompt(8, base=300), max_tokens=2, slo_class=BATCH)
    h.submit("i0", prompt(8, base=600), max_tokens=2, slo_class=INTER)
    h.submit("i1", prompt(8, base=700), max_tokens=2, slo_class=INTER)
    h.run()
    assert first_owners(h) == ["i0", "i1", "b0", "b1"]


def test_batch_fills_the_slack_leaving_a_slot_for_interactive() -> None:
    h = Harness.make(policy="slo", max_running=4)
    h.submit("i0", prompt(8), max_tokens=30, slo_class=INTER)
    for k in range(6):
        h.submit(f"b{k}", prompt(8, base=300 + k), max_tokens=40, slo_class=BATCH)
    with_i0, batch_alone = [], []
    while h.sched.has_work:
        owners = [s.owner for s in h.cycle().slices]
        (with_i0 if "i0/0" in owners else batch_alone).append(len(owners))
    # 4 slots: interactive holds one and one is kept free for the next interactive arrival;
    # alone, batch takes all but that one
    assert max(with_i0) == 3 and max(batch_alone) == 3


def test_an_interactive_arrival_starts_at_once_in_the_reserved_slot() -> None:
    h = Harness.make(policy="slo", max_running=4)
    for k in range(6):
        h.submit(f"b{k}", prompt(8, base=300 + k), max_tokens=50, slo_class=BATCH)
    for _ in range(3):
        h.cycle()
    h.submit("i1", prompt(8, base=900), max_tokens=5, slo_class=INTER)
    plan = h.cycle()
    assert "i1/0" in [s.owner for s in plan.slices]


def aging_run(aging_s: float, cycles: int) -> tuple[Simulation, str]:
    """Interactive traffic keeps the queue full (8 in flight, 2 slots) while one batch request
    waits. Returns the simulation and the batch request's id."""
    loads = {"chat": Load(prompt_len=20, max_tokens=6, outstanding=8)}
    sim = Simulation("slo", loads, max_running=2, slo=SloConfig(batch_aging_s=aging_s))
    for _ in range(5):
        sim.step()
    sim.h.submit("job", prompt(20, base=500), max_tokens=4, tenant="etl", slo_class=BATCH)
    for _ in range(cycles):
        sim.step()
    return sim, "job"


def test_batch_starves_behind_interactive_without_aging() -> None:
    sim, job = aging_run(aging_s=1e9, cycles=400)
    assert (job, 0) not in sim.h.results()
    assert sim.h.sched.stats().waiting_by_class == (("batch", 1), ("interactive", 6))


def test_aging_bounds_a_batch_requests_wait() -> None:
    aging_s = 0.5
    sim, job = aging_run(aging_s, cycles=400)
    res = sim.h.results()[job, 0]
    assert res.timings.first_scheduled is not None
    wait = res.timings.first_scheduled - res.timings.arrival
    # The bound of SloPolicy's docstring, with P = 0 promoted before it and R = the longest a
    # running interactive request keeps its slot: 1 prefill step + 6 decode steps.
    r_steps = 1 + 6
    assert aging_s <= wait <= aging_s + CYCLE_S * (1 + r_steps) + 1e-9
    # and interactive was served all along: it did not wait for the batch job
    assert sum(1 for (rid, _) in sim.h.results() if rid.startswith("chat")) > 50


def test_several_promoted_batch_requests_are_admitted_oldest_first_within_the_bound() -> None:
    loads = {"chat": Load(prompt_len=20, max_tokens=6, outstanding=8)}
    aging_s = 0.3
    sim = Simulation("slo", loads, max_running=2, slo=SloConfig(batch_aging_s=aging_s))
    for k in range(3):
        sim.h.submit(
            f"job{k}", prompt(20, base=500 + k), max_tokens=4, tenant="etl", slo_class=BATCH
        )
    for _ in range(300):
        sim.step()
    results = sim.h.results()
    starts = [results[f"job{k}", 0].timings.first_scheduled for k in range(3)]
    assert starts == sorted(starts)  # type: ignore[type-var]
    for p, start in enumerate(starts):
        assert start is not None
        # P = p promoted before it; R = 7 steps (interactive 1 + 6; a batch job 1 + 4)
        assert start <= aging_s + CYCLE_S * (1 + (p + 1) * 7) + 1e-9


def test_a_preempted_batch_request_ages_from_its_preemption() -> None:
    h = Harness.make(
        FakeExecutor(n_ctx=64),
        policy="slo",
        enable_prefix_cache=False,
        slo=SloConfig(batch_aging_s=0.05),
    )
    h.submit("b0", prompt(16), max_tokens=20, slo_class=BATCH)
    h.submit("b1", prompt(16, base=300), max_tokens=20, slo_class=BATCH)
    h.submit("b2", prompt(32, base=600), max_tokens=20, slo_class=BATCH)
    h.cycle()
    h.cycle()  # b2 (newest) is preempted at t = 0.01
    policy = h.sched.policy
    assert isinstance(policy, SloPolicy)
    [b2] = [r for r in policy.queue if r.request_id == "b2"]
    assert b2.preempted_at == [0.01]
    h.cycle()  # t = 0.02: waited 0.01 since its preemption, not promoted
    assert not policy.queue.is_promoted(b2)


def test_batch_is_the_victim_before_interactive() -> None:
    def victim(policy: str) -> str:
        h = Harness.make(
            FakeExecutor(n_ctx=64),
            policy=policy,
            enable_prefix_cache=False,
            slo=SloConfig(interactive_itl_s=10.0),  # no step cap: all three prefill at once
        )
        h.submit("b0", prompt(16), max_tokens=20, slo_class=BATCH)
        h.submit("i0", prompt(16, base=300), max_tokens=20, slo_class=INTER)
        h.submit("i1", prompt(32, base=600), max_tokens=20, slo_class=INTER)
        h.cycle()  # 4 blocks, all taken
        op = h.cycle().kv_ops[0]
        assert isinstance(op, Stash)
        return op.key

    assert victim("fcfs") == "i1/0#1"  # the newest
    assert victim("slo") == "b0/0#1"  # batch first, though it is the oldest


def test_a_running_batch_prefill_yields_to_interactive_and_never_takes_a_streams_token() -> None:
    h = Harness.make(FakeExecutor(n_ctx=8192), policy="slo", max_running=16)
    long_prompt = tuple(1 + i % 900 for i in range(2000))
    h.submit("b", long_prompt, max_tokens=5, slo_class=BATCH)
    h.cycle()  # batch alone: a full 512-token chunk
    h.submit("i", prompt(20), max_tokens=10, slo_class=INTER)
    plans = [[(s.owner, len(s.tokens)) for s in h.cycle().slices] for _ in range(3)]
    # it starts at once, in a short step: the batch prefill takes what is left after it
    # under the ITL target (2 sequences, 28 tokens: ~196 ms by the prior)
    assert plans[0] == [("i/0", 20), ("b/0", 8)]
    # then the stream's token comes first and the batch chunk fits the ITL target beside it
    assert plans[1] == plans[2] == [("i/0", 1), ("b/0", 26)]
    h.run()
    assert h.results()["b", 0].finish_reason.value == "length"


def test_a_batch_prefill_is_not_held_up_by_an_interactive_request_that_does_not_fit() -> None:
    # 8 blocks of 16; the batch prompt (120 tokens, chunks of 26) holds 7 after 4 steps: the
    # interactive request's first chunk (26 tokens, 2 blocks) cannot start until it ends.
    h = Harness.make(
        FakeExecutor(n_ctx=128), policy="slo", token_budget=26, enable_prefix_cache=False
    )
    h.submit("b", prompt(120), max_tokens=2, slo_class=BATCH)
    for _ in range(4):
        h.cycle()
    h.submit("i", prompt(30, base=500), max_tokens=2, slo_class=INTER)
    h.run(max_cycles=50)
    after = [[(s.owner, len(s.tokens)) for s in p.slices] for p in h.plans[4:7]]
    # the batch prefill goes after admission, which cannot start "i": it keeps the budget
    assert after == [[("b/0", 16)], [("b/0", 1)], [("i/0", 26)]]
    assert [r.finish_reason.value for r in h.results().values()] == ["length", "length"]
