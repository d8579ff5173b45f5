"""``quanta fleet``: PostgreSQL, N replicas and Envoy on this machine, until Ctrl-C."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer


def fleet(
    replicas: Annotated[int, typer.Option(help="replicas of `quanta run`", min=1)] = 3,
    port: Annotated[int, typer.Option(help="Envoy's port (replicas: the next ones)")] = 8000,
    folder: Annotated[Path, typer.Option(help="the fleet's files")] = Path(".quanta-fleet"),
    pg_port: Annotated[int, typer.Option(help="the folder's own PostgreSQL's port")] = 5433,
    database_url: Annotated[
        str | None, typer.Option(help="an existing PostgreSQL instead (postgresql+asyncpg://…)")
    ] = None,
) -> None:
    """Serve through Envoy from several replicas sharing one PostgreSQL (quotas fleet-wide)."""
    from app.fleet.local import LocalFleet

    local = LocalFleet(folder, replicas, port, pg_port, database_url)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        typer.echo(f"starting PostgreSQL, {replicas} replicas and Envoy (logs in {folder}/)…")
        admin_key = local.start()
        if admin_key is not None:
            typer.echo(f"\nGenerated the admin key (shown this once):\n\n    {admin_key}\n")
        typer.echo(f"serving on {local.url}/v1 (Envoy admin: 127.0.0.1:{local.admin_port})")
        for r in local.members:
            typer.echo(f"  {r.name}: {r.url}")
        typer.echo("Ctrl-C stops the fleet.")
        stop.wait()
    finally:
        typer.echo("stopping: replicas drain, then Envoy and PostgreSQL stop")
        local.stop()
