"""Quanta on PostgreSQL: the same migrations and the same admin and key flow, by URL alone.

Needs a server: ``QUANTA_TEST_POSTGRES_URL`` (``scripts/postgres_for_tests.sh`` starts one and
prints it; ``.ci/run`` does that). Skipped where there is none.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import inspect

from app.db.engine import make_engine
from app.db.migrate import current_revision, downgrade, head_revision, upgrade
from app.db.models import Base
from tests.fakes import FakeDriver
from tests.tenancy_setup import TenancyDb, fake_app, in_own_loop
from tests.test_admin_api import admin, chat, new_key, new_tenant
from tests.test_db_migrations import TABLES

URL = os.environ.get("QUANTA_TEST_POSTGRES_URL", "")
pytestmark = pytest.mark.skipif(not URL, reason="QUANTA_TEST_POSTGRES_URL is not set")


@dataclass
class PostgresDb(TenancyDb):
    """The tests' tenancy database, on PostgreSQL instead of a SQLite file."""

    @property
    def url(self) -> str:
        return URL


@pytest.fixture
def empty_schema() -> None:
    in_own_loop(lambda: downgrade(URL, "base"))


async def table_names() -> set[str]:
    engine = make_engine(URL)
    try:
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        return names - {"alembic_version"}
    finally:
        await engine.dispose()


async def model_diff() -> list[object]:
    engine = make_engine(URL)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda c: list(compare_metadata(MigrationContext.configure(c), Base.metadata))
            )
    finally:
        await engine.dispose()


@pytest.mark.usefixtures("empty_schema")
async def test_migrations_round_trip_and_match_the_models() -> None:
    assert await table_names() == set()
    in_own_loop(lambda: upgrade(URL, None))
    assert await table_names() == TABLES
    assert await current_revision(URL) == head_revision()
    assert await model_diff() == []
    in_own_loop(lambda: downgrade(URL, "base"))
    assert await table_names() == set()
    in_own_loop(lambda: upgrade(URL, None))
    assert await current_revision(URL) == head_revision()


@pytest.fixture
async def client(tmp_path: Path, empty_schema: None) -> AsyncIterator[AsyncTestClient[Litestar]]:
    in_own_loop(lambda: upgrade(URL, None))
    async with AsyncTestClient(fake_app(PostgresDb(tmp_path), FakeDriver())) as c:
        for _ in range(200):
            if (await c.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        yield c


async def test_tenants_keys_and_usage_on_postgresql(client: AsyncTestClient[Litestar]) -> None:
    tenant = await new_tenant(client, "pg-tenant", weight=2.0)
    key = await new_key(client, tenant["id"], slo_class="batch")
    assert (await chat(client, key["value"])).status_code == 200
    got = await admin(client, "GET", f"/keys/{key['id']}")
    assert got.json()["slo_class"] == "batch"
    assert "value" not in got.json()
    revoked = await admin(client, "POST", f"/keys/{key['id']}/revoke")
    assert revoked.status_code == 200
    assert (await chat(client, key["value"])).status_code == 401
    listed = await admin(client, "GET", "/tenants")
    assert [t["name"] for t in listed.json()["data"]] == ["pg-tenant"]
