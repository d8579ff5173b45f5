"""The ``slo`` policy's waiting queue: promoted batch, then interactive, then batch.

- promoted: batch requests that waited ``batch_aging_s``, oldest first, ahead of all;
- interactive: a fair queue (VTC between the class's tenants), whose head ``choose`` may
  overrule to keep a promised first token (``quanta_core.scheduler.policies.promises``);
- batch: a fair queue (VTC between the class's tenants), admitted into the slack.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from quanta_core.requests import SloClass
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.policies.vtc import FairQueue, VirtualCounters
from quanta_core.scheduler.queue import ChoiceQueue, WaitingQueue, arrival_order


class ClassQueue:
    def __init__(
        self,
        counters: Mapping[SloClass, VirtualCounters],
        choose: Callable[[Choice], Choice] | None = None,
    ) -> None:
        """``choose``: the interactive head, given VTC's (VTC's unless a promise needs
        another first); None: VTC's."""
        self.promoted = WaitingQueue(arrival_order)
        self.classes = {c: FairQueue(counters[c]) for c in SloClass}
        self._home: dict[Choice, ChoiceQueue] = {}
        self.choose = choose

    def __len__(self) -> int:
        return len(self._home)

    def push(self, r: Choice) -> None:
        queue = self.classes[r.slo_class]
        queue.push(r)
        self._home[r] = queue

    def promote(self, r: Choice) -> None:
        """Move a waiting batch request ahead of everything not promoted before it."""
        self.remove(r)
        self.promoted.push(r)
        self._home[r] = self.promoted

    def is_promoted(self, r: Choice) -> bool:
        return self._home.get(r) is self.promoted

    def _head_queue(self) -> ChoiceQueue | None:
        queues: list[ChoiceQueue] = [self.promoted, *self.classes.values()]
        for queue in queues:
            if queue.peek() is not None:
                return queue
        return None

    def peek(self) -> Choice | None:
        queue = self._head_queue()
        if queue is None:
            return None
        head = queue.peek()
        interactive = queue is self.classes[SloClass.INTERACTIVE]
        if head is not None and interactive and self.choose is not None:
            return self.choose(head)
        return head

    def pop(self) -> Choice:
        r = self.peek()
        if r is None:
            raise IndexError("pop from an empty class queue")
        self.remove(r)
        return r

    def remove(self, r: Choice) -> None:
        queue = self._home.pop(r, None)
        if queue is not None:
            queue.remove(r)

    def __iter__(self) -> Iterator[Choice]:
        return iter(list(self._home))
