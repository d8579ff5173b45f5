"""A real SQLite file made by the real migrations, with a tenant key, for tests.

The migrations run once per test session into a template file; each test copies it.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from litestar.testing import AsyncTestClient

from app.admin.schemas import KeyCreate, QuotaIn, TenantCreate
from app.admin.service import AdminService
from app.db.engine import make_engine, make_sessionmaker
from app.db.migrate import upgrade
from app.server.settings import Settings
from app.tenancy.keys import KeyHasher

ADMIN_KEY = "test-admin-key-0123456789abcdef"
SECRET_KEY = "test-secret-key-0123456789abcdefghijkl"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}

_template: Path | None = None
T = TypeVar("T")


def in_own_loop(work: Callable[[], T]) -> T:
    """Run ``work`` (which may call ``asyncio.run``) even from inside a running loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(work).result()


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def _template_db() -> Path:
    global _template
    if _template is None:
        folder = Path(tempfile.mkdtemp(prefix="quanta-template-"))
        atexit.register(shutil.rmtree, folder, True)
        in_own_loop(lambda: upgrade(sqlite_url(folder / "template.db"), None))
        _template = folder / "template.db"
    return _template


@dataclass
class TenancyDb:
    root: Path

    @property
    def url(self) -> str:
        return sqlite_url(self.root / "quanta.db")

    def env(self) -> dict[str, str]:
        return {
            "QUANTA_DATABASE_URL": self.url,
            "QUANTA_DATA_DIR": str(self.root / "data"),
            "QUANTA_ADMIN_KEY": ADMIN_KEY,
            "QUANTA_SECRET_KEY": SECRET_KEY,
        }

    def settings(self, **overrides: Any) -> Settings:
        return Settings(
            database_url=self.url,
            data_dir=self.root / "data",
            admin_key=ADMIN_KEY,  # type: ignore[arg-type]
            secret_key=SECRET_KEY,  # type: ignore[arg-type]
            **overrides,
        )

    def create_key(self, tenant: str = "test", slo_class: str = "interactive", **quota: int) -> str:
        """A tenant (with ``quota`` if given) and one key; returns the key's value."""
        return in_own_loop(lambda: asyncio.run(self._create(tenant, slo_class, quota)))

    async def _create(self, tenant: str, slo_class: str, quota: dict[str, int]) -> str:
        engine = make_engine(self.url)
        try:
            async with make_sessionmaker(engine)() as session:
                admin = AdminService(session, KeyHasher(SECRET_KEY.encode()), actor="test")
                t = await admin.create_tenant(TenantCreate(name=tenant))
                if quota:
                    await admin.put_quota("tenant", t.id, QuotaIn(**quota))
                key = await admin.create_key(t.id, KeyCreate(slo_class=slo_class))  # type: ignore[arg-type]
                assert isinstance(key.value, str)
                return key.value
        finally:
            await engine.dispose()


def fresh_db(root: Path | None = None) -> TenancyDb:
    """A migrated database of its own (in ``root``, else a temporary folder)."""
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="quanta-test-"))
        atexit.register(shutil.rmtree, root, True)
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template_db(), root / "quanta.db")
    return TenancyDb(root)


def fake_app(db: TenancyDb, driver: Any, **settings: Any) -> Any:
    """The real app on ``db`` with the scripted fake core (no model)."""
    from app.server.app import create_app
    from tests.fakes import fake_core

    return create_app(db.settings(**settings), core_factory=lambda _: fake_core(driver))


@asynccontextmanager
async def serving(db: TenancyDb, driver: Any = None, **settings: Any) -> AsyncIterator[Any]:
    """An in-process client of ``fake_app`` (a fresh ``FakeDriver`` unless given), once ready."""
    from tests.fakes import FakeDriver

    async with AsyncTestClient(fake_app(db, driver or FakeDriver(), **settings)) as c:
        for _ in range(200):
            if (await c.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        yield c


async def streamed_usage(client: Any, body: dict[str, Any], key: str) -> dict[str, int]:
    """Stream a chat completion (200 expected) and return its usage chunk."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    usage: dict[str, int] | None = None
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=bearer(key)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"usage":{' in line:
                usage = json.loads(line[6:])["usage"]
    assert usage is not None
    return usage


def bearer(value: str) -> dict[str, str]:
    return {"authorization": f"Bearer {value}"}


@contextmanager
def over_http(app: Any, http: Any = "auto") -> Iterator[str]:
    """``app`` served by uvicorn on a free port in a thread: real HTTP, real disconnects
    (``http``: uvicorn's protocol, e.g. ``quanta run``'s ``guarded_protocol``)."""
    import uvicorn

    from tests.server_process import free_port

    port = free_port()
    config = uvicorn.Config(app, port=port, log_level="warning", lifespan="on", http=http)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(500):
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
