"""The ``slo`` policy's waiting queue: promoted batch, then interactive, then batch.

- promoted: batch requests that waited ``batch_aging_s``, oldest first, ahead of all;
- interactive: a fair queue (VTC between the class's tenants), whose head ``choose`` may
  overrule to keep a promised first token (``quanta_core.scheduler.promises``);
- batch: a fair queue (VTC between the class's tenants), admitted into the slack.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from quanta_core.requests import SloClass
from quanta_core.scheduler.queue import RequestQueue, WaitingQueue, arrival_order
from quanta_core.scheduler.request import Request
from quanta_core.scheduler.vtc import FairQueue, VirtualCounters


class ClassQueue:
    def __init__(self, counters: Mapping[SloClass, VirtualCounters]) -> None:
        self.promoted = WaitingQueue(arrival_order)
        self.classes = {c: FairQueue(counters[c]) for c in SloClass}
        self._home: dict[Request, RequestQueue] = {}
        # The interactive head, given VTC's: VTC's unless a promise needs another first.
        self.choose: Callable[[Request], Request] | None = None

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
        if queue is None:
            return None
        head = queue.peek()
        interactive = queue is self.classes[SloClass.INTERACTIVE]
        if head is not None and interactive and self.choose is not None:
            return self.choose(head)
        return head

    def pop(self) -> Request:
        r = self.peek()
        if r is None:
            raise IndexError("pop from an empty class queue")
        self.remove(r)
        return r

    def remove(self, r: Request) -> None:
        queue = self._home.pop(r, None)
        if queue is not None:
            queue.remove(r)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._home))
