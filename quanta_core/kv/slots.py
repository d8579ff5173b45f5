"""KV slots: llama.cpp's stream-per-sequence layout (``kv_unified=False``), as the scheduler
sees it.

Each of the engine's ``n_seq_max`` sequence ids owns a stream of ``slot_tokens`` cells, and a
step attends only over the streams in its batch (each token over its own stream's used
cells), so a sequence's attention costs its own length, not the pool's. Memory is per slot:
a request fits when a slot is free and its prompt and answer fit the slot's cells; growing
never takes anything from another sequence. A slot is in one of three states:

    FREE     holds nothing
    ACTIVE   a running sequence: tokens [0, num_tokens) reserved, its computed full blocks
             hashed (chained, as ``prefix_cache``: a hash names a block and all before it)
    HOLDER   idle: a finished sequence's tokens, kept with their hashes until the slot is
             needed (least recently used first), for later prefix hits

A new request's prompt is matched against every slot's hashes (its cache salt is the chain's
root). A hit is served without computing the prefix, in one of two ways:

    take    an idle holder's slot becomes the request's:   Truncate(H, hit)        no copy
    copy    the whole stream to another slot:              CopyPrefix(S, D, hit)
            (the worker runs llama_memory_seq_cp(S, D, -1, -1), then seq_rm(D, hit, -1):
            between streams llama.cpp copies only whole streams; a partial copy aborts it)

A copy moves the whole stream's cells whatever the hit's length, so it pays only where
computing the hit would cost more: ``min_copy_tokens`` (the scheduler derives it from the
copy's bytes and the prefill rate). A holder is copied rather than taken when a free slot
exists and its own tail past the hit is worth keeping by the same measure (a conversation's
earlier turn, say): taking it would throw that tail away.

llama.cpp runs a stream copy at the next decode, not when asked. Until then the source's and
the destination's cells are in flight: neither may be read (stash) or written (restore or
another copy's destination) by an op of the same plan, and a destination is no source yet
(one source may feed several copies). Those slots are pinned until ``drain_ops``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from quanta_core.engine.types import CopyPrefix, DropStash, KvOp, Restore, Stash, Truncate
from quanta_core.kv.block_pool import BlockKey, KvIntegrityError
from quanta_core.kv.kv_manager import Allocation, KvStats, cdiv
from quanta_core.kv.prefix_cache import BlockChain


class SlotRole(Enum):
    FREE = "free"
    ACTIVE = "active"
    HOLDER = "holder"


@dataclass(slots=True, eq=False)
class Slot:
    seq: int
    role: SlotRole = SlotRole.FREE
    num_tokens: int = 0  # ACTIVE: tokens reserved; HOLDER: tokens the engine holds
    hashes: list[int] = field(default_factory=list)  # its computed full blocks' chained hashes
    keys: list[BlockKey] = field(default_factory=list)  # what each hash stands for


@dataclass(frozen=True, slots=True)
class _Hit:
    """The deepest match of a prompt among the slots: ``n_blocks`` blocks, held by
    ``slots`` (idle holders first, the most recently used first)."""

    n_blocks: int
    slots: tuple[int, ...]


class SlotManager:
    def __init__(
        self,
        num_slots: int,
        slot_tokens: int,
        block_size: int,
        enable_prefix_cache: bool = True,
        min_copy_tokens: int = 0,
    ) -> None:
        if num_slots < 1 or block_size < 1 or slot_tokens < block_size:
            raise ValueError(
                f"bad geometry: {num_slots} slots of {slot_tokens} tokens, block_size={block_size}"
            )
        self.num_seqs = num_slots
        self.slot_tokens = slot_tokens
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        # A prefix shorter than this is computed again rather than copied from another stream.
        self.min_copy_tokens = min_copy_tokens
        self.num_blocks = num_slots * (slot_tokens // block_size)
        self.queries = 0  # prompt tokens looked up in the prefix cache
        self.hits = 0  # of those, tokens found
        self._ops: list[KvOp] = []
        self._pinned: set[int] = set()  # slots in a stream copy of the pending ops
        self._copied_into: set[int] = set()  # of those, the copies' destinations
        self._empty()

    def _empty(self) -> None:
        self._slots = [Slot(i) for i in range(self.num_seqs)]
        self._holders: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._index: dict[int, set[int]] = {}  # block hash -> the slots whose hashes hold it

    # ---- queries ----

    @property
    def num_seqs_available(self) -> int:
        """Slots a request may take now: free ones and idle holders."""
        return sum(1 for s in self._slots if s.role is not SlotRole.ACTIVE)

    @property
    def num_free_slots(self) -> int:
        return sum(1 for s in self._slots if s.role is SlotRole.FREE)

    def holders(self) -> list[int]:
        return list(self._holders)

    def role(self, seq: int) -> SlotRole:
        return self._slots[seq].role

    def num_tokens(self, seq: int) -> int:
        return self._slots[seq].num_tokens

    @property
    def has_pending_ops(self) -> bool:
        return bool(self._ops)

    @property
    def pending_ops(self) -> tuple[KvOp, ...]:
        return tuple(self._ops)

    def drain_ops(self) -> list[KvOp]:
        ops, self._ops = self._ops, []
        self._pinned.clear()
        self._copied_into.clear()
        return ops

    def shares_prefix(self, n_tokens: int) -> bool:
        """Whether copying a stream holding ``n_tokens`` wanted tokens beats computing them."""
        return n_tokens >= max(1, self.min_copy_tokens)

    def stats(self) -> KvStats:
        bs = self.block_size
        active = [s for s in self._slots if s.role is SlotRole.ACTIVE]
        active_blocks = sum(cdiv(s.num_tokens, bs) for s in active)
        cached = sum(cdiv(s.num_tokens, bs) for s in self._slots if s.role is SlotRole.HOLDER)
        return KvStats(
            num_blocks=self.num_blocks,
            active_blocks=active_blocks,
            cached_blocks=cached,
            free_blocks=self.num_blocks - active_blocks - cached,
            waste_tokens=sum(cdiv(s.num_tokens, bs) * bs - s.num_tokens for s in active),
            prefix_queries=self.queries,
            prefix_hits=self.hits,
        )

    def block_map(self) -> str:
        """One character per block, slot after slot: ``a`` active, ``c`` held for the cache,
        ``f`` free (a slot's unused cells are free)."""
        bs, per_slot = self.block_size, self.slot_tokens // self.block_size
        chars = []
        for s in self._slots:
            used = min(cdiv(s.num_tokens, bs), per_slot)
            mark = {SlotRole.ACTIVE: "a", SlotRole.HOLDER: "c", SlotRole.FREE: "f"}[s.role]
            chars.append(mark * used + "f" * (per_slot - used))
        return "".join(chars)

    # ---- admission ----

    def allocate(
        self,
        tokens: Sequence[int],
        budget: int,
        copy_from: tuple[int, int] | None = None,
        chain: BlockChain | None = None,
    ) -> Allocation | None:
        """Give ``tokens`` a slot, starting from the longest prefix another slot holds where
        that pays, and room for a first chunk of at most ``budget`` tokens.

        ``copy_from=(seq, n)``: a running sibling's first ``n`` tokens (n > 1 choices);
        otherwise the prefix cache is asked, under ``chain``'s root (the cache salt;
        ``chain`` is ``tokens``' block chain, as ``commit`` takes it). At least the last
        token is left to compute. ``None`` (and nothing changed) when no slot can be had or
        ``tokens`` cannot fit one."""
        if len(tokens) > self.slot_tokens or not tokens or budget <= 0:
            return None
        if self.num_seqs_available == 0:
            return None
        if copy_from is not None:
            return self._allocate_sibling(tokens, budget, copy_from)
        if not self.enable_prefix_cache:
            return self._allocate_plain(tokens, budget)
        chain = BlockChain() if chain is None else chain
        bs = self.block_size
        chain.upto(tokens, bs, (len(tokens) - 1) // bs)
        self.queries += len(tokens)
        hit = self._lookup(chain, (len(tokens) - 1) // bs)
        if hit is not None:
            adm = self._allocate_hit(tokens, budget, chain, hit)
            if adm is not None:
                self.hits += adm.cached_tokens
                return adm
        return self._allocate_plain(tokens, budget)

    def _allocate_hit(
        self, tokens: Sequence[int], budget: int, chain: BlockChain, hit: _Hit
    ) -> Allocation | None:
        n_hit = hit.n_blocks * self.block_size
        num_new = min(len(tokens) - n_hit, budget)
        src = hit.slots[0]
        holder = self._slots[src]
        if holder.role is SlotRole.HOLDER and (
            self._free_slot() is None or not self.shares_prefix(holder.num_tokens - n_hit)
        ):
            # Its tail past the hit costs less to compute again than a copy: take the slot.
            self._truncate(src, n_hit)
            self._start(holder, n_hit + num_new, chain, hit.n_blocks)
            return Allocation(src, n_hit, num_new, n_hit)
        if not self.shares_prefix(n_hit) or src in self._copied_into:
            return None  # computing the hit costs less than a copy (a free slot exists)
        dst = self._take_slot(exclude=src, unpinned=True)
        if dst is None:
            return None
        self._copy(src, dst, n_hit)
        self._start(self._slots[dst], n_hit + num_new, chain, hit.n_blocks)
        return Allocation(dst, n_hit, num_new, n_hit)

    def _allocate_sibling(
        self, tokens: Sequence[int], budget: int, copy_from: tuple[int, int]
    ) -> Allocation | None:
        src, n_copy = copy_from
        n_copy = min(n_copy, len(tokens) - 1)
        source = self._slots[src]
        if (
            source.role is not SlotRole.ACTIVE
            or n_copy <= 0
            or not self.shares_prefix(n_copy)
            or src in self._copied_into
        ):
            return self._allocate_plain(tokens, budget)
        dst = self._take_slot(exclude=src, unpinned=True)
        if dst is None:
            return None
        num_new = min(len(tokens) - n_copy, budget)
        self._copy(src, dst, n_copy)
        slot = self._slots[dst]
        slot.role = SlotRole.ACTIVE
        slot.num_tokens = n_copy + num_new
        n_full = min(n_copy // self.block_size, len(source.hashes))
        slot.hashes = source.hashes[:n_full]
        slot.keys = source.keys[:n_full]
        self._index_add(dst, 0)
        return Allocation(dst, n_copy, num_new, 0)

    def _allocate_plain(self, tokens: Sequence[int], budget: int) -> Allocation | None:
        seq = self._take_slot(exclude=None)
        if seq is None:
            return None
        num_new = min(len(tokens), budget)
        slot = self._slots[seq]
        slot.role = SlotRole.ACTIVE
        slot.num_tokens = num_new
        return Allocation(seq, 0, num_new, 0)

    def _start(self, slot: Slot, num_tokens: int, chain: BlockChain, n_blocks: int) -> None:
        """``slot`` runs a sequence that holds ``chain``'s first ``n_blocks`` blocks."""
        self._index_remove(slot.seq, 0)
        slot.role = SlotRole.ACTIVE
        slot.num_tokens = num_tokens
        slot.hashes = chain.hashes[:n_blocks]
        slot.keys = chain.keys[:n_blocks]
        self._index_add(slot.seq, 0)

    def _lookup(self, chain: BlockChain, max_blocks: int) -> _Hit | None:
        """The slots holding the longest start of ``chain`` (keys compared: a hash collision
        is a miss, never wrong KV)."""
        found: set[int] = set()
        depth = 0
        index, slots = self._index, self._slots
        for i in range(min(max_blocks, len(chain.hashes))):
            holding = index.get(chain.hashes[i])
            if not holding:
                break
            key = chain.keys[i]
            here = {s for s in holding if len(slots[s].keys) > i and slots[s].keys[i] == key}
            if i:
                here &= found
            if not here:
                break
            found, depth = here, i + 1
        if not depth:
            return None
        holders = [s for s in reversed(self._holders) if s in found]
        active = sorted(s for s in found if slots[s].role is SlotRole.ACTIVE)
        return _Hit(depth, (*holders, *active))

    def restore(
        self,
        key: str,
        tokens: Sequence[int],
        n_stashed: int,
        budget: int,
        chain: BlockChain | None = None,
    ) -> Allocation | None:
        """Bring a stash back into a slot (a free one, else the least recently used holder's;
        never one in a stream copy of this plan: the restore would write cells in flight)."""
        num_new = min(len(tokens) - n_stashed, budget)
        if num_new <= 0 or n_stashed + num_new > self.slot_tokens:
            return None
        seq = self._take_slot(exclude=None, unpinned=True)
        if seq is None:
            return None
        slot = self._slots[seq]
        slot.role = SlotRole.ACTIVE
        slot.num_tokens = n_stashed + num_new
        self._ops.append(Restore(seq=seq, key=key))
        self.commit(seq, tokens, n_stashed, chain=chain)
        return Allocation(seq, n_stashed, num_new, 0)

    # ---- growth and release ----

    def num_blocks_of(self, seq: int) -> int:
        return cdiv(self._slots[seq].num_tokens, self.block_size)

    def can_grow(self, seq: int, num_tokens: int) -> bool:
        return num_tokens <= self.slot_tokens

    def grow(self, seq: int, num_tokens: int) -> bool:
        """Room for ``num_tokens`` in ``seq``'s slot: its own cells, nobody else's."""
        slot = self._slots[seq]
        if num_tokens > self.slot_tokens:
            return False
        if num_tokens > slot.num_tokens:
            slot.num_tokens = num_tokens
        return True

    def commit(
        self,
        seq: int,
        tokens: Sequence[int],
        num_computed: int,
        chain: BlockChain | None = None,
    ) -> None:
        """``seq`` now holds ``tokens[:num_computed]``: hash and index its new full blocks."""
        if not self.enable_prefix_cache:
            return
        slot = self._slots[seq]
        bs = self.block_size
        n_full = num_computed // bs
        if n_full <= len(slot.hashes):
            return
        if chain is None:
            chain = BlockChain(list(slot.hashes), list(slot.keys))
        chain.upto(tokens, bs, n_full)
        start = len(slot.hashes)
        slot.hashes.extend(chain.hashes[start:n_full])
        slot.keys.extend(chain.keys[start:n_full])
        self._index_add(seq, start)

    def free(self, seq: int, num_computed: int, keep_cache: bool = True) -> None:
        """A running sequence is done: its slot keeps what it computed as an idle holder
        (if any full block of it is hashed), or is emptied."""
        slot = self._active(seq, "free")
        if keep_cache and self.enable_prefix_cache and slot.hashes and num_computed > 0:
            slot.role = SlotRole.HOLDER
            slot.num_tokens = num_computed
            self._holders[seq] = None
            return
        self._truncate(seq, 0)

    def stash(self, seq: int, key: str) -> None:
        """Move ``seq``'s KV to host RAM (the engine empties the slot)."""
        slot = self._active(seq, "stash")
        if seq in self._pinned:
            raise KvIntegrityError(f"stash of slot {seq}, whose stream is being copied")
        self._ops.append(Stash(seq=seq, key=key))
        self._index_remove(seq, 0)
        self._clear(slot)

    def drop_stash(self, key: str) -> None:
        self._ops.append(DropStash(key=key))

    def reset(self, wipe_engine: bool) -> None:
        self._empty()
        self._pinned.clear()
        self._copied_into.clear()
        self._ops = [Truncate(seq=s, start=0) for s in range(self.num_seqs)] if wipe_engine else []

    # ---- internals ----

    def _active(self, seq: int, what: str) -> Slot:
        slot = self._slots[seq]
        if slot.role is not SlotRole.ACTIVE:
            raise KvIntegrityError(f"{what} of slot {seq}, which is not running")
        return slot

    def _free_slot(self) -> int | None:
        return next((s.seq for s in self._slots if s.role is SlotRole.FREE), None)

    def _take_slot(self, exclude: int | None, unpinned: bool = False) -> int | None:
        """A slot for a new sequence: the lowest free one, else the least recently used
        holder's (emptied), never ``exclude``; ``unpinned``: none in a stream copy."""
        for s in self._slots:
            if s.role is SlotRole.FREE and not (unpinned and s.seq in self._pinned):
                return s.seq
        for h in self._holders:
            if h != exclude and not (unpinned and h in self._pinned):
                self._truncate(h, 0)
                return h
        return None

    def _copy(self, src: int, dst: int, n_tokens: int) -> None:
        self._ops.append(CopyPrefix(src=src, dst=dst, n_tokens=n_tokens))
        self._pinned.update((src, dst))
        self._copied_into.add(dst)
        if src in self._holders:
            self._holders.move_to_end(src)

    def _truncate(self, seq: int, n_tokens: int) -> None:
        """Cut ``seq`` to its first ``n_tokens`` (0: empty it, and the slot is free)."""
        slot = self._slots[seq]
        if n_tokens < slot.num_tokens or slot.role is SlotRole.ACTIVE:
            self._ops.append(Truncate(seq=seq, start=n_tokens))
        n_blocks = n_tokens // self.block_size
        self._index_remove(seq, n_blocks)
        del slot.hashes[n_blocks:]
        del slot.keys[n_blocks:]
        slot.num_tokens = min(slot.num_tokens, n_tokens)
        self._holders.pop(seq, None)
        if not n_tokens:
            self._clear(slot)

    def _clear(self, slot: Slot) -> None:
        slot.role = SlotRole.FREE
        slot.num_tokens = 0
        slot.hashes = []
        slot.keys = []

    def _index_add(self, seq: int, start: int) -> None:
        index = self._index
        for h in self._slots[seq].hashes[start:]:
            index.setdefault(h, set()).add(seq)

    def _index_remove(self, seq: int, start: int) -> None:
        index = self._index
        for h in self._slots[seq].hashes[start:]:
            holding = index.get(h)
            if holding is None or seq not in holding:
                raise KvIntegrityError(f"slot {seq}'s block hash {h:#x} is not indexed")
            holding.discard(seq)
            if not holding:
                del index[h]

    # ---- integrity ----

    def check_integrity(self) -> None:
        """Raise ``KvIntegrityError`` on a slot whose state, hashes or index disagree."""
        bs = self.block_size
        expected: dict[int, set[int]] = {}
        for i, s in enumerate(self._slots):
            if s.seq != i:
                raise KvIntegrityError(f"slot {s.seq} filed under {i}")
            if not 0 <= s.num_tokens <= self.slot_tokens:
                raise KvIntegrityError(f"slot {i} holds {s.num_tokens} tokens")
            if len(s.hashes) != len(s.keys) or len(s.hashes) * bs > max(s.num_tokens, 0):
                raise KvIntegrityError(
                    f"slot {i}: {len(s.hashes)} hashed blocks, {len(s.keys)} keys, "
                    f"{s.num_tokens} tokens"
                )
            if s.role is SlotRole.FREE and (s.num_tokens or s.hashes):
                raise KvIntegrityError(f"free slot {i} holds {s.num_tokens} tokens")
            if (s.role is SlotRole.HOLDER) != (i in self._holders):
                raise KvIntegrityError(f"slot {i} is {s.role.value}; the holder list disagrees")
            if s.role is SlotRole.HOLDER and not s.hashes:
                raise KvIntegrityError(f"holder {i} holds no hashed block")
            for d, (h, key) in enumerate(zip(s.hashes, s.keys, strict=True)):
                if hash(key) != h or (d and key[0] != s.hashes[d - 1]):
                    raise KvIntegrityError(f"slot {i}: block {d}'s hash is not its chain's")
                expected.setdefault(h, set()).add(i)
        if expected != self._index:
            raise KvIntegrityError("the prefix index disagrees with the slots' hashes")
