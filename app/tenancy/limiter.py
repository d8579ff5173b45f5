"""Counters per scope (a tenant, a key) and the check-then-charge reservation over them.

    now-60s                                     now
      │ 1-s buckets: [t, n] [t, n] … [t, n]      │   sliding minute: exact to the second
      day: (UTC day number, tokens)                 resets at 00:00 UTC
      in_flight: requests holding a concurrency slot

``check`` reads every scope and charges nothing; only if all pass does ``charge`` add to all
of them, so a refused request consumes nothing. A request is admitted if its prompt and one
token per choice fit (``Ask``); a charge reserves what it will likely use, as much of it as
every scope has left; ``grow`` charges output past the reservation as it comes, and answers
0 where a scope has nothing left (the request ends there); ``settle`` replaces the charge by
what was served and frees the concurrency slot. Single-threaded by design: the event loop
is the lock.

A scope whose quota is shared by a fleet of replicas has a ``Share`` (app/tenancy/share.py):
its per-minute tokens, requests and concurrency are then what this replica leased from the
database; the window still counts this replica's use, for headers and the live view.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app.tenancy.quotas import Ask, Denial, Limit, Limits
from app.tenancy.share import UNBOUNDED, Hold, Share

MINUTE = 60
DAY = 86_400


class Window:
    """Amounts added in the last 60 s, in 1-s buckets."""

    def __init__(self) -> None:
        self._buckets: deque[list[int]] = deque()
        self.total = 0

    def _expire(self, now: float) -> None:
        horizon = int(now) - MINUTE
        while self._buckets and self._buckets[0][0] <= horizon:
            self.total -= self._buckets.popleft()[1]

    def used(self, now: float) -> int:
        self._expire(now)
        return self.total

    def add(self, now: float, amount: int) -> int:
        second = int(now)
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += amount
        else:
            self._buckets.append([second, amount])
        self.total += amount
        return second

    def adjust(self, second: int, delta: int, now: float) -> None:
        """Change what was added at ``second`` (if it is still in the window)."""
        self._expire(now)
        for bucket in reversed(self._buckets):
            if bucket[0] == second:
                bucket[1] += delta
                self.total += delta
                return
            if bucket[0] < second:
                return

    def wait_for(self, now: float, allowed: int, wanted: int) -> float:
        """Seconds until ``wanted`` more fits under ``allowed``."""
        excess = self.used(now) + wanted - allowed
        for second, amount in self._buckets:
            excess -= amount
            if excess <= 0:
                return max(0.0, second + MINUTE - now)
        return float(MINUTE)

    def reset_in(self, now: float) -> float:
        self._expire(now)
        return max(0.0, self._buckets[-1][0] + MINUTE - now) if self._buckets else 0.0


@dataclass
class Counters:
    requests: Window = field(default_factory=Window)
    tokens: Window = field(default_factory=Window)
    day: int = 0
    day_tokens: int = 0
    in_flight: int = 0
    share: Share | None = None  # the scope's quota is the fleet's: what this replica leased
    others_today: int = 0  # fleet quotas: the other replicas' tokens today (heartbeats)

    def tokens_today(self, now: float) -> int:
        own = self.day_tokens if self.day == int(now // DAY) else 0
        return own + self.others_today

    def add_today(self, now: float, amount: int) -> None:
        today = int(now // DAY)
        if self.day != today:
            self.day, self.day_tokens = today, 0
        self.day_tokens += amount


@dataclass(frozen=True, slots=True)
class Scope:
    name: str  # "key key_…" / "tenant ten_…": counters' key and what a 429 names
    limits: Limits


@dataclass
class Charge:
    """One request's reservation in every scope it was charged to."""

    scopes: Sequence[Scope]
    counters: list[Counters]
    at: float
    tokens: int
    holds: list[Hold | None] = field(default_factory=list)  # per scope, where it has a Share
    settled: bool = False


@dataclass(frozen=True, slots=True)
class Remaining:
    """The tightest scope's per-minute figures, for the x-ratelimit-* headers."""

    limit_requests: int | None = None
    remaining_requests: int = 0
    reset_requests_s: float = 0.0
    limit_tokens: int | None = None
    remaining_tokens: int = 0
    reset_tokens_s: float = 0.0


