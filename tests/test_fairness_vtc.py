"""The ``vtc`` policy: order, victims, and service shared by weight (fake executor).

The long-vs-short and weighted simulations are deterministic closed loops (each tenant keeps
12 requests in flight, more than the 4 running slots, so both stay backlogged); service is
counted from the plans that ran: 1 per prompt token computed, 2 per token sampled.
"""

from __future__ import annotations

from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import Stash
from quanta_core.metrics.fairness import jain_index
from quanta_core.scheduler import make_policy
from quanta_core.scheduler.policies.fair import VtcPolicy
from quanta_core.scheduler.policies.vtc import FairQueue, VirtualCounters
from tests.fairness_sim import Load, closed_loop
from tests.scheduler_harness import Harness, prompt
from tests.test_fairness_counters import req

CYCLES = 1500


def first_owners(h: Harness) -> list[str]:
    """Each request's id, in the order it was first scheduled."""
    seen: list[str] = []
    for p in h.plans:
        for s in p.slices:
            rid = s.owner.split("/")[0]
            if rid not in seen:
                seen.append(rid)
    return seen


def test_vtc_is_chosen_by_name() -> None:
    assert isinstance(make_policy("vtc"), VtcPolicy)


def test_the_lowest_counter_goes_first_fcfs_within_a_tenant() -> None:
    book = VirtualCounters()
    queue = FairQueue(book)
    a1, a2, b1, b2, c1 = req("a", 1), req("a", 2), req("b", 3), req("b", 4), req("c", 5)
    for r in (a1, a2, b1, b2, c1):
        book.join(r)
        queue.push(r)
    book.charge(a1, 50, 0)
    book.charge(b1, 10, 0)
    book.charge(c1, 30, 0)
    popped = []
    while len(queue):
        r = queue.pop()
        popped.append(r.request_id)
        book.charge(r, 25, 0)  # each admission costs its tenant 25
    # b (10 -> 35), c (30 -> 55), b (35 -> 60), a (50 -> 75), a (the last one left)
    assert popped == ["b3", "c5", "b4", "a1", "a2"]


def test_tenants_take_turns_where_fcfs_serves_in_arrival_order() -> None:
    def order(policy: str) -> list[str]:
        h = Harness.make(policy=policy, max_running=1)
        for i in range(3):
            h.submit(f"a{i}", prompt(8, base=100 + i), max_tokens=2, tenant="a")
        for i in range(3):
            h.submit(f"b{i}", prompt(8, base=200 + i), max_tokens=2, tenant="b")
        h.run()
        return first_owners(h)

    assert order("fcfs") == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert order("vtc") == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_one_admission_pass_alternates_tenants_by_reserved_prompt_cost() -> None:
    h = Harness.make(policy="vtc", max_running=4, token_budget=512)
    for i in range(3):
        h.submit(f"a{i}", prompt(40, base=100 + i), max_tokens=2, tenant="a")
    for i in range(3):
        h.submit(f"b{i}", prompt(40, base=200 + i), max_tokens=2, tenant="b")
    plan = h.cycle()
    assert [s.owner for s in plan.slices] == ["a0/0", "b0/0", "a1/0", "b1/0"]


def test_the_victim_is_the_highest_counter_tenants_newest_request() -> None:
    def victim(policy: str) -> str:
        h = Harness.make(FakeExecutor(n_ctx=64), policy=policy, enable_prefix_cache=False)
        h.submit("a0", prompt(16), max_tokens=20, tenant="a", weight=0.5)  # a: 2x the counter
        h.submit("a1", prompt(16, base=300), max_tokens=20, tenant="a", weight=0.5)
        h.submit("b0", prompt(32, base=600), max_tokens=20, tenant="b")
        h.cycle()  # 4 blocks, all taken; a0's first decode needs a fifth
        op = h.cycle().kv_ops[0]
        assert isinstance(op, Stash)
        return op.key

    assert victim("fcfs") == "b0/0#1"  # the newest
    assert victim("vtc") == "a1/0#1"  # a's counter (72) is above b's (34): a's newest


def test_long_and_short_prompts_service_difference_is_bounded_under_vtc_not_fcfs() -> None:
    loads = {"long": Load(200, 4, outstanding=12), "short": Load(10, 4, outstanding=12)}
    # VTC's bound: twice the largest single request's cost (200 x 1 + 4 x 2).
    bound = 2 * (200 + 2 * 4)
    vtc = closed_loop("vtc", loads, CYCLES)
    assert max(abs(s["long"] - s["short"]) for s in vtc.history) <= bound
    fcfs = closed_loop("fcfs", loads, CYCLES)
    diff = [s["long"] - s["short"] for s in fcfs.history]
    # fcfs serves requests, not tokens: the long tenant gets ~20x the service, and the gap
    # grows with every cycle (here by ~45 tokens per cycle).
    assert diff[-1] > 100 * bound
    assert diff[CYCLES // 2] > 50 * bound
    assert diff[-1] > 1.9 * diff[CYCLES // 2]


def test_weights_1_to_2_give_service_1_to_2() -> None:
    loads = {"a": Load(20, 8, outstanding=12), "b": Load(20, 8, weight=2.0, outstanding=12)}
    vtc = closed_loop("vtc", loads, CYCLES)
    end = vtc.history[-1]
    assert 1.95 < end["b"] / end["a"] < 2.05
    assert jain_index([end["a"] / 1.0, end["b"] / 2.0]) >= 0.999
    # the weighted counters never drift apart by more than twice one request's cost
    assert max(abs(s["b"] / 2 - s["a"]) for s in vtc.history) <= 2 * (20 + 2 * 8)
    fcfs_end = closed_loop("fcfs", loads, CYCLES).history[-1]
    assert 0.95 < fcfs_end["b"] / fcfs_end["a"] < 1.05  # fcfs ignores weights
