"""A real ``quanta run`` process on a free port, for tests that drive it over HTTP: on a copy
of the session's migrated database (``tests.tenancy_setup``), started, waited for and stopped
by the one server harness (``app.lab.server``, which needs no lab library)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from app.lab.server import free_port, quanta_run, stop_process, wait_ready
from tests.tenancy_setup import ADMIN_KEY, TenancyDb, fresh_db

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    port: int
    db: TenancyDb
    api_key: str  # a key of a tenant of its own, no quota
    seen_not_ready: bool = False

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"}

    @property
    def admin(self) -> dict[str, str]:
        return {"authorization": f"Bearer {ADMIN_KEY}"}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        def not_ready(status: int) -> None:
            if status == 503:
                self.seen_not_ready = True

        wait_ready(self.process, f"{self.url}/readyz", timeout_s, on_status=not_ready)

    def stop(self, timeout_s: float = 30.0) -> int:
        return stop_process(self.process, timeout_s)


def start_server(
    *flags: str,
    db: TenancyDb | None = None,
    env: dict[str, str] | None = None,
    log: Path | None = None,
) -> ServerProcess:
    """``quanta run`` on a migrated database of its own with one tenant key (or on ``db``),
    with ``env`` over this process's environment; its output to ``log`` if given."""
    db = db or fresh_db()
    api_key = db.create_key(f"test-{uuid.uuid4().hex[:8]}")
    port = free_port()
    environment = {
        "QUANTA_CONFIG": "",
        # A server's KV defaults to 1/8 of the RAM; a test's takes at most 1 GiB of it, as
        # the suite runs beside other work (its slots and context are fitted to that).
        "QUANTA_KV_MEMORY_GB": "1",
        "PYTHONPATH": str(ROOT),
        **db.env(),
        **(env or {}),
    }
    return ServerProcess(quanta_run(port, flags, environment, log), port, db, api_key)


@contextmanager
def running_server(
    *flags: str, db: TenancyDb | None = None, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """``start_server``, ready, for the ``with`` block; it must stop cleanly after it."""
    proc = start_server(*flags, db=db, env=env)
    try:
        proc.wait_ready()
        yield proc
    finally:
        assert proc.stop() == 0  # a clean stop
