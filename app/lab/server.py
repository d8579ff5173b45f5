"""The lab's one server harness: a throw-away ``quanta run`` in a child process.

    QuantaServer.fresh(*flags)   a temporary folder: its own SQLite file (migrated), data
                                 directory and admin key; no developer config
    .start() / .stop() / .kill() the process on a free port, waited for until /readyz is 200
    .tenant_key(name, ...)       a tenant and one key, through the admin API
    with QuantaServer.fresh(...) as server:   started, then stopped and its folder removed

``quanta_run``, ``wait_ready``, ``stop_process`` and ``child_pids`` serve any server process
(llama-server too, and the tests' servers in ``tests/server_process.py``). Every measurement
that starts a server starts it here. This module imports none of the lab's libraries (httpx
and the standard library only): the product's tests use it without the ``lab`` extra.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

QUANTA = (sys.executable, "-m", "app.cli")
ROOT = Path(__file__).resolve().parents[2]  # the checkout: a server of its code


def free_port() -> int:
    """A port nobody listens on now (the machine is shared: a fixed one may be taken)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(
    process: subprocess.Popen[bytes],
    url: str,
    timeout_s: float = 180.0,
    on_status: Callable[[int], None] | None = None,
) -> None:
    """Poll ``url`` (``…/readyz``, llama-server's ``…/health``) until it answers 200; fail at
    once if the process exits first. ``on_status`` sees every other status it answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited while starting (status {process.returncode})")
        try:
            status = httpx.get(url, timeout=2.0).status_code
        except httpx.TransportError:
            status = None
        if status == 200:
            return
        if status is not None and on_status is not None:
            on_status(status)
        time.sleep(0.05)
    raise TimeoutError(f"the server did not become ready at {url}")


def quanta_run(
    port: int, flags: Sequence[str] = (), env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """``quanta run --port PORT FLAGS`` of this checkout in a child process, not waited for;
    ``env`` over this process's environment, its output appended to ``log`` (None: ours)."""
    output = None if log is None else log.open("ab")
    try:
        return subprocess.Popen(
            [*QUANTA, "run", "--port", str(port), *flags],
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
        )
    finally:
        if output is not None:
            output.close()  # the child has its own copy


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a server's engine worker)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> int:
    """SIGTERM (a server finishes its streams and stops), SIGKILL if it does not in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


@dataclass
class QuantaServer:
    """``quanta run`` on a database and data directory of its own under ``root``."""

    root: Path
    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # over this process's environment
    port: int = field(default_factory=free_port)
    admin_key: str = field(default_factory=lambda: "admin-" + secrets.token_hex(16))
    log: Path | None = None  # the server's output (None: this process's)
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def fresh(
        cls,
        *flags: str,
        env: dict[str, str] | None = None,
        log: bool = False,
        prefix: str = "quanta-lab-",
    ) -> QuantaServer:
        root = Path(tempfile.mkdtemp(prefix=prefix))
        return cls(root, flags, dict(env or {}), log=root / "server.log" if log else None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db_path(self) -> Path:
        return self.root / "quanta.db"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("the server is not started")
        return self.process.pid

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "QUANTA_CONFIG": "",  # the defaults, not a developer's config file
            "QUANTA_DATABASE_URL": f"sqlite+aiosqlite:///{self.db_path}",
            "QUANTA_DATA_DIR": str(self.root / "data"),
            "QUANTA_ADMIN_KEY": self.admin_key,
            **self.env,
        }

    def start(self, timeout_s: float = 180.0) -> None:
        """Migrate the database (once: a restart keeps it), start, wait until ready."""
        env = self.environment()
        if not self.db_path.exists():
            subprocess.run([*QUANTA, "migrate"], env=env, cwd=ROOT, check=True, capture_output=True)
        self.process = quanta_run(self.port, self.flags, env, self.log)
        wait_ready(self.process, f"{self.url}/readyz", timeout_s)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        return None if self.process is None else stop_process(self.process, timeout_s)

    def engine_pids(self) -> list[int]:
        """The server's child processes (the engine worker)."""
        return child_pids(self.pid)

    def kill(self) -> None:
        """SIGKILL the server and its engine worker (it would die with its server)."""
        if self.process is None:
            return
        for child in self.engine_pids():
            os.kill(child, signal.SIGKILL)
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def remove(self) -> None:
        """Stop it if running, and delete its folder."""
        if self.process is not None and self.process.poll() is None:
            self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def admin(self, method: str, path: str, **kw: Any) -> Any:
        """One admin API call (``path`` under ``/admin/v1``); its JSON body."""
        response = httpx.request(
            method,
            f"{self.url}/admin/v1{path}",
            headers={"authorization": f"Bearer {self.admin_key}"},
            timeout=30,
            **kw,
        )
        response.raise_for_status()
        return response.json() if response.content else None

    def tenant_key(
        self,
        name: str,
        slo_class: str | None = None,
        weight: float | None = None,
        quota: dict[str, int] | None = None,
    ) -> str:
        """A new tenant (weight and quota if given) and one key of ``slo_class``: its value."""
        body: dict[str, Any] = {"name": name}
        if weight is not None:
            body["weight"] = weight
        tenant = self.admin("POST", "/tenants", json=body)
        if quota:
            self.admin("PUT", f"/tenants/{tenant['id']}/quota", json=quota)
        key_body: dict[str, Any] = {"name": name}
        if slo_class is not None:
            key_body["slo_class"] = slo_class
        return str(self.admin("POST", f"/tenants/{tenant['id']}/keys", json=key_body)["value"])

    def __enter__(self) -> QuantaServer:
        try:
            self.start()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            self.remove()
