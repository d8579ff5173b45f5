"""Overload: ten times what the server can serve, for two minutes, then normal load.

    python -m app.lab.reliability.overload --minutes 2

First the capacity: requests per second that a closed loop of a few clients completes.
Then open-loop arrivals at ``--factor`` times that rate (at most ``MAX_IN_FLIGHT`` requests
held open by this client), with ``/healthz`` probed every half second and the server's RSS
sampled; rejections (429/503) are timed from send to answer. Then the closed loop again:
how soon and how well it is served after the flood.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

from app.lab.reliability.harness import (
    Client,
    Key,
    Server,
    Tally,
    healthz_ms,
    loadavg,
    model_of,
    rss_kib,
    run_and_report,
)

MAX_IN_FLIGHT = 400
MAX_TOKENS = 32


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


async def closed_loop(client: Client, keys: list[Key], seconds: float, workers: int) -> float:
    """Requests completed per second by ``workers`` clients back to back."""
    done = 0
    end = time.monotonic() + seconds

    async def one_worker(seed: int) -> None:
        nonlocal done
        rng = random.Random(seed)
        while time.monotonic() < end:
            if await client.one(rng.choice(keys), "json", MAX_TOKENS, rng) == "completed":
                done += 1

    await asyncio.gather(*(one_worker(i) for i in range(workers)))
    return done / seconds


async def overload(minutes: float, factor: float, workers: int) -> dict[str, Any]:
    server = Server.fresh()
    server.start()
    keys = [server.tenant(f"flood-{i}", ("interactive", "batch")[i % 2]) for i in range(4)]
    model = model_of(server.url, keys[0])
    warm = Client(server.url, model, Tally())
    capacity = await closed_loop(warm, keys, 30.0, workers)
    await warm.close()

    tally = Tally()
    flood = Client(server.url, model, tally, timeout_s=600)
    rate = capacity * factor
    start = time.monotonic()
    end = start + minutes * 60
    health: list[float] = []
    rss: list[int] = []
    tasks: set[asyncio.Task[str]] = set()
    skipped = 0

    async def probe() -> None:
        while time.monotonic() < end:
            health.append(await healthz_ms(server.url))
            rss.append(rss_kib(server.pid))
            await asyncio.sleep(0.5)

    prober = asyncio.create_task(probe())
    rng = random.Random(0)
    next_at = start
    while next_at < end:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at += rng.expovariate(rate)
        if len(tasks) >= MAX_IN_FLIGHT:
            skipped += 1
            continue
        task = asyncio.create_task(flood.one(rng.choice(keys), "json", MAX_TOKENS, rng))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await prober
    in_flight_at_end = len(tasks)
    await asyncio.gather(*tasks)
    await flood.close()

    after = Client(server.url, model, Tally())
    t0 = time.monotonic()
    first_ok = None
    rng2 = random.Random(1)
    while first_ok is None and time.monotonic() - t0 < 60:
        if await after.one(keys[0], "json", MAX_TOKENS, rng2) == "completed":
            first_ok = time.monotonic() - t0
    recovered = await closed_loop(after, keys, 30.0, workers)
    await after.close()
    server.stop()

    rejected = {o: v for o, v in tally.latencies.items() if o in ("http_429", "http_503")}
    rejection_ms = [1000 * x for v in rejected.values() for x in v]
    return {
        "minutes": minutes,
        "factor": factor,
        "capacity_rps": round(capacity, 2),
        "offered_rps": round(rate, 2),
        "sent": sum(tally.outcomes.values()),
        "not_sent_client_cap": skipped,
        "in_flight_when_the_flood_stopped": in_flight_at_end,
        "outcomes": dict(tally.outcomes),
        "rejection_ms_p50_p99_max": [
            pct(rejection_ms, 0.5),
            pct(rejection_ms, 0.99),
            pct(rejection_ms, 1.0),
        ],
        "completed_s_p50_p99": [
            pct(tally.latencies.get("completed", []), 0.5),
            pct(tally.latencies.get("completed", []), 0.99),
        ],
        "healthz_ms_p50_p99_max": [pct(health, 0.5), pct(health, 0.99), pct(health, 1.0)],
        "healthz_probes": len(health),
        "healthz_over_100ms": sum(1 for h in health if h > 100),
        "server_rss_kib_min_max": [min(rss), max(rss)],
        "server_rss_kib_median": statistics.median(rss),
        "after_first_success_s": None if first_ok is None else round(first_ok, 2),
        "after_rps": round(recovered, 2),
        "after_over_capacity": round(recovered / capacity, 2) if capacity else None,
        "load1_at_end": loadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--name", default="overload")
    args = parser.parse_args()
    run_and_report(args.name, overload(args.minutes, args.factor, args.workers))


if __name__ == "__main__":
    main()
