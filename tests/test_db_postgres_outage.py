"""PostgreSQL stopped mid-run (``pg_ctl stop`` of a cluster of the test's own), then started
again: known keys are served from memory meanwhile, the admin API and unknown keys get a
clear 503, nothing answers another 5xx, and once the database is back the ledger holds
exactly what was served. Skipped where PostgreSQL's server binaries cannot be had.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from app.db.engine import make_engine
from app.db.migrate import upgrade
from tests.fakes import MODEL
from tests.postgres_cluster import Cluster, new_cluster
from tests.tenancy_setup import (
    ADMIN,
    TenancyDb,
    bearer,
    in_own_loop,
    serving,
    streamed_usage,
)

Client = AsyncTestClient[Litestar]
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 5}


@dataclass
class ClusterDb(TenancyDb):
    cluster_url: str = ""

    @property
    def url(self) -> str:
        return self.cluster_url


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = new_cluster()
    if made is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) to start a cluster")
    try:
        in_own_loop(lambda: upgrade(made.url, None))
        yield made
    finally:
        made.remove()


async def ledger(url: str) -> tuple[int, int, int]:
    """Requests (final rows), prompt and completion tokens in the ledger."""
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT COUNT(*) FILTER (WHERE status != 'partial'), "
                        "COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0) "
                        "FROM usage_ledger"
                    )
                )
            ).one()
        return int(row[0]), int(row[1]), int(row[2])
    finally:
        await engine.dispose()


async def wait_for_ledger(url: str, requests: int) -> tuple[int, int, int]:
    for _ in range(600):
        try:
            got = await ledger(url)
        except OSError:
            got = (0, 0, 0)
        if got[0] >= requests:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"the ledger never reached {requests} requests")


async def test_postgresql_stopped_and_restarted_mid_run(tmp_path: Path, cluster: Cluster) -> None:
    db = ClusterDb(tmp_path, cluster.url)
    key = db.create_key("acme")
    served = [0, 0, 0]  # requests, prompt and completion tokens the clients were given

    async def chat(client: Client) -> int:
        r = await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
        if r.status_code == 200:
            usage = r.json()["usage"]
            served[0] += 1
            served[1] += usage["prompt_tokens"]
            served[2] += usage["completion_tokens"]
        return r.status_code

    async def stream(client: Client) -> None:
        usage = await streamed_usage(client, BODY, key)
        served[0] += 1
        served[1] += usage["prompt_tokens"]
        served[2] += usage["completion_tokens"]

    async with serving(db) as client:
        assert await chat(client) == 200
        await wait_for_ledger(cluster.url, 1)
        await asyncio.to_thread(cluster.stop)
        for _ in range(5):
            assert await chat(client) == 200  # a known key: served from memory
            await stream(client)
        assert (await client.get("/v1/key", headers=bearer(key))).status_code == 200
        r = await client.post("/admin/v1/tenants", json={"name": "new"}, headers=ADMIN)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "database_unavailable"
        assert "retry-after" in r.headers
        # An unknown key needs the database to be told apart from a new one: a clear 503.
        r = await client.post("/v1/chat/completions", json=BODY, headers=bearer("qk-" + "u" * 43))
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "database_unavailable"
        tenancy = client.app.state["tenancy"]
        for _ in range(400):
            if tenancy.ledger.failing_since is not None:
                break
            await asyncio.sleep(0.05)
        assert tenancy.ledger.failing_since is not None  # the flushes fail meanwhile
        await asyncio.to_thread(cluster.start)
        assert await wait_for_ledger(cluster.url, served[0]) == tuple(served)
        r = await client.post("/admin/v1/tenants", json={"name": "new"}, headers=ADMIN)
        assert r.status_code == 201, r.text
        assert await chat(client) == 200
        assert await wait_for_ledger(cluster.url, served[0]) == tuple(served)


async def test_past_the_outage_bound_postgresql_gets_a_clear_503(
    tmp_path: Path, cluster: Cluster
) -> None:
    db = ClusterDb(tmp_path, cluster.url)
    key = db.create_key("acme")
    async with serving(db, ledger_outage_s=0.2) as client:
        await asyncio.to_thread(cluster.stop)
        r = await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
        assert r.status_code == 200  # its row waits in memory
        tenancy = client.app.state["tenancy"]
        for _ in range(400):
            if tenancy.ledger.failing_since is not None:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # past the bound
        r = await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "database_unavailable"
        assert "retry-after" in r.headers
        await asyncio.to_thread(cluster.start)
        await wait_for_ledger(cluster.url, 1)
        for _ in range(400):
            if tenancy.ledger.failing_since is None:
                break
            await asyncio.sleep(0.05)
        r = await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
        assert r.status_code == 200
