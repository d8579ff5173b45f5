"""The live view's data: the core's snapshot and its stats, read in one event-loop turn.

The scheduler changes only between turns of the event loop, so the snapshot and the gauges
read here together agree with each other; ``running``, ``waiting`` and ``kv_usage`` are the
very values ``/metrics`` exports (``quanta:*`` and ``vllm:*``) at that moment.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

import msgspec

from app.server.core import Core
from quanta_core.scheduler.snapshot import ChoiceView, Decision, StepRates


class TenantRow(msgspec.Struct):
    tenant: str
    slo_class: str
    virtual_tokens: float  # VTC: weighted service received
    share: float  # of its class's virtual tokens, 0..1
    waiting: int
    running: int


class QueueRow(msgspec.Struct):
    slo_class: str
    tenant: str
    waiting: int


class LiveState(msgspec.Struct):
    model: str
    policy: str
    now: float  # the core's clock: decisions' ``at`` are on it
    running: int  # = quanta:num_requests_running
    waiting: int  # = quanta:num_requests_waiting
    kv_usage: float  # = quanta:kv_cache_usage_perc
    preemptions: int
    prefix_cache_hits: int
    prefix_cache_queries: int
    block_size: int
    blocks: str  # one character per block: a running, s shared, c cached prefix, f free
    running_set: list[ChoiceView]
    queues: list[QueueRow]  # per class and tenant
    waiting_set: list[ChoiceView]
    tenants: list[TenantRow]
    decisions: list[Decision]  # newest first
    rates: StepRates


def live_state(core: Core, names: Callable[[str], str] = str) -> LiveState | None:
    """``None`` when the core cannot tell (no snapshot). Tenants are shown by name
    (``names``: a tenant's id to its name); the core knows them by id."""
    if core.snapshot is None:
        return None
    stats, snap = core.stats(), core.snapshot()
    queues: defaultdict[tuple[str, str], int] = defaultdict(int)
    for r in snap.waiting:
        queues[(r.slo_class, names(r.tenant))] += 1
    totals: defaultdict[str, float] = defaultdict(float)
    for t in snap.tenants:
        totals[t.slo_class] += t.counter
    return LiveState(
        model=core.model_name,
        policy=snap.policy,
        now=snap.now,
        running=stats.running,
        waiting=stats.waiting,
        kv_usage=stats.kv_usage,
        preemptions=stats.preemptions,
        prefix_cache_hits=stats.prefix_cache_hits,
        prefix_cache_queries=stats.prefix_cache_queries,
        block_size=snap.block_size,
        blocks=snap.blocks,
        running_set=[replace(r, tenant=names(r.tenant)) for r in snap.running],
        queues=[QueueRow(c, t, n) for (c, t), n in sorted(queues.items())],
        waiting_set=[replace(r, tenant=names(r.tenant)) for r in snap.waiting],
        tenants=[
            TenantRow(
                names(t.tenant),
                t.slo_class,
                t.counter,
                t.counter / totals[t.slo_class] if totals[t.slo_class] else 0.0,
                t.waiting,
                t.running,
            )
            for t in snap.tenants
        ],
        decisions=[replace(d, tenant=names(d.tenant)) for d in reversed(snap.decisions)],
        rates=snap.rates,
    )
