"""The scheduler's cycle against the fake executor: exact plans, exact tokens."""

from __future__ import annotations

from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import CopyPrefix, SamplingParams, SeqSlice, Truncate
from quanta_core.requests import ChoiceFinished, FinishReason, TokenEvent
from quanta_core.scheduler import Scheduler
from tests.scheduler_harness import Harness, expected_tokens, prompt


def test_one_request_prefills_then_decodes_to_max_tokens() -> None:
    h = Harness.make()
    p = prompt(20)
    h.submit("a", p, max_tokens=5)
    h.run()
    want = expected_tokens(p, 5)
    assert h.plans[0].slices == (SeqSlice(0, p, 0, True, "a/0"),)
    assert h.plans[1].slices == (SeqSlice(0, (want[0],), 20, True, "a/0"),)
    assert len(h.executor.steps) == 6  # 5 tokens, then the frees
    assert h.streamed("a") == want
    res = h.results()["a", 0]
    assert res.finish_reason is FinishReason.LENGTH
    assert (res.prompt_tokens, res.completion_tokens, res.output_tokens) == (20, 5, tuple(want))
    assert res.timings.first_scheduled == 0.0 and res.timings.first_token == 0.01
    assert res.token_times == (0.01, 0.02, 0.03, 0.04, 0.05)
    # its freed sequence stays as a cache holder of its one full block
    assert h.plans[-1].kv_ops == (Truncate(0, 16),) and h.plans[-1].release == ("a/0",)
    assert h.plans[-1].slices == ()
    assert h.sched.kv.holders() == [0]


def test_end_of_generation_is_counted_not_emitted() -> None:
    h = Harness.make(FakeExecutor(eos_after={"a/0": 3}))
    h.submit("a", prompt(5), max_tokens=10)
    h.run()
    res = h.results()["a", 0]
    assert res.finish_reason is FinishReason.STOP
    assert h.streamed("a") == expected_tokens(prompt(5), 2)
    assert (res.completion_tokens, len(res.output_tokens)) == (3, 2)


def test_ignore_eos_is_passed_to_the_worker_and_runs_to_length() -> None:
    h = Harness.make()
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    h.submit("a", prompt(5), max_tokens=3, sampling=params)
    h.run()
    assert all(s.sampling.ignore_eos for p in h.plans for s in p.slices)
    assert h.results()["a", 0].finish_reason is FinishReason.LENGTH


def test_context_full_ends_with_length() -> None:
    h = Harness.make(FakeExecutor(n_ctx=64))
    h.submit("a", prompt(60), max_tokens=100)
    h.run()
    res = h.results()["a", 0]
    assert res.finish_reason is FinishReason.LENGTH
    assert res.completion_tokens == 4  # 60 + 4 == n_ctx: the 4th cannot be computed


def test_requests_that_can_never_run_are_rejected_at_once() -> None:
    h = Harness.make(FakeExecutor(n_ctx=64))
    h.submit("long", prompt(64), max_tokens=1)
    h.submit("empty", (), max_tokens=1)
    h.submit("vocab", (5, 5000), max_tokens=1)
    h.submit("zero", prompt(3), max_tokens=0)
    results = h.results()
    assert {k[0] for k in results} == {"long", "empty", "vocab", "zero"}
    assert all(r.finish_reason is FinishReason.REJECTED and r.error for r in results.values())
    assert not h.sched.has_work


def test_chunked_prefill_never_stalls_running_decodes() -> None:
    h = Harness.make(token_budget=16)
    h.submit("a", prompt(4), max_tokens=20)
    h.cycle()
    h.submit("b", prompt(40, base=500), max_tokens=2)
    for _ in range(4):
        h.cycle()
    # a decodes one token a step; b's prompt is chunked into what is left of the budget
    assert [[(s.seq, s.start_pos, len(s.tokens), s.sample) for s in p.slices] for p in h.plans] == [
        [(0, 0, 4, True)],
        [(0, 4, 1, True), (1, 0, 15, False)],
        [(0, 5, 1, True), (1, 15, 15, False)],
        [(0, 6, 1, True), (1, 30, 10, True)],
        [(0, 7, 1, True), (1, 40, 1, True)],
    ]
    h.run()
    assert h.streamed("b") == expected_tokens(prompt(40, base=500), 2)
    assert h.streamed("a") == expected_tokens(prompt(4), 20)


def test_prefix_hit_is_a_copy_prefix_and_only_the_rest_is_computed() -> None:
    h = Harness.make()
    p = prompt(40)
    h.submit("a", p, max_tokens=2)
    h.run()
    q = (*p, 7, 8, 9)
    h.submit("b", q, max_tokens=3)
    h.run()
    first_b = next(pl for pl in h.plans if any(s.owner == "b/0" for s in pl.slices))
    assert first_b.kv_ops == (CopyPrefix(src=0, dst=1, n_tokens=32),)
    assert first_b.slices == (SeqSlice(1, q[32:], 32, True, "b/0"),)
    res = h.results()["b", 0]
    assert res.cached_tokens == 32
    assert h.streamed("b") == expected_tokens(q, 3)
    stats = h.sched.stats()
    assert (stats.prefix_cache_hits, stats.prefix_cache_queries) == (32, 40 + 43)


