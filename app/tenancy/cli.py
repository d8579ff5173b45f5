"""``quanta migrate``, and what every command on the database checks before it starts.

quanta migrate      the schema to head (idempotent), saying what it did
quanta run          (``prepare_run``) refuses a schema not at head and a secret that is not
                    the keys' one; makes the admin key on a first run and shows it once

The admin commands (tenants, keys, quotas, usage, audit) are in ``app.admin.cli``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from pathlib import Path

import typer
from sqlalchemy import select

from app.db.engine import make_engine, make_sessionmaker
from app.db.migrate import NotAtHead, check_at_head, current_revision, upgrade
from app.db.models import AdminCredential
from app.server.config import load_settings
from app.server.config_file import ConfigError
from app.server.settings import Settings
from app.tenancy.keys import SecretError, prepare_data_dir, resolve_secret, sha256_hex

ADMIN_KEY_FILE = "admin_key"  # in data_dir, 0600: where a generated admin key is left


def fail(message: str, code: int = 2) -> typer.Exit:
    """Say ``message`` on stderr; the ``Exit`` to raise."""
    typer.echo(message, err=True)
    return typer.Exit(code=code)


def config_failure(exc: ConfigError) -> typer.Exit:
    for line in exc.lines:
        typer.echo(f"invalid configuration: {line}", err=True)
    return typer.Exit(code=2)


def cli_settings() -> Settings:
    """The settings, warnings said and mistakes refused (exit 2), before anything starts."""
    try:
        return load_settings(warn=lambda line: typer.echo(line, err=True))
    except ConfigError as exc:
        raise config_failure(exc) from None


def ready_database(settings: Settings | None = None) -> Settings:
    """The settings of a database at head, with the data directory in place."""
    settings = settings or cli_settings()
    prepare_data_dir(settings.data_dir)
    try:
        asyncio.run(check_at_head(settings.database_url))
    except NotAtHead as exc:
        raise fail(str(exc)) from None
    return settings


def migrate() -> None:
    """Bring the database schema to head (Alembic). Safe to run again."""
    settings = cli_settings()
    prepare_data_dir(settings.data_dir)
    before = asyncio.run(current_revision(settings.database_url))
    done = upgrade(settings.database_url, before)
    if not done.applied:
        typer.echo(f"database is at head ({done.after}): nothing to do")
        return
    typer.echo(f"database upgraded from {before or 'empty'} to {done.after}:")
    for revision in done.applied:
        typer.echo(f"  applied {revision}")


async def ensure_admin_key(settings: Settings) -> str | None:
    """A newly generated admin key (to show once), or None if one is configured or stored.

    Only its SHA-256 is stored (admin_credentials); it is 256 random bits, so no salt needed.
    """
    if settings.admin_key is not None:
        return None
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine).begin() as session:
            if await session.scalar(select(AdminCredential.id).limit(1)) is not None:
                return None
            value = "qa-" + secrets.token_urlsafe(32)
            session.add(AdminCredential(hashed=sha256_hex(value), created_at=time.time()))
            return value
    finally:
        await engine.dispose()


async def check_secret(settings: Settings) -> None:
    """``SecretError`` unless the secret is the one the database's keys were made with
    (made here, 0600, where there are no keys yet)."""
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            await resolve_secret(settings, session)
    finally:
        await engine.dispose()


def hand_over_admin_key(value: str, data_dir: Path) -> None:
    """Show a generated admin key once, on a terminal only: never into a log. Without a
    terminal (a service manager's log) it goes to a file readable by its owner alone, and
    the log says where."""
    if sys.stderr.isatty():
        typer.echo(
            "\nGenerated the admin key for /admin/v1 (shown this once; only its hash is "
            f"stored):\n\n    {value}\n\nSet QUANTA_ADMIN_KEY to choose your own. "
            "For a tenant API key: quanta tenants create NAME\n",
            err=True,
        )
        return
    path = data_dir / ADMIN_KEY_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    typer.echo(
        f"Generated the admin key for /admin/v1: it is in {path} (mode 0600); read it, keep "
        "it elsewhere and delete the file. Only its hash is stored.",
        err=True,
    )


def prepare_run(settings: Settings) -> None:
    """What ``quanta run`` does before serving: refuse an old schema or a secret that is
    not the keys', make an admin key if there is none."""
    ready_database(settings)
    try:
        asyncio.run(check_secret(settings))
    except SecretError as exc:
        raise fail(f"cannot start: {exc}") from None
    generated = asyncio.run(ensure_admin_key(settings))
    if generated is not None:
        hand_over_admin_key(generated, settings.data_dir)
