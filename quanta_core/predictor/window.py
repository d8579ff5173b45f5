"""A sliding window of observed lengths, kept sorted: exact quantiles of the recent past,
conditional ones included ("how much longer, given it already ran ``g`` tokens").

    window (size 8)   [ 12  40  41  90 | 150 200 230 512 ]     g = 100
                                        └─ the lengths > g: remaining = length - g

Insertion and eviction are a bisect and a memmove of at most ``size`` ints, a quantile is two
bisects: microseconds at the sizes used (hundreds).
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Iterable


class LengthWindow:
    def __init__(self, size: int, values: Iterable[int] = ()) -> None:
        if size < 1:
            raise ValueError(f"a window holds at least one value, not {size}")
        self.size = size
        self._recent: deque[int] = deque()
        self._sorted: list[int] = []
        for v in values:
            self.add(v)

    def __len__(self) -> int:
        return len(self._recent)

    def add(self, length: int) -> None:
        if len(self._recent) == self.size:
            old = self._recent.popleft()
            del self._sorted[bisect_right(self._sorted, old) - 1]
        self._recent.append(length)
        insort(self._sorted, length)

    def count_above(self, generated: int) -> int:
        return len(self._sorted) - bisect_right(self._sorted, generated)

    def remaining(self, generated: int, q: float) -> int | None:
        """The ``q``-quantile of ``length - generated`` over the lengths above ``generated``
        (None: no such length). The quantile is the smallest value with at least a fraction
        ``q`` of them at or below it."""
        lo = bisect_right(self._sorted, generated)
        n = len(self._sorted) - lo
        if n == 0:
            return None
        k = max(math.ceil(q * n - 1e-9) - 1, 0)
        return self._sorted[lo + min(k, n - 1)] - generated

    def mean(self) -> float:
        return sum(self._recent) / len(self._recent) if self._recent else 0.0

    def values(self) -> list[int]:
        """Oldest first (what a saved state keeps)."""
        return list(self._recent)