class Limiter:
    def __init__(self) -> None:
        self._counters: dict[str, Counters] = {}

    def counters(self, scope: str) -> Counters:
        found = self._counters.get(scope)
        if found is None:
            found = self._counters[scope] = Counters()
        return found

    def check(self, scopes: Sequence[Scope], ask: Ask, now: float) -> Denial | None:
        for scope in scopes:
            denial = self._check_one(scope, self.counters(scope.name), ask.least, now)
            if denial is not None:
                return denial
        return None

    def _check_one(self, scope: Scope, c: Counters, tokens: int, now: float) -> Denial | None:
        lim = _limits(scope, c)
        if (tpm := lim.max_tokens_per_1_minute) is not None and tokens > tpm:
            return Denial(Limit.TOKENS, scope.name, tpm, c.tokens.used(now), tokens, 60.0, False)
        if (tpd := lim.max_tokens_per_1_day) is not None:
            used = c.tokens_today(now)
            if used + tokens > tpd:
                until_midnight = (math.floor(now / DAY) + 1) * DAY - now
                return Denial(
                    Limit.TOKENS_DAY, scope.name, tpd, used, tokens, until_midnight, False
                )
        share = _leased(c)
        if (rpm := lim.max_requests_per_1_minute) is not None:
            used = c.requests.used(now)
            if share is not None and share.requests_left() < 1:
                return Denial(Limit.REQUESTS, scope.name, rpm, used, 1, share.retry_after_s, True)
            if share is None and used + 1 > rpm:
                wait = c.requests.wait_for(now, rpm, 1)
                return Denial(Limit.REQUESTS, scope.name, rpm, used, 1, wait, True)
        if tpm is not None:
            used = c.tokens.used(now)
            if share is not None and share.tokens_left() < tokens:
                used = max(used, share.fleet_used)  # the fleet's, as the database counted it
                wait = share.retry_after_s
                return Denial(Limit.TOKENS, scope.name, tpm, used, tokens, wait, True)
            if share is None and used + tokens > tpm:
                wait = c.tokens.wait_for(now, tpm, tokens)
                return Denial(Limit.TOKENS, scope.name, tpm, used, tokens, wait, True)
        if (most := lim.max_concurrent_requests) is not None:
            full = share.slots_free() < 1 if share is not None else c.in_flight + 1 > most
            if full:
                return Denial(Limit.CONCURRENCY, scope.name, most, c.in_flight, 1, 1.0, True)
        return None

    def headroom(self, scopes: Sequence[Scope], now: float) -> int:
        """The tokens every scope still allows now (``UNBOUNDED`` without a token limit)."""
        room = UNBOUNDED
        for scope in scopes:
            c = self.counters(scope.name)
            lim = _limits(scope, c)
            if (tpd := lim.max_tokens_per_1_day) is not None:
                room = min(room, tpd - c.tokens_today(now))
            share = _leased(c)
            if share is not None:
                room = min(room, share.tokens_left())
            elif (tpm := lim.max_tokens_per_1_minute) is not None:
                room = min(room, tpm - c.tokens.used(now))
        return max(room, 0)

    def charge(self, scopes: Sequence[Scope], ask: Ask, now: float) -> Charge:
        """Reserve what ``ask`` will likely use, as much as every scope has left (at least
        ``ask.least``, which ``check`` found to fit)."""
        tokens = max(ask.least, min(ask.likely_total, self.headroom(scopes, now)))
        counters = [self.counters(s.name) for s in scopes]
        holds: list[Hold | None] = []
        for c in counters:
            c.requests.add(now, 1)
            c.tokens.add(now, tokens)
            c.add_today(now, tokens)
            c.in_flight += 1
            share = _leased(c)
            holds.append(share.take(tokens, now) if share is not None else None)
        return Charge(scopes, counters, now, tokens, holds)

    def grow(self, charge: Charge, tokens: int, now: float) -> int:
        """Up to ``tokens`` more for a running request: what every scope still allows."""
        if charge.settled:
            return 0
        got = min(tokens, self.headroom(charge.scopes, now))
        if got <= 0:
            return 0
        for c, hold in zip(charge.counters, charge.holds, strict=True):
            if hold is not None and c.share is not None:
                got = min(got, c.share.grow(hold, got, now))
        if got <= 0:
            return 0
        # A share granted less than another: the first ones keep the surplus until settled.
        for c in charge.counters:
            c.tokens.add(now, got)
            c.add_today(now, got)
        charge.tokens += got
        return got

    def settle(self, charge: Charge, tokens: int, now: float, *, count_request: bool) -> None:
        """Replace the reservation by ``tokens``; free the slot. Idempotent."""
        if charge.settled:
            return
        charge.settled = True
        delta = tokens - charge.tokens
        second = int(charge.at)
        for c, hold in zip(charge.counters, charge.holds, strict=True):
            c.in_flight -= 1
            c.tokens.adjust(second, delta, now)
            if not count_request:
                c.requests.adjust(second, -1, now)
            if int(charge.at // DAY) == c.day:
                c.day_tokens += delta
            if hold is not None and c.share is not None:
                c.share.settle(hold, tokens, count_request=count_request, now=now)

    def remaining(self, scopes: Iterable[Scope], now: float) -> Remaining:
        best_r: tuple[int, int, float] | None = None
        best_t: tuple[int, int, float] | None = None
        for scope in scopes:
            c = self.counters(scope.name)
            if (rpm := scope.limits.max_requests_per_1_minute) is not None:
                left = max(0, rpm - c.requests.used(now))
                if best_r is None or left < best_r[1]:
                    best_r = (rpm, left, c.requests.reset_in(now))
            if (tpm := scope.limits.max_tokens_per_1_minute) is not None:
                left = max(0, tpm - c.tokens.used(now))
                if best_t is None or left < best_t[1]:
                    best_t = (tpm, left, c.tokens.reset_in(now))
        r = best_r or (None, 0, 0.0)
        t = best_t or (None, 0, 0.0)
        return Remaining(r[0], r[1], r[2], t[0], t[1], t[2])

    def counters_by_scope(self) -> dict[str, Counters]:
        return self._counters

    def live(self, now: float) -> list[tuple[str, int, int, int, int]]:
        """Every scope with something to show: (scope, requests and tokens of the last
        minute, tokens today, in flight)."""
        rows = []
        for name, c in self._counters.items():
            own_today = c.tokens_today(now) - c.others_today
            row = (c.requests.used(now), c.tokens.used(now), own_today, c.in_flight)
            if any(row):
                rows.append((name, *row))
        return rows

    def rebuild(
        self,
        minute: Iterable[tuple[str, float, int, bool]],
        today: Iterable[tuple[str, int]],
        now: float,
    ) -> None:
        """Set the counters from the ledger: (scope, started_at, tokens, counted) of the last
        minute, and (scope, tokens) of today. Replaces whatever was counted before."""
        shares = {name: c.share for name, c in self._counters.items() if c.share is not None}
        self._counters = {}
        for name, share in shares.items():
            self.counters(name).share = share
        for scope, at, tokens, counted in minute:
            c = self.counters(scope)
            c.requests.add(at, 1 if counted else 0)
            c.tokens.add(at, tokens)
        day = int(now // DAY)
        for scope, tokens in today:
            c = self.counters(scope)
            c.day, c.day_tokens = day, c.day_tokens + tokens


def _leased(c: Counters) -> Share | None:
    """The scope's share while it holds, None where the window counts (no share, or the
    database unreachable)."""
    return c.share if c.share is not None and not c.share.degraded else None


def _limits(scope: Scope, c: Counters) -> Limits:
    """The scope's limits; with the database unreachable, this replica's part of them."""
    share = c.share
    if share is None or not share.degraded or share.fleet_size <= 1:
        return scope.limits
    n = share.fleet_size
    lim = scope.limits

    def part(value: int | None) -> int | None:
        return None if value is None else max(1, value // n)

    return Limits(
        part(lim.max_requests_per_1_minute),
        part(lim.max_tokens_per_1_minute),
        lim.max_tokens_per_1_day,
        part(lim.max_concurrent_requests),
    )
