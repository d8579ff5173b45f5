"""The fleet behind Envoy, measured from the client's side (issue 41's "It must show").

    quanta bench fleet quota      3 replicas, 6,000 tokens/min and concurrency 4,
                                  24 closed-loop streams
    quanta bench fleet revoke     a revoked key, polled on every replica
    quanta bench fleet small      300 tokens/min, chats without max_tokens
    quanta bench fleet kill       a replica kill -9'ed mid-load
    quanta bench fleet pg         PostgreSQL restarted mid-load
    quanta bench fleet spill      2 replicas: one full, the other idle
    quanta bench fleet weights    tenants of weights 1 and 2

Each starts its own fleet (``LocalFleet``: PostgreSQL, replicas, Envoy) in a temporary
folder, runs, checks the ledger in the database against what the clients received, and writes
bench/results/fleet/<scenario>.json. Replicas run with QUANTA_THREADS (default 1): the
machine has few cores and three replicas share them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from app.db.engine import make_engine
from app.fleet.local import LocalFleet
from app.lab.measure.common import console, environment, write_results

OUT = Path("bench/results/fleet")
PROMPTS = [
    "Write a haiku about the sea.",
    "Name three colours and say why you like them.",
    "Explain what a queue is in two sentences.",
    "Tell me a short story about a cat.",
]


@dataclass
class Call:
    """One request as its client saw it (seconds since the run's start)."""

    request_id: str
    tenant: str
    started: float
    status: int = 0
    headers_at: float | None = None
    ended: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # received: the last usage the stream carried
    finish_reason: str | None = None
    upstream: str | None = None
    retry_after: str | None = None
    error: str | None = None
    first_at: float | None = None  # the first chunk with usage (the prompt is served)
    # (time received, output tokens): each chunk's new output, as its usage counted it
    served: list[tuple[float, int]] = field(default_factory=list)


class Run:
    def __init__(self, fleet: LocalFleet, admin_key: str) -> None:
        self.fleet = fleet
        self.admin = {"authorization": f"Bearer {admin_key}"}
        self.t0 = time.monotonic()
        self.calls: list[Call] = []
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(120, connect=5))

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def tenant(
        self, name: str, weight: float = 1.0, slo_class: str = "interactive", **quota: int
    ) -> tuple[str, str]:
        base = self.fleet.url
        t = await self.http.post(
            f"{base}/admin/v1/tenants", json={"name": name, "weight": weight}, headers=self.admin
        )
        tid = t.json()["id"]
        if quota:
            r = await self.http.put(
                f"{base}/admin/v1/tenants/{tid}/quota", json=quota, headers=self.admin
            )
            r.raise_for_status()
        k = await self.http.post(
            f"{base}/admin/v1/tenants/{tid}/keys", json={"slo_class": slo_class}, headers=self.admin
        )
        return tid, k.json()["value"]

    async def chat(
        self, key: str, tenant: str, prompt: str, max_tokens: int | None, url: str | None = None
    ) -> Call:
        call = Call(uuid.uuid4().hex, tenant, self.now())
        self.calls.append(call)
        body: dict[str, Any] = {
            "model": "quanta",
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        headers = {"authorization": f"Bearer {key}", "x-request-id": call.request_id}
        try:
            async with self.http.stream(
                "POST", f"{url or self.fleet.url}/v1/chat/completions", json=body, headers=headers
            ) as r:
                call.status = r.status_code
                call.headers_at = self.now()
                call.upstream = r.headers.get("x-quanta-upstream")
                call.retry_after = r.headers.get("retry-after")
                if r.status_code != 200:
                    await r.aread()
                    call.error = r.text[:200]
                    return call
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    call.request_id = chunk["id"].removeprefix("chatcmpl-")  # the ledger's id
                    if usage := chunk.get("usage"):
                        new = usage["completion_tokens"] - call.completion_tokens
                        if call.first_at is None:
                            call.first_at = self.now()
                        if new:
                            call.served.append((self.now(), new))
                        call.prompt_tokens = usage["prompt_tokens"]
                        call.completion_tokens = usage["completion_tokens"]
                    for choice in chunk.get("choices", []):
                        call.finish_reason = choice.get("finish_reason") or call.finish_reason
        except httpx.HTTPError as exc:
            call.error = f"{type(exc).__name__}: {exc}"
        finally:
            call.ended = self.now()
        return call

    async def closed_loop(
        self,
        key: str,
        tenant: str,
        until: float,
        max_tokens: int | None,
        i: int,
        url: str | None = None,
    ) -> None:
        n = 0
        while self.now() < until:
            call = await self.chat(key, tenant, PROMPTS[(i + n) % len(PROMPTS)], max_tokens, url)
            n += 1
            if call.status in (429, 503) and call.retry_after is not None:
                await asyncio.sleep(min(float(call.retry_after), max(0.0, until - self.now())))
            elif call.status != 200:
                await asyncio.sleep(0.2)


def sliding_max(points: list[tuple[float, int]], width: float = 60.0) -> int:
    """The most ``amount`` whose times fall in any window of ``width`` seconds."""
    points = sorted(points)
    best = total = 0
    lo = 0
    for t, amount in points:
        total += amount
        while points[lo][0] <= t - width:
            total -= points[lo][1]
            lo += 1
        best = max(best, total)
    return best


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


async def ledger(url: str) -> dict[str, dict[str, Any]]:
    """Per request: prompt and completion tokens charged, and when it started (the ledger's
    partial rows and final row summed)."""
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT request_id, tenant_id, min(started_at), sum(prompt_tokens), "
                    "sum(completion_tokens), sum(charged_tokens), max(finished_at), "
                    "bool_or(status != 'partial') FROM usage_ledger "
                    "GROUP BY request_id, tenant_id"
                )
            )
            return {
                r[0]: {
                    "tenant": r[1],
                    "started_at": float(r[2]),
                    "prompt": int(r[3]),
                    "completion": int(r[4]),
                    "charged": int(r[5]),
                    "finished_at": float(r[6]),
                    "final": bool(r[7]),
                }
                for r in rows
            }
    finally:
        await engine.dispose()


