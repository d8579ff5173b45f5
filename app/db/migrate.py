"""Alembic, driven from code: where the schema is, where it should be, getting it there.

``upgrade`` and ``downgrade`` run Alembic's env.py, which runs its own event loop: call them
from synchronous code (the CLI) or a worker thread, never from inside a running loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from app.db.engine import make_engine

ROOT = Path(__file__).resolve().parents[2]


class NotAtHead(RuntimeError):
    """The database schema is not the one this code expects."""


@dataclass(frozen=True, slots=True)
class Upgrade:
    before: str | None
    after: str
    applied: tuple[str, ...]  # revision ids with their messages, oldest first


def alembic_config(url: str) -> Config:
    ini = ROOT / "alembic.ini"
    config = Config(str(ini)) if ini.is_file() else Config()
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.attributes["database_url"] = url
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None, "no migrations found"
    return head


def _revision_of(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def current_revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(_revision_of)
    finally:
        await engine.dispose()


async def check_at_head(url: str) -> None:
    current, head = await current_revision(url), head_revision()
    if current != head:
        raise NotAtHead(
            f"the database is at revision {current or 'none (empty)'}, this server needs "
            f"{head}: run `quanta migrate` first"
        )


def upgrade(url: str, before: str | None) -> Upgrade:
    """To head; ``before`` is the revision found (``current_revision``). Idempotent."""
    config = alembic_config(url)
    script = ScriptDirectory.from_config(config)
    head = head_revision()
    pending = [
        f"{r.revision} ({r.doc.splitlines()[0] if r.doc else ''})"
        for r in script.iterate_revisions(head, before)
    ]
    if pending:
        command.upgrade(config, "head")
    return Upgrade(before, head, tuple(reversed(pending)))


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
