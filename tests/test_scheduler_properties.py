"""Property tests: random submits, cancels, finishes and crashes never leak a block.

Every plan is checked by the fake executor's KV mirror (a wrong position or copy would be
refused, and show up as an ERROR), the block accounting is checked after every operation,
and the engine's sequences must hold exactly what the scheduler believes they hold.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.kv_mirror import KvMirror
from quanta_core.engine.types import StepPlan
from quanta_core.kv import KvManager
from quanta_core.requests import FinishReason, SloClass
from quanta_core.scheduler import QueueBound, SloConfig
from quanta_core.scheduler.choice import ChoiceStatus
from tests.scheduler_harness import Harness, expected_tokens

BS = 16
PREFIXES = [tuple(range(100, 140)), tuple(range(300, 324)), ()]
TENANTS = [("a", 1.0), ("b", 2.0), ("c", 0.5)]
# Tiny queues and fast aging: the fair policies reject, shed and promote all the time.
TIGHT = SloConfig(
    batch_aging_s=0.03,
    interactive_queue=QueueBound(4, 300),
    batch_queue=QueueBound(3, 200),
    total_queue=QueueBound(5, 400),
)


def engine_matches_scheduler(h: Harness) -> None:
    """Once the ops decided since the last step ran, the engine holds what we think it does."""
    mirror = h.executor.mirror
    scratch = KvMirror(mirror.n_seq_max, mirror.n_ctx, mirror.n_batch, mirror.n_vocab)
    scratch.lengths = dict(mirror.lengths)
    scratch.stash_lengths = dict(mirror.stash_lengths)
    scratch.apply(StepPlan(kv_ops=h.sched.kv.pending_ops))
    held = scratch.lengths
    kv = h.sched.kv
    if isinstance(kv, KvManager):
        want = {seq: len(kv.table(seq)) * BS for seq in kv.holders()}
    else:  # an idle slot keeps every token its sequence computed
        want = {seq: kv.num_tokens(seq) for seq in kv.holders()}
    for r in h.sched.running:
        assert r.seq is not None
        if r.num_computed_tokens:
            want[r.seq] = r.num_computed_tokens
    assert held == want


requests = st.tuples(
    st.sampled_from(range(len(PREFIXES))),  # shared prefix
    st.integers(1, 30),  # own tokens
    st.integers(1, 12),  # max_tokens
    st.integers(1, 3),  # n
    st.one_of(st.none(), st.integers(1, 6)),  # end of generation after k tokens
    st.sampled_from(range(len(TENANTS))),  # tenant (and its weight)
    st.sampled_from(list(SloClass)),
)
actions = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), requests),
        st.tuples(st.just("cycle"), st.integers(1, 4)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("crash"), st.integers(0, 3)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    actions=actions,
    n_ctx=st.sampled_from([96, 160, 256]),
    n_seq_max=st.integers(2, 6),
    budget=st.sampled_from([8, 24, 64]),
    stash_budget=st.sampled_from([0, 64 * 1024, 1 << 30]),
    policy=st.sampled_from(["fcfs", "static", "sequential", "vtc", "slo", "horizon"]),
    cache=st.booleans(),
    slo=st.sampled_from([SloConfig(), TIGHT]),
    kv_unified=st.booleans(),
)
def test_random_workloads_never_leak_and_never_lose_a_token(
    actions: list[tuple[str, object]],
    n_ctx: int,
    n_seq_max: int,
    budget: int,
    stash_budget: int,
    policy: str,
    cache: bool,
    slo: SloConfig,
    kv_unified: bool,
) -> None:
    eos: dict[str, int] = {}
    executor = FakeExecutor(n_ctx=n_ctx, n_seq_max=n_seq_max, eos_after=eos, kv_unified=kv_unified)
    h = Harness.make(
        executor,
        policy=policy,
        token_budget=budget,
        stash_budget_bytes=stash_budget,
        enable_prefix_cache=cache,
        max_engine_deaths_per_request=100,
        slo=slo,
    )
    submitted: dict[str, tuple[tuple[int, ...], int, int, int | None]] = {}
    for kind, arg in actions:
        if kind == "submit":
            prefix_i, own, max_tokens, n, eos_k, tenant_i, slo_class = arg  # type: ignore[misc]
            rid = f"r{len(submitted)}"
            p = PREFIXES[prefix_i] + tuple(
                range(700 + 40 * len(submitted), 700 + 40 * len(submitted) + own)
            )
            p = p[: n_ctx - 1]
            submitted[rid] = (p, max_tokens, n, eos_k)
            if eos_k is not None:
                for i in range(n):
                    eos[f"{rid}/{i}"] = eos_k
            tenant, weight = TENANTS[tenant_i]
            h.submit(
                rid,
                p,
                max_tokens=max_tokens,
                n=n,
                tenant=tenant,
                weight=weight,
                slo_class=slo_class,
            )
        elif kind == "cycle":
            for _ in range(arg):  # type: ignore[call-overload]
                if h.sched.has_work:
                    h.cycle()
                    engine_matches_scheduler(h)
        elif kind == "cancel":
            h.sched.cancel(f"r{arg}")
        elif kind == "crash":
            executor.crash_at_step = len(executor.steps) + arg  # type: ignore[operator]
        h.sched.check_integrity()
    executor.crash_at_step = None
    h.run()
    engine_matches_scheduler(h)
    assert h.sched.kv.stats().active_blocks == 0
    assert executor.memory_stats().n_stashes == 0
    assert h.sched.stats().stash_bytes == 0
    results = h.results()
    finished = [e.result for e in h.events if hasattr(e, "result")]
    assert len(finished) == len(results)  # each choice finished exactly once
    for rid, (p, max_tokens, n, eos_k) in submitted.items():
        for i in range(n):
            res = results[rid, i]
            assert res.finish_reason is not FinishReason.ERROR, res.error
            streamed = h.streamed(rid, i)
            assert tuple(streamed) == res.output_tokens
            # whatever it got is exactly the start of what the engine would generate
            assert streamed == expected_tokens(p, len(streamed))
            if res.finish_reason is FinishReason.LENGTH:
                assert len(streamed) == min(max_tokens, h.sched.max_seq_tokens - len(p))
            if res.finish_reason is FinishReason.STOP:
                assert eos_k is not None and res.completion_tokens == eos_k
    assert all(r.status is ChoiceStatus.FINISHED for r in h.sched.open_choices())
    for res in results.values():
        if res.finish_reason is FinishReason.REJECTED and res.rejection is not None:
            # a load rejection (or a shed) never threw work away, and says when to come back
            assert res.preemptions == 0 and res.timings.first_scheduled is None
            assert res.retry_after_s is not None and res.retry_after_s > 0
    stats = h.sched.stats()
    assert stats.num_waiting == stats.num_running == 0
    assert all(t.waiting == t.running == 0 for t in stats.tenants)


kv_ops = st.lists(
    st.tuples(st.sampled_from(["admit", "grow", "free", "stash", "restore"]), st.integers(0, 50)),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=kv_ops, num_blocks=st.integers(2, 12), num_seqs=st.integers(1, 5))
def test_block_manager_operations_keep_the_books_exact(
    ops: list[tuple[str, int]], num_blocks: int, num_seqs: int
) -> None:
    kv = KvManager(num_blocks, 4, num_seqs)
    live: dict[int, list[int]] = {}  # seq -> tokens computed
    stashes: dict[str, list[int]] = {}
    for i, (op, x) in enumerate(ops):
        if op == "admit":
            tokens = [x % 3] * (1 + x % 9) + [i]
            adm = kv.allocate(tokens, budget=1 + x % 7)
            if adm is not None:
                assert adm.seq not in live
                done = adm.num_computed + adm.num_new
                kv.commit(adm.seq, tokens, done)
                live[adm.seq] = tokens[:done]
        elif op == "grow" and live:
            seq = sorted(live)[x % len(live)]
            extra = [x] * (1 + x % 5)
            if kv.grow(seq, len(live[seq]) + len(extra)):
                live[seq] += extra
                kv.commit(seq, live[seq], len(live[seq]))
        elif op == "free" and live:
            seq = sorted(live)[x % len(live)]
            kv.free(seq, len(live.pop(seq)), keep_cache=x % 2 == 0)
        elif op == "stash" and live:
            seq = sorted(live)[x % len(live)]
            key = f"k{i}"
            kv.stash(seq, key)
            stashes[key] = live.pop(seq)
        elif op == "restore" and stashes:
            key = sorted(stashes)[x % len(stashes)]
            tokens = [*stashes[key], x]
            adm = kv.restore(key, tokens, len(stashes[key]), budget=1)
            if adm is not None:
                del stashes[key]
                kv.commit(adm.seq, tokens, len(tokens))
                live[adm.seq] = tokens
        kv.check_integrity()
        stats = kv.stats()
        assert stats.active_blocks + stats.cached_blocks + stats.free_blocks == num_blocks
    for seq, tokens in list(live.items()):
        kv.free(seq, len(tokens))
        kv.check_integrity()
    assert kv.stats().active_blocks == 0
