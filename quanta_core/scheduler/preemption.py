"""How to evict a victim: stash its KV to host RAM or drop it and recompute later.

Both are priced in seconds: a stash costs copying its bytes out and back in; a recompute
costs prefilling its tokens again. The cheaper wins, if the stash fits the host-RAM budget.
On the default CPU setup 1,000 tokens stash+restore in ~5 ms but recompute in ~4.5 s, so a
stash wins unless host RAM is out or the victim holds almost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class PreemptMode(Enum):
    STASH = "stash"
    RECOMPUTE = "recompute"


@dataclass(frozen=True, slots=True)
class PreemptionCosts:
    kv_bytes_per_token: int
    stash_bytes_per_s: float  # copy out + copy back, per byte moved once
    prefill_tokens_per_s: float
    stash_budget_bytes: int

    def stash_bytes(self, num_tokens: int) -> int:
        return num_tokens * self.kv_bytes_per_token

    def choose(self, num_computed: int, stash_bytes_in_use: int) -> PreemptMode:
        if num_computed <= 0:
            return PreemptMode.RECOMPUTE  # nothing in the engine to save
        n_bytes = self.stash_bytes(num_computed)
        if stash_bytes_in_use + n_bytes > self.stash_budget_bytes:
            return PreemptMode.RECOMPUTE
        stash_s = 2 * n_bytes / self.stash_bytes_per_s
        recompute_s = num_computed / self.prefill_tokens_per_s
        return PreemptMode.STASH if stash_s < recompute_s else PreemptMode.RECOMPUTE
