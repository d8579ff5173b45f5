"""Two replicas on one PostgreSQL (a cluster of the tests' own), each served over real HTTP
with the fake core: a tenant's quotas hold for the pair, not for each; a revocation, a
rotation and a new quota made through one replica apply on the other. Skipped where
PostgreSQL's server binaries cannot be had.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db.engine import make_engine
from app.db.migrate import upgrade
from app.tenancy.fleet import Fleet, FleetConfig
from app.tenancy.limiter import Limiter, Scope
from app.tenancy.quotas import Ask, Limit, Limits
from tests.fakes import MODEL, FakeDriver
from tests.postgres_cluster import Cluster, new_cluster
from tests.tenancy_setup import ADMIN, TenancyDb, bearer, fake_app, in_own_loop, over_http

PROMPT = 16  # the fake byte tokenizer: "<user>Say hi\n<a>"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "ignore_eos": True}


@dataclass
class ClusterDb(TenancyDb):
    cluster_url: str = ""

    @property
    def url(self) -> str:
        return self.cluster_url


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    made = new_cluster()
    if made is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) to start a cluster")
    try:
        in_own_loop(lambda: upgrade(made.url, None))
        yield made
    finally:
        made.remove()


@pytest.fixture
def replicas(tmp_path: Path, cluster: Cluster) -> Iterator[list[str]]:
    """Two replicas' URLs, each with its own data folder and fake engine."""
    with ExitStack() as stack:
        urls = []
        for i in range(2):
            db = ClusterDb(tmp_path / f"replica{i}", cluster.url)
            driver = FakeDriver(delay_s=0.02)
            app = fake_app(db, driver, replica_id=f"replica{i}")
            urls.append(stack.enter_context(over_http(app)))
        yield urls


async def new_tenant(c: httpx.AsyncClient, name: str, **quota: int) -> tuple[str, str, str]:
    t = (await c.post("/admin/v1/tenants", json={"name": name}, headers=ADMIN)).json()
    if quota:
        r = await c.put(f"/admin/v1/tenants/{t['id']}/quota", json=quota, headers=ADMIN)
        assert r.status_code == 200, r.text
    k = (await c.post(f"/admin/v1/tenants/{t['id']}/keys", json={}, headers=ADMIN)).json()
    return t["id"], k["id"], k["value"]


async def chat(c: httpx.AsyncClient, key: str, **fields: Any) -> httpx.Response:
    return await c.post("/v1/chat/completions", json={**BODY, **fields}, headers=bearer(key))


def assert_429(r: httpx.Response, limit: str) -> None:
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1
    assert limit in r.json()["error"]["message"]


async def test_a_token_budget_holds_for_the_fleet(replicas: list[str]) -> None:
    # 300 tokens a minute, requests of PROMPT + 20: eight fit, the ninth fits on neither
    # replica although each alone has never served more than half of the budget.
    a, b = (httpx.AsyncClient(base_url=url, timeout=30) for url in replicas)
    async with a, b:
        _, _, key = await new_tenant(a, "tpm", max_tokens_per_1_minute=300)
        served: list[int] = []
        refused: list[httpx.Response] = []
        for i in range(12):
            r = await chat((a, b)[i % 2], key, max_tokens=20)
            if r.status_code == 200:
                served.append(r.json()["usage"]["total_tokens"])
            else:
                refused.append(r)
        assert sum(served) <= 300
        assert sum(served) > 300 - (PROMPT + 20)
        assert len(refused) == 12 - len(served) >= 2
        for r in refused:
            assert_429(r, "tokens per min (TPM)")


async def test_concurrency_holds_for_the_fleet_and_slots_move(replicas: list[str]) -> None:
    a, b = (httpx.AsyncClient(base_url=url, timeout=30) for url in replicas)
    async with a, b:
        _, _, key = await new_tenant(a, "conc", max_concurrent_requests=2)
        clients = [a, b, a, b, a, b]
        answers = await asyncio.gather(*(chat(c, key, max_tokens=40) for c in clients))
        ok = [r for r in answers if r.status_code == 200]
        assert len(ok) == 2
        for r in answers:
            if r.status_code != 200:
                assert_429(r, "concurrent requests")
        # Idle slots go back to the database: each replica in turn serves both at once.
        for c in (a, b):
            for _ in range(100):
                pair = await asyncio.gather(chat(c, key, max_tokens=5), chat(c, key, max_tokens=5))
                if all(r.status_code == 200 for r in pair):
                    break
                await asyncio.sleep(0.1)
            assert [r.status_code for r in pair] == [200, 200]


