"""A disk that fills up under the server, then gets space back: served requests complete,
writes get a clear 503, nothing crashes, and the ledger is written once there is room.

Two real ways to fail the writes:
- a small tmpfs holding the database, filled to the last byte (ENOSPC; mounting needs root,
  skipped elsewhere);
- a file-size limit set on a running ``quanta run`` process (RLIMIT_FSIZE, as ``ulimit -f``:
  every write past the limit fails with EFBIG, as CPython ignores SIGXFSZ; works
  unprivileged), its core the scripted fake so that no model is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.lab.server import wait_ready
from tests.fakes import MODEL
from tests.server_process import ROOT, free_port
from tests.tenancy_setup import ADMIN, TenancyDb, bearer, fresh_db, serving

Client = AsyncTestClient[Litestar]
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 5}


def ledger(db: TenancyDb) -> tuple[int, int, int]:
    """Requests (final rows), prompt and completion tokens in the ledger."""
    with contextlib.closing(sqlite3.connect(db.root / "quanta.db")) as con:
        row = con.execute(
            "SELECT COUNT(*) FILTER (WHERE status != 'partial'), "
            "COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0) "
            "FROM usage_ledger"
        ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


class Served:
    """What the clients were given: requests, prompt and completion tokens."""

    def __init__(self) -> None:
        self.requests = self.prompt = self.completion = 0

    def add(self, response: httpx.Response) -> int:
        if response.status_code == 200:
            usage = response.json()["usage"]
            self.requests += 1
            self.prompt += usage["prompt_tokens"]
            self.completion += usage["completion_tokens"]
        else:
            assert response.status_code == 503, response.text  # nothing but a designed 503
            assert response.json()["error"]["code"] == "database_unavailable"
            assert "retry-after" in response.headers
        return response.status_code

    def totals(self) -> tuple[int, int, int]:
        return self.requests, self.prompt, self.completion


# ---- a full tmpfs ----


@pytest.fixture
def small_disk() -> Iterator[Path]:
    mount = Path(tempfile.mkdtemp(prefix="quanta-disk-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        mount.rmdir()


def fill(folder: Path) -> Path:
    """Write a file until the disk is full; the file (delete it to give the space back)."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


async def wait_until(what: Callable[[], bool]) -> None:
    for _ in range(600):
        if what():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out waiting")


async def test_a_full_disk_then_space_again(small_disk: Path) -> None:
    db = fresh_db(small_disk / "db")
    key = db.create_key("acme")
    served = Served()
    async with serving(db) as client:
        tenancy = client.app.state["tenancy"]

        async def chat() -> int:
            return served.add(
                await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
            )

        assert await chat() == 200
        await wait_until(lambda: ledger(db)[0] == 1)
        filler = fill(small_disk)
        for _ in range(20):
            assert await chat() == 200  # served from memory; its row waits
        await wait_until(lambda: tenancy.ledger.failing_since is not None)
        r = await client.post("/admin/v1/tenants", json={"name": "new"}, headers=ADMIN)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "database_unavailable"
        assert ledger(db)[0] == 1
        filler.unlink()
        await wait_until(lambda: ledger(db)[0] == served.requests)
        assert ledger(db) == served.totals()
        r = await client.post("/admin/v1/tenants", json={"name": "new"}, headers=ADMIN)
        assert r.status_code == 201, r.text


# ---- a file-size limit on a running server ----

FAKE_SERVER = """
import sys
from app.server.serve import serve
from app.server.settings import Settings
from tests.fakes import FakeDriver, fake_core

sys.exit(serve(Settings(port=int(sys.argv[1])), core_factory=lambda _: fake_core(FakeDriver())))
"""


def set_file_size_limit(pid: int, limit: int) -> None:
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, hard))


def wait_for(what: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_a_file_size_limit_then_none(tmp_path: Path) -> None:
    db = fresh_db(tmp_path)
    key = db.create_key("acme")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QUANTA_CONFIG": "", **db.env()}
    server = subprocess.Popen(
        [sys.executable, "-c", FAKE_SERVER, str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,  # neither is a regular file: the limit does not apply
        stderr=subprocess.PIPE,
    )
    log: list[bytes] = []
    assert server.stderr is not None
    drain = threading.Thread(target=lambda: log.extend(server.stderr), daemon=True)  # type: ignore[arg-type]
    drain.start()
    url = f"http://127.0.0.1:{port}"
    served = Served()
    try:
        try:
            wait_ready(server, f"{url}/readyz", timeout_s=60)
        except (RuntimeError, TimeoutError) as exc:
            pytest.fail(f"{exc}: {b''.join(log).decode()[-3000:]}")
        with httpx.Client(base_url=url, timeout=30) as http:

            def chat() -> int:
                return served.add(http.post("/v1/chat/completions", json=BODY, headers=bearer(key)))

            assert chat() == 200
            wait_for(lambda: ledger(db)[0] == 1)
            set_file_size_limit(server.pid, 0)  # no write to any file succeeds
            for _ in range(20):
                assert chat() == 200
            time.sleep(1.5)  # a few flushes fail meanwhile
            r = http.post("/admin/v1/tenants", json={"name": "new"}, headers=ADMIN)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "database_unavailable"
            assert server.poll() is None  # SIGXFSZ did not kill it
            assert ledger(db)[0] == 1
            set_file_size_limit(server.pid, resource.RLIM_INFINITY)
            wait_for(lambda: ledger(db)[0] == served.requests)
            assert ledger(db) == served.totals()
            r = http.post("/admin/v1/tenants", json={"name": "new"}, headers=ADMIN)
            assert r.status_code == 201, r.text
    finally:
        server.terminate()
        server.wait(60)
        drain.join(10)
    assert server.returncode == 0, b"".join(log).decode()[-3000:]
