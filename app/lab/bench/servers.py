"""Servers for the scenario suite: a throw-away ``quanta run`` per policy, or llama-server.

The same steps as ``scripts/lib_server.sh`` and ``scripts/bench_fairness.sh``, in Python so
that ``quanta bench scenarios`` is one command: a fresh database and data directory, no
developer config (``QUANTA_CONFIG`` is empty), the server started in the background
and waited for, the workload's tenants created through the admin API (name, weight, one key
of the tenant's class), and everything removed afterwards.

A ``Launcher`` is what the suite calls; tests pass one that starts a stub server.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from quanta_core.workload import TenantSpec

LLAMA_SERVER = "llama-server"  # -np slots, llama-server's defaults: one KV stream per slot
LLAMA_SERVER_KVU = "llama-server-kvu"  # the same with --kv-unified: one KV buffer for all slots
LLAMA_SERVERS = (LLAMA_SERVER, LLAMA_SERVER_KVU)


@dataclass(frozen=True, slots=True)
class Running:
    url: str
    keys: dict[str, str]  # tenant -> API key (empty: the server has no tenants)


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """What a scenario asks of the machine: the same on every server."""

    n_ctx: int | None  # Quanta's --n-ctx (None: its default) and llama-server's -c
    tenants: tuple[TenantSpec, ...]
    llama_slots: int = 20  # llama-server -np
    llama_ctx: int | None = None  # llama-server -c (None: n_ctx)

    @property
    def llama_context(self) -> int:
        ctx = self.llama_ctx if self.llama_ctx is not None else self.n_ctx
        if ctx is None:
            raise ValueError("llama-server needs a context size: n_ctx or llama_ctx")
        return ctx


Launcher = Callable[[str, ServerSpec], AbstractContextManager[Running]]


def free_port() -> int:
    """A port nobody listens on now (the machine is shared: a fixed one may be taken)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _quanta_bin() -> list[str]:
    return [sys.executable, "-m", "app.cli"]


def _wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited while starting (status {proc.returncode})")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not become ready at {url}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _create_tenants(url: str, admin_key: str, tenants: Sequence[TenantSpec]) -> dict[str, str]:
    keys: dict[str, str] = {}
    headers = {"Authorization": f"Bearer {admin_key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=10.0) as client:
        for t in tenants:
            r = client.post("/admin/v1/tenants", json={"name": t.name, "weight": t.weight})
            r.raise_for_status()
            tid = r.json()["id"]
            body = {"name": t.name, "slo_class": t.slo_class.value}
            r = client.post(f"/admin/v1/tenants/{tid}/keys", json=body)
            r.raise_for_status()
            keys[t.name] = r.json()["value"]
    return keys


@dataclass(frozen=True, slots=True)
class RealServers:
    """``quanta run --policy P`` (default settings but the model, threads, port and, where
    the scenario sets one, context) and llama-server ``-np slots`` over the same model: as a
    user starts it (its defaults split the context into one KV stream per slot) and with
    ``--kv-unified`` (one buffer shared by all slots)."""

    model: Path
    threads: int
    port: int = 0  # 0: a free one for each server
    llama_server: Path | None = None

    def __call__(self, name: str, spec: ServerSpec) -> AbstractContextManager[Running]:
        if name in LLAMA_SERVERS:
            return self._llama(spec, unified=name == LLAMA_SERVER_KVU)
        return self._quanta(name, spec)

    @contextmanager
    def _quanta(self, policy: str, spec: ServerSpec) -> Iterator[Running]:
        state = Path(tempfile.mkdtemp(prefix="quanta-scenarios-"))
        admin = "admin-" + secrets.token_hex(16)
        env = {
            **os.environ,
            "QUANTA_DATABASE_URL": f"sqlite+aiosqlite:///{state}/quanta.db",
            "QUANTA_DATA_DIR": str(state / "data"),
            "QUANTA_CONFIG": "",
            "QUANTA_ADMIN_KEY": admin,
        }
        port = self.port or free_port()
        url = f"http://127.0.0.1:{port}"
        try:
            subprocess.run([*_quanta_bin(), "migrate"], env=env, check=True, capture_output=True)
            cmd = [
                *_quanta_bin(),
                "run",
                "--port",
                str(port),
                "--model",
                str(self.model),
                "--policy",
                policy,
                *([] if spec.n_ctx is None else ["--n-ctx", str(spec.n_ctx)]),
                "--threads",
                str(self.threads),
                "--log-level",
                "warning",
            ]
            proc = subprocess.Popen(cmd, env=env)
            try:
                _wait_ready(proc, url + "/readyz")
                yield Running(url, _create_tenants(url, admin, spec.tenants))
            finally:
                _stop(proc)
        finally:
            shutil.rmtree(state, ignore_errors=True)

    @contextmanager
    def _llama(self, spec: ServerSpec, unified: bool) -> Iterator[Running]:
        if self.llama_server is None:
            raise RuntimeError("llama-server is not built (scripts/build_llama_server.sh)")
        port = self.port or free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [
            str(self.llama_server),
            "-m",
            str(self.model),
            "-c",
            str(spec.llama_context),
            "-np",
            str(spec.llama_slots),
            "-t",
            str(self.threads),
            "-tb",
            str(self.threads),
            *(["--kv-unified"] if unified else []),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-webui",
            "--log-disable",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_ready(proc, url + "/health")
            yield Running(url, {})
        finally:
            _stop(proc)


def find_llama_server() -> Path | None:
    """The binary ``scripts/build_llama_server.sh`` builds, if it was built."""
    cache = Path(os.environ.get("BUILD_DIR", Path.home() / ".cache/quanta/llama-server"))
    found = sorted(cache.glob("*/llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-server"))
    return found[-1] if found else None
