"""Each policy's order: sequential, static batching, FCFS continuous batching."""

from __future__ import annotations

import pytest

from quanta_core.scheduler import PolicyName, SchedulerConfig, make_policy
from quanta_core.scheduler.policies.baselines import FcfsPolicy, SequentialPolicy, StaticPolicy
from tests.scheduler_harness import Harness, expected_tokens, prompt


def owners(h: Harness) -> list[list[str]]:
    return [[s.owner for s in p.slices] for p in h.plans if p.slices]


def test_policies_are_chosen_by_name() -> None:
    assert isinstance(make_policy("sequential"), SequentialPolicy)
    assert isinstance(make_policy(PolicyName.STATIC), StaticPolicy)
    assert isinstance(make_policy("fcfs"), FcfsPolicy)
    with pytest.raises(ValueError, match="unknown scheduling policy 'lottery'"):
        make_policy("lottery")
    assert SchedulerConfig(policy="static").policy is PolicyName.STATIC  # type: ignore[arg-type]


def test_sequential_runs_one_request_to_completion_at_a_time() -> None:
    h = Harness.make(policy="sequential")
    h.submit("a", prompt(4), max_tokens=2)
    h.submit("b", prompt(4, base=300), max_tokens=3)
    h.submit("c", prompt(4, base=600), max_tokens=1)
    h.run()
    assert owners(h) == [["a/0"], ["a/0"], ["b/0"], ["b/0"], ["b/0"], ["c/0"]]
    assert h.streamed("b") == expected_tokens(prompt(4, base=300), 3)


def test_sequential_runs_all_choices_of_its_one_request() -> None:
    h = Harness.make(policy="sequential")
    h.submit("a", prompt(4), max_tokens=2, n=2)
    h.submit("b", prompt(4, base=300), max_tokens=1)
    h.run()
    assert owners(h) == [["a/0"], ["a/0", "a/1"], ["a/1"], ["b/0"]]


def test_static_batch_runs_until_all_of_it_finished() -> None:
    h = Harness.make(policy="static")
    h.submit("a", prompt(4), max_tokens=1)
    h.submit("b", prompt(4, base=300), max_tokens=3)
    h.cycle()
    h.submit("c", prompt(4, base=600), max_tokens=1)  # arrives while the batch decodes
    h.run()
    assert owners(h) == [["a/0", "b/0"], ["b/0"], ["b/0"], ["c/0"]]


def test_fcfs_admits_in_arrival_order_as_soon_as_there_is_room() -> None:
    h = Harness.make(policy="fcfs", max_running=2)
    h.submit("a", prompt(4), max_tokens=1)
    h.submit("b", prompt(4, base=300), max_tokens=3)
    h.submit("c", prompt(4, base=600), max_tokens=2)
    h.run()
    assert owners(h) == [["a/0", "b/0"], ["b/0", "c/0"], ["b/0", "c/0"]]


def test_fcfs_head_that_does_not_fit_blocks_those_behind_it() -> None:
    # 4 blocks of 16: a holds 2, b (3 blocks) must wait, c (1 block) may not overtake it.
    from quanta_core.engine.fake import FakeExecutor

    h = Harness.make(FakeExecutor(n_ctx=64), policy="fcfs")
    h.submit("a", prompt(20), max_tokens=3)
    h.submit("b", prompt(40, base=300), max_tokens=1)
    h.submit("c", prompt(4, base=600), max_tokens=1)
    h.run()
    assert owners(h)[:3] == [["a/0"], ["a/0"], ["a/0"]]
    assert owners(h)[3] == ["b/0", "c/0"]
    assert h.sched.stats().num_preemptions == 0


def test_fcfs_evicts_the_newest_running_request() -> None:
    from quanta_core.engine.fake import FakeExecutor

    h = Harness.make(FakeExecutor(n_ctx=64), policy="fcfs", enable_prefix_cache=False)
    h.submit("a", prompt(16), max_tokens=20)  # needs a second block at its 1st decode
    h.submit("b", prompt(16, base=300), max_tokens=20)
    h.submit("c", prompt(32, base=600), max_tokens=20)
    h.cycle()  # 4 blocks: all taken by a, b, c's prompts
    plan = h.cycle()  # a's first decode token needs a block: c (newest) goes
    assert [op.__class__.__name__ for op in plan.kv_ops] == ["Stash"]
    assert plan.kv_ops[0].seq == 2  # type: ignore[union-attr]
    assert [s.owner for s in plan.slices] == ["a/0", "b/0"]
