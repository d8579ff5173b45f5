"""Class isolation (``quanta``): interactive takes its slot and memory from running batch.

An interactive request that cannot start for want of a slot or of memory preempts running
batch requests (stashed: cheap, and they resume later), the tenant furthest ahead of its
share first, its newest first. The last running batch request is never taken while batch
waits: batch always progresses.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from quanta_core.requests import SloClass
from quanta_core.scheduler.choice import Choice


def batch_victims(
    waiting: Sequence[Choice],
    running: Collection[Choice],
    max_running: int,
    batch_waits: bool,
    fits: Callable[[Choice, Collection[Choice]], bool],
    victim_key: Callable[[Choice], tuple[float, int, int]],
) -> list[Choice]:
    """The running batch requests to preempt so that ``waiting`` interactive requests (in
    arrival order) find a slot under ``max_running`` and memory (``fits``); the highest
    ``victim_key`` first. Stops at the first that no victim left can make room for."""
    batch = sorted(
        (r for r in running if r.slo_class is SloClass.BATCH), key=victim_key, reverse=True
    )
    if batch_waits:
        batch = batch[:-1]  # batch waits: its last running request stays
    staying = list(running)
    victims: list[Choice] = []
    for x in sorted(waiting, key=lambda r: (r.order, r.index)):
        if not batch:
            break  # no victim left: whether the rest start is ``may_start``'s to say
        need_slot = len(staying) + 1 > max_running
        while batch and (need_slot or not fits(x, staying)):
            v = batch.pop(0)
            victims.append(v)
            staying.remove(v)
            need_slot = False
        if need_slot or not fits(x, staying):
            break
        staying.append(x)
    return victims
