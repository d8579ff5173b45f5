"""Engine failures: a dead worker (restart, restore, recompute) and a refused plan."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from quanta_core.engine.errors import EngineInputError
from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import Restore, StepPlan, StepResult, Truncate
from quanta_core.requests import FinishReason
from tests.scheduler_harness import Harness, expected_tokens, prompt

WORKLOAD = {
    "a": (prompt(16), 6, 1),
    "b": (prompt(16, base=300), 6, 1),
    "c": (prompt(32, base=600), 6, 1),
    "d": (prompt(20, base=800), 4, 2),  # n = 2
}


def run_workload(executor: FakeExecutor, **config: object) -> Harness:
    h = Harness.make(executor, **config)
    for rid, (p, max_tokens, n) in WORKLOAD.items():
        h.submit(rid, p, max_tokens=max_tokens, n=n)
    h.run()
    return h


def streams(h: Harness) -> dict[tuple[str, int], list[int]]:
    return {(rid, i): h.streamed(rid, i) for rid, (_, _, n) in WORKLOAD.items() for i in range(n)}


def test_the_uncrashed_workload_is_what_the_fake_engine_computes() -> None:
    h = run_workload(FakeExecutor(n_ctx=96))
    for (rid, _), tokens in streams(h).items():
        p, max_tokens, _ = WORKLOAD[rid]
        assert tokens == expected_tokens(p, max_tokens)


@pytest.mark.parametrize("crash_at", range(12))
@pytest.mark.parametrize("stash_budget", [0, 1 << 30])
def test_a_crash_anywhere_changes_no_token(crash_at: int, stash_budget: int) -> None:
    reference = run_workload(FakeExecutor(n_ctx=96), stash_budget_bytes=stash_budget)
    h = run_workload(
        FakeExecutor(n_ctx=96, crash_at_step=crash_at), stash_budget_bytes=stash_budget
    )
    assert h.executor.restarts == 1
    assert streams(h) == streams(reference)  # no token lost, none repeated
    assert all(r.finish_reason is FinishReason.LENGTH for r in h.results().values())
    assert h.sched.stats().engine_deaths == 1
    assert h.sched.kv.stats().active_blocks == 0


def test_a_stash_survives_the_crash_and_is_restored() -> None:
    # step 1 stashes c (out of blocks); the engine dies at step 3; c comes back by Restore
    h = run_workload(FakeExecutor(n_ctx=64, crash_at_step=3))
    keys = [op.key for p in h.plans for op in p.kv_ops if isinstance(op, Restore)]
    assert "c/0#1" in keys
    c = [s for p in h.plans for s in p.slices if s.owner == "c/0" and s.sample]
    first_after_restore = next(s for s in c if s.start_pos == 32)
    # the worker's sampler died with it: the restored choice replays its output
    assert first_after_restore.replay == tuple(expected_tokens(WORKLOAD["c"][0], 1))
    assert h.streamed("c") == expected_tokens(WORKLOAD["c"][0], 6)


def test_running_requests_are_recomputed_with_a_replay_after_a_crash() -> None:
    h = Harness.make(FakeExecutor(crash_at_step=3))
    p = prompt(10)
    h.submit("a", p, max_tokens=6)
    h.run()
    got = [(s.start_pos, len(s.tokens), s.replay) for pl in h.plans for s in pl.slices]
    want = expected_tokens(p, 6)
    assert (
        got
        == [
            (0, 10, ()),
            (10, 1, ()),
            (11, 1, ()),
            (12, 1, ()),  # the engine died running this one: nothing of it counted
            (0, 13, tuple(want[:3])),  # prompt + 3 outputs prefilled, outputs replayed
            (13, 1, ()),
            (14, 1, ()),
        ]
    )
    assert h.streamed("a") == want


def test_a_request_the_engine_keeps_dying_under_fails_with_an_error() -> None:
    executor = FakeExecutor(crash_at_step=1)
    h = Harness.make(executor, max_engine_deaths_per_request=2)
    h.submit("a", prompt(10), max_tokens=6)
    h.cycle()
    h.cycle()  # dies
    executor.crash_at_step = 2
    h.cycle()  # recompute
    h.cycle()  # dies again
    h.run()
    res = h.results()["a", 0]
    assert res.finish_reason is FinishReason.ERROR
    assert res.error is not None and "died 2 times" in res.error
    assert h.streamed("a") == expected_tokens(prompt(10), 2)  # what it got before
    assert not h.sched.has_work


@dataclass
class RefusingExecutor(FakeExecutor):
    refuse_at: int = -1

    def step(self, plan: StepPlan) -> StepResult:
        if len(self.steps) == self.refuse_at:
            self.refuse_at = -1
            raise EngineInputError("refused for the test")
        return super().step(plan)


def test_a_refused_plan_fails_its_requests_and_the_server_keeps_serving() -> None:
    executor = RefusingExecutor(n_seq_max=4, refuse_at=2)
    h = Harness.make(executor, token_budget=8)
    h.submit("a", prompt(4), max_tokens=10)
    h.cycle()
    h.cycle()
    h.submit("b", prompt(30, base=300), max_tokens=2)  # chunked: b is not in every plan
    h.cycle()  # refused: a and b were in it
    plan = h.cycle()
    assert plan.kv_ops == tuple(Truncate(s, 0) for s in range(4))  # the engine is wiped
    assert plan.release == ("a/0",)
    results = h.results()
    assert results["a", 0].finish_reason is FinishReason.ERROR
    assert results["b", 0].finish_reason is FinishReason.ERROR
    assert "refused for the test" in (results["a", 0].error or "")
    h.submit("c", prompt(5, base=900), max_tokens=3)
    h.run()
    assert h.streamed("c") == expected_tokens(prompt(5, base=900), 3)
    assert h.sched.kv.stats().active_blocks == 0
