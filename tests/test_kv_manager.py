"""The block manager on a tiny pool: 16-token blocks, 11 blocks, 4 sequence ids."""

from __future__ import annotations

import pytest

from quanta_core.engine.types import CopyPrefix, Restore, Stash, Truncate
from quanta_core.kv import KvIntegrityError, KvManager

BS = 16


def make(num_blocks: int = 11, num_seqs: int = 4, cache: bool = True) -> KvManager:
    return KvManager(num_blocks, BS, num_seqs, enable_prefix_cache=cache)


def toks(n: int, base: int = 100) -> list[int]:
    return list(range(base, base + n))


def run_to(kv: KvManager, seq: int, tokens: list[int]) -> None:
    """Pretend the engine computed every token of ``tokens`` in ``seq``."""
    assert kv.grow(seq, len(tokens))
    kv.commit(seq, tokens, len(tokens))
    kv.check_integrity()


def computed_pair(kv: KvManager, n: int) -> tuple[list[int], list[int]]:
    """Sequences 0 and 1 admitted with distinct ``n``-token prompts, all computed."""
    first, second = toks(n, base=100), toks(n, base=500)
    for seq, tokens in ((0, first), (1, second)):
        assert kv.allocate(tokens, 512) is not None
        kv.commit(seq, tokens, n)
    return first, second


def test_admit_takes_lowest_blocks_and_seq() -> None:
    kv = make()
    adm = kv.allocate(toks(40), budget=512)
    assert adm is not None
    assert (adm.seq, adm.num_computed, adm.num_new, adm.cached_tokens) == (0, 0, 40, 0)
    assert kv.table(0) == [0, 1, 2]
    assert kv.drain_ops() == []
    stats = kv.stats()
    assert (stats.active_blocks, stats.free_blocks, stats.waste_tokens) == (3, 8, 8)
    kv.check_integrity()


def test_budget_limits_the_first_chunk() -> None:
    kv = make()
    adm = kv.allocate(toks(100), budget=20)
    assert adm is not None and adm.num_new == 20
    assert kv.table(0) == [0, 1]
    assert kv.grow(0, 52)
    assert kv.table(0) == [0, 1, 2, 3]
    kv.check_integrity()


def test_finished_sequence_keeps_its_full_blocks_as_a_cache_holder() -> None:
    kv = make()
    prompt = toks(40)
    assert kv.allocate(prompt, 512) is not None
    kv.commit(0, prompt, 40)
    kv.free(0, num_computed=40)
    assert kv.drain_ops() == [Truncate(seq=0, start=32)]  # the partial tail goes
    assert kv.holders() == [0]
    assert kv.table(0) == [0, 1]
    stats = kv.stats()
    assert (stats.active_blocks, stats.cached_blocks, stats.free_blocks) == (0, 2, 9)
    assert list(kv.pool.lru) == [1, 0]  # the deepest block is evicted first
    kv.check_integrity()


def test_prefix_hit_becomes_copy_prefix_and_reuses_blocks() -> None:
    kv = make()
    prompt = toks(40)
    kv.allocate(prompt, 512)
    kv.commit(0, prompt, 40)
    kv.free(0, 40)
    kv.drain_ops()
    adm = kv.allocate([*prompt[:32], 7, 8, 9], 512)
    assert adm is not None
    assert (adm.seq, adm.num_computed, adm.num_new, adm.cached_tokens) == (1, 32, 3, 32)
    assert kv.drain_ops() == [CopyPrefix(src=0, dst=1, n_tokens=32)]
    # blocks 0, 1 shared; the fresh one is the free queue's head (block 2 went to its tail)
    assert kv.table(1) == [0, 1, 3]
    stats = kv.stats()
    assert (stats.active_blocks, stats.cached_blocks, stats.prefix_hits) == (3, 0, 32)
    assert stats.prefix_queries == 40 + 35
    kv.check_integrity()


def test_the_whole_prompt_is_never_taken_from_the_cache() -> None:
    kv = make()
    prompt = toks(32)
    kv.allocate(prompt, 512)
    kv.commit(0, prompt, 32)
    kv.free(0, 32)
    kv.drain_ops()
    adm = kv.allocate(prompt, 512)
    assert adm is not None
    assert (adm.num_computed, adm.num_new) == (16, 16)  # the last token must make logits
    assert kv.drain_ops() == [CopyPrefix(src=0, dst=1, n_tokens=16)]
    assert kv.table(1) == [0, 2]
    kv.check_integrity()


def test_running_sequence_is_a_copy_source_once_its_blocks_are_computed() -> None:
    kv = make()
    prompt = toks(40)
    kv.allocate(prompt, 512)
    assert kv.allocate(prompt, 512) is not None  # not yet computed: no hit
    assert kv.drain_ops() == []
    kv.commit(0, prompt, 40)
    adm = kv.allocate(prompt, 512)
    assert adm is not None and adm.seq == 2
    assert kv.drain_ops() == [CopyPrefix(src=0, dst=2, n_tokens=32)]
    assert kv.table(2) == [0, 1, 6]
    kv.check_integrity()


