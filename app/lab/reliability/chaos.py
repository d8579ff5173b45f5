"""Chaos: the engine killed every ~20 s under load, the server killed and restarted twice.

    quanta bench reliability chaos --minutes 5

Every request must end whole (``completed``: tokens received == its usage) or with a clear
error (an HTTP error, an error event in the stream); a request cut by the server's own
death is ``cut``. After a clean stop the ledger holds, per key, what the clients received
(a request cut by a server kill: at most the one write under way when it died). A tenant
with a daily token quota is checked after each restart, before its key is used again: its
rebuilt counter equals the ledger's, and once spent the quota refuses (429).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sqlite3
import time
from typing import Any

import httpx

from app.lab.reliability.harness import (
    Client,
    Key,
    Server,
    Tally,
    loadavg,
    model_of,
    run_and_report,
)

ENGINE_KILL_EVERY_S = 20.0
DAILY_QUOTA = 4000


async def worker(client: Client, keys: list[Key], end: float, seed: int, quiet: set[str]) -> None:
    """Back-to-back requests on ``keys`` but those in ``quiet``."""
    rng = random.Random(seed)
    while time.monotonic() < end:
        kind = rng.choice(("json", "stream", "stream"))
        key = rng.choice([k for k in keys if k.key_id not in quiet])
        outcome = await client.one(key, kind, rng.randint(16, 96), rng)
        if outcome.startswith("transport"):
            await asyncio.sleep(0.5)  # the server is restarting
        await asyncio.sleep(rng.uniform(0.0, 0.3))


def charged_today(server: Server, tenant_id: str) -> int:
    """The tenant's charged tokens in the ledger, of today (UTC) as the daily quota counts."""
    midnight = time.time() // 86_400 * 86_400
    with sqlite3.connect(server.db_path) as con:
        (n,) = con.execute(
            "SELECT COALESCE(SUM(charged_tokens), 0) FROM usage_ledger "
            "WHERE tenant_id = ? AND started_at >= ?",
            (tenant_id, midnight),
        ).fetchone()
    return int(n)


def quota_check(server: Server, limited: Key, model: str, tally: Tally) -> dict[str, Any]:
    """Right after a restart, before the quota's key is used again: the rebuilt counter
    against the ledger, then one request (what it receives counted in ``tally``)."""
    counters = server.admin("GET", f"/tenants/{limited.tenant_id}")["counters"]
    ledger = charged_today(server, limited.tenant_id)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {limited.value}"},
        timeout=60,
    )
    if r.status_code == 200:
        tally.received[limited.key_id] += r.json()["usage"]["completion_tokens"]
    return {
        "tokens_today_rebuilt": counters["tokens_today"],
        "tokens_in_ledger": ledger,
        "equal": counters["tokens_today"] == ledger,
        "quota": DAILY_QUOTA,
        "next_request_status": r.status_code,
        "refused_when_spent": ledger + 64 <= DAILY_QUOTA or r.status_code == 429,
    }


async def chaos(minutes: float, workers: int) -> dict[str, Any]:
    server = Server.fresh()
    server.start()
    keys = [
        server.tenant("chaos-interactive", "interactive"),
        server.tenant("chaos-batch", "batch"),
    ]
    limited = server.tenant("chaos-quota", "interactive", {"max_tokens_per_1_day": DAILY_QUOTA})
    tally = Tally()
    model = model_of(server.url, keys[0])
    client = Client(server.url, model, tally, timeout_s=120)
    start = time.monotonic()
    end = start + minutes * 60
    server_kills_at = (start + minutes * 60 / 3, start + minutes * 120 / 3)
    events: list[dict[str, Any]] = []
    quota_checks: list[dict[str, Any]] = []
    # The quota's key rests from its server's kill to its check: what is in flight on it
    # then is cut by the kill, and nothing new is charged to it before the check reads.
    quiet: set[str] = set()

    async def havoc() -> None:
        next_engine_kill = start + ENGINE_KILL_EVERY_S
        pending = list(server_kills_at)
        while time.monotonic() < end:
            now = time.monotonic()
            if pending and now >= pending[0]:
                pending.pop(0)
                quiet.add(limited.key_id)
                server.kill()
                events.append({"t_s": round(now - start, 1), "killed": "server"})
                await asyncio.to_thread(server.start)
                events.append({"t_s": round(time.monotonic() - start, 1), "restarted": True})
                check = await asyncio.to_thread(quota_check, server, limited, model, tally)
                quota_checks.append(check)
                quiet.discard(limited.key_id)
            elif now >= next_engine_kill:
                next_engine_kill = now + ENGINE_KILL_EVERY_S
                for pid in server.engine_pids():
                    os.kill(pid, signal.SIGKILL)
                    events.append({"t_s": round(now - start, 1), "killed": "engine"})
            await asyncio.sleep(0.2)

    await asyncio.gather(
        havoc(), *(worker(client, [*keys, limited], end, i, quiet) for i in range(workers))
    )
    await client.close()
    await asyncio.sleep(2.0)
    slots = {
        k.key_id: server.admin("GET", f"/tenants/{k.tenant_id}")["counters"]["concurrent_requests"]
        for k in [*keys, limited]
    }
    server.stop()
    ledger = server.ledger_tokens()
    per_key = {
        k.key_id: {"ledger": ledger.get(k.key_id, 0), "received": tally.received[k.key_id]}
        for k in [*keys, limited]
    }
    clear = ("completed", "cut", "stream_error", "http_", "transport")
    unclear = {o: n for o, n in tally.outcomes.items() if not o.startswith(clear)}
    return {
        "minutes": minutes,
        "workers": workers,
        "engine_kills": sum(1 for e in events if e.get("killed") == "engine"),
        "server_kills": sum(1 for e in events if e.get("killed") == "server"),
        "requests": tally.summary(),
        "unclear_outcomes": unclear,
        "ledger_vs_received": per_key,
        "ledger_minus_received_total": sum(v["ledger"] - v["received"] for v in per_key.values()),
        "quota_after_restarts": quota_checks,
        "concurrency_slots_held_at_end": slots,
        "load1_at_end": loadavg()[0],
        "events": events,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--name", default="chaos")
    args = parser.parse_args()
    run_and_report(args.name, chaos(args.minutes, args.workers), hidden="events")
