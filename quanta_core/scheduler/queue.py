"""The waiting queue: a heap in a policy's order, with O(1) lazy removal (cancel).

``ChoiceQueue`` is what the scheduler needs of any waiting queue; ``WaitingQueue`` is the
plain one, the fair policies compose several of them (``quanta_core.scheduler.policies.vtc``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from itertools import count
from typing import Any, Protocol

from quanta_core.scheduler.choice import Choice

SortKey = tuple[Any, ...]


def arrival_order(r: Choice) -> SortKey:
    """First come, first served; the choices of one request in index order."""
    return (r.order, r.index)


class ChoiceQueue(Protocol):
    def __len__(self) -> int: ...

    def push(self, r: Choice) -> None: ...

    def peek(self) -> Choice | None: ...

    def pop(self) -> Choice: ...

    def remove(self, r: Choice) -> None: ...

    def __iter__(self) -> Iterator[Choice]: ...


class WaitingQueue:
    def __init__(self, key: Callable[[Choice], SortKey]) -> None:
        self._key = key
        self._heap: list[tuple[SortKey, int, Choice]] = []
        self._stamps = count(1)
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, r: Choice) -> None:
        if r.queue_stamp:
            raise RuntimeError(f"{r.owner} is queued twice")
        r.queue_stamp = next(self._stamps)
        heapq.heappush(self._heap, (self._key(r), r.queue_stamp, r))
        self._len += 1

    def peek(self) -> Choice | None:
        heap = self._heap
        while heap and heap[0][2].queue_stamp != heap[0][1]:
            heapq.heappop(heap)  # a removed (or re-pushed) entry
        return heap[0][2] if heap else None

    def pop(self) -> Choice:
        r = self.peek()
        if r is None:
            raise IndexError("pop from an empty waiting queue")
        heapq.heappop(self._heap)
        r.queue_stamp = 0
        self._len -= 1
        return r

    def remove(self, r: Choice) -> None:
        """Forget ``r`` (its heap entry is skipped when it surfaces)."""
        if r.queue_stamp:
            r.queue_stamp = 0
            self._len -= 1

    def __iter__(self) -> Iterator[Choice]:
        """The queued requests, in no particular order."""
        return (r for _, stamp, r in self._heap if r.queue_stamp == stamp)
