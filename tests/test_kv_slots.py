"""The slot manager (a KV stream per sequence) on tiny slots: 4 slots of 64 tokens, 16-token
blocks. Integrity is checked after every operation; the random test also replays every op
on a model of the engine's streams and checks each sequence holds the tokens it is said to."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta_core.engine.types import CopyPrefix, DropStash, KvOp, Restore, Stash, Truncate
from quanta_core.kv import KvIntegrityError
from quanta_core.kv.prefix_cache import BlockChain, root_hash
from quanta_core.kv.slots import SlotManager, SlotRole
from quanta_core.sim.steady import start_stays_blocked, steps_from_free

BS = 16


def make(num_slots: int = 4, slot_tokens: int = 64, min_copy: int = 0) -> SlotManager:
    return SlotManager(num_slots, slot_tokens, BS, min_copy_tokens=min_copy)


def toks(n: int, base: int = 100) -> list[int]:
    return list(range(base, base + n))


def finish(kv: SlotManager, seq: int, tokens: list[int]) -> None:
    """The engine computed all of ``tokens`` in ``seq``, which then finished."""
    assert kv.grow(seq, len(tokens))
    kv.commit(seq, tokens, len(tokens))
    kv.free(seq, len(tokens))
    kv.check_integrity()


def test_a_plain_start_takes_the_lowest_free_slot() -> None:
    kv = make()
    adm = kv.allocate(toks(40), budget=512)
    assert adm is not None
    assert (adm.seq, adm.num_computed, adm.num_new, adm.cached_tokens) == (0, 0, 40, 0)
    assert kv.drain_ops() == []
    assert kv.role(0) is SlotRole.ACTIVE and kv.num_seqs_available == 3
    kv.check_integrity()


def test_a_request_longer_than_a_slot_never_starts() -> None:
    kv = make()
    assert kv.allocate(toks(65), 512) is None
    assert start_stays_blocked(kv, toks(65), 512)
    assert kv.drain_ops() == [] and kv.num_free_slots == 4


def test_growth_is_bounded_by_the_slot_and_takes_nothing_from_others() -> None:
    kv = make()
    kv.allocate(toks(10), 512)
    assert kv.grow(0, 64)
    assert not kv.grow(0, 65)
    assert steps_from_free(kv, [(0, 60, 1)], limit=100) == 4
    kv.check_integrity()


def test_a_finished_sequence_keeps_its_slot_as_an_idle_holder() -> None:
    kv = make()
    kv.allocate(toks(40), 512)
    finish(kv, 0, toks(40))
    assert kv.drain_ops() == []  # nothing to tell the engine: the tokens stay
    assert kv.holders() == [0] and kv.role(0) is SlotRole.HOLDER
    assert kv.num_seqs_available == 4
    stats = kv.stats()
    assert (stats.active_blocks, stats.cached_blocks) == (0, 3)


def test_a_hit_without_a_free_slot_takes_the_holders_slot_and_cuts_its_tail() -> None:
    kv = make(num_slots=2)
    kv.allocate(toks(40), 512)
    finish(kv, 0, toks(40))
    kv.allocate(toks(8, base=900), 512)  # slot 1 runs: no free slot left
    adm = kv.allocate([*toks(32), 7, 8], 512)
    assert adm is not None
    assert (adm.seq, adm.num_computed, adm.num_new, adm.cached_tokens) == (0, 32, 2, 32)
    assert kv.drain_ops() == [Truncate(seq=0, start=32)]
    assert kv.holders() == []
    assert (kv.stats().prefix_hits, kv.stats().prefix_queries) == (32, 40 + 8 + 34)
    kv.check_integrity()


def test_a_hit_whose_holder_has_a_worthwhile_tail_copies_the_stream_to_a_free_slot() -> None:
    kv = make(min_copy=8)
    kv.allocate(toks(60), 512)
    finish(kv, 0, toks(60))
    adm = kv.allocate([*toks(32), 7, 8], 512)  # hits 32; the holder's 28 more are kept
    assert adm is not None and (adm.seq, adm.num_computed, adm.cached_tokens) == (1, 32, 32)
    assert kv.drain_ops() == [CopyPrefix(src=0, dst=1, n_tokens=32)]
    assert kv.holders() == [0] and kv.num_tokens(0) == 60
    kv.check_integrity()


def test_a_short_hit_is_computed_again_rather_than_copied() -> None:
    kv = make(min_copy=40)  # a copy costs as much as 40 tokens of prefill
    kv.allocate(toks(60), 512)
    finish(kv, 0, toks(60))
    # a 16-token hit: cheaper to compute than a copy; the holder's 44 more are worth keeping
    adm = kv.allocate([*toks(16), 7, 8], 512)
    assert adm is not None and (adm.seq, adm.num_computed, adm.cached_tokens) == (1, 0, 0)
    assert kv.drain_ops() == []
    assert kv.holders() == [0]  # untouched, for a longer hit later
    kv.check_integrity()


def test_a_running_sequence_is_copied_once_its_blocks_are_computed() -> None:
    kv = make()
    prompt = toks(40)
    kv.allocate(prompt, 512)
    assert kv.allocate(prompt, 512) is not None  # nothing computed yet: no hit
    kv.commit(0, prompt, 40)
    adm = kv.allocate(prompt, 512)
    assert adm is not None and (adm.seq, adm.num_computed, adm.num_new) == (2, 32, 8)
    assert kv.drain_ops() == [CopyPrefix(src=0, dst=2, n_tokens=32)]
    kv.check_integrity()


def test_no_hit_across_cache_salts() -> None:
    kv = make()
    prompt = toks(40)
    a = BlockChain(root=root_hash("tenant-a"))
    adm = kv.allocate(prompt, 512, chain=a)
    assert adm is not None
    kv.commit(0, prompt, 40, chain=a)
    kv.free(0, 40)
    b = kv.allocate([*prompt, 1], 512, chain=BlockChain(root=root_hash("tenant-b")))
    assert b is not None and b.cached_tokens == 0
    again = kv.allocate([*prompt, 2], 512, chain=BlockChain(root=root_hash("tenant-a")))
    assert again is not None and again.cached_tokens == 32
    kv.check_integrity()


def test_holders_give_up_their_slots_least_recently_used_first() -> None:
    kv = make(num_slots=2)
    for base in (100, 300):
        adm = kv.allocate(toks(20, base=base), 512)
        assert adm is not None
        finish(kv, adm.seq, toks(20, base=base))
    kv.allocate(toks(5, base=700), 512)
    assert kv.drain_ops() == [Truncate(seq=0, start=0)]
    assert kv.holders() == [1]
    kv.check_integrity()


def test_a_sibling_copies_the_running_prompt_when_a_copy_pays() -> None:
    kv = make(min_copy=16)
    prompt = toks(40)
    kv.allocate(prompt, 512)
    kv.commit(0, prompt, 40)
    adm = kv.allocate(prompt, 512, copy_from=(0, 39))
    assert adm is not None and (adm.seq, adm.num_computed, adm.num_new) == (1, 39, 1)
    assert kv.drain_ops() == [CopyPrefix(src=0, dst=1, n_tokens=39)]
    short = kv.allocate(toks(10), 512, copy_from=(0, 9))  # 9 tokens: cheaper to compute
    assert short is not None and short.num_computed == 0
    kv.check_integrity()


def test_a_stream_in_flight_is_neither_restored_into_nor_stashed() -> None:
    kv = make(num_slots=2)
    prompt = toks(40)
    kv.allocate(prompt, 512)
    kv.commit(0, prompt, 40)
    kv.stash(0, "x#1")
    kv.drain_ops()
    kv.allocate(prompt, 512)
    finish(kv, 0, prompt)  # slot 0 holds the prompt
    kv.drain_ops()
    adm = kv.allocate([*prompt, 5], 512)  # copies 0 -> 1 (a free slot, a worthwhile tail)
    assert adm is not None and kv.pending_ops == (CopyPrefix(src=0, dst=1, n_tokens=32),)
    kv.free(1, 0, keep_cache=False)
    # slots 0 and 1 are both in the copy until the plan runs: the restore waits
    assert kv.restore("x#1", [*prompt, 9], 40, 512) is None
    kv.drain_ops()
    assert kv.restore("x#1", [*prompt, 9], 40, 512) is not None
    kv.check_integrity()


def test_stash_empties_the_slot_and_restore_fills_one() -> None:
    kv = make()
    prompt = toks(40)
    kv.allocate(prompt, 512)
    kv.commit(0, prompt, 40)
    kv.stash(0, "r/0#1")
    assert kv.drain_ops() == [Stash(seq=0, key="r/0#1")]
    assert kv.num_free_slots == 4
    adm = kv.restore("r/0#1", [*prompt, 5], n_stashed=40, budget=512)
    assert adm is not None and (adm.seq, adm.num_computed, adm.num_new) == (0, 40, 1)
    assert kv.drain_ops() == [Restore(seq=0, key="r/0#1")]
    kv.check_integrity()


def test_reset_can_wipe_every_stream() -> None:
    kv = make(num_slots=2)
    kv.allocate(toks(40), 512)
    kv.reset(wipe_engine=True)
    assert kv.drain_ops() == [Truncate(seq=0, start=0), Truncate(seq=1, start=0)]
    assert kv.num_free_slots == 2
    kv.check_integrity()


def test_integrity_check_catches_a_stale_index_and_a_double_free() -> None:
    kv = make()
    kv.allocate(toks(40), 512)
    kv.commit(0, toks(40), 40)
    kv._index.clear()
    with pytest.raises(KvIntegrityError):
        kv.check_integrity()
    kv = make()
    kv.allocate(toks(40), 512)
    kv.free(0, 40, keep_cache=False)
    with pytest.raises(KvIntegrityError):
        kv.free(0, 40)


# ---- random sequences of operations, replayed on a model of the engine's streams ----


class Streams:
    """What each stream holds, as llama.cpp would after each op (a copy is a whole stream)."""

    def __init__(self, num_slots: int) -> None:
        self.held: list[list[int]] = [[] for _ in range(num_slots)]
        self.stashes: dict[str, list[int]] = {}

    def apply(self, ops: list[KvOp]) -> None:
        in_flight: set[int] = set()
        copied_into: set[int] = set()
        for op in ops:
            match op:
                case CopyPrefix(src=src, dst=dst, n_tokens=n):
                    assert src not in copied_into and dst not in in_flight
                    assert not self.held[dst] and n <= len(self.held[src])
                    self.held[dst] = self.held[src][:n]
                    in_flight.update((src, dst))
                    copied_into.add(dst)
                case Truncate(seq=seq, start=start):
                    del self.held[seq][start:]
                case Stash(seq=seq, key=key):
                    assert seq not in in_flight and self.held[seq]
                    self.stashes[key], self.held[seq] = self.held[seq], []
                case Restore(seq=seq, key=key):
                    assert seq not in in_flight and not self.held[seq]
                    self.held[seq] = self.stashes.pop(key)
                case DropStash(key=key):
                    del self.stashes[key]


slot_ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "sibling", "grow", "free", "stash", "restore"]),
        st.integers(0, 60),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(
    ops=slot_ops,
    num_slots=st.integers(1, 5),
    min_copy=st.sampled_from([0, 8, 40]),
    salts=st.integers(1, 2),
)
def test_slot_operations_keep_the_books_and_the_streams_exact(
    ops: list[tuple[str, int]], num_slots: int, min_copy: int, salts: int
) -> None:
    replay(ops, num_slots, min_copy, salts)


def replay(ops: list[tuple[str, int]], num_slots: int, min_copy: int, salts: int) -> None:
    slot_tokens = 48
    kv = SlotManager(num_slots, slot_tokens, 4, min_copy_tokens=min_copy)
    engine = Streams(num_slots)
    live: dict[int, tuple[list[int], int, BlockChain]] = {}  # seq -> tokens, computed, chain
    stashes: dict[str, tuple[list[int], int]] = {}
    prefixes = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [20, 21, 22, 23, 24, 25]]

    def started(adm_seq: int, tokens: list[int], computed: int, new: int, ch: BlockChain) -> None:
        engine.apply(kv.drain_ops())
        assert adm_seq not in live
        assert engine.held[adm_seq] == tokens[:computed]  # the start holds what it was said to
        engine.held[adm_seq] += tokens[computed : computed + new]
        kv.commit(adm_seq, tokens, computed + new, chain=ch)
        live[adm_seq] = (tokens, computed + new, ch)

    for i, (op, x) in enumerate(ops):
        if op == "admit":
            tokens = prefixes[x % 2][: 4 + x % 9] + [100 + i] * (1 + x % 5)
            chain = BlockChain(root=root_hash(f"t{x % salts}"))
            adm = kv.allocate(tokens, budget=1 + x % 11, chain=chain)
            if adm is not None:
                started(adm.seq, tokens, adm.num_computed, adm.num_new, chain)
        elif op == "sibling" and live:
            src = sorted(live)[x % len(live)]
            tokens, computed, chain = live[src]
            adm = kv.allocate(tokens, 512, copy_from=(src, computed), chain=chain)
            if adm is not None:
                sib = BlockChain(root=chain.root)
                started(adm.seq, list(tokens), adm.num_computed, adm.num_new, sib)
        elif op == "grow" and live:
            seq = sorted(live)[x % len(live)]
            tokens, computed, chain = live[seq]
            if computed == len(tokens):  # decoding: new tokens
                tokens = tokens + [200 + x] * (1 + x % 5)
            end = min(len(tokens), computed + 1 + x % 5)  # the next chunk
            if kv.grow(seq, end):
                engine.held[seq] += tokens[computed:end]
                kv.commit(seq, tokens, end, chain=chain)
                live[seq] = (tokens, end, chain)
        elif op == "free" and live:
            seq = sorted(live)[x % len(live)]
            _, computed, _ = live.pop(seq)
            kv.free(seq, computed, keep_cache=x % 3 != 0)
        elif op == "stash" and live:
            seq = sorted(live)[x % len(live)]
            tokens, computed, _ = live.pop(seq)
            engine.apply(kv.drain_ops())
            kv.stash(seq, f"s{i}")
            stashes[f"s{i}"] = (tokens, computed)
        elif op == "restore" and stashes:
            key = sorted(stashes)[x % len(stashes)]
            tokens, computed = stashes[key]
            more = [*tokens, 300 + i]
            chain = BlockChain()
            adm = kv.restore(key, more, computed, 512, chain)
            if adm is not None:
                del stashes[key]
                started(adm.seq, more, adm.num_computed, adm.num_new, chain)
        kv.check_integrity()
        pending = kv.drain_ops()
        engine.apply(pending)
        for seq, (tokens, computed, _) in live.items():
            assert engine.held[seq] == tokens[:computed]
        for h in kv.holders():
            assert len(engine.held[h]) == kv.num_tokens(h) > 0
    assert sorted(engine.stashes) == sorted(stashes)
