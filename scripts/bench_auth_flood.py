#!/usr/bin/env python
"""Bad-key flood benchmark: what a flood of made-up API keys costs, and whether it slows a
good key, with the unknown-key guard (app/tenancy/key_flood.py) at its defaults and with it
opened wide (every unknown key one database lookup, as without a guard).

A real migrated SQLite file and ``Tenancy`` (no HTTP: the figures are the authentication's
own). In each turn, ``--flooders`` tasks send ``--bad`` distinct made-up keys from one
address while one task authenticates a good key ``--good`` times; recorded: the database
lookups, the CPU per bad key, the good key's latency, and how long its requests took from
first to last (the event loop is shared: that is where a flood slows other tenants). Turns
alternate (alone, guarded, open) ``--rounds`` times, so load from other processes falls on
all of them alike. Writes ``bench/results/reliability/auth_flood.json``.

    .venv/bin/python -m scripts.bench_auth_flood [--bad 2000] [--good 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event

from app.db.migrate import upgrade
from app.server.errors import InvalidApiKey, RateLimited
from app.server.settings import Settings
from app.tenancy.service import Tenancy
from tests.tenancy_setup import TenancyDb

OUT = Path("bench/results/reliability/auth_flood.json")
OPEN = {"auth_failures_per_minute": 10**9, "unknown_key_lookups_per_s": 1e9}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def turn(
    settings: Settings, good: str, bad: int, good_n: int, flooders: int, seed: int
) -> dict[str, Any]:
    tenancy = Tenancy(settings)
    await tenancy.start()
    lookups = [0]

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "FROM api_keys" in statement:
            lookups[0] += 1

    event.listen(tenancy.engine.sync_engine, "before_cursor_execute", seen)
    outcomes = {"401": 0, "429": 0}
    latencies: list[float] = []
    wall = [0.0]

    async def flood(worker: int) -> None:
        for i in range(worker, bad, flooders):
            try:
                await tenancy.authenticate(f"Bearer qk-flood-{seed}-{i:08d}", "10.0.0.2")
            except InvalidApiKey:
                outcomes["401"] += 1
            except RateLimited:
                outcomes["429"] += 1

    async def good_key() -> None:
        started = time.perf_counter()
        for _ in range(good_n):
            t0 = time.perf_counter()
            await tenancy.authenticate(f"Bearer {good}", "10.0.0.1")
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0)  # the flood's turn
        wall[0] = time.perf_counter() - started

    cpu0 = time.process_time()
    tasks = [good_key()]
    if bad:
        tasks += [flood(w) for w in range(flooders)]
    await asyncio.gather(*tasks)
    cpu = time.process_time() - cpu0
    await tenancy.stop()
    return {
        "good_all_ms": wall[0] * 1e3,  # the good key's requests, start to end, among the flood
        "good_p50_us": statistics.median(latencies) * 1e6,
        "good_p99_us": quantile(latencies, 0.99) * 1e6,
        "good_max_us": max(latencies) * 1e6,
        "db_lookups": lookups[0],
        "answers": outcomes if bad else {},
        "cpu_s": cpu,
    }


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="quanta-flood-"))
    await asyncio.to_thread(upgrade, f"sqlite+aiosqlite:///{root / 'quanta.db'}", None)
    db = TenancyDb(root)
    good = db.create_key("good")
    base = db.settings()
    turns: dict[str, list[dict[str, Any]]] = {"alone": [], "guarded": [], "open": []}
    for r in range(args.rounds):
        for name in turns:
            bad = 0 if name == "alone" else args.bad
            settings = db.settings(**OPEN) if name == "open" else base
            result = await turn(settings, good, bad, args.good, args.flooders, r)
            turns[name].append(result)
            print(name, json.dumps(result))
    summary = {
        name: {
            "good_all_ms": statistics.median(t["good_all_ms"] for t in ts),
            "good_p50_us": statistics.median(t["good_p50_us"] for t in ts),
            "good_p99_us": statistics.median(t["good_p99_us"] for t in ts),
            "db_lookups": statistics.median(t["db_lookups"] for t in ts),
            "cpu_us_per_bad_key": (
                statistics.median(t["cpu_s"] for t in ts) * 1e6 / args.bad
                if name != "alone"
                else None
            ),
        }
        for name, ts in turns.items()
    }
    for name, s in summary.items():
        print(f"{name:8s} {s}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "args": vars(args),
                "defaults": {
                    "auth_failures_per_minute": base.auth_failures_per_minute,
                    "unknown_key_lookups_per_s": base.unknown_key_lookups_per_s,
                },
                "load_average": os.getloadavg(),
                "summary": summary,
                "turns": turns,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bad", type=int, default=2000)
    parser.add_argument("--good", type=int, default=500)
    parser.add_argument("--flooders", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