def test_lru_eviction_order_and_truncate_ops() -> None:
    kv = make(num_blocks=11, num_seqs=8)
    a, b = toks(48, base=100), toks(48, base=300)
    for tokens in (a, b):
        adm = kv.allocate(tokens, 512)
        assert adm is not None
        kv.commit(adm.seq, tokens, 48)
    kv.free(0, 48)  # a: blocks 0 1 2
    kv.free(1, 48)  # b: blocks 3 4 5
    kv.drain_ops()
    assert list(kv.pool.lru) == [2, 1, 0, 5, 4, 3]
    # 5 free blocks; a 128-token request needs 8: evicts 3 cached blocks, oldest first
    adm = kv.allocate(toks(128, base=500), 512)
    assert adm is not None and adm.seq == 2
    # Three blocks of holder 0 evicted tail first: one truncate to 0, not 32, 16, 0.
    assert kv.drain_ops() == [Truncate(seq=0, start=0)]
    assert kv.table(adm.seq) == [6, 7, 8, 9, 10, 2, 1, 0]
    assert kv.holders() == [1]
    assert list(kv.pool.lru) == [5, 4, 3]
    kv.check_integrity()


def test_a_cache_limit_evicts_the_least_recently_used_at_once() -> None:
    # Room for 11 blocks, but at most 3 cached: cached cells cost the engine time each step.
    kv = KvManager(11, BS, 4, enable_prefix_cache=True, max_cached_blocks=3)
    _, second = computed_pair(kv, 32)
    kv.free(0, num_computed=32)
    assert kv.stats().cached_blocks == 2 and kv.drain_ops() == [Truncate(seq=0, start=32)]
    kv.free(1, num_computed=32)
    # 4 cached > 3: the least recently used goes (seq 0's tail: a holder's deepest first).
    assert kv.drain_ops() == [Truncate(seq=1, start=32), Truncate(seq=0, start=16)]
    assert kv.holders() == [0, 1]
    assert kv.stats().cached_blocks == 3
    kv.check_integrity()
    # What is left still hits.
    adm = kv.allocate([*second, 7, 8], 512)
    assert adm is not None and adm.cached_tokens == 32


def test_a_cache_limit_cuts_a_holders_tail_once_and_stops_at_the_limit() -> None:
    kv = KvManager(11, BS, 4, enable_prefix_cache=True, max_cached_blocks=4)
    computed_pair(kv, 48)
    kv.free(0, num_computed=48)
    kv.drain_ops()
    kv.free(1, num_computed=48)
    # 6 cached > 4: seq 0's two deepest blocks go, in one cut; its first block stays.
    assert kv.drain_ops() == [Truncate(seq=1, start=48), Truncate(seq=0, start=16)]
    assert kv.table(0) == [0] and kv.table(1) == [3, 4, 5]
    assert kv.stats().cached_blocks == 4
    kv.check_integrity()


def test_evicting_a_shared_parent_truncates_every_holder() -> None:
    kv = make(num_blocks=6, num_seqs=4)
    p = toks(32)
    kv.allocate(p, 512)
    kv.commit(0, p, 32)
    q = [*p[:16], *toks(16, base=900)]
    kv.allocate(q, 512)  # hits block 0 of seq 0
    kv.commit(1, q, 32)
    kv.free(0, 32)
    kv.free(1, 32)
    kv.drain_ops()
    assert kv.table(0) == [0, 1] and kv.table(1) == [0, 2]
    assert list(kv.pool.lru) == [1, 2, 0]
    # Take everything: 3 free + 3 cached. Block 0 goes with every holder that holds it.
    adm = kv.allocate(toks(96, base=2000), 512)
    assert adm is not None and adm.seq == 2
    assert kv.drain_ops() == [
        Truncate(seq=0, start=16),
        Truncate(seq=1, start=16),
        Truncate(seq=0, start=0),
        Truncate(seq=1, start=0),
    ]
    assert kv.table(2) == [3, 4, 5, 1, 2, 0]
    assert kv.holders() == []
    kv.check_integrity()


def test_out_of_blocks_changes_nothing() -> None:
    kv = make(num_blocks=3)
    assert kv.allocate(toks(64), 512) is None
    assert kv.drain_ops() == []
    assert kv.stats().free_blocks == 3
    assert kv.num_seqs_available == 4
    kv.check_integrity()


def test_holders_give_up_their_sequence_ids_when_ids_run_out() -> None:
    kv = make(num_blocks=11, num_seqs=2)
    for base in (100, 300):
        t = toks(16, base=base)
        adm = kv.allocate(t, 512)
        assert adm is not None
        kv.commit(adm.seq, t, 16)
        kv.free(adm.seq, 16)
    kv.drain_ops()
    assert kv.holders() == [0, 1]
    adm = kv.allocate(toks(5, base=700), 512)
    assert adm is not None and adm.seq == 0
    assert kv.drain_ops() == [Truncate(seq=0, start=0)]
    assert kv.holders() == [1]
    kv.check_integrity()


