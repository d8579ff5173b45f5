"""KV memory: slots (a stream per sequence, the default) or blocks over one buffer, block tables,
the prefix cache."""

from quanta_core.kv.block_pool import Block, BlockPool, BlockState, KvIntegrityError
from quanta_core.kv.kv_manager import Allocation, KvManager, KvStats, SeqRole
from quanta_core.kv.prefix_cache import PrefixCache, chain_hashes

__all__ = [
    "Allocation",
    "Block",
    "BlockPool",
    "BlockState",
    "KvIntegrityError",
    "KvManager",
    "KvStats",
    "PrefixCache",
    "SeqRole",
    "chain_hashes",
]
