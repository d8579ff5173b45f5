"""The only source of time in the core: a wall clock in the server, a virtual one in the sim."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic."""
        ...


class WallClock:
    def now(self) -> float:
        return time.monotonic()


class VirtualClock:
    """Time that moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"time cannot go back ({seconds} s)")
        self._now += seconds

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"time cannot go back (from {self._now} to {t})")
        self._now = t
