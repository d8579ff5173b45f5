"""Physical blocks: a free queue, and an LRU queue of cached blocks no running sequence holds.

A block is ``block_size`` cells of the engine's one KV buffer. It is in exactly one of three
states, and the pool keeps the counts exact:

    FREE       no sequence id holds its cells              (in ``free``, FIFO)
    CACHED     only cache-holder sequence ids hold it      (in ``lru``, oldest first)
    ACTIVE     at least one running sequence holds it      (in neither queue)

A block id always sits at the same depth (index in every block table that holds it), behind
the same parents: tables grow by fresh blocks or by copying a holder's leading blocks.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from itertools import islice


class KvIntegrityError(RuntimeError):
    """The block accounting is broken: a leak, a double free, a stale reference."""


class BlockState(Enum):
    FREE = "free"
    CACHED = "cached"
    ACTIVE = "active"


# (parent block's chained hash, the block's token ids): what a full block's hash stands for.
BlockKey = tuple[int, tuple[int, ...]]


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    depth: int = 0  # index in every table that holds it: positions [depth*bs, (depth+1)*bs)
    seqs: set[int] = field(default_factory=set)  # sequence ids whose cells these are
    n_active: int = 0  # how many of ``seqs`` are running sequences
    hash: int | None = None  # set while this block is the prefix cache's entry for its content
    key: BlockKey | None = None

    @property
    def state(self) -> BlockState:
        if self.n_active:
            return BlockState.ACTIVE
        return BlockState.CACHED if self.seqs else BlockState.FREE


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a pool needs at least one block, got {num_blocks}")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: deque[int] = deque(range(num_blocks))
        # Insertion order is LRU order; OrderedDict gives O(1) removal from the middle.
        self.lru: OrderedDict[int, None] = OrderedDict()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_cached(self) -> int:
        return len(self.lru)

    @property
    def num_active(self) -> int:
        return self.num_blocks - self.num_free - self.num_cached

    def take_free(self, depth: int) -> Block:
        block = self.blocks[self.free.popleft()]
        block.depth = depth
        return block

    def release(self, block: Block) -> None:
        """The last sequence let go of ``block``'s cells."""
        self.lru.pop(block.block_id, None)
        block.hash = None
        block.key = None
        block.n_active = 0
        self.free.append(block.block_id)

    def mark_cached(self, block: Block) -> None:
        self.lru[block.block_id] = None

    def unmark_cached(self, block: Block) -> None:
        del self.lru[block.block_id]

    def oldest_cached(self) -> Block:
        return self.blocks[next(iter(self.lru))]

    def cached_oldest_first(self, n: int) -> Iterator[Block]:
        """The ``n`` oldest cached blocks (fewer if fewer are cached), oldest first."""
        return (self.blocks[i] for i in islice(self.lru, n))

    def check(self) -> None:
        """Raise ``KvIntegrityError`` unless every block sits in the queue its state says."""
        free = set(self.free)
        if len(free) != len(self.free):
            raise KvIntegrityError(f"double free: a block id appears twice in {list(self.free)}")
        for block in self.blocks:
            state = block.state
            in_free = block.block_id in free
            in_lru = block.block_id in self.lru
            if in_free != (state is BlockState.FREE) or in_lru != (state is BlockState.CACHED):
                raise KvIntegrityError(
                    f"block {block.block_id} is {state.value} but in_free={in_free} "
                    f"in_lru={in_lru} (seqs={sorted(block.seqs)}, n_active={block.n_active})"
                )
            if state is BlockState.FREE and block.hash is not None:
                raise KvIntegrityError(f"free block {block.block_id} still carries a hash")
