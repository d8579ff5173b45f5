"""Auth and quota benchmark: what tenancy adds to each request on the hot path.

100 tenants and 10,000 keys in a real migrated SQLite file, every tenant with a quota and one
key in ten with its own; then, for requests on random keys, the per-request cost of
  authenticate   Bearer → HMAC-SHA256 → the in-memory directory → checks (401/403)
  admit          every limit checked read-only, then charged together; x-ratelimit-* built
  settle         the reservation reconciled, the slot freed, the ledger row queued
Prints a table and writes ``bench/results/auth.json``. Target: median total under 1 ms.

    quanta bench auth [--tenants 100] [--keys 10000] [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import insert

from app.db.engine import make_engine
from app.db.migrate import upgrade
from app.db.models import ApiKey, QuotaPolicy, Tenant
from app.server.settings import Settings
from app.tenancy.keys import KeyHasher, new_key_value, prefix_of
from app.tenancy.meter import Run
from app.tenancy.quotas import Ask
from app.tenancy.service import Tenancy

SECRET = "bench-secret-0123456789abcdefghijklmnop"
OUT = Path("bench/results/auth.json")
BIG = 10**9  # quotas that are checked every time but never refuse


async def populate(url: str, tenants: int, keys: int) -> list[str]:
    hasher = KeyHasher(SECRET.encode())
    now = time.time()
    values: list[str] = []
    tenant_rows, key_rows, quota_rows = [], [], []
    for t in range(tenants):
        tid = f"ten_{t:08d}"
        tenant_rows.append(
            {
                "id": tid,
                "name": f"tenant-{t}",
                "status": "active",
                "weight": 1.0,
                "created_at": now,
                "updated_at": now,
            }
        )
        quota_rows.append(
            {
                "tenant_id": tid,
                "key_id": None,
                "max_requests_per_1_minute": BIG,
                "max_tokens_per_1_minute": BIG,
                "max_tokens_per_1_day": BIG,
                "max_concurrent_requests": BIG,
                "updated_at": now,
            }
        )
    for k in range(keys):
        value = new_key_value()
        values.append(value)
        kid = f"key_{k:08d}"
        key_rows.append(
            {
                "id": kid,
                "tenant_id": f"ten_{k % tenants:08d}",
                "name": None,
                "prefix": prefix_of(value),
                "hashed": hasher.hash(value),
                "slo_class": "interactive" if k % 3 else "batch",
                "status": "active",
                "created_at": now,
                "updated_at": now,
            }
        )
        if k % 10 == 0:
            quota_rows.append(
                {
                    "tenant_id": None,
                    "key_id": kid,
                    "max_requests_per_1_minute": BIG,
                    "max_tokens_per_1_minute": BIG,
                    "max_tokens_per_1_day": None,
                    "max_concurrent_requests": BIG,
                    "updated_at": now,
                }
            )
    engine = make_engine(url)
    async with engine.begin() as conn:
        await conn.execute(insert(Tenant), tenant_rows)
        await conn.execute(insert(ApiKey), key_rows)
        await conn.execute(insert(QuotaPolicy), quota_rows)
    await engine.dispose()
    return values


def summary(ns: list[int]) -> dict[str, float]:
    us = sorted(n / 1000 for n in ns)
    q = statistics.quantiles(us, n=100)
    return {
        "median_us": statistics.median(us),
        "p90_us": q[89],
        "p99_us": q[98],
        "mean_us": statistics.fmean(us),
        "max_us": us[-1],
    }


async def measure(settings: Settings, values: list[str], n: int, seed: int) -> dict[str, Any]:
    tenancy = Tenancy(settings)
    started = time.perf_counter()
    await tenancy.start()
    load_s = time.perf_counter() - started
    rng = random.Random(seed)
    run = Run("completed", 100)  # a request served whole, in a write that reached its client
    auth_ns, admit_ns, settle_ns, total_ns = [], [], [], []
    clock = time.perf_counter_ns
    for i in range(n + n // 10):
        header = f"Bearer {rng.choice(values)}"
        t0 = clock()
        principal = await tenancy.authenticate(header)
        t1 = clock()
        meter = await tenancy.reserve(principal, f"req-{i}", Ask(100, 256))
        tenancy.headers(principal)
        t2 = clock()
        meter.running(run)
        meter.sending(50)
        meter.written(True)
        meter.close()
        t3 = clock()
        if i >= n // 10:  # the first tenth warms up
            auth_ns.append(t1 - t0)
            admit_ns.append(t2 - t1)
            settle_ns.append(t3 - t2)
            total_ns.append(t3 - t0)
    pending = tenancy.ledger.pending
    flush_started = time.perf_counter()
    await tenancy.stop()  # flushes the ledger: every row of the run, in one batch
    flush_s = time.perf_counter() - flush_started
    return {
        "directory_load_s": load_s,
        "authenticate": summary(auth_ns),
        "admit": summary(admit_ns),
        "settle": summary(settle_ns),
        "total": summary(total_ns),
        "ledger_rows_flushed": pending,
        "ledger_flush_s": flush_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="quanta-bench-auth-") as folder:
        url = f"sqlite+aiosqlite:///{folder}/quanta.db"
        upgrade(url, None)
        values = asyncio.run(populate(url, args.tenants, args.keys))
        settings = Settings(
            database_url=url,
            data_dir=Path(folder),
            secret_key=SECRET,  # type: ignore[arg-type]
            admin_key="bench-admin-key-0123456789abcdef",  # type: ignore[arg-type]
        )
        figures = asyncio.run(measure(settings, values, args.requests, args.seed))
    table = Table(title=f"auth + quotas per request ({args.tenants} tenants, {args.keys} keys)")
    for column in ("step", "median µs", "p90 µs", "p99 µs", "mean µs"):
        table.add_column(column, justify="right" if "µs" in column else "left")
    for step in ("authenticate", "admit", "settle", "total"):
        s = figures[step]
        table.add_row(step, *(f"{s[k]:.1f}" for k in ("median_us", "p90_us", "p99_us", "mean_us")))
    console.print(table)
    median_ms = figures["total"]["median_us"] / 1000
    verdict = "PASS" if median_ms < 1.0 else "FAIL"
    console.print(f"median total {median_ms:.4f} ms per request (target < 1 ms): {verdict}")
    console.print(
        f"directory load {figures['directory_load_s'] * 1000:.0f} ms; ledger flush of "
        f"{figures['ledger_rows_flushed']} rows {figures['ledger_flush_s'] * 1000:.0f} ms"
    )
    result = {
        "benchmark": "auth",
        "tenants": args.tenants,
        "keys": args.keys,
        "requests": args.requests,
        "seed": args.seed,
        "target_median_ms": 1.0,
        "median_total_ms": median_ms,
        "pass": median_ms < 1.0,
        "figures": figures,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")
