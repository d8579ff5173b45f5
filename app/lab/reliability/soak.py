"""Soak: mixed load for a long while; memory stays flat and the ledger matches the clients.

    quanta bench reliability soak --minutes 30

Three tenants of both classes (one with a concurrency quota of 2, so 429s and slot
releases happen all along) send JSON requests and streams; a fourth key only sends
streams it cuts after a few tokens (a cancel, a disconnect). At the end: no request
running or waiting, no concurrency slot held, and, after a clean stop, the ledger's
completion tokens per key against what that key's clients received.
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
    loadavg,
    model_of,
    rss_kib,
    run_and_report,
)

SAMPLE_EVERY_S = 15.0


async def worker(client: Client, keys: list[Key], cutter: Key, end: float, seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < end:
        if rng.random() < 0.2:
            await client.one(cutter, "cancel", 64, rng)
        else:
            kind = "json" if rng.random() < 0.5 else "stream"
            await client.one(rng.choice(keys), kind, rng.randint(8, 96), rng)
        await asyncio.sleep(rng.uniform(0.0, 0.5))


async def soak(minutes: float, workers: int) -> dict[str, Any]:
    server = Server.fresh()
    server.start()
    keys = [
        server.tenant("soak-interactive", "interactive"),
        server.tenant("soak-batch", "batch"),
        server.tenant("soak-limited", "interactive", {"max_concurrent_requests": 2}),
    ]
    cutter = server.tenant("soak-cancels", "interactive")
    tally = Tally()
    client = Client(server.url, model_of(server.url, keys[0]), tally)
    start = time.monotonic()
    end = start + minutes * 60
    samples: list[dict[str, float]] = []

    async def sample() -> None:
        while time.monotonic() < end:
            engines = server.engine_pids()
            samples.append(
                {
                    "t_s": round(time.monotonic() - start, 1),
                    "server_rss_kib": rss_kib(server.pid),
                    "engine_rss_kib": sum(rss_kib(p) for p in engines),
                    "load1": loadavg()[0],
                }
            )
            await asyncio.sleep(SAMPLE_EVERY_S)

    sampler = asyncio.create_task(sample())
    await asyncio.gather(*(worker(client, keys, cutter, end, i) for i in range(workers)))
    await sampler
    await client.close()
    await asyncio.sleep(2.0)
    metrics = server.metrics()
    slots = {
        k.key_id: server.admin("GET", f"/tenants/{k.tenant_id}")["counters"]["concurrent_requests"]
        for k in [*keys, cutter]
    }
    server.stop()  # a clean stop flushes the ledger
    ledger = server.ledger_tokens()

    warm = [s for s in samples if s["t_s"] >= minutes * 60 * 0.1]
    first = statistics.median(s["server_rss_kib"] for s in warm[:3])
    last = statistics.median(s["server_rss_kib"] for s in warm[-3:])
    per_key = {
        k.key_id: {"ledger": ledger.get(k.key_id, 0), "received": tally.received[k.key_id]}
        for k in [*keys, cutter]
    }
    whole = [k.key_id for k in keys]
    return {
        "minutes": minutes,
        "workers": workers,
        "requests": tally.summary(),
        "server_rss_kib_after_warmup": first,
        "server_rss_kib_at_end": last,
        "server_rss_growth_pct": round(100 * (last - first) / first, 2),
        "engine_rss_kib_at_end": warm[-1]["engine_rss_kib"],
        "at_end": {
            "running": metrics.get("quanta:num_requests_running"),
            "waiting": metrics.get("quanta:num_requests_waiting"),
            "kv_cache_usage_perc": metrics.get("quanta:kv_cache_usage_perc"),
            "concurrency_slots_held": slots,
        },
        "ledger_vs_received": per_key,
        "ledger_equals_received_for_whole_requests": all(
            per_key[k]["ledger"] == per_key[k]["received"] for k in whole
        ),
        "cancel_key_excess_tokens": per_key[cutter.key_id]["ledger"]
        - per_key[cutter.key_id]["received"],
        "load1_median": statistics.median(s["load1"] for s in samples),
        "server_log": str(server.root / "server.log"),
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--name", default="soak")
    args = parser.parse_args()
    run_and_report(args.name, soak(args.minutes, args.workers), hidden="samples")
