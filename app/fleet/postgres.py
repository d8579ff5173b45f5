"""A PostgreSQL cluster in a folder of the fleet's own: initdb once, then pg_ctl start/stop.

Needs PostgreSQL's server binaries (Debian: ``apt-get install postgresql``); as root they run
as the ``postgres`` user, which initdb requires. Trust authentication on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def server_bindir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parts[-3])
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")
    return Path(initdb).parent


@dataclass
class LocalPostgres:
    root: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://quanta@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(server_bindir() / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, timeout=120)
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip()
            raise RuntimeError(f"{args[0]} failed: {why}")

    def start(self) -> None:
        data = self.root / "data"
        if not data.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:  # the server runs as postgres: it must reach its folder
                owner = pwd.getpwnam("postgres")
                os.chown(self.root, owner.pw_uid, owner.pw_gid)
                for parent in self.root.parents:
                    if parent.stat().st_mode & 0o001 == 0:
                        parent.chmod(parent.stat().st_mode | 0o011)
            self._run("initdb", "-D", str(data), "-A", "trust", "-U", "quanta", "--no-sync")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        log = str(self.root / "log")
        self._run("pg_ctl", "-D", str(data), "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()