async def wait_ledger(url: str, ids: set[str], timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = await ledger(url)
        final = {i for i, row in rows.items() if row["final"]}
        if ids <= final or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.5)


def reconcile(calls: list[Call], rows: dict[str, Any]) -> dict[str, Any]:
    """The ledger against what the clients received, request by request."""
    served = [c for c in calls if c.status == 200]
    mismatched = []
    for c in served:
        row = rows.get(c.request_id)
        got = (row or {}).get("completion")
        if got != c.completion_tokens:
            mismatched.append(
                {"request_id": c.request_id, "client": c.completion_tokens, "ledger": got}
            )
    extra = [r for r in rows if r not in {c.request_id for c in served} and rows[r]["charged"]]
    return {
        "served_requests": len(served),
        "client_completion_tokens": sum(c.completion_tokens for c in served),
        "ledger_completion_tokens": sum(
            rows[c.request_id]["completion"] for c in served if c.request_id in rows
        ),
        "mismatched": mismatched[:20],
        "mismatched_count": len(mismatched),
        "charged_requests_not_served": len(extra),
    }


def summary_of(calls: list[Call]) -> dict[str, Any]:
    by_status: dict[str, int] = {}
    for c in calls:
        key = str(c.status) if not c.error or c.status else "transport error"
        by_status[key] = by_status.get(key, 0) + 1
    refusals = [c for c in calls if c.status == 429]
    return {
        "requests": len(calls),
        "by_status": by_status,
        "refusals_with_retry_after": sum(1 for c in refusals if c.retry_after),
        "refusals": len(refusals),
    }


