"""A database that goes away (here: SQLite locked by another process's transaction).

Known keys are served from memory and their usage waits in the ledger's buffer; the admin
API answers a clear 503; once the database is back the ledger is written. Past
``ledger_outage_s`` new requests get a 503 too, so service never goes unrecorded longer.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from litestar import Litestar
from litestar.testing import AsyncTestClient

from tests.fakes import MODEL
from tests.tenancy_setup import ADMIN, TenancyDb, bearer, fresh_db, serving, streamed_usage

Client = AsyncTestClient[Litestar]
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3}


@contextmanager
def locked(db: TenancyDb) -> Iterator[None]:
    con = sqlite3.connect(db.root / "quanta.db", isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        con.execute("ROLLBACK")
        con.close()


def ledger_rows(db: TenancyDb) -> int:
    with sqlite3.connect(db.root / "quanta.db") as con:
        (n,) = con.execute("SELECT COUNT(*) FROM usage_ledger WHERE status != 'partial'").fetchone()
    return int(n)


async def wait_for_rows(db: TenancyDb, n: int) -> None:
    for _ in range(400):
        if ledger_rows(db) >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the ledger never reached {n} rows")


async def test_known_keys_are_served_and_the_ledger_catches_up(tmp_path: Path) -> None:
    db = fresh_db(tmp_path)
    key = db.create_key("acme")
    async with serving(db) as client:
        with locked(db):
            for _ in range(3):
                r = await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
                assert r.status_code == 200, r.text
            # (WAL: reads go on; a write waits out the busy timeout, then is refused.)
            r = await client.post("/admin/v1/tenants", json={"name": "new"}, headers=ADMIN)
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "database_unavailable"
            assert "retry-after" in r.headers
            assert ledger_rows(db) == 0
        await wait_for_rows(db, 3)
        r = await client.post("/admin/v1/tenants", json={"name": "new"}, headers=ADMIN)
        assert r.status_code == 201


async def test_past_the_outage_bound_requests_get_a_clear_503(tmp_path: Path) -> None:
    db = fresh_db(tmp_path)
    key = db.create_key("acme")
    async with serving(db, ledger_outage_s=0.1) as client:
        with locked(db):
            r = await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
            assert r.status_code == 200  # its row waits in memory; the flush fails
            tenancy = client.app.state["tenancy"]
            for _ in range(400):
                if tenancy.ledger.failing_since is not None:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # past the bound
            r = await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "database_unavailable"
        await wait_for_rows(db, 1)
        for _ in range(400):
            if tenancy.ledger.failing_since is None:
                break
            await asyncio.sleep(0.05)
        r = await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
        assert r.status_code == 200


def ledger_totals(db: TenancyDb) -> tuple[int, int, int]:
    with sqlite3.connect(db.root / "quanta.db") as con:
        row = con.execute(
            "SELECT COUNT(*) FILTER (WHERE status != 'partial'), "
            "COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0) "
            "FROM usage_ledger"
        ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


async def test_streams_and_unknown_keys_while_locked(tmp_path: Path) -> None:
    """Streams are served too, and their tokens reach the ledger once it is unlocked; an
    unknown key is still told apart (WAL: the lookup is a read, it goes on)."""
    db = fresh_db(tmp_path)
    key = db.create_key("acme")
    served = [0, 0, 0]
    async with serving(db) as client:
        with locked(db):
            for _ in range(3):
                usage = await streamed_usage(client, BODY, key)
                served[0] += 1
                served[1] += usage["prompt_tokens"]
                served[2] += usage["completion_tokens"]
            unknown = bearer("qk-" + "u" * 43)
            r = await client.post("/v1/chat/completions", json=BODY, headers=unknown)
            assert r.status_code == 401
            assert ledger_rows(db) == 0
        await wait_for_rows(db, 3)
        assert ledger_totals(db) == tuple(served)