def test_hit_whose_holder_is_the_only_reclaimable_id_falls_back_to_computing() -> None:
    kv = make(num_blocks=11, num_seqs=2)
    p = toks(33)
    kv.allocate(p, 512)
    kv.commit(0, p, 33)
    kv.free(0, 33)
    kv.allocate(toks(4, base=800), 512)  # seq 1 runs
    kv.drain_ops()
    adm = kv.allocate(p, 512)
    assert adm is not None
    assert (adm.seq, adm.num_computed, adm.num_new) == (0, 0, 33)
    assert kv.drain_ops() == [Truncate(seq=0, start=0)]
    kv.check_integrity()


def test_sibling_copy_shares_full_blocks_and_gets_a_private_tail() -> None:
    kv = make()
    prompt = toks(40)
    kv.allocate(prompt, 512)
    kv.commit(0, prompt, 40)
    kv.grow(0, 41)
    adm = kv.allocate(prompt, 512, copy_from=(0, 39))
    assert adm is not None
    assert (adm.seq, adm.num_computed, adm.num_new, adm.cached_tokens) == (1, 39, 1, 0)
    assert kv.drain_ops() == [CopyPrefix(src=0, dst=1, n_tokens=39)]
    assert kv.table(0) == [0, 1, 2]
    assert kv.table(1) == [0, 1, 3]
    kv.check_integrity()


def test_stash_frees_blocks_and_restore_takes_fresh_ones() -> None:
    kv = make()
    prompt = toks(40)
    kv.allocate(prompt, 512)
    kv.commit(0, prompt, 40)
    kv.stash(0, "r/0#1")
    assert kv.drain_ops() == [Stash(seq=0, key="r/0#1")]
    assert kv.stats().free_blocks == 11
    kv.check_integrity()
    adm = kv.restore("r/0#1", [*prompt, 5], n_stashed=40, budget=512)
    assert adm is not None
    assert (adm.seq, adm.num_computed, adm.num_new) == (0, 40, 1)
    assert kv.drain_ops() == [Restore(seq=0, key="r/0#1")]
    assert kv.table(0) == [3, 4, 5]
    kv.check_integrity()


def test_restore_evicts_cached_blocks_before_it_reads_the_stash() -> None:
    """The engine needs the stash's cells free when it reads it: the truncation of the
    cached blocks that make the room comes first in the ops."""
    kv = make()
    prompt = toks(40)
    kv.allocate(prompt, 512)
    kv.commit(0, prompt, 40)
    kv.stash(0, "r/0#1")
    cached = toks(144, base=900)  # 9 full blocks, kept as a cache holder: 2 blocks free
    kv.allocate(cached, 512)
    run_to(kv, 0, cached)
    kv.free(0, 144)
    kv.drain_ops()
    adm = kv.restore("r/0#1", [*prompt, 5], n_stashed=40, budget=512)
    assert adm is not None and adm.seq == 1
    assert kv.drain_ops() == [Truncate(seq=0, start=8 * BS), Restore(seq=1, key="r/0#1")]
    kv.check_integrity()


def test_without_prefix_cache_free_drops_everything() -> None:
    kv = make(cache=False)
    prompt = toks(40)
    kv.allocate(prompt, 512)
    kv.commit(0, prompt, 40)
    kv.free(0, 40)
    assert kv.drain_ops() == [Truncate(seq=0, start=0)]
    assert kv.holders() == []
    adm = kv.allocate(prompt, 512)
    assert adm is not None and adm.num_computed == 0
    assert kv.stats().prefix_queries == 0
    kv.check_integrity()


def test_reset_forgets_everything_and_can_wipe_the_engine() -> None:
    kv = make(num_seqs=2)
    kv.allocate(toks(40), 512)
    kv.reset(wipe_engine=True)
    assert kv.drain_ops() == [Truncate(seq=0, start=0), Truncate(seq=1, start=0)]
    assert kv.stats().free_blocks == 11
    kv.check_integrity()


def test_integrity_check_catches_a_leak_and_a_double_free() -> None:
    kv = make()
    kv.allocate(toks(40), 512)
    block = kv.pool.blocks[1]
    block.seqs.discard(0)  # a table still lists it: leak
    with pytest.raises(KvIntegrityError):
        kv.check_integrity()
    kv = make()
    kv.allocate(toks(40), 512)
    kv.pool.free.append(0)  # freed while held
    with pytest.raises(KvIntegrityError):
        kv.check_integrity()
    kv = make()
    kv.allocate(toks(40), 512)
    kv.free(0, 40)
    with pytest.raises(KvIntegrityError):
        kv.free(0, 40)
