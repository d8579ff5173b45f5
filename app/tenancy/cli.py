"""``quanta migrate``, ``quanta tenants …`` and what ``quanta run`` checks before it serves.

quanta migrate                        the schema to head (idempotent), saying what it did
quanta tenants create NAME            a tenant and a working API key, printed once
quanta tenants list
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Annotated

import typer
from pydantic import ValidationError
from sqlalchemy import select

from app.admin.schemas import KeyCreate, TenantCreate
from app.admin.service import AdminService
from app.db.engine import make_engine, make_sessionmaker
from app.db.migrate import NotAtHead, check_at_head, current_revision, upgrade
from app.db.models import AdminCredential, Tenant
from app.server.errors import ApiError
from app.server.settings import Settings
from app.tenancy.keys import KeyHasher, load_secret, sha256_hex

tenants_cli = typer.Typer(help="Tenants and their API keys.", no_args_is_help=True)


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        typer.echo(f"invalid settings: {exc}", err=True)
        raise typer.Exit(code=2) from None


def _at_head(settings: Settings) -> None:
    try:
        asyncio.run(check_at_head(settings.database_url))
    except NotAtHead as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None


def migrate() -> None:
    """Bring the database schema to head (Alembic). Safe to run again."""
    settings = _settings()
    before = asyncio.run(current_revision(settings.database_url))
    done = upgrade(settings.database_url, before)
    if not done.applied:
        typer.echo(f"database is at head ({done.after}): nothing to do")
        return
    typer.echo(f"database upgraded from {before or 'empty'} to {done.after}:")
    for revision in done.applied:
        typer.echo(f"  applied {revision}")


async def ensure_admin_key(settings: Settings) -> str | None:
    """A newly generated admin key (to print once), or None if one is configured or stored.

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


def prepare_run(settings: Settings) -> None:
    """What ``quanta run`` does before serving: refuse an old schema, make an admin key."""
    _at_head(settings)
    generated = asyncio.run(ensure_admin_key(settings))
    if generated is not None:
        typer.echo(
            "\nGenerated the admin key for /admin/v1 (shown this once; only its hash is "
            f"stored):\n\n    {generated}\n\nSet QUANTA_ADMIN_KEY to choose your own. "
            "For a tenant API key: quanta tenants create NAME\n"
        )


async def _create(settings: Settings, name: str, weight: float, slo_class: str) -> tuple[str, str]:
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            admin = AdminService(session, KeyHasher(load_secret(settings)), actor="cli")
            tenant = await admin.create_tenant(TenantCreate(name=name, weight=weight))
            key = await admin.create_key(
                tenant.id,
                KeyCreate(name="default", slo_class=slo_class),  # type: ignore[arg-type]
            )
            assert isinstance(key.value, str)
            return tenant.id, key.value
    finally:
        await engine.dispose()


@tenants_cli.command("create")
def create(
    name: Annotated[str, typer.Argument(help="the tenant's unique name")],
    weight: Annotated[float, typer.Option(help="share of service within its class")] = 1.0,
    slo_class: Annotated[str, typer.Option(help="interactive or batch")] = "interactive",
    quiet: Annotated[bool, typer.Option(help="print the API key alone (for scripts)")] = False,
) -> None:
    """Create a tenant with one API key, and print the key (shown once)."""
    settings = _settings()
    _at_head(settings)
    if slo_class not in ("interactive", "batch"):
        typer.echo("--slo-class must be interactive or batch", err=True)
        raise typer.Exit(code=2)
    try:
        tenant_id, value = asyncio.run(_create(settings, name, weight, slo_class))
    except (ApiError, ValueError) as exc:
        typer.echo(f"cannot create tenant '{name}': {exc}", err=True)
        raise typer.Exit(code=1) from None
    if quiet:
        typer.echo(value)
        return
    typer.echo(f"tenant {name} ({tenant_id})")
    typer.echo(f"api key (shown once): {value}")
    typer.echo(
        f"try: OPENAI_API_KEY={value} OPENAI_BASE_URL=http://{settings.host}:{settings.port}/v1"
    )


async def _list(settings: Settings) -> list[Tenant]:
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            return list(await session.scalars(select(Tenant).order_by(Tenant.id)))
    finally:
        await engine.dispose()


@tenants_cli.command("list")
def list_tenants() -> None:
    """List tenants: id, name, status, weight."""
    settings = _settings()
    _at_head(settings)
    for t in asyncio.run(_list(settings)):
        typer.echo(f"{t.id}  {t.name}  {t.status}  weight={t.weight:g}")