def test_n_choices_share_the_prompt_and_compute_only_the_last_token() -> None:
    h = Harness.make()
    p = prompt(20)
    h.submit("a", p, max_tokens=3, n=3)
    h.run()
    assert h.plans[0].slices == (SeqSlice(0, p, 0, True, "a/0"),)
    assert h.plans[1].kv_ops == (
        CopyPrefix(src=0, dst=1, n_tokens=19),
        CopyPrefix(src=0, dst=2, n_tokens=19),
    )
    assert [(s.seq, s.start_pos, s.tokens, s.owner) for s in h.plans[1].slices[1:]] == [
        (1, 19, (p[-1],), "a/1"),
        (2, 19, (p[-1],), "a/2"),
    ]
    results = h.results()
    assert [results["a", i].cached_tokens for i in range(3)] == [0, 19, 19]
    for i in range(3):  # the fake samples from content: every choice sees the same sequence
        assert h.streamed("a", i) == expected_tokens(p, 3)


def test_cancel_frees_blocks_at_the_next_cycle() -> None:
    h = Harness.make()
    h.submit("a", prompt(40), max_tokens=50)
    h.submit("b", prompt(8, base=300), max_tokens=50)
    h.cycle()
    h.cycle()
    assert h.sched.stats().kv_usage == 4 / 256
    assert h.sched.cancel("a")
    assert not h.sched.cancel("nope")
    plan = h.cycle()
    assert plan.kv_ops == (Truncate(0, 32),)  # its two full blocks stay cached
    assert plan.release == ("a/0",)
    assert [s.owner for s in plan.slices] == ["b/0"]
    res = h.results()["a", 0]
    assert res.finish_reason is FinishReason.CANCELLED and res.completion_tokens == 2
    assert h.sched.stats().kv_usage == 1 / 256
    h.sched.cancel("b")
    h.run()
    assert h.sched.stats().kv_usage == 0.0
    assert h.sched.kv.stats().active_blocks == 0


def test_cancel_of_a_waiting_request_never_runs_it() -> None:
    h = Harness.make(policy="sequential")
    h.submit("a", prompt(4), max_tokens=3)
    h.submit("b", prompt(4, base=300), max_tokens=3)
    h.cycle()
    h.sched.cancel("b")
    h.run()
    assert h.results()["b", 0].finish_reason is FinishReason.CANCELLED
    assert all(s.owner == "a/0" for p in h.plans for s in p.slices)


def test_with_a_stream_per_sequence_a_prompt_is_shared_by_its_slot_and_a_stream_copy() -> None:
    h = Harness.make(FakeExecutor(n_ctx=256, n_seq_max=4, kv_unified=False))
    p = prompt(40)
    h.submit("a", p, max_tokens=2)
    h.run()
    assert h.sched.kv.holders() == [0]  # a's slot keeps its tokens
    h.submit("b", p, max_tokens=70, n=2)
    h.run()
    copies = [op for plan in h.plans for op in plan.kv_ops if isinstance(op, CopyPrefix)]
    # A free slot and a copy as cheap as a token's compute (the fake's bytes): b/0 copies
    # a's stream (two blocks hit) and a's slot keeps its tail; b/1 copies b/0's prompt.
    assert copies == [CopyPrefix(src=0, dst=1, n_tokens=32), CopyPrefix(src=1, dst=2, n_tokens=39)]
    assert [h.results()["b", i].cached_tokens for i in range(2)] == [32, 39]
    # each stream is n_ctx / n_seq_max = 64 cells: 40 + 24 tokens fill it
    assert [h.results()["b", i].completion_tokens for i in range(2)] == [24, 24]
    assert h.results()["b", 0].finish_reason is FinishReason.LENGTH


def test_choices_of_a_seeded_request_draw_with_distinct_seeds() -> None:
    from quanta_core.engine.types import SamplingParams

    h = Harness.make()
    h.submit("s", prompt(8), 2, sampling=SamplingParams(seed=7), n=3)
    h.run()
    seeds = {s.owner: s.sampling.seed for p in h.plans for s in p.slices}
    assert seeds == {"s/0": 7, "s/1": 8, "s/2": 9}


def test_without_token_events_only_the_finishes_are_told_and_nothing_else_changes() -> None:
    runs = []
    for token_events in (True, False):
        h = Harness.make()
        h.sched = Scheduler(h.sched.config, h.executor.info, h.clock, token_events=token_events)
        h.submit("a", prompt(20), max_tokens=5)
        h.submit("b", prompt(30, base=300), max_tokens=3, n=2)
        h.run()
        runs.append(h)
    told, quiet = runs
    assert quiet.plans == told.plans
    assert not any(isinstance(e, TokenEvent) for e in quiet.events)
    assert [e for e in quiet.events if isinstance(e, ChoiceFinished)] == [
        e for e in told.events if isinstance(e, ChoiceFinished)
    ]
    assert quiet.results()["a", 0].output_tokens == tuple(told.streamed("a"))