async def with_fleet(
    name: str,
    work: Callable[[Run], Any],
    replicas: int = 3,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"quanta-fleet-{name}-"))
    threads = os.environ.get("QUANTA_THREADS", "1")
    port = int(os.environ.get("FLEET_PORT", "24100"))
    fleet = LocalFleet(
        folder,
        replicas,
        port,
        pg_port=port + 50,
        replica_env={
            "QUANTA_THREADS": threads,
            "QUANTA_LOG_LEVEL": "warning",
            "QUANTA_SERVED_MODEL_NAMES": "quanta",
            **(env or {}),
        },
    )
    console.print(f"[bold]{name}[/]: starting {replicas} replicas in {folder}")
    try:
        admin_key = await asyncio.to_thread(fleet.start)
        assert admin_key is not None
        run = Run(fleet, admin_key)
        async with run.http:
            figures = await work(run)
        figures["calls"] = [asdict(c) for c in run.calls]
        return {
            "scenario": name,
            "environment": environment(replicas=replicas, quanta_threads=int(threads)),
            **figures,
        }
    finally:
        await asyncio.to_thread(fleet.stop)


# ---- scenarios ----


async def quota(run: Run, seconds: float, tpm: int = 6000, concurrency: int = 4) -> dict[str, Any]:
    tid, key = await run.tenant(
        "limited", max_tokens_per_1_minute=tpm, max_concurrent_requests=concurrency
    )
    start = run.now()
    until = start + seconds
    await asyncio.gather(*(run.closed_loop(key, tid, until, 64, i) for i in range(24)))
    served = [c for c in run.calls if c.status == 200]
    rows = await wait_ledger(run.fleet.db_url, {c.request_id for c in served})
    by_start = [(c.started, c.prompt_tokens + c.completion_tokens) for c in served]
    by_end = [(c.ended or 0.0, c.prompt_tokens + c.completion_tokens) for c in served]
    ledger_points = [(r["started_at"], r["charged"]) for r in rows.values() if r["tenant"] == tid]
    # Every token when its client received it: the prompt with the first chunk, output as
    # it streamed (the usage each chunk carried).
    by_served = [point for c in served for point in c.served]
    by_served += [(c.first_at, c.prompt_tokens) for c in served if c.first_at is not None]
    minutes = []
    minutes_served = []
    for m in range(int(seconds // 60)):
        lo, hi = start + 60 * m, start + 60 * (m + 1)
        minutes.append(sum(t for at, t in by_end if lo <= at < hi))
        minutes_served.append(sum(t for at, t in by_served if lo <= at < hi))
    streams = [(c.headers_at or 0.0, c.ended or 0.0) for c in served]
    upstreams: dict[str, int] = {}
    for c in served:
        upstreams[c.upstream or "?"] = upstreams.get(c.upstream or "?", 0) + 1
    return {
        "limit_tokens_per_minute": tpm,
        "limit_concurrency": concurrency,
        "streams": 24,
        "seconds": seconds,
        "served_tokens_each_minute_as_served": minutes_served,
        "served_tokens_max_sliding_minute_as_served": sliding_max(by_served),
        "served_tokens_each_minute_by_end": minutes,
        "served_tokens_max_sliding_minute_by_start": sliding_max(by_start),
        "served_tokens_max_sliding_minute_by_end": sliding_max(by_end),
        "ledger_charged_max_sliding_minute": sliding_max(ledger_points),
        "max_concurrent_streams_seen_by_clients": max_overlap(streams),
        # The server's own: each request from its reservation to its settlement (the ledger).
        "max_concurrent_requests_in_the_ledger": max_overlap(
            [(r["started_at"], r["finished_at"]) for r in rows.values() if r["tenant"] == tid]
        ),
        "served_by_replica": upstreams,
        "summary": summary_of(run.calls),
        "ledger": reconcile(run.calls, rows),
    }


async def revoke(run: Run, rounds: int = 10) -> dict[str, Any]:
    times: list[list[float]] = []
    for i in range(rounds):
        tid, key = await run.tenant(f"revoke{i}")
        headers = {"authorization": f"Bearer {key}"}
        for r in run.fleet.members:  # every replica knows the key
            assert (await run.http.get(f"{r.url}/v1/key", headers=headers)).status_code == 200
        keys = await run.http.get(f"{run.fleet.url}/admin/v1/tenants/{tid}/keys", headers=run.admin)
        key_id = keys.json()["data"][0]["id"]
        sent = time.monotonic()
        done = await run.http.post(
            f"{run.fleet.url}/admin/v1/keys/{key_id}/revoke", headers=run.admin
        )
        answered = time.monotonic()
        done.raise_for_status()

        got = await asyncio.gather(
            *(refused_after(run, r.url, headers, answered) for r in run.fleet.members)
        )
        times.append([answered - sent, *got])
    after = sorted(max(t[1:]) for t in times)
    return {
        "rounds": rounds,
        "revoke_call_s": [t[0] for t in times],
        "refused_by_every_replica_after_the_answer_s": after,
        "median_s": after[len(after) // 2],
        "max_s": after[-1],
    }


async def refused_after(run: Run, url: str, headers: dict[str, str], since: float) -> float:
    """Seconds from ``since`` until ``url`` refuses the key (polled every 2 ms)."""
    while (await run.http.get(f"{url}/v1/key", headers=headers)).status_code != 401:
        await asyncio.sleep(0.002)
    return time.monotonic() - since


async def small(run: Run, seconds: float = 60.0) -> dict[str, Any]:
    from openai import AsyncOpenAI, RateLimitError

    _, key = await run.tenant("small", max_tokens_per_1_minute=300)
    client = AsyncOpenAI(base_url=f"{run.fleet.url}/v1", api_key=key, max_retries=0)
    answers: list[dict[str, Any]] = []
    start = run.now()
    while run.now() - start < seconds:
        try:
            r = await client.chat.completions.create(
                model="quanta", messages=[{"role": "user", "content": "hi"}]
            )
            assert r.usage is not None
            answers.append(
                {
                    "at": run.now(),
                    "status": 200,
                    "tokens": r.usage.total_tokens,
                    "finish_reason": r.choices[0].finish_reason,
                }
            )
        except RateLimitError as exc:
            retry = exc.response.headers.get("retry-after")
            answers.append({"at": run.now(), "status": 429, "retry_after": retry})
            await asyncio.sleep(min(float(retry or 1), 5.0))
    served = [a for a in answers if a["status"] == 200]
    return {
        "limit_tokens_per_minute": 300,
        "seconds": seconds,
        "served_requests": len(served),
        "served_tokens": sum(a["tokens"] for a in served),
        "first_request_served": bool(answers) and answers[0]["status"] == 200,
        "refusals": len(answers) - len(served),
        "refusals_with_retry_after": sum(1 for a in answers if a.get("retry_after")),
        "answers": answers,
    }


async def kill(run: Run, seconds: float = 60.0, kill_at: float = 20.0) -> dict[str, Any]:
    tid, key = await run.tenant("load")
    start = run.now()
    until = start + seconds
    victim = run.fleet.members[-1]
    port = f"127.0.0.1:{victim.port}"
    loops = [run.closed_loop(key, tid, until, 48, i) for i in range(9)]
    killed = {}

    async def killer() -> None:
        await asyncio.sleep(kill_at)
        killed["at"] = run.now()
        run.fleet.kill(len(run.fleet.members) - 1)
        # Envoy's view of the victim: when its health flag turns.
        while run.now() - killed["at"] < 10:
            r = await run.http.get(f"http://127.0.0.1:{run.fleet.admin_port}/clusters")
            if any(
                port in line and "health_flags::/failed_active_hc" in line
                for line in r.text.splitlines()
            ):
                killed["unhealthy_at"] = run.now()
                break
            await asyncio.sleep(0.02)

    await asyncio.gather(killer(), *loops)
    t_kill = killed["at"]
    cut = [
        c
        for c in run.calls
        if c.upstream == port and c.started < t_kill and (c.ended or 0) > t_kill
    ]
    others = [
        c
        for c in run.calls
        if c.upstream != port and c.started < t_kill + 5 and (c.ended or 0) > t_kill
    ]
    sent_after = [c for c in run.calls if c.upstream == port and c.started > t_kill]
    # The victim comes back: its journal gives the ledger what it had sent.
    run.fleet.start_replica(victim)
    await asyncio.to_thread(run.fleet.wait_ready, 600)
    served = [c for c in run.calls if c.status == 200]
    rows = await wait_ledger(run.fleet.db_url, {c.request_id for c in served})
    return {
        "killed_at_s": t_kill - start,
        "envoy_marked_unhealthy_after_s": killed.get("unhealthy_at", float("nan")) - t_kill,
        "health_check_interval_s": 1.0,
        "streams_on_the_victim_cut": len(cut),
        "streams_on_others_in_flight_at_the_kill": len(others),
        "streams_on_others_that_failed": sum(
            1 for c in others if c.error or c.status != 200 or c.finish_reason is None
        ),
        "requests_answered_by_the_victim_after_the_kill": sum(1 for c in sent_after if c.status),
        "summary": summary_of(run.calls),
        "ledger": reconcile(run.calls, rows),
        "cut_streams": [
            {"client": c.completion_tokens, "ledger": rows.get(c.request_id, {}).get("completion")}
            for c in cut
        ],
    }


async def pg(run: Run, seconds: float = 60.0, restart_at: float = 20.0) -> dict[str, Any]:
    tid, key = await run.tenant("load", max_tokens_per_1_minute=100_000, max_concurrent_requests=6)
    start = run.now()
    until = start + seconds
    info: dict[str, float] = {}

    async def restarter() -> None:
        await asyncio.sleep(restart_at)
        info["stopped_at"] = run.now() - start
        assert run.fleet.postgres is not None
        await asyncio.to_thread(run.fleet.postgres.stop)
        await asyncio.sleep(5.0)
        await asyncio.to_thread(run.fleet.postgres.start)
        info["started_at"] = run.now() - start

    await asyncio.gather(restarter(), *(run.closed_loop(key, tid, until, 48, i) for i in range(9)))
    during = [c for c in run.calls if info["stopped_at"] <= c.started - start <= info["started_at"]]
    served = [c for c in run.calls if c.status == 200]
    rows = await wait_ledger(run.fleet.db_url, {c.request_id for c in served})
    return {
        **info,
        "requests_started_while_down": len(during),
        "served_while_down": sum(1 for c in during if c.status == 200),
        "summary": summary_of(run.calls),
        "summary_while_down": summary_of(during),
        "ledger": reconcile(run.calls, rows),
    }


async def spill(run: Run, seconds: float = 60.0) -> dict[str, Any]:
    """One replica full, the other idle (run with 2 replicas, each running 2 and queueing 1):
    replica 0 is kept full by 4 clients of its own (another tenant, bypassing Envoy), and 2
    clients come through Envoy, which the idle replica can always serve. Envoy does not see
    replica 0's own load: what it sends there is refused (503) and retried once on the other.
    A 503 reaching an Envoy client is one the fleet could have served."""
    hog, hog_key = await run.tenant("hog")
    tid, key = await run.tenant("load")
    full = run.fleet.members[0]
    start = run.now()
    until = start + seconds
    direct = [run.closed_loop(hog_key, hog, until, 64, i, url=full.url) for i in range(4)]
    through = [run.closed_loop(key, tid, until, 32, 100 + i) for i in range(2)]
    await asyncio.gather(*direct, *through)
    stats = (await run.http.get(f"http://127.0.0.1:{run.fleet.admin_port}/stats")).text
    wanted = (
        "upstream_rq_503",
        "upstream_rq_retry",
        "upstream_rq_retry_success",
        "upstream_rq_retry_overflow",
        "upstream_rq_200",
    )
    envoy = {
        line.split(":")[0]: int(line.split(":")[1])
        for line in stats.splitlines()
        if line.startswith("cluster.quanta.") and line.split(":")[0].rsplit(".", 1)[-1] in wanted
    }
    clients = [c for c in run.calls if c.tenant == tid]
    return {
        "seconds": seconds,
        "replica_settings": "QUANTA_MAX_RUNNING=2, QUANTA_QUEUE_REQUESTS=1",
        "direct_to_the_full_replica": summary_of([c for c in run.calls if c.tenant == hog]),
        "through_envoy": summary_of(clients),
        "through_envoy_503": sum(1 for c in clients if c.status == 503),
        "through_envoy_by_replica": _count(c.upstream for c in clients),
        "envoy_stats": envoy,
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[str(item)] = out.get(str(item), 0) + 1
    return out


async def weights(
    run: Run, seconds: float = 120.0, slo_class: str = "interactive"
) -> dict[str, Any]:
    light, key1 = await run.tenant("light", weight=1.0, slo_class=slo_class)
    heavy, key2 = await run.tenant("heavy", weight=2.0, slo_class=slo_class)
    start = run.now()
    until = start + seconds
    loops = [run.closed_loop(key1, light, until, 64, i) for i in range(12)]
    loops += [run.closed_loop(key2, heavy, until, 64, i) for i in range(12)]
    await asyncio.gather(*loops)
    # Service while both were backlogged (after a start-up margin, before the loops end), by
    # when each token was received: output tokens, and VTC's service (prompt 1, output 2).
    lo, hi = start + 15, until - 5
    out = {light: 0, heavy: 0}
    vtc = {light: 0, heavy: 0}
    per_replica: dict[str, dict[str, int]] = {}
    for c in run.calls:
        if c.status != 200:
            continue
        got = sum(n for at, n in c.served if lo <= at <= hi)
        prompt = c.prompt_tokens if c.first_at is not None and lo <= c.first_at <= hi else 0
        out[c.tenant] += got
        vtc[c.tenant] += prompt + 2 * got
        row = per_replica.setdefault(c.upstream or "?", {"light": 0, "heavy": 0})
        row["light" if c.tenant == light else "heavy"] += got
    ratio = out[heavy] / out[light] if out[light] else float("nan")
    ratio_vtc = vtc[heavy] / vtc[light] if vtc[light] else float("nan")
    return {
        "weights": "1:2",
        "slo_class": slo_class,
        "window_s": [lo - start, hi - start],
        "output_tokens_light": out[light],
        "output_tokens_heavy": out[heavy],
        "heavy_over_light": ratio,
        "error_vs_2": abs(ratio - 2) / 2,
        "vtc_service_heavy_over_light": ratio_vtc,
        "vtc_error_vs_2": abs(ratio_vtc - 2) / 2,
        "output_tokens_by_replica": per_replica,
        "summary_light": summary_of([c for c in run.calls if c.tenant == light]),
        "summary_heavy": summary_of([c for c in run.calls if c.tenant == heavy]),
    }


SCENARIOS: dict[str, Callable[..., Any]] = {
    "quota": quota,
    "revoke": revoke,
    "small": small,
    "kill": kill,
    "pg": pg,
    "spill": spill,
    "weights": weights,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--replicas", type=int, default=None, help="default 3 (spill: 2)")
    parser.add_argument(
        "--tpm", type=int, default=None, help="quota: the tenant's tokens/min (default 6,000)"
    )
    parser.add_argument("--slo-class", default=None, help="weights: the keys' class")
    parser.add_argument("--out", default=None, help="results file name (default: the scenario)")
    args = parser.parse_args()
    work = SCENARIOS[args.scenario]
    kwargs: dict[str, Any] = {}
    if args.seconds is not None and args.scenario != "revoke":
        kwargs["seconds"] = args.seconds
    if args.slo_class is not None and args.scenario == "weights":
        kwargs["slo_class"] = args.slo_class
    if args.tpm is not None and args.scenario == "quota":
        kwargs["tpm"] = args.tpm
    env: dict[str, str] = {}
    replicas = args.replicas or 3
    if args.scenario == "spill":
        # A replica is full with 2 running and 1 waiting; one full, one idle.
        env = {"QUANTA_MAX_RUNNING": "2", "QUANTA_QUEUE_REQUESTS": "1"}
        replicas = args.replicas or 2
    results = asyncio.run(with_fleet(args.scenario, lambda run: work(run, **kwargs), replicas, env))
    shown = {k: v for k, v in results.items() if k not in ("calls", "answers", "environment")}
    console.print_json(json.dumps(shown, default=str))
    # Every request's row goes to a file of its own, not committed (.gitignore).
    calls = {"calls": results.pop("calls", []), "answers": results.pop("answers", [])}
    name = args.out or args.scenario
    write_results(OUT / f"{name}.calls.json", calls)
    write_results(OUT / f"{name}.json", results)


if __name__ == "__main__":
    main()