async def test_revocation_rotation_and_quotas_reach_the_other_replica(
    replicas: list[str],
) -> None:
    a, b = (httpx.AsyncClient(base_url=url, timeout=30) for url in replicas)
    async with a, b:
        tenant, key_id, key = await new_tenant(a, "revoke")
        assert (await chat(b, key, max_tokens=2)).status_code == 200  # b knows the key

        r = await a.put(
            f"/admin/v1/tenants/{tenant}/quota",
            json={"max_requests_per_1_minute": 1},
            headers=ADMIN,
        )
        assert r.status_code == 200
        assert await eventually(
            lambda: chat(b, key, max_tokens=2),
            lambda r: r.headers.get("x-ratelimit-limit-requests") == "1",
        )

        rotated = await a.post(f"/admin/v1/keys/{key_id}/rotate", json={}, headers=ADMIN)
        assert rotated.status_code in (200, 201), rotated.text
        new_value = rotated.json()["value"]
        assert await eventually(
            lambda: b.get("/v1/key", headers=bearer(new_value)), lambda r: r.status_code == 200
        )

        revoked = await a.post(f"/admin/v1/keys/{key_id}/revoke", headers=ADMIN)
        assert revoked.status_code == 200, revoked.text
        assert await eventually(
            lambda: b.get("/v1/key", headers=bearer(new_value)), lambda r: r.status_code == 401
        )
        assert (await b.get("/v1/key", headers=bearer(key))).status_code == 401


async def eventually(ask: Any, done: Any, within_s: float = 10.0) -> bool:
    """``done(await ask())`` becomes true within ``within_s`` (a bound on correctness, not a
    timing: the notification takes milliseconds; the figures are in bench/results/fleet/)."""
    for _ in range(int(within_s / 0.02)):
        if done(await ask()):
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_day_quota_and_the_live_counters_are_the_fleets(replicas: list[str]) -> None:
    # Day quotas are checked on each replica against its own use plus the others' from their
    # heartbeats; the admin API of either replica shows the pair's counters.
    a, b = (httpx.AsyncClient(base_url=url, timeout=30) for url in replicas)
    async with a, b:
        tenant, _, key = await new_tenant(a, "day", max_tokens_per_1_day=3 * (PROMPT + 20))
        for _ in range(2):
            assert (await chat(a, key, max_tokens=20)).status_code == 200

        async def counters() -> httpx.Response:
            return await b.get(f"/admin/v1/tenants/{tenant}", headers=ADMIN)

        assert await eventually(
            counters, lambda r: r.json()["counters"]["tokens_today"] == 2 * (PROMPT + 20)
        )
        assert r_ok(await chat(b, key, max_tokens=20))
        refused = await chat(b, key, max_tokens=20)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "insufficient_quota"
        shown = (await counters()).json()["counters"]
        assert shown["tokens_last_minute"] == shown["tokens_today"] == 3 * (PROMPT + 20)


def r_ok(r: httpx.Response) -> bool:
    return r.status_code == 200 and r.json()["usage"]["total_tokens"] == PROMPT + 20


async def test_tokens_count_for_a_minute_from_when_they_were_served(cluster: Cluster) -> None:
    # Two replicas' quota parts on the shared database, on a clock of the test's: replica 0
    # serves a request of the whole minute's budget that streams for 30 s. Its tokens count
    # until a minute after the last was served (not after its admission), so replica 1 is
    # refused 75 s after that admission and granted again past 90 s.
    engine = make_engine(cluster.url)
    t0 = time.time()
    clock = [t0]
    limiters = [Limiter(), Limiter()]
    fleets = [
        Fleet(engine, limiter, FleetConfig(f"served{i}"), lambda: clock[0])
        for i, limiter in enumerate(limiters)
    ]
    scope = Scope("tenant ten_served_minute", Limits(max_tokens_per_1_minute=300))
    whole = Ask(prompt=100, max_tokens=200)
    small = Ask(prompt=10, max_tokens=10)

    async def admits(i: int, ask: Ask) -> bool:
        await fleets[i].prepare([scope], ask)
        return limiters[i].check([scope], ask, clock[0]) is None

    try:
        assert await admits(0, whole)
        charge = limiters[0].charge([scope], whole, clock[0])
        clock[0] = t0 + 30  # the last token is served; the request settles
        limiters[0].settle(charge, 300, clock[0], count_request=True)
        await fleets[0].sync_once()  # its lease closes, its 300 tokens used

        clock[0] = t0 + 75
        assert not await admits(1, small)
        denial = limiters[1].check([scope], small, clock[0])
        assert denial is not None and denial.limit is Limit.TOKENS
        assert 14 <= denial.retry_after_s <= 16  # until t0 + 90: a minute after it was served

        clock[0] = t0 + 91
        assert await admits(1, small)
    finally:
        await engine.dispose()
