"""Admitted load: the engine-seconds of interactive work let in lately, per second.

Refusing a request whose first token the projection puts past its target is honest under
sustained overload, where a queue only grows. Below capacity it is not: traffic of mixed
prompt lengths (a coding assistant's: 30 to 4,000 tokens) comes in clumps, and a clump
behind a long prompt projects past the target although the queue drains a minute later. So
the policy refuses on the target only while the work admitted over the last ``window_s``,
with the arrival's own (each priced alone on the step-cost model: its prefill and its
answer's share of the decode steps), would exceed the time it came in; below that, it
queues. Refused work is not counted: a client that sends again at once when refused
(a closed loop that ignores retry-after) would else read as an overload of its own
making and be refused for good; under a real overload the admitted work alone reaches
the engine's capacity within ``min_s`` and the target bounds the rest.

    load(t) = sum(work admitted in (t - window_s, t]) / max(min(t - first, window_s), min_s)

``min_s`` keeps the first arrivals from reading as overload (a burst on an idle machine is
the calm-burst rule's) and a lone arrival from reading as idle.
"""

from __future__ import annotations

from collections import deque


class OfferedLoad:
    def __init__(self, window_s: float, min_s: float) -> None:
        if window_s <= 0 or not 0 < min_s <= window_s:
            raise ValueError(f"need 0 < min_s <= window_s, got {min_s}, {window_s}")
        self.window_s = window_s
        self.min_s = min_s
        self._arrivals: deque[tuple[float, float]] = deque()  # (time, work seconds)
        self._sum = 0.0
        self._first: float | None = None

    def add(self, now: float, work_s: float) -> None:
        if self._first is None:
            self._first = now
        self._arrivals.append((now, work_s))
        self._sum += work_s
        self._expire(now)

    def load(self, now: float, extra_s: float = 0.0) -> float:
        """Work per second over the window (1: as much as the engine serves), with
        ``extra_s`` more arriving now."""
        self._expire(now)
        first = now if self._first is None else self._first
        span = max(min(now - first, self.window_s), self.min_s)
        return (self._sum + extra_s) / span

    def _expire(self, now: float) -> None:
        while self._arrivals and self._arrivals[0][0] <= now - self.window_s:
            self._sum -= self._arrivals.popleft()[1]
        if not self._arrivals:
            self._sum = 0.0  # no drift from float sums
