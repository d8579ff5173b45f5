"""The ``slo`` policy's waiting queue: promoted batch, then interactive, then batch.

- promoted: batch requests that waited ``batch_aging_s``, oldest first, ahead of all;
- interactive: a fair queue (VTC between the class's tenants);
- batch: a fair queue (VTC between the class's tenants), admitted into the slack.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from quanta_core.requests import SloClass
from quanta_core.scheduler.queue import RequestQueue, WaitingQueue, arrival_order
from quanta_core.scheduler.request import Request
from quanta_core.scheduler.vtc import FairQueue, VirtualCounters


class ClassQueue:
    def __init__(self, counters: Mapping[SloClass, VirtualCounters]) -> None:
        self.promoted = WaitingQueue(arrival_order)
        self.classes = {c: FairQueue(counters[c]) for c in SloClass}
        self._home: dict[Request, RequestQueue] = {}

    def __len__(self) -> int:
        return len(self._home)

    def push(self, r: Request) -> None:
        queue = self.classes[r.slo_class]
        queue.push(r)
        self._home[r] = queue

    def promote(self, r: Request) -> None:
        """Move a waiting batch request ahead of everything not promoted before it."""
        self.remove(r)
        self.promoted.push(r)
        self._home[r] = self.promoted

    def is_promoted(self, r: Request) -> bool:
        return self._home.get(r) is self.promoted

    def _head_queue(self) -> RequestQueue | None:
        queues: list[RequestQueue] = [self.promoted, *self.classes.values()]
        for queue in queues:
            if queue.peek() is not None:
                return queue
        return None

    def peek(self) -> Request | None:
        queue = self._head_queue()
        return None if queue is None else queue.peek()

    def pop(self) -> Request:
        queue = self._head_queue()
        if queue is None:
            raise IndexError("pop from an empty class queue")
        r = queue.pop()
        del self._home[r]
        return r

    def remove(self, r: Request) -> None:
        queue = self._home.pop(r, None)
        if queue is not None:
            queue.remove(r)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._home))
