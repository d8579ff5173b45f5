"""What a flood of bad API keys may cost: a bounded number of database lookups, nothing more.

A known key is found in memory (an HMAC and a dict lookup) and never waits on these bounds. A
key not in memory may be one the CLI made while the server runs, so it costs one database
lookup; a flood of made-up keys would make that one lookup per request. Two bounds:

    per client address   auth_failures_per_minute failed authentications in a fixed 60-s
                         window; past it, an unknown key from that address is answered 429
                         (with retry-after: the window's end) before the database is asked
    all addresses        unknown_key_lookups_per_s lookups (a token bucket of one second's
                         worth); past it an unknown key is answered 429 for a second

So N bad keys from one address cost at most ``auth_failures_per_minute`` lookups a minute,
and any number of addresses at most ``unknown_key_lookups_per_s`` a second; other tenants'
known keys are served from memory meanwhile. Memory is bounded too: at most
``MAX_ADDRESSES`` addresses are tracked (the oldest windows are dropped first).
Single-threaded by design: the event loop is the lock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

WINDOW_S = 60.0
MAX_ADDRESSES = 10_000


@dataclass(slots=True)
class _Failures:
    since: float
    count: int = 0


class KeyFloodBound:
    def __init__(self, failures_per_minute: int, lookups_per_s: float) -> None:
        self._limit = failures_per_minute
        self._rate = lookups_per_s
        self._tokens = lookups_per_s
        self._filled_at: float | None = None
        self._by_address: OrderedDict[str, _Failures] = OrderedDict()

    def blocked_for(self, address: str, now: float) -> float | None:
        """Seconds until ``address`` may try an unknown key again; ``None``: it may now."""
        entry = self._by_address.get(address)
        if entry is None or now - entry.since >= WINDOW_S or entry.count < self._limit:
            return None
        return entry.since + WINDOW_S - now

    def failed(self, address: str, now: float) -> None:
        entry = self._by_address.get(address)
        if entry is None or now - entry.since >= WINDOW_S:
            entry = _Failures(now)
            self._by_address.pop(address, None)
            self._by_address[address] = entry  # newest window last: the oldest go first
            while len(self._by_address) > MAX_ADDRESSES:
                self._by_address.popitem(last=False)
        entry.count += 1

    def take_lookup(self, now: float) -> float | None:
        """Spend one database lookup of an unknown key; ``None`` if one was left, else the
        seconds until one is."""
        if self._filled_at is not None:
            self._tokens = min(self._rate, self._tokens + (now - self._filled_at) * self._rate)
        self._filled_at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return (1.0 - self._tokens) / self._rate


def retry_after_s(seconds: float) -> int:
    return max(1, math.ceil(seconds))
