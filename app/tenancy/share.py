"""A replica's part of one scope's fleet-wide quota: what it leased from the database.

    PostgreSQL fleet_leases ──grant──▶ Share.leases  [closing …, current]
                                          take · grow · settle   (memory only)
                            ◀──close(used)── a lease no longer taking, its charges settled

A lease grants tokens and requests for a minute's quota. Requests are charged to the
current lease only, in memory; it stops taking charges once spent, ``rotate_s`` old, or idle
``idle_s`` (nothing charged to it in flight), and is closed in the database (what it did not
use given back) once every charge on it settled. A closed lease's use is counted by the fleet
for a minute from ``last_at``: its last charge or the last settlement of a request charged to
it, whichever came later. A request's tokens are all served by its settlement, so every token
a lease served stays counted for at least 60 s after it was served, and the tokens served
fleet-wide in any 60 s never exceed the limit (app/tenancy/leases.py). Concurrency is a
count of slots held by the replica: taken from the database when a request finds none
free, given back when idle. Nothing here touches the database (``Fleet`` does).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from app.tenancy.quotas import Limits

UNBOUNDED = sys.maxsize


@dataclass(eq=False)
class Lease:
    id: str
    tokens: int
    requests: int
    opened: float
    used_tokens: int = 0
    used_requests: int = 0
    holders: int = 0  # charges on it not yet settled
    last_at: float = 0.0  # its last charge or settlement: its use counts a minute from then
    taking: bool = True

    def tokens_left(self) -> int:
        return self.tokens - self.used_tokens if self.taking else 0

    def requests_left(self) -> int:
        return self.requests - self.used_requests if self.taking else 0


@dataclass(eq=False)
class Hold:
    """One request's charges on a share: ``[lease, tokens]`` pieces, and its slot."""

    pieces: list[tuple[Lease, int]] = field(default_factory=list)
    request_lease: Lease | None = None
    slot: bool = False


class Share:
    def __init__(self, scope: str, limits: Limits) -> None:
        self.scope = scope
        self.limits = limits
        self.leases: list[Lease] = []
        self.slots = 0  # held
        self.in_flight = 0
        self.idle_since: float | None = None  # a free slot held since then
        self.used_at = 0.0  # last admission: the share is active
        self.retry_after_s = 1.0  # the database's estimate when it last refused
        self.fleet_used = 0  # the minute's tokens the fleet had counted at the last grant
        self.degraded = False  # the database is unreachable: a fixed part of the limits
        self.fleet_size = 1

    @property
    def leases_tokens(self) -> bool:
        lim = self.limits
        return lim.max_tokens_per_1_minute is not None or lim.max_requests_per_1_minute is not None

    def current(self) -> Lease | None:
        if self.leases and self.leases[-1].taking:
            return self.leases[-1]
        return None

    def tokens_left(self) -> int:
        if self.limits.max_tokens_per_1_minute is None:
            return UNBOUNDED
        lease = self.current()
        return 0 if lease is None else lease.tokens_left()

    def requests_left(self) -> int:
        if self.limits.max_requests_per_1_minute is None:
            return UNBOUNDED
        lease = self.current()
        return 0 if lease is None else lease.requests_left()

    def slots_free(self) -> int:
        if self.limits.max_concurrent_requests is None:
            return UNBOUNDED
        return self.slots - self.in_flight

    def take(self, tokens: int, now: float) -> Hold:
        hold = Hold()
        self.used_at = now
        lease = self.current()
        if lease is not None:
            lease.used_tokens += tokens
            lease.used_requests += 1
            lease.holders += 1
            lease.last_at = now
            hold.pieces.append((lease, tokens))
            hold.request_lease = lease
        if self.limits.max_concurrent_requests is not None:
            hold.slot = True
            self.in_flight += 1
            self.idle_since = None
        return hold

    def grow(self, hold: Hold, tokens: int, now: float) -> int:
        """Up to ``tokens`` more for a running request, from the current lease."""
        lease = self.current()
        if lease is None:
            return 0
        got = min(tokens, lease.tokens_left())
        if got <= 0:
            return 0
        lease.used_tokens += got
        lease.last_at = now
        if all(piece[0] is not lease for piece in hold.pieces):
            lease.holders += 1
        hold.pieces.append((lease, got))
        return got

    def settle(self, hold: Hold, tokens: int, *, count_request: bool, now: float) -> None:
        """The request was served ``tokens`` in all: each lease keeps its part of them, in
        the order they were charged, and gets the rest back."""
        left = tokens
        seen: set[int] = set()
        for lease, amount in hold.pieces:
            kept = min(amount, max(left, 0))
            left -= kept
            lease.used_tokens -= amount - kept
            if id(lease) not in seen:
                seen.add(id(lease))
                lease.holders -= 1
                # Its tokens were served until now: the fleet counts them a minute from here.
                lease.last_at = max(lease.last_at, now)
        if hold.request_lease is not None and not count_request:
            hold.request_lease.used_requests -= 1
        if hold.slot:
            self.in_flight -= 1
            if self.in_flight < self.slots:
                self.idle_since = now

    def retire(self, now: float, rotate_s: float, idle_s: float) -> None:
        """The current lease stops taking charges once spent, ``rotate_s`` old, or idle for
        ``idle_s`` (what it holds unused then goes back to the fleet at once)."""
        lease = self.current()
        if lease is not None and (
            now - lease.opened >= rotate_s
            or (lease.holders == 0 and now - max(lease.last_at, lease.opened) >= idle_s)
            or (lease.tokens_left() <= 0 and self.limits.max_tokens_per_1_minute is not None)
            or (lease.requests_left() <= 0 and self.limits.max_requests_per_1_minute is not None)
        ):
            lease.taking = False

    def closable(self) -> list[Lease]:
        """Leases no longer taking whose charges all settled, removed from the share."""
        done = [lease for lease in self.leases if not lease.taking and lease.holders == 0]
        if done:
            self.leases = [lease for lease in self.leases if lease not in done]
        return done

    def add(self, lease: Lease) -> None:
        current = self.current()
        if current is not None:
            current.taking = False
        self.leases.append(lease)
