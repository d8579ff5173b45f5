"""Overload: ten times what the server can serve, for two minutes, then normal load.

    quanta bench reliability overload --minutes 2

First the capacity: requests per second that a closed loop of a few clients completes.
Then open-loop arrivals at ``--factor`` times that rate (at most ``MAX_IN_FLIGHT`` requests
held open by this client), with ``/healthz`` probed every half second and the server's RSS
sampled; rejections (429/503) are timed from send to answer, by the flood's own clients
(their event loop's delays included; this process's collector is off meanwhile) and by a
door probe in a process of its own (one interactive stream a second, timed to its status
line). Then the closed loop again:
how soon and how well it is served after the flood.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import multiprocessing
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine
from typing import Any

import httpx

from app.lab.reliability.harness import (
    Client,
    Key,
    Server,
    Tally,
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


def health_probe(url: str, pid: int, end: float) -> tuple[list[float], list[int]]:
    """``/healthz`` every half second on a connection of its own, timed; the server's RSS."""
    health: list[float] = []
    rss: list[int] = []
    with httpx.Client(timeout=10) as http:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            http.get(f"{url}/healthz")
            health.append((time.perf_counter() - t0) * 1000)
            rss.append(rss_kib(pid))
            time.sleep(0.5)
    return health, rss


def door_probe(url: str, model: str, key: str, end: float) -> dict[int, list[float]]:
    """Once a second an interactive stream, timed to its status line, then dropped."""
    door: dict[int, list[float]] = defaultdict(list)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    auth = {"authorization": f"Bearer {key}"}
    with httpx.Client(timeout=60) as http:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            with http.stream("POST", f"{url}/v1/chat/completions", json=body, headers=auth) as r:
                door[r.status_code].append((time.perf_counter() - t0) * 1000)
            time.sleep(1.0)
    return dict(door)


async def flood_until(
    end: float,
    rate: float,
    one: Callable[[Key, random.Random], Coroutine[Any, Any, str]],
    keys: list[Key],
    tasks: set[asyncio.Task[str]],
) -> int:
    """Open-loop arrivals at ``rate`` until ``end``; how many the cap held back."""
    rng = random.Random(0)
    skipped = 0
    next_at = time.monotonic()
    while next_at < end:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at += rng.expovariate(rate)
        if len(tasks) >= MAX_IN_FLIGHT:
            skipped += 1
            continue
        task = asyncio.create_task(one(rng.choice(keys), rng))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    return skipped


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
    tasks: set[asyncio.Task[str]] = set()

    by_class: dict[str, Counter[str]] = defaultdict(Counter)
    completed_s: dict[str, list[float]] = defaultdict(list)

    async def one(key: Key, rng: random.Random) -> str:
        t0 = time.monotonic()
        outcome = await flood.one(key, "json", MAX_TOKENS, rng)
        by_class[key.slo_class][outcome] += 1
        if outcome == "completed":
            completed_s[key.slo_class].append(time.monotonic() - t0)
        return outcome

    # The probes run in a process of their own: in this one, the flood's event loop and its
    # collector (hundreds of open requests) would hold the interpreter lock from under them.
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=spawn) as pool:
        probes = asyncio.gather(
            asyncio.wrap_future(pool.submit(health_probe, server.url, server.pid, end)),
            asyncio.wrap_future(pool.submit(door_probe, server.url, model, keys[0].value, end)),
        )
        # Nor does this process's own collector pause the flood's clients while they time.
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            skipped = await flood_until(end, rate, one, keys, tasks)
            (health, rss), door = await probes
        finally:
            gc.enable()
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
        "rejections_over_50ms": sum(1 for ms in rejection_ms if ms > 50),
        "door_probe_refusals_over_50ms": sum(
            1 for code in (429, 503) for ms in door.get(code, []) if ms > 50
        ),
        "completed_s_p50_p99": [
            pct(tally.latencies.get("completed", []), 0.5),
            pct(tally.latencies.get("completed", []), 0.99),
        ],
        "outcomes_by_class": {c: dict(v) for c, v in by_class.items()},
        "completed_s_p50_p99_max_by_class": {
            c: [pct(v, 0.5), pct(v, 0.99), pct(v, 1.0)] for c, v in completed_s.items()
        },
        "door_probe_ms_p50_p99_max_by_status": {
            str(code): [pct(v, 0.5), pct(v, 0.99), pct(v, 1.0)] for code, v in door.items()
        },
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
