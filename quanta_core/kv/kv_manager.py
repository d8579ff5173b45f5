"""Block tables over the engine's one KV buffer, the prefix cache, and the KV ops they imply.

The engine is llama.cpp with one unified buffer of ``n_ctx`` cells shared by ``n_seq_max``
sequence ids; a sequence id holds the contiguous positions ``[0, n)``. This manager counts
those cells in blocks and decides which sequence id holds what. Each decision that changes
the engine appends a ``KvOp`` to ``pending ops``; the scheduler puts them, in order, at the
head of the next plan, so the engine sees exactly the transitions made here.

A sequence id is free, ACTIVE (a running choice) or a cache HOLDER: a finished (or
recompute-preempted) sequence keeps its full, hashed blocks so that their cells survive for
later prefix hits. Evicting the least recently used cached block truncates every holder at
that block's position, which drops its deeper blocks too (no running sequence holds them:
one that held a child block would hold its parents, so the block would not be cached):

    holder 5:  [b0 b1 b2 b3]      evict b2 (LRU)  ->  Truncate(5, 2*bs)  ->  [b0 b1]
    holder 7:  [b0 b1 b2]                          ->  Truncate(7, 2*bs)  ->  [b0 b1]

Evicting a holder's blocks one by one, tail first, merges into one op: Truncate(5, 2*bs)
followed by Truncate(5, bs) is queued as Truncate(5, bs) alone.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from quanta_core.engine.types import CopyPrefix, DropStash, KvOp, Restore, Stash, Truncate
from quanta_core.kv.block_pool import Block, BlockKey, BlockPool, BlockState, KvIntegrityError
from quanta_core.kv.prefix_cache import ROOT_HASH, BlockChain, PrefixCache


class SeqRole(Enum):
    ACTIVE = "active"
    HOLDER = "holder"


@dataclass(slots=True, eq=False)
class SeqTable:
    seq: int
    role: SeqRole
    table: list[Block] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chained hashes of its computed full blocks
    num_tokens: int = 0  # tokens the table has room reserved for
    root: int = ROOT_HASH  # the parent of its first block's hash (its cache salt's)


@dataclass(frozen=True, slots=True)
class Allocation:
    """A sequence id was taken and blocks reserved for its first ``num_new`` tokens."""

    seq: int
    num_computed: int  # tokens the sequence holds once the plan's ops ran (copied or restored)
    num_new: int  # tokens to compute in this step, from position ``num_computed``
    cached_tokens: int  # of ``num_computed``, tokens that came from the prefix cache


@dataclass(frozen=True, slots=True)
class KvStats:
    num_blocks: int
    active_blocks: int
    cached_blocks: int
    free_blocks: int
    waste_tokens: int  # reserved in active blocks but not (yet) holding a token
    prefix_queries: int  # tokens looked up in the prefix cache
    prefix_hits: int  # of those, tokens found

    @property
    def usage(self) -> float:
        return self.active_blocks / self.num_blocks


@dataclass(frozen=True, slots=True)
class StartNeed:
    """What ``allocate`` would take now: ``blocks`` to reserve besides the shared prefix's,
    ``pinned`` of those shared that are cached (no longer reclaimable once shared), ``hit``
    the chained hashes of the shared prefix's blocks."""

    blocks: int
    pinned: int
    hit: tuple[int, ...]


