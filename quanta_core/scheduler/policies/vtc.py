"""Virtual token counters (VTC, Sheng et al., OSDI '24) and the fair queue they order.

Each tenant of a class has a counter of the service it received, weighted:

    counter[t] += (input_cost * prompt tokens computed + output_cost * tokens sampled) / weight

charged per token as the engine produces it: a prompt token when a step computes it (once:
a recompute after preemption, or a prefix-cache hit, is not the tenant's doing), an output
token when it is sampled. The tenant served least goes next, so two backlogged tenants'
counters never drift apart by more than about one request's worth of service.

Idling banks no credit: a tenant that becomes backlogged (its first live request: waiting or
running) is lifted to the smallest counter among the backlogged tenants, or, when nobody is,
to the counter of the last tenant that went idle.

Admission runs ahead of charging (a whole prompt is admitted in one cycle, charged over the
next ones), so the order also counts a reservation: the uncharged prompt tokens of a tenant's
running requests. Without it one admission pass would take every slot for the tenant that
happened to be lowest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.queue import SortKey, WaitingQueue, arrival_order

_MIN_WEIGHT = 1e-6


class VirtualCounters:
    """The counters of one pool of tenants (one SLO class, or everyone for ``vtc``)."""

    def __init__(self, input_cost: float = 1.0, output_cost: float = 2.0) -> None:
        self.input_cost = input_cost
        self.output_cost = output_cost
        self.counter: dict[str, float] = {}
        self._live: dict[str, int] = {}  # tenant -> live choices (waiting or running)
        self._members: set[Choice] = set()
        self._reserved: dict[Choice, float] = {}
        self._reserved_by: dict[str, float] = {}
        self._last_idle = 0.0  # the counter of the last tenant that went idle

    def is_backlogged(self, tenant: str) -> bool:
        return self._live.get(tenant, 0) > 0

    def backlogged(self) -> list[str]:
        return list(self._live)

    def rank(self, tenant: str) -> float:
        """The order's key: service received plus prompt service already admitted."""
        return self.counter.get(tenant, 0.0) + self._reserved_by.get(tenant, 0.0)

    def join(self, r: Choice) -> None:
        """A choice enters (submit): its tenant, if it was idle, is lifted."""
        if r in self._members:
            return
        self._members.add(r)
        t = r.tenant
        if t not in self._live:
            others = [self.counter[u] for u in self._live]
            floor = min(others) if others else self._last_idle
            self.counter[t] = max(self.counter.get(t, 0.0), floor)
            self._live[t] = 0
        self._live[t] += 1

    def leave(self, r: Choice) -> None:
        """A choice ends (any reason)."""
        self.release(r)
        if r not in self._members:
            return
        self._members.remove(r)
        t = r.tenant
        self._live[t] -= 1
        if self._live[t] == 0:
            del self._live[t]
            self._last_idle = self.counter[t]

    def charge(self, r: Choice, input_tokens: int, output_tokens: int) -> None:
        w = max(r.weight, _MIN_WEIGHT)
        cost_in = self.input_cost * input_tokens / w
        self.counter[r.tenant] = (
            self.counter.get(r.tenant, 0.0) + cost_in + self.output_cost * output_tokens / w
        )
        held = self._reserved.get(r)
        if held is not None and cost_in > 0:
            paid = min(held, cost_in)
            self._reserved[r] = held - paid
            self._reserved_by[r.tenant] -= paid

    def reserve(self, r: Choice) -> None:
        """``r`` was admitted: count its uncharged prompt in its tenant's rank."""
        self.release(r)
        todo = r.prompt_len - max(r.num_computed_tokens, r.charged_input)
        if todo > 0:
            amount = self.input_cost * todo / max(r.weight, _MIN_WEIGHT)
            self._reserved[r] = amount
            self._reserved_by[r.tenant] = self._reserved_by.get(r.tenant, 0.0) + amount

    def release(self, r: Choice) -> None:
        """``r`` left the engine (finished or preempted): its reservation goes."""
        held = self._reserved.pop(r, None)
        if held is not None:
            self._reserved_by[r.tenant] -= held


class FairQueue:
    """Waiting requests, one queue per tenant (FIFO, or in ``key``'s order); the head is the
    lowest-ranked tenant's first (ties: the older head).

    O(tenants) per peek: tenants are few, requests many.
    """

    def __init__(
        self, counters: VirtualCounters, key: Callable[[Choice], SortKey] = arrival_order
    ) -> None:
        self.counters = counters
        self._key = key
        self._by_tenant: dict[str, WaitingQueue] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_tenant.values())

    def push(self, r: Choice) -> None:
        queue = self._by_tenant.get(r.tenant)
        if queue is None:
            queue = self._by_tenant[r.tenant] = WaitingQueue(self._key)
        queue.push(r)

    def _head_queue(self) -> WaitingQueue | None:
        best: tuple[float, int, int] | None = None
        best_queue = None
        for tenant, queue in self._by_tenant.items():
            head = queue.peek()
            if head is None:
                continue
            key = (self.counters.rank(tenant), head.order, head.index)
            if best is None or key < best:
                best, best_queue = key, queue
        return best_queue

    def peek(self) -> Choice | None:
        queue = self._head_queue()
        return None if queue is None else queue.peek()

    def pop(self) -> Choice:
        queue = self._head_queue()
        if queue is None:
            raise IndexError("pop from an empty fair queue")
        r = queue.pop()
        self._forget_if_empty(r.tenant)
        return r

    def remove(self, r: Choice) -> None:
        queue = self._by_tenant.get(r.tenant)
        if queue is not None and r.queue_stamp:
            queue.remove(r)
            self._forget_if_empty(r.tenant)

    def _forget_if_empty(self, tenant: str) -> None:
        if not self._by_tenant[tenant]:
            del self._by_tenant[tenant]

    def waiting_of(self, tenant: str) -> list[Choice]:
        queue = self._by_tenant.get(tenant)
        return [] if queue is None else list(queue)

    def tenants(self) -> dict[str, int]:
        return {t: len(q) for t, q in self._by_tenant.items()}

    def __iter__(self) -> Iterator[Choice]:
        for queue in list(self._by_tenant.values()):
            yield from queue
