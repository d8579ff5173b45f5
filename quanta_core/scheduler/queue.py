"""The waiting queue: a heap in a policy's order, with O(1) lazy removal (cancel).

``RequestQueue`` is what the scheduler needs of any waiting queue; ``WaitingQueue`` is the
plain one, the fair policies compose several of them (``quanta_core.scheduler.vtc``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from itertools import count
from typing import Any, Protocol

from quanta_core.scheduler.request import Request

SortKey = tuple[Any, ...]


def arrival_order(r: Request) -> SortKey:
    """First come, first served; the choices of one request in index order."""
    return (r.order, r.index)


class RequestQueue(Protocol):
    def __len__(self) -> int: ...

    def push(self, r: Request) -> None: ...

    def peek(self) -> Request | None: ...

    def pop(self) -> Request: ...

    def remove(self, r: Request) -> None: ...

    def __iter__(self) -> Iterator[Request]: ...


class WaitingQueue:
    def __init__(self, key: Callable[[Request], SortKey]) -> None:
        self._key = key
        self._heap: list[tuple[SortKey, int, Request]] = []
        self._stamps = count(1)
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, r: Request) -> None:
        if r.queue_stamp:
            raise RuntimeError(f"{r.owner} is queued twice")
        r.queue_stamp = next(self._stamps)
        heapq.heappush(self._heap, (self._key(r), r.queue_stamp, r))
        self._len += 1

    def peek(self) -> Request | None:
        heap = self._heap
        while heap and heap[0][2].queue_stamp != heap[0][1]:
            heapq.heappop(heap)  # a removed (or re-pushed) entry
        return heap[0][2] if heap else None

    def pop(self) -> Request:
        r = self.peek()
        if r is None:
            raise IndexError("pop from an empty waiting queue")
        heapq.heappop(self._heap)
        r.queue_stamp = 0
        self._len -= 1
        return r

    def remove(self, r: Request) -> None:
        """Forget ``r`` (its heap entry is skipped when it surfaces)."""
        if r.queue_stamp:
            r.queue_stamp = 0
            self._len -= 1

    def __iter__(self) -> Iterator[Request]:
        """The queued requests, in no particular order."""
        return (r for _, stamp, r in self._heap if r.queue_stamp == stamp)
