"""A PostgreSQL cluster of a test's own (initdb in a temporary folder, a free port), so a
test may stop and restart it without touching the shared one of ``postgres_for_tests.sh``.

Needs PostgreSQL's server binaries (``initdb``, ``pg_ctl``); as root they run as the
``postgres`` user, which initdb requires. ``None`` where they cannot be had.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.server_process import free_port


def _bindir() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parts[-3])
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class Cluster:
    bindir: Path
    root: Path
    port: int
    user: str | None  # run the binaries as this user (we are root), else as ourselves

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://quanta@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -F"
        log = str(self.root / "log")
        self._run("pg_ctl", "-D", str(self.root / "data"), "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def new_cluster() -> Cluster | None:
    """A started cluster with a superuser ``quanta`` (trust authentication), or ``None``."""
    bindir = _bindir()
    if bindir is None or not (bindir / "pg_ctl").exists():
        return None
    user = None
    root = Path(tempfile.mkdtemp(prefix="quanta-pg-"))
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            return None
        os.chown(root, owner.pw_uid, owner.pw_gid)
        user = "postgres"
    cluster = Cluster(bindir, root, free_port(), user)
    try:
        cluster._run("initdb", "-D", str(root / "data"), "-A", "trust", "-U", "quanta", "--no-sync")
        cluster.start()
    except (OSError, subprocess.SubprocessError):
        shutil.rmtree(root, ignore_errors=True)
        return None
    return cluster
