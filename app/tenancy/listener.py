"""Every change of a tenant, key or quota reaches this replica's directory at once.

PostgreSQL's triggers (migration 0003) ``NOTIFY quanta_tenancy, '<tenant id>'`` on every
write to ``tenants``, ``api_keys`` and ``quota_policies``, whoever writes (any replica's admin
API, the CLI, SQL by hand). This replica LISTENs on its own connection and reloads that
tenant. A connection lost (PostgreSQL restarted) may have missed notifications: on every
(re)connection the whole directory is reloaded, and the connection is checked every
``check_s``; so a change reaches every replica within one round trip while the database is
up, and within ``check_s`` + a reload after it comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

log = logging.getLogger("quanta.fleet")

CHANNEL = "quanta_tenancy"


def asyncpg_dsn(url: str) -> str:
    """The libpq DSN of a SQLAlchemy ``postgresql+asyncpg://`` URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class TenancyListener:
    def __init__(
        self,
        url: str,
        reload_tenant: Callable[[str], Awaitable[None]],
        reload_all: Callable[[], Awaitable[None]],
        check_s: float = 1.0,
    ) -> None:
        self._dsn = asyncpg_dsn(url)
        self._reload_tenant = reload_tenant
        self._reload_all = reload_all
        self._check_s = check_s
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self.notifications = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="quanta-tenancy-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _heard(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.notifications += 1
        if payload:
            task = asyncio.create_task(self._reload(payload))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _reload(self, tenant_id: str) -> None:
        try:
            await self._reload_tenant(tenant_id)
        except Exception as exc:  # the next reconnection reloads everything
            log.warning("tenant %s not reloaded after a change: %s", tenant_id, exc)

    async def _run(self) -> None:
        connected = True
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self._dsn, timeout=5)
                await conn.add_listener(CHANNEL, self._heard)
                if not connected:
                    log.warning("tenancy changes: listening again; the directory is reloaded")
                # Changes made while nobody listened are picked up here.
                await self._reload_all()
                connected = True
                while not conn.is_closed():
                    await asyncio.sleep(self._check_s)
                    await conn.execute("SELECT 1")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if connected:
                    log.warning("tenancy changes: not listening (%s); retrying", exc)
                connected = False
                await asyncio.sleep(self._check_s)
            finally:
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1)
