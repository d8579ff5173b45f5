"""The schema: real migrations on a real SQLite file, a round trip, and `quanta migrate`/`run`."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from typer.testing import CliRunner, Result

from app.cli import cli
from app.db.migrate import current_revision, downgrade, head_revision, upgrade
from app.db.models import Base
from tests.server_process import free_port
from tests.tenancy_setup import ADMIN_KEY, sqlite_url

TABLES = {
    "tenants",
    "api_keys",
    "quota_policies",
    "usage_ledger",
    "usage_daily",
    "audit_log",
    "admin_credentials",
    "stored_responses",
    "fleet_leases",
    "fleet_live",
    "fleet_replicas",
    "secret_check",
}


def quanta(*args: str, env: dict[str, str]) -> Result:
    """The real CLI, in this process (a subprocess would spend seconds importing)."""
    return CliRunner().invoke(cli, list(args), env={"QUANTA_CONFIG": "", **env})


def tables(path: Path) -> set[str]:
    engine = create_engine(f"sqlite:///{path}")
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    url = sqlite_url(path)
    assert asyncio.run(current_revision(url)) is None
    first = upgrade(url, None)
    assert first.before is None and first.after == head_revision() and first.applied
    assert tables(path) == TABLES
    assert asyncio.run(current_revision(url)) == head_revision()
    downgrade(url, "base")
    assert tables(path) == set()
    assert asyncio.run(current_revision(url)) is None
    upgrade(url, None)
    assert tables(path) == TABLES
    again = upgrade(url, head_revision())
    assert again.applied == ()  # idempotent


def test_the_migrations_match_the_models_and_sqlite_runs_in_wal(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    upgrade(sqlite_url(path), None)
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
            assert diff == []
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    finally:
        engine.dispose()


def test_quanta_migrate_is_idempotent_and_says_what_it_did(tmp_path: Path) -> None:
    env = {"QUANTA_DATABASE_URL": sqlite_url(tmp_path / "q.db")}
    first = quanta("migrate", env=env)
    assert first.exit_code == 0, first.output
    assert "upgraded from empty" in first.stdout and "applied 0001" in first.stdout
    second = quanta("migrate", env=env)
    assert second.exit_code == 0
    assert "nothing to do" in second.stdout


def test_quanta_run_refuses_a_database_not_at_head(tmp_path: Path) -> None:
    env = {"QUANTA_DATABASE_URL": sqlite_url(tmp_path / "q.db"), "QUANTA_ADMIN_KEY": ADMIN_KEY}
    r = quanta("run", "--port", str(free_port()), env=env)
    assert r.exit_code == 2
    assert "quanta migrate" in r.output


def test_quanta_run_refuses_a_short_or_empty_admin_key(tmp_path: Path) -> None:
    for key in ("", "short"):
        env = {"QUANTA_DATABASE_URL": sqlite_url(tmp_path / "q.db"), "QUANTA_ADMIN_KEY": key}
        r = quanta("run", "--port", str(free_port()), env=env)
        assert r.exit_code == 2
        assert "QUANTA_ADMIN_KEY: must be at least 24 characters" in r.output


def test_tenants_create_prints_a_key_that_the_server_knows(tmp_path: Path) -> None:
    env = {
        "QUANTA_DATABASE_URL": sqlite_url(tmp_path / "q.db"),
        "QUANTA_DATA_DIR": str(tmp_path / "data"),
    }
    assert quanta("tenants", "create", "acme", env=env).exit_code == 2  # not migrated yet
    assert quanta("migrate", env=env).exit_code == 0
    r = quanta("tenants", "create", "acme", "--slo-class", "batch", env=env)
    assert r.exit_code == 0, r.output
    value = r.stdout.split("api key (shown once): ")[1].split()[0]
    assert value.startswith("qk-")
    assert (tmp_path / "data" / "secret_key").stat().st_mode & 0o777 == 0o600
    engine = create_engine(f"sqlite:///{tmp_path / 'q.db'}")
    try:
        with engine.connect() as conn:
            hashed, slo = conn.execute(text("SELECT hashed, slo_class FROM api_keys")).one()
            actions = conn.execute(text("SELECT actor, action FROM audit_log")).all()
    finally:
        engine.dispose()
    assert value not in hashed and len(hashed) == 64 and slo == "batch"
    assert actions == [("cli", "tenant.create"), ("cli", "key.create")]
    dup = quanta("tenants", "create", "acme", env=env)
    assert dup.exit_code == 1 and "exists" in dup.output
    quiet = quanta("tenants", "create", "beta", "--quiet", env=env)
    assert quiet.exit_code == 0 and quiet.stdout.strip().startswith("qk-")
    assert len(quiet.stdout.split()) == 1  # the key alone: `export KEY=$(...)` works
