"""Counters per scope (a tenant, a key) and the check-then-charge reservation over them.

    now-60s                                     now
      │ 1-s buckets: [t, n] [t, n] … [t, n]      │   sliding minute: exact to the second
      day: (UTC day number, tokens)                 resets at 00:00 UTC
      in_flight: requests holding a concurrency slot

``check`` reads every scope and charges nothing; only if all pass does ``charge`` add to all
of them, so a refused request consumes nothing. A charge reserves prompt + max_tokens;
``settle`` replaces the reservation by what was served and frees the concurrency slot.
Single-threaded by design: the event loop is the lock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app.tenancy.limits import Denial, Limit, Limits

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

    def tokens_today(self, now: float) -> int:
        return self.day_tokens if self.day == int(now // DAY) else 0

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

    counters: list[Counters]
    at: float
    tokens: int
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

    def check(self, scopes: Sequence[Scope], tokens: int, now: float) -> Denial | None:
        for scope in scopes:
            denial = self._check_one(scope, self.counters(scope.name), tokens, now)
            if denial is not None:
                return denial
        return None

    def _check_one(self, scope: Scope, c: Counters, tokens: int, now: float) -> Denial | None:
        lim = scope.limits
        if (tpm := lim.max_tokens_per_1_minute) is not None and tokens > tpm:
            return Denial(Limit.TOKENS, scope.name, tpm, c.tokens.used(now), tokens, 60.0, False)
        if (tpd := lim.max_tokens_per_1_day) is not None:
            used = c.tokens_today(now)
            if used + tokens > tpd:
                until_midnight = (math.floor(now / DAY) + 1) * DAY - now
                return Denial(
                    Limit.TOKENS_DAY, scope.name, tpd, used, tokens, until_midnight, False
                )
        if (rpm := lim.max_requests_per_1_minute) is not None:
            used = c.requests.used(now)
            if used + 1 > rpm:
                wait = c.requests.wait_for(now, rpm, 1)
                return Denial(Limit.REQUESTS, scope.name, rpm, used, 1, wait, True)
        if tpm is not None:
            used = c.tokens.used(now)
            if used + tokens > tpm:
                wait = c.tokens.wait_for(now, tpm, tokens)
                return Denial(Limit.TOKENS, scope.name, tpm, used, tokens, wait, True)
        if (most := lim.max_concurrent_requests) is not None and c.in_flight + 1 > most:
            return Denial(Limit.CONCURRENCY, scope.name, most, c.in_flight, 1, 1.0, True)
        return None

    def charge(self, scopes: Sequence[Scope], tokens: int, now: float) -> Charge:
        counters = [self.counters(s.name) for s in scopes]
        for c in counters:
            c.requests.add(now, 1)
            c.tokens.add(now, tokens)
            c.add_today(now, tokens)
            c.in_flight += 1
        return Charge(counters, now, tokens)

    def settle(self, charge: Charge, tokens: int, now: float, *, count_request: bool) -> None:
        """Replace the reservation by ``tokens``; free the slot. Idempotent."""
        if charge.settled:
            return
        charge.settled = True
        delta = tokens - charge.tokens
        second = int(charge.at)
        for c in charge.counters:
            c.in_flight -= 1
            c.tokens.adjust(second, delta, now)
            if not count_request:
                c.requests.adjust(second, -1, now)
            if int(charge.at // DAY) == c.day:
                c.day_tokens += delta

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

    def rebuild(
        self,
        minute: Iterable[tuple[str, float, int, bool]],
        today: Iterable[tuple[str, int]],
        now: float,
    ) -> None:
        """Set the counters from the ledger: (scope, started_at, tokens, counted) of the last
        minute, and (scope, tokens) of today. Replaces whatever was counted before."""
        self._counters = {}
        for scope, at, tokens, counted in minute:
            c = self.counters(scope)
            c.requests.add(at, 1 if counted else 0)
            c.tokens.add(at, tokens)
        day = int(now // DAY)
        for scope, tokens in today:
            c = self.counters(scope)
            c.day, c.day_tokens = day, c.day_tokens + tokens
