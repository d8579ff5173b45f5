"""Servers for the scenario suite: a throw-away ``quanta run`` per policy, or llama-server.

Quanta is the lab's server (``app.lab.server``): a fresh database and data directory, no
developer config, started and waited for, the workload's tenants created through the admin
API (name, weight, one key of the tenant's class), and everything removed afterwards.

A ``Launcher`` is what the suite calls; tests pass one that starts a stub server.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from app.lab.server import QuantaServer, free_port, stop_process, wait_ready
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
        flags = [
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
        server = QuantaServer.fresh(*flags, prefix="quanta-scenarios-")
        if self.port:
            server.port = self.port
        with server:
            keys = {
                t.name: server.tenant_key(t.name, t.slo_class.value, weight=t.weight)
                for t in spec.tenants
            }
            yield Running(server.url, keys)

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
            wait_ready(proc, url + "/health")
            yield Running(url, {})
        finally:
            stop_process(proc)


def find_llama_server() -> Path | None:
    """The binary ``scripts/build_llama_server.sh`` builds, if it was built."""
    cache = Path(os.environ.get("BUILD_DIR", Path.home() / ".cache/quanta/llama-server"))
    found = sorted(cache.glob("*/llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-server"))
    return found[-1] if found else None
