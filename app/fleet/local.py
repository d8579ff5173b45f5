"""A fleet on one machine: PostgreSQL, N replicas of ``quanta run`` and Envoy in front.

    folder/postgres/      the cluster (kept between runs)      127.0.0.1:pg_port
    folder/replica{i}/    each replica's data_dir              127.0.0.1:port+1+i
    folder/envoy.yaml     deploy/envoy.yaml with these ports   127.0.0.1:port (admin: the
                                                               port after the replicas')
    folder/*.log          each process's output

Every replica gets the same HMAC secret (a key made through one is valid on all) and the
same database; the admin key is made once, before the replicas start. Used by ``quanta
fleet`` and by the fleet benchmark (``quanta bench fleet``), which also kills replicas and
restarts PostgreSQL through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from app.db.migrate import upgrade
from app.fleet.envoy import write_envoy_config
from app.fleet.postgres import LocalPostgres
from app.server.settings import Settings
from app.tenancy.keys import SECRET_FILE, read_secret, write_secret


@dataclass
class Replica:
    index: int
    port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return f"replica{self.index}"


@dataclass
class LocalFleet:
    folder: Path
    replicas: int = 3
    port: int = 8000
    pg_port: int = 5433
    database_url: str | None = None  # an existing PostgreSQL instead of the folder's own
    replica_env: dict[str, str] = field(default_factory=dict)  # QUANTA_* for every replica
    postgres: LocalPostgres | None = None
    members: list[Replica] = field(default_factory=list)
    envoy: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_port(self) -> int:
        return self.port + self.replicas + 1

    @property
    def db_url(self) -> str:
        if self.database_url is not None:
            return self.database_url
        assert self.postgres is not None
        return self.postgres.url

    def start(self, ready_timeout_s: float = 600.0) -> str | None:
        """Start everything; returns a newly generated admin key (None: one existed)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.database_url is None:
            self.postgres = LocalPostgres(self.folder / "postgres", self.pg_port)
            self.postgres.start()
        upgrade(self.db_url, None)
        from app.tenancy.cli import ensure_admin_key

        settings = Settings(database_url=self.db_url, data_dir=self.folder)
        admin_key = asyncio.run(ensure_admin_key(settings))
        if read_secret(settings) is None:  # made once in the folder, copied to every replica
            write_secret(settings)
        for i in range(self.replicas):
            replica = Replica(i, self.port + 1 + i, self.folder / f"replica{i}")
            replica.data_dir.mkdir(parents=True, exist_ok=True)
            secret = replica.data_dir / SECRET_FILE
            if not secret.exists():
                shutil.copyfile(self.folder / SECRET_FILE, secret)
                secret.chmod(0o600)
            self.members.append(replica)
            self.start_replica(replica)
        config = write_envoy_config(
            self.folder / "envoy.yaml",
            self.port,
            self.admin_port,
            [r.port for r in self.members],
        )
        envoy = shutil.which("envoy", path=str(Path(sys.executable).parent)) or "envoy"
        with open(self.folder / "envoy.log", "ab") as log:
            self.envoy = subprocess.Popen(
                [envoy, "-c", str(config), "--use-dynamic-base-id", "--log-level", "warn"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.wait_ready(ready_timeout_s)
        return admin_key

    def start_replica(self, replica: Replica) -> None:
        env = {
            **os.environ,
            **self.replica_env,
            "QUANTA_DATABASE_URL": self.db_url,
            "QUANTA_DATA_DIR": str(replica.data_dir),
            "QUANTA_REPLICA_ID": replica.name,
            "QUANTA_PORT": str(replica.port),
            "QUANTA_HOST": "127.0.0.1",
        }
        quanta = shutil.which("quanta", path=str(Path(sys.executable).parent)) or "quanta"
        with open(self.folder / f"{replica.name}.log", "ab") as log:
            replica.process = subprocess.Popen(
                [quanta, "run"], env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def wait_ready(self, timeout_s: float) -> None:
        """Every replica ready, and Envoy answering for them."""
        deadline = time.monotonic() + timeout_s
        pending = [*(r.url for r in self.members), self.url]
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {timeout_s:.0f} s: {pending}")
            for process in [r.process for r in self.members] + [self.envoy]:
                if process is not None and process.poll() is not None:
                    raise RuntimeError(f"a process of the fleet exited: see {self.folder}/*.log")
            try:
                if httpx.get(f"{pending[0]}/readyz", timeout=2).status_code == 200:
                    pending.pop(0)
                    continue
            except httpx.TransportError:
                pass
            time.sleep(0.2)

    def kill(self, index: int) -> None:
        """``kill -9`` a replica."""
        process = self.members[index].process
        if process is not None:
            process.kill()
            process.wait()

    def stop(self) -> None:
        for replica in self.members:
            if replica.process is not None and replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)
        for replica in self.members:
            if replica.process is not None:
                try:
                    replica.process.wait(60)
                except subprocess.TimeoutExpired:
                    replica.process.kill()
                    replica.process.wait()
        if self.envoy is not None and self.envoy.poll() is None:
            self.envoy.terminate()
            self.envoy.wait(30)
        if self.postgres is not None:
            with contextlib.suppress(RuntimeError):  # it never started
                self.postgres.stop()
