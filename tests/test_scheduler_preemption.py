"""Out of memory: stash (KV to host RAM) or recompute, chosen by cost; never a lost token."""

from __future__ import annotations

from quanta_core.engine.fake import KV_BYTES_PER_TOKEN, FakeExecutor
from quanta_core.engine.types import Restore, Stash, Truncate
from quanta_core.scheduler.preemption import PreemptionCosts, PreemptMode
from tests.scheduler_harness import Harness, expected_tokens, prompt

PROMPTS = {"a": prompt(16), "b": prompt(16, base=300), "c": prompt(32, base=600)}


def crowded(**config: object) -> Harness:
    """4 blocks of 16 tokens, three requests whose prompts fill them all."""
    h = Harness.make(FakeExecutor(n_ctx=64), enable_prefix_cache=False, **config)
    for rid, p in PROMPTS.items():
        h.submit(rid, p, max_tokens=6)
    return h


def assert_streams_exact(h: Harness) -> None:
    for rid, p in PROMPTS.items():
        assert h.streamed(rid) == expected_tokens(p, 6), rid
        assert h.results()[rid, 0].output_tokens == tuple(expected_tokens(p, 6))


def test_costs_pick_stash_for_long_sequences_and_recompute_for_empty_ones() -> None:
    costs = PreemptionCosts(23_040, 4.6e9, 220.0, stash_budget_bytes=1 << 30)
    assert costs.choose(1000, 0) is PreemptMode.STASH  # ~10 ms vs ~4.5 s
    assert costs.choose(0, 0) is PreemptMode.RECOMPUTE
    assert costs.choose(1000, (1 << 30) - 1000) is PreemptMode.RECOMPUTE  # over budget
    slow_copy = PreemptionCosts(23_040, 1e3, 220.0, stash_budget_bytes=1 << 30)
    assert slow_copy.choose(1000, 0) is PreemptMode.RECOMPUTE


def test_stash_then_restore_gives_the_same_tokens() -> None:
    h = crowded()
    h.run()
    ops = [op for p in h.plans for op in p.kv_ops]
    stashes = [op for op in ops if isinstance(op, Stash)]
    restores = [op for op in ops if isinstance(op, Restore)]
    assert stashes[0] == Stash(seq=2, key="c/0#1")
    assert [op.key for op in restores] == [op.key for op in stashes]
    assert_streams_exact(h)
    res = h.results()["c", 0]
    assert res.preemptions == len(stashes)
    # the stash was sized by the engine's bytes per token; the sampler outlived it
    assert h.sched.stats().stash_bytes == 0
    assert not any(s.replay for p in h.plans for s in p.slices)
    assert h.sched.stats().num_preemptions == len(stashes)
    assert h.sched.kv.stats().active_blocks == 0


def test_recompute_when_host_ram_is_out_replays_the_outputs() -> None:
    h = crowded(stash_budget_bytes=0)
    h.run()
    c_first = expected_tokens(PROMPTS["c"], 1)
    assert h.plans[1].kv_ops == (Truncate(seq=2, start=0),)
    assert h.plans[1].release == ("c/0",)  # its sampler goes; a new one gets a replay
    c_slices = [
        (s.seq, s.start_pos, len(s.tokens), s.replay)
        for p in h.plans[2:]
        for s in p.slices
        if s.owner == "c/0"
    ]
    # prompt and first output prefilled again (33 tokens), the output replayed to the sampler
    assert c_slices == [(0, 0, 33, tuple(c_first)), (0, 33, 1, ()), (0, 34, 1, ()),
                        (0, 35, 1, ()), (0, 36, 1, ())]  # fmt: skip
    assert_streams_exact(h)
    assert not any(isinstance(op, Stash) for p in h.plans for op in p.kv_ops)
    assert h.results()["c", 0].preemptions == 1


def test_stash_restores_into_fresh_blocks_and_keeps_the_sampler() -> None:
    h = crowded()
    h.run()
    assert h.plans[1].kv_ops == (Stash(seq=2, key="c/0#1"),)
    assert h.plans[1].release == ()
    assert h.plans[6].kv_ops == (Truncate(0, 0), Truncate(1, 0), Restore(seq=0, key="c/0#1"))
    assert [(s.owner, s.start_pos, len(s.tokens)) for s in h.plans[6].slices] == [("c/0", 32, 1)]


def test_stash_bytes_are_reported_and_count_against_the_budget() -> None:
    h = crowded(stash_budget_bytes=32 * KV_BYTES_PER_TOKEN)
    h.cycle()
    h.cycle()
    assert h.sched.stats().num_stashes == 1
    assert h.sched.stats().stash_bytes == 32 * KV_BYTES_PER_TOKEN
    h.run()
    assert_streams_exact(h)
