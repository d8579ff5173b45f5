"""Drive a plan against a server: open loop (arrivals on the clock, optional cap on requests
in flight) or closed loop (N users, each sends its next request when its answer is in).

Open loop: a request is *scheduled* at its arrival time and *sent* when a slot under the cap
is free (at once without a cap); every latency counts from the send, as vLLM's benchmark does,
and the record keeps both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from app.lab.bench.client import Target, perf_clock, send
from app.lab.bench.prompts import request_body
from quanta_core.metrics import RequestRecord
from quanta_core.workload import PlannedRequest, WorkloadSpec

OnDone = Callable[[RequestRecord], None]
Send = Callable[[PlannedRequest], Awaitable[RequestRecord]]


@dataclass(frozen=True, slots=True)
class RunOptions:
    api_key: str | None = None  # for tenants whose workload entry has none
    timeout_s: float = 600.0  # per request, between two bytes
    # A 429/503 that says when to come back is sent again then, up to this many times;
    # every attempt is passed to ``on_done``, the last one is the request's record.
    retries: int = 0
    # Each request's prompt as token ids, by its plan index (None: ``prompts.py``'s own).
    prompts: Mapping[int, Sequence[int]] | None = None


def _client(options: RunOptions) -> httpx.AsyncClient:
    timeout = httpx.Timeout(options.timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


async def run_plan(
    spec: WorkloadSpec,
    plan: Sequence[PlannedRequest],
    target: Target,
    options: RunOptions,
    on_done: OnDone | None = None,
    clock: Callable[[], float] | None = None,
) -> list[RequestRecord]:
    """Send the plan; ``clock`` (seconds since the run's start) is injectable for tests."""
    tenants = {t.name: t for t in spec.tenants}
    async with _client(options) as client:
        clock = clock or perf_clock(time.perf_counter())

        async def one(planned: PlannedRequest) -> RequestRecord:
            tenant = tenants[planned.tenant]
            body = request_body(
                planned,
                model=target.model,
                endpoint=target.endpoint,
                seed=spec.seed,
                ignore_eos=target.ignore_eos,
                temperature=target.temperature,
                prompt_ids=None if options.prompts is None else options.prompts[planned.index],
            )
            attempt = 0
            while True:
                record = await send(
                    client,
                    target,
                    planned,
                    body,
                    api_key=tenant.api_key or options.api_key,
                    clock=clock,
                    weight=tenant.weight,
                    attempt=attempt,
                )
                if on_done is not None:
                    on_done(record)
                wait = record.retry_after_s
                if attempt >= options.retries or record.status not in (429, 503) or wait is None:
                    return record
                attempt += 1
                await asyncio.sleep(wait)

        if spec.closed_loop:
            records = await _closed(spec, plan, one, clock)
        else:
            records = await _open(spec, plan, one, clock)
    return sorted(records, key=lambda r: int(r.request_id[1:]))


async def _open(
    spec: WorkloadSpec,
    plan: Sequence[PlannedRequest],
    one: Send,
    clock: Callable[[], float],
) -> list[RequestRecord]:
    cap = asyncio.Semaphore(spec.concurrency) if spec.concurrency else None

    async def arrive(planned: PlannedRequest) -> RequestRecord:
        delay = (planned.arrival or 0.0) - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if cap is None:
            return await one(planned)
        async with cap:
            return await one(planned)

    return list(await asyncio.gather(*(arrive(p) for p in plan)))


async def _closed(
    spec: WorkloadSpec,
    plan: Sequence[PlannedRequest],
    one: Send,
    clock: Callable[[], float],
) -> list[RequestRecord]:
    records: list[RequestRecord] = []

    async def user(queue: list[PlannedRequest]) -> None:
        while queue:
            if spec.duration_s is not None and clock() >= spec.duration_s:
                return
            records.append(await one(queue.pop()))
            if spec.think_s > 0:
                await asyncio.sleep(spec.think_s)

    own = {t.name: t.users for t in spec.tenants if t.users}
    if own:  # each tenant's users send only its requests
        queues = {name: [p for p in reversed(plan) if p.tenant == name] for name in own}
        users = [user(queues[name]) for name, n in own.items() for _ in range(n)]
    else:
        shared = list(reversed(plan))
        users = [user(shared) for _ in range(spec.users or 1)]
    await asyncio.gather(*users)
    return records