# (shared blocks, their hashes, source seq, shared tokens, from the cache, new tokens,
#  blocks to reserve, cached blocks pinned): ``KvManager._size_start``
_StartSize = tuple[list[Block], list[int], int | None, int, bool, int, int, int]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KvManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_seqs: int,
        enable_prefix_cache: bool = True,
        max_cached_blocks: int | None = None,
    ) -> None:
        if block_size < 1 or num_seqs < 1:
            raise ValueError(f"bad geometry: block_size={block_size}, num_seqs={num_seqs}")
        self.block_size = block_size
        self.num_seqs = num_seqs
        self.enable_prefix_cache = enable_prefix_cache
        # Cached cells are not free in the engine: llama.cpp scans every cell in use for each
        # token of a step (masked, but scanned). Beyond this many cached blocks the least
        # recently used go at once, not only when a block is needed. None: no limit.
        self.max_cached_blocks = max_cached_blocks
        self.num_blocks = num_blocks
        self.cache = PrefixCache(block_size)
        self._ops: list[KvOp] = []
        self._empty()

    def _empty(self) -> None:
        self.pool = BlockPool(self.num_blocks)
        self.cache.clear()
        self._seqs: dict[int, SeqTable] = {}
        self._free_seqs = list(range(self.num_seqs))  # a heap: the lowest free id first
        self._holders: OrderedDict[int, None] = OrderedDict()  # least recently used first

    # ---- queries ----

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be had now: free ones and cached ones nobody runs on."""
        return self.pool.num_free + self.pool.num_cached

    @property
    def num_cached_blocks(self) -> int:
        """Blocks held only for the prefix cache (reclaimed by eviction, oldest first)."""
        return self.pool.num_cached

    @property
    def num_seqs_available(self) -> int:
        return len(self._free_seqs) + len(self._holders)

    def table(self, seq: int) -> list[int]:
        return [b.block_id for b in self._seqs[seq].table]

    def num_blocks_of(self, seq: int) -> int:
        return len(self._seqs[seq].table)

    def block_hashes(self, seq: int) -> Sequence[int]:
        """The chained hashes of ``seq``'s computed full blocks (read only)."""
        return self._seqs[seq].hashes

    def caches(self, block_hash: int) -> bool:
        """Whether a cached block (no running sequence on it) is the cache's entry for
        ``block_hash``."""
        block = self.cache.entries.get(block_hash)
        return block is not None and block.n_active == 0

    def holders(self) -> list[int]:
        return list(self._holders)

    def block_map(self) -> str:
        """One character per block, in block-id order: ``a`` active, ``s`` shared by several
        running sequences, ``c`` cached, ``f`` free."""
        chars = []
        for b in self.pool.blocks:
            if b.n_active:
                chars.append("s" if len(b.seqs) > 1 else "a")
            else:
                chars.append("c" if b.seqs else "f")
        return "".join(chars)

    @property
    def has_pending_ops(self) -> bool:
        return bool(self._ops)

    @property
    def pending_ops(self) -> tuple[KvOp, ...]:
        """The KV operations decided since the last plan took them (``drain_ops``)."""
        return tuple(self._ops)

    def stats(self) -> KvStats:
        bs = self.block_size
        active = [t for t in self._seqs.values() if t.role is SeqRole.ACTIVE]
        waste = sum(len(t.table) * bs - t.num_tokens for t in active)
        return KvStats(
            num_blocks=self.pool.num_blocks,
            active_blocks=self.pool.num_active,
            cached_blocks=self.pool.num_cached,
            free_blocks=self.pool.num_free,
            waste_tokens=waste,
            prefix_queries=self.cache.queries,
            prefix_hits=self.cache.hits,
        )

    def drain_ops(self) -> list[KvOp]:
        ops, self._ops = self._ops, []
        return ops

    # ---- admission ----

    def shares_prefix(self, n_tokens: int) -> bool:
        """Whether a sequence may start from another's first ``n_tokens`` rather than compute
        them: always, in one buffer (a copy shares cells, it moves no data)."""
        return True

    def allocate(
        self,
        tokens: Sequence[int],
        budget: int,
        copy_from: tuple[int, int] | None = None,
        chain: BlockChain | None = None,
    ) -> Allocation | None:
        """Give a new sequence id the longest shared prefix of ``tokens`` and room for a chunk.

        ``copy_from=(seq, n)`` shares the first ``n`` tokens of a running sibling (n > 1
        choices); otherwise the prefix cache is asked, under ``chain``'s root (the request's
        cache salt; ``chain`` is ``tokens``' block chain, as ``commit`` takes it). At least
        the last token of ``tokens`` is left to compute, so there are logits to sample from.
        ``None`` (and nothing changed) when a sequence id or the blocks are lacking.
        """
        root = ROOT_HASH if chain is None else chain.root
        sizing = self._size_start(tokens, budget, copy_from, root)
        if sizing is None:
            return None
        shared, hashes, src, n_copy, from_cache, num_new, need, pinned = sizing
        if need > self.num_free_blocks - pinned:
            return None
        seq = self._acquire_seq(exclude=src)
        if seq is None and from_cache:
            # The only reclaimable id is the hit's holder: give up the hit, not the request.
            return self._allocate_plain(tokens, budget, root)
        if seq is None:
            return None
        if from_cache:
            self.cache.queries += len(tokens)
            self.cache.hits += n_copy
        elif copy_from is None and self.enable_prefix_cache:
            self.cache.queries += len(tokens)
        st = SeqTable(seq, SeqRole.ACTIVE, hashes=list(hashes), root=root)
        self._seqs[seq] = st
        if src is not None:
            self._ops.append(CopyPrefix(src=src, dst=seq, n_tokens=n_copy))
            if src in self._holders:
                self._holders.move_to_end(src)
        for b in shared:
            self._hold(b, seq, active=True)
            st.table.append(b)
        self._reserve(st, n_copy + num_new)
        return Allocation(seq, n_copy, num_new, n_copy if from_cache else 0)

    def _size_start(
        self,
        tokens: Sequence[int],
        budget: int,
        copy_from: tuple[int, int] | None,
        root: int = ROOT_HASH,
    ) -> _StartSize | None:
        """What ``allocate`` would take: the shared prefix (blocks, hashes, source, tokens,
        whether from the cache), the new tokens, the blocks to reserve and the cached blocks
        the prefix pins; ``None`` when there is nothing to compute."""
        bs = self.block_size
        shared: list[Block] = []
        hashes: list[int] = []
        src: int | None = None
        n_copy = 0
        from_cache = False
        sibling = self._seqs.get(copy_from[0]) if copy_from is not None else None
        if copy_from is not None and sibling is not None and sibling.role is SeqRole.ACTIVE:
            src, n_copy = copy_from
            n_copy = min(n_copy, len(tokens) - 1)
            shared = sibling.table[: n_copy // bs]
            hashes = sibling.hashes[: len(shared)]
        elif self.enable_prefix_cache:
            found, hashes = self.cache.lookup(tokens, (len(tokens) - 1) // bs, root)
            if found:
                # The copy gives the source's own blocks: the chain may have found a parent
                # in another sequence that holds the same content in other cells.
                src = min(found[-1].seqs)
                shared = self._seqs[src].table[: len(found)]
                n_copy = len(shared) * bs
                from_cache = True
        if n_copy <= 0:
            shared, hashes, src, n_copy = [], [], None, 0
        num_new = min(len(tokens) - n_copy, budget)
        if num_new <= 0:
            return None
        need = cdiv(n_copy + num_new, bs) - len(shared)
        pinned = sum(1 for b in shared if b.n_active == 0)
        return shared, hashes, src, n_copy, from_cache, num_new, need, pinned

    def start_need(
        self,
        tokens: Sequence[int],
        budget: int,
        copy_from: tuple[int, int] | None = None,
        chain: BlockChain | None = None,
    ) -> StartNeed | None:
        """What ``allocate`` (same arguments) would take now, whether or not it would get it;
        ``None`` when there is nothing to compute."""
        sizing = self._size_start(
            tokens, budget, copy_from, ROOT_HASH if chain is None else chain.root
        )
        if sizing is None:
            return None
        _, hashes, _, _, _, _, need, pinned = sizing
        return StartNeed(need, pinned, tuple(hashes))

    def _allocate_plain(
        self, tokens: Sequence[int], budget: int, root: int = ROOT_HASH
    ) -> Allocation | None:
        num_new = min(len(tokens), budget)
        if cdiv(num_new, self.block_size) > self.num_free_blocks:
            return None
        seq = self._acquire_seq(exclude=None)
        if seq is None:
            return None
        self.cache.queries += len(tokens)
        st = SeqTable(seq, SeqRole.ACTIVE, root=root)
        self._seqs[seq] = st
        self._reserve(st, num_new)
        return Allocation(seq, 0, num_new, 0)

    def restore(
        self,
        key: str,
        tokens: Sequence[int],
        n_stashed: int,
        budget: int,
        chain: BlockChain | None = None,
    ) -> Allocation | None:
        """Bring a stash back into fresh blocks of a new sequence id (its cells are new).
        ``chain``: ``tokens``' block hashes, as ``commit`` takes them."""
        num_new = min(len(tokens) - n_stashed, budget)
        if num_new <= 0 or cdiv(n_stashed + num_new, self.block_size) > self.num_free_blocks:
            return None
        seq = self._acquire_seq(exclude=None)
        if seq is None:
            return None
        st = SeqTable(seq, SeqRole.ACTIVE, root=ROOT_HASH if chain is None else chain.root)
        self._seqs[seq] = st
        # Reserve first: the cached blocks it evicts are truncated in the engine before the
        # restore needs their cells (llama.cpp finds the stash's cells when it reads it).
        self._reserve(st, n_stashed + num_new)
        self._ops.append(Restore(seq=seq, key=key))
        self.commit(seq, tokens, n_stashed, chain=chain)
        return Allocation(seq, n_stashed, num_new, 0)

    # ---- growth and release ----

    def can_grow(self, seq: int, num_tokens: int) -> bool:
        st = self._seqs[seq]
        return cdiv(num_tokens, self.block_size) - len(st.table) <= self.num_free_blocks

    def grow(self, seq: int, num_tokens: int) -> bool:
        """Reserve room for ``num_tokens`` in ``seq``, evicting cached blocks if needed."""
        st = self._seqs[seq]
        bs = self.block_size
        if num_tokens <= len(st.table) * bs:  # the common case: room in the tail
            if num_tokens > st.num_tokens:
                st.num_tokens = num_tokens
            return True
        pool = self.pool
        if -(-num_tokens // bs) - len(st.table) > len(pool.free) + len(pool.lru):  # can_grow
            return False
        self._reserve(st, num_tokens)
        return True

    def commit(
        self,
        seq: int,
        tokens: Sequence[int],
        num_computed: int,
        chain: BlockChain | None = None,
    ) -> None:
        """``seq`` now holds ``tokens[:num_computed]``: hash (and cache) its new full blocks.
        ``chain``: the hashes of ``tokens``' blocks kept with them (the same as hashed here),
        extended as needed."""
        if not self.enable_prefix_cache:
            return
        st = self._seqs[seq]
        bs = self.block_size
        n_full = num_computed // bs
        if n_full <= len(st.hashes):
            return  # no block filled up
        hashes, table, entries = st.hashes, st.table, self.cache.entries
        if chain is not None:
            chain.upto(tokens, bs, n_full)
            self._register(st, chain.hashes, chain.keys, n_full)
            return
        parent = hashes[-1] if hashes else st.root
        for i in range(len(hashes), n_full):
            key = (parent, tuple(tokens[i * bs : (i + 1) * bs]))  # ``block_key``, inline
            parent = hash(key)
            hashes.append(parent)
            # ``self.cache.register(block, parent, key)``, inline: every full block passes here.
            block = table[i]
            if block.hash is None and parent not in entries:
                block.hash = parent
                block.key = key
                entries[parent] = block

    def _register(
        self,
        st: SeqTable,
        chain_hashes: list[int],
        chain_keys: list[BlockKey],
        n_full: int,
    ) -> None:
        """``commit``'s registration of ``st``'s blocks up to ``n_full``, their hashes and keys
        taken from a chain."""
        hashes, table, entries = st.hashes, st.table, self.cache.entries
        for i in range(len(hashes), n_full):
            h = chain_hashes[i]
            hashes.append(h)
            block = table[i]
            if block.hash is None and h not in entries:
                block.hash = h
                block.key = chain_keys[i]
                entries[h] = block

    def free(self, seq: int, num_computed: int, keep_cache: bool = True) -> None:
        """A running sequence is done: keep its hashed full blocks as a cache holder, or drop it."""
        st = self._active(seq, "free")
        bs = self.block_size
        keep = 0
        if keep_cache and self.enable_prefix_cache:
            keep = min(len(st.hashes), num_computed // bs)
            while keep and st.table[keep - 1].hash is None:
                keep -= 1
        self._let_go_active(reversed(st.table[keep:]), seq)
        del st.table[keep:]
        del st.hashes[keep:]
        self._ops.append(Truncate(seq=seq, start=keep * bs))
        if not keep:
            self._release_seq(seq)
            return
        # Deepest first, so that among this sequence's blocks the tail is evicted first.
        for b in reversed(st.table):
            b.n_active -= 1
            if not b.n_active:
                self.pool.mark_cached(b)
        st.role = SeqRole.HOLDER
        st.num_tokens = keep * bs
        self._holders[seq] = None
        self._trim_cache()

    def stash(self, seq: int, key: str) -> None:
        """Move ``seq``'s KV to host RAM (the engine frees the sequence) and drop its blocks."""
        st = self._active(seq, "stash")
        self._ops.append(Stash(seq=seq, key=key))
        self._let_go_active(reversed(st.table), seq)
        self._release_seq(seq)

    def drop_stash(self, key: str) -> None:
        """A stash whose owner will not come back (kept in the op order with the rest)."""
        self._ops.append(DropStash(key=key))

    def reset(self, wipe_engine: bool) -> None:
        """Forget every sequence (the engine lost them, or is about to be wiped).

        ``wipe_engine`` queues a ``Truncate(seq, 0)`` of every id, for an engine that is alive
        but whose state is no longer known (a rejected plan).
        """
        self._empty()
        self._ops = [Truncate(seq=s, start=0) for s in range(self.num_seqs)] if wipe_engine else []

    # ---- internals ----

    def _active(self, seq: int, what: str) -> SeqTable:
        st = self._seqs.get(seq)
        if st is None or st.role is not SeqRole.ACTIVE:
            raise KvIntegrityError(f"{what} of sequence {seq}, which is not running")
        return st

    def _reserve(self, st: SeqTable, num_tokens: int) -> None:
        pool, seq, table = self.pool, st.seq, st.table
        free, blocks = pool.free, pool.blocks
        n_blocks = -(-num_tokens // self.block_size)
        for depth in range(len(table), n_blocks):
            if not free:
                # As many as are still needed, in one truncation where they are one holder's
                # tail: block by block would free (and take) the same blocks in this order.
                self._evict_oldest_cached(up_to=n_blocks - depth)
            block = blocks[free.popleft()]  # ``pool.take_free(depth)``, inline
            block.depth = depth
            # ``_hold(block, seq, active=True)`` of a free block (nobody holds it: not cached),
            # inline: a long prompt reserves dozens of blocks at once.
            block.seqs.add(seq)
            block.n_active += 1
            table.append(block)
        st.num_tokens = max(st.num_tokens, num_tokens)

    def _trim_cache(self) -> None:
        limit = self.max_cached_blocks
        while limit is not None and self.pool.num_cached > limit:
            self._evict_oldest_cached(up_to=self.pool.num_cached - limit)

    def _evict_oldest_cached(self, up_to: int = 1) -> None:
        """Evict the oldest cached block; with ``up_to`` > 1, also the next oldest while each
        is the same holder's new tail: one truncation where block by block would do the same
        (a trim takes a finished sequence's tail off, deepest first, block by block)."""
        block = self.pool.oldest_cached()
        if len(block.seqs) != 1:
            for holder in sorted(block.seqs):
                self._truncate_holder(holder, block.depth)
            return
        (holder,) = block.seqs
        depth = block.depth
        if up_to > 1 and depth == len(self._seqs[holder].table) - 1:
            for b in self.pool.cached_oldest_first(up_to):
                if b is not block and (
                    b.depth != depth - 1 or len(b.seqs) != 1 or holder not in b.seqs
                ):
                    break
                depth = b.depth
        self._truncate_holder(holder, depth)

    def _truncate_holder(self, seq: int, n_blocks: int) -> None:
        st = self._seqs[seq]
        self._truncate_op(seq, n_blocks * self.block_size)
        entries, lru, free = self.cache.entries, self.pool.lru, self.pool.free
        for b in reversed(st.table[n_blocks:]):
            # Let go of ``b`` as a holder, and ``_release_block(b)`` if nobody holds it now,
            # inline: a reclaimed holder lets go of every block at once.
            seqs = b.seqs
            if seq not in seqs:
                raise KvIntegrityError(f"sequence {seq} lets go of block {b.block_id} twice")
            seqs.remove(seq)
            if not seqs:
                h = b.hash
                if h is not None:
                    del entries[h]
                    b.hash = None
                b.key = None
                b.n_active = 0
                lru.pop(b.block_id, None)
                free.append(b.block_id)
        del st.table[n_blocks:]
        del st.hashes[n_blocks:]
        st.num_tokens = min(st.num_tokens, n_blocks * self.block_size)
        if not st.table:
            del self._holders[seq]
            self._release_seq(seq)

    def _truncate_op(self, seq: int, start: int) -> None:
        """Queue ``Truncate(seq, start)``, merged into the op before it if that one cut the
        same sequence no higher (a cache trim evicts a holder's tail one block at a time)."""
        ops = self._ops
        last = ops[-1] if ops else None
        if type(last) is Truncate and last.seq == seq and last.start >= start:
            ops[-1] = Truncate(seq=seq, start=start)
        else:
            ops.append(Truncate(seq=seq, start=start))

    def _acquire_seq(self, exclude: int | None) -> int | None:
        if not self._free_seqs:
            victim = next((h for h in self._holders if h != exclude), None)
            if victim is None:
                return None
            self._truncate_holder(victim, 0)
        return heapq.heappop(self._free_seqs)

    def _release_seq(self, seq: int) -> None:
        del self._seqs[seq]
        heapq.heappush(self._free_seqs, seq)

    def _hold(self, block: Block, seq: int, active: bool) -> None:
        was_cached = block.state is BlockState.CACHED
        block.seqs.add(seq)
        if active:
            block.n_active += 1
            if was_cached:
                self.pool.unmark_cached(block)

    def _let_go_active(self, blocks: Iterable[Block], seq: int) -> None:
        """``seq``, running, lets go of each of ``blocks`` in turn (a finished or preempted
        sequence lets go of all its blocks at once): a block nobody holds any more is free, one
        only holders hold is cached."""
        release, lru = self._release_block, self.pool.lru
        for b in blocks:
            seqs = b.seqs
            if seq not in seqs:
                raise KvIntegrityError(f"sequence {seq} lets go of block {b.block_id} twice")
            seqs.remove(seq)
            b.n_active -= 1
            if not seqs:
                release(b)
            elif not b.n_active:
                lru[b.block_id] = None  # ``pool.mark_cached(b)``, inline

    def _release_block(self, b: Block) -> None:
        """The last sequence let go of ``b``: ``cache.forget(b)`` then ``pool.release(b)``,
        inline (a block is released per block ever reserved)."""
        if b.hash is not None:
            del self.cache.entries[b.hash]
            b.hash = None
        b.key = None
        b.n_active = 0
        pool = self.pool
        pool.lru.pop(b.block_id, None)
        pool.free.append(b.block_id)

    # ---- integrity ----

    def check_integrity(self) -> None:
        """Raise ``KvIntegrityError`` on any leak, double free or stale reference."""
        self.pool.check()
        self.cache.check()
        bs = self.block_size
        expected: dict[int, tuple[set[int], int]] = {}
        for seq, st in self._seqs.items():
            if st.seq != seq:
                raise KvIntegrityError(f"sequence table {st.seq} filed under {seq}")
            ids = [b.block_id for b in st.table]
            if len(set(ids)) != len(ids):
                raise KvIntegrityError(f"sequence {seq} holds a block twice: {ids}")
            if cdiv(st.num_tokens, bs) != len(st.table):
                raise KvIntegrityError(
                    f"sequence {seq} reserves {st.num_tokens} tokens in {len(st.table)} blocks"
                )
            if st.role is SeqRole.HOLDER and (not st.table or seq not in self._holders):
                raise KvIntegrityError(f"holder {seq} is empty or unlisted")
            for depth, b in enumerate(st.table):
                if b.depth != depth:
                    raise KvIntegrityError(f"block {b.block_id} at depth {depth}, not {b.depth}")
                seqs, n_active = expected.setdefault(b.block_id, (set(), 0))
                seqs.add(seq)
                expected[b.block_id] = (seqs, n_active + (st.role is SeqRole.ACTIVE))
        for b in self.pool.blocks:
            seqs, n_active = expected.get(b.block_id, (set(), 0))
            if b.seqs != seqs or b.n_active != n_active:
                raise KvIntegrityError(
                    f"block {b.block_id}: held by {sorted(b.seqs)} ({b.n_active} active), "
                    f"tables say {sorted(seqs)} ({n_active} active)"
                )
        ids = sorted([*self._seqs, *self._free_seqs])
        if ids != list(range(self.num_seqs)):
            raise KvIntegrityError(f"sequence ids leaked or doubled: {ids}")
        if set(self._holders) != {s for s, t in self._seqs.items() if t.role is SeqRole.HOLDER}:
            raise KvIntegrityError("the holder list disagrees with the tables")
