"""VTC counter rules: lift on return from idle, weights, per-token charging (fake executor)."""

from __future__ import annotations

from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import SamplingParams
from quanta_core.requests import SloClass
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.policies.fair import SloPolicy, VtcPolicy
from quanta_core.scheduler.policies.vtc import VirtualCounters
from tests.scheduler_harness import Harness, prompt

GREEDY = SamplingParams(temperature=0.0)


def req(tenant: str, order: int, prompt_len: int = 4, weight: float = 1.0) -> Choice:
    return Choice(
        request_id=f"{tenant}{order}",
        index=0,
        tokens=list(range(prompt_len)),
        prompt_len=prompt_len,
        max_tokens=8,
        sampling=GREEDY,
        tenant=tenant,
        slo_class=SloClass.INTERACTIVE,
        weight=weight,
        arrival=0.0,
        order=order,
    )


def counters_of(h: Harness) -> dict[str, float]:
    policy = h.sched.policy
    assert isinstance(policy, VtcPolicy)
    return dict(policy.counters.counter)


# ---- the book alone ----


def test_a_tenant_returning_from_idle_is_lifted_to_the_smallest_backlogged_counter() -> None:
    book = VirtualCounters()
    a, b, c = req("a", 1), req("b", 2), req("c", 3)
    book.join(a)
    book.join(b)
    book.charge(a, 100, 0)
    book.charge(b, 40, 0)
    book.join(c)  # idle until now, counter 0: lifted to min(100, 40)
    assert book.counter == {"a": 100.0, "b": 40.0, "c": 40.0}
    book.leave(c)
    book.charge(b, 500, 0)
    book.join(req("c", 4))  # still below the smallest backlogged (a: 100): lifted again
    assert book.counter["c"] == 100.0


def test_a_tenant_above_the_backlogged_keeps_its_counter() -> None:
    book = VirtualCounters()
    a, b = req("a", 1), req("b", 2)
    book.join(b)
    book.charge(b, 500, 0)
    book.leave(b)
    book.join(a)  # nobody backlogged: lifted to the last one to go idle (b, 500)
    assert book.counter["a"] == 500.0
    book.join(req("b", 3))  # b (500) is not below a (500): unchanged
    assert book.counter["b"] == 500.0


def test_idling_banks_no_credit() -> None:
    book = VirtualCounters()
    a = req("a", 1)
    book.join(a)
    for _ in range(10):
        book.charge(a, 0, 50)  # a alone is served 10 x 100 while b idles
    b = req("b", 2)
    book.join(b)
    assert book.counter["b"] == book.counter["a"] == 1000.0


def test_charges_are_input_1_output_2_divided_by_weight() -> None:
    book = VirtualCounters()
    light, heavy = req("l", 1), req("h", 2, weight=2.0)
    book.join(light)
    book.join(heavy)
    book.charge(light, 10, 5)
    book.charge(heavy, 10, 5)
    assert book.counter == {"l": 20.0, "h": 10.0}


def test_the_rank_counts_admitted_but_uncharged_prompt_tokens() -> None:
    book = VirtualCounters()
    a = req("a", 1, prompt_len=30)
    book.join(a)
    book.reserve(a)
    assert (book.counter["a"], book.rank("a")) == (0.0, 30.0)
    book.charge(a, 10, 0)
    assert (book.counter["a"], book.rank("a")) == (10.0, 30.0)
    book.release(a)  # preempted: what is not computed is not reserved any more
    assert book.rank("a") == 10.0


def test_a_choice_never_joined_does_not_unbalance_the_book() -> None:
    book = VirtualCounters()
    a = req("a", 1)
    book.join(a)
    book.leave(req("a", 2))  # rejected at submit: never joined
    assert book.is_backlogged("a")
    book.leave(a)
    assert not book.is_backlogged("a")


# ---- charged per token, through the scheduler ----


def test_prompt_tokens_are_charged_as_computed_and_outputs_as_sampled() -> None:
    h = Harness.make(policy="vtc", token_budget=8)
    h.submit("a", prompt(20), max_tokens=3)
    seen = []
    while h.sched.has_work:
        h.cycle()
        seen.append(counters_of(h)["default"])
    # chunks of 8, 8 and 4 prompt tokens (the last samples the 1st output), then 2 more outputs
    assert seen[:5] == [8.0, 16.0, 22.0, 24.0, 26.0]


def test_weights_divide_the_charge() -> None:
    h = Harness.make(policy="vtc")
    h.submit("a", prompt(10), max_tokens=2, tenant="a", weight=2.0)
    h.submit("b", prompt(10, base=300), max_tokens=2, tenant="b", weight=1.0)
    h.run()
    assert counters_of(h) == {"a": 7.0, "b": 14.0}  # (10 + 2 x 2) / weight


def test_prefix_cache_hits_and_recomputes_are_not_charged() -> None:
    h = Harness.make(policy="vtc")
    p = prompt(40)
    h.submit("a", p, max_tokens=1)
    h.run()
    h.submit("b", p, max_tokens=1)  # 32 of its 40 prompt tokens come from the cache
    h.run()
    assert h.results()["b", 0].cached_tokens == 32
    assert counters_of(h)["default"] == (40 + 2) + (8 + 2)


def test_a_preempted_and_recomputed_request_pays_its_prompt_once() -> None:
    executor = FakeExecutor(n_ctx=64)
    h = Harness.make(executor, policy="vtc", enable_prefix_cache=False, stash_budget_bytes=0)
    h.submit("a", prompt(16), max_tokens=6, tenant="a")
    h.submit("b", prompt(16, base=300), max_tokens=6, tenant="b")
    h.submit("c", prompt(32, base=600), max_tokens=6, tenant="c")
    h.run()
    assert sum(r.preemptions for r in h.results().values()) > 0
    assert counters_of(h) == {"a": 16 + 12.0, "b": 16 + 12.0, "c": 32 + 12.0}


def test_slo_keeps_a_book_per_class() -> None:
    h = Harness.make(policy="slo")
    h.submit("a", prompt(10), max_tokens=2, tenant="t", slo_class=SloClass.INTERACTIVE)
    h.submit("b", prompt(20, base=300), max_tokens=2, tenant="t", slo_class=SloClass.BATCH)
    h.run()
    policy = h.sched.policy
    assert isinstance(policy, SloPolicy)
    assert policy.counters[SloClass.INTERACTIVE].counter == {"t": 14.0}
    assert policy.counters[SloClass.BATCH].counter == {"t": 24.0}


def test_counters_and_queues_are_in_the_scheduler_stats() -> None:
    h = Harness.make(policy="vtc", max_running=1)
    h.submit("a0", prompt(10), max_tokens=5, tenant="a")
    h.submit("b0", prompt(10, base=300), max_tokens=5, tenant="b")
    h.submit("a1", prompt(10, base=600), max_tokens=5, tenant="a")
    h.cycle()
    stats = h.sched.stats()
    assert {(t.tenant, t.slo_class, t.counter, t.waiting, t.running) for t in stats.tenants} == {
        ("a", "all", 12.0, 1, 1),
        ("b", "all", 0.0, 1, 0),
    }
    assert stats.waiting_by_class == (("interactive", 2),)
