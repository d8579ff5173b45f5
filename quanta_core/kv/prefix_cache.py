"""Chained block hashes and the map from a full block's hash to the block that holds it.

    tokens  [a b c d][e f g h][i j]          block_size = 4
    hash    h0=H(root,(a b c d))  h1=H(h0,(e f g h))   (the partial block has no hash)

A hash names a block's content *and* everything before it, so a chain of hits is a prefix.
Entries keep their key and a hit compares it, so a hash collision is a miss, never wrong KV.

The root is the request's cache salt (``root_hash``): requests with different salts never
share a block, so a tenant whose salt is its own cannot learn from ``cached_tokens`` what
another tenant sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from quanta_core.kv.block_pool import Block, BlockKey, KvIntegrityError

ROOT_HASH = 0x5157_414E_5441  # the parent of an unsalted sequence's first block


def root_hash(salt: str | None) -> int:
    """The parent of the first block of a sequence salted with ``salt`` (None: no salt).
    A digest, not ``hash()``: a str's ``hash()`` changes with each process."""
    if salt is None:
        return ROOT_HASH
    digest = hashlib.blake2b(salt.encode(), digest_size=8, key=b"quanta-cache-salt").digest()
    return int.from_bytes(digest, "little") ^ ROOT_HASH


def block_key(parent: int, tokens: Sequence[int]) -> BlockKey:
    return (parent, tuple(tokens))


def chain_hashes(
    tokens: Sequence[int],
    block_size: int,
    n_blocks: int,
    start: Sequence[int] = (),
    root: int = ROOT_HASH,
) -> list[int]:
    """Hashes of the first ``n_blocks`` full blocks of ``tokens``, reusing ``start``."""
    hashes = list(start)
    parent = hashes[-1] if hashes else root
    for i in range(len(hashes), n_blocks):
        parent = hash(block_key(parent, tokens[i * block_size : (i + 1) * block_size]))
        hashes.append(parent)
    return hashes


@dataclass(slots=True, eq=False)
class BlockChain:
    """The chained hashes and keys of one token list's first full blocks, as far as asked
    (``upto``). A choice's tokens only grow, so its blocks' hashes never change: a sequence
    restored from a stash or prefilled again after a preemption takes them from here instead
    of hashing every block again."""

    hashes: list[int] = field(default_factory=list)
    keys: list[BlockKey] = field(default_factory=list)
    root: int = ROOT_HASH  # the parent of the first block: the cache salt's (``root_hash``)

    def upto(self, tokens: Sequence[int], block_size: int, n_blocks: int) -> None:
        """Hash ``tokens``' blocks up to the first ``n_blocks`` (``tokens`` are the list
        this chain is of, and hold them)."""
        hashes, keys, bs = self.hashes, self.keys, block_size
        parent = hashes[-1] if hashes else self.root
        for i in range(len(hashes), n_blocks):
            key = (parent, tuple(tokens[i * bs : (i + 1) * bs]))  # ``block_key``, inline
            parent = hash(key)
            hashes.append(parent)
            keys.append(key)


class PrefixCache:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.entries: dict[int, Block] = {}
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # of those, tokens found

    def lookup(
        self, tokens: Sequence[int], max_blocks: int, root: int = ROOT_HASH
    ) -> tuple[list[Block], list[int]]:
        """The longest chain of cached blocks that starts ``tokens`` (at most ``max_blocks``)
        under the salt whose root is ``root``."""
        found: list[Block] = []
        hashes: list[int] = []
        parent = root
        bs = self.block_size
        for i in range(max_blocks):
            key = block_key(parent, tokens[i * bs : (i + 1) * bs])
            h = hash(key)
            block = self.entries.get(h)
            if block is None or block.key != key:
                break
            found.append(block)
            hashes.append(h)
            parent = h
        return found, hashes

    def register(self, block: Block, h: int, key: BlockKey) -> None:
        """Make ``block`` the entry for ``h`` unless another block already is."""
        if block.hash is None and h not in self.entries:
            block.hash = h
            block.key = key
            self.entries[h] = block

    def forget(self, block: Block) -> None:
        if block.hash is not None:
            del self.entries[block.hash]

    def clear(self) -> None:
        self.entries.clear()

    def check(self) -> None:
        for h, block in self.entries.items():
            if block.hash != h or block.key is None or not block.seqs:
                raise KvIntegrityError(
                    f"prefix cache entry {h:#x} points at block {block.block_id} "
                    f"(hash={block.hash}, seqs={sorted(block.seqs)})"
                )
