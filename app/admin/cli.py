"""``quanta tenants|keys|quotas|usage|audit``: the admin API from the command line.

Each command runs the admin API's own services (``AdminService``, ``UsageService``) on the
database, with the API's request bodies decoded the API's way: a mistake is the error the API
answers (``Invalid value for 'weight': Expected `float` > 0.0``), on stderr, exit code 1.
``--json`` prints the API's JSON response. A tenant is named by its name or its id.

quanta tenants create acme --exist-ok --quiet     a key for acme (made if it is new)
quanta keys create acme --slo-class batch         another key
quanta keys rotate KEY_ID --grace 3600            a new value; the old one works an hour
quanta quotas set acme --tokens-per-minute 20000  the tenant's quota (KEY_ID: the key's)
quanta usage --bucket-width 1h --group-by tenant
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import typer

from app.admin.schemas import (
    KeyCreate,
    KeyOut,
    KeyRotate,
    KeyUpdate,
    QuotaIn,
    QuotaOut,
    TenantCreate,
    TenantOut,
    TenantUpdate,
)
from app.admin.service import AdminService
from app.admin.usage import BucketWidth, GroupBy, UsageService
from app.db.engine import make_engine, make_sessionmaker
from app.server.errors import ApiError, Conflict, struct_error
from app.tenancy.cli import fail, ready_database
from app.tenancy.keys import KeyHasher, SecretError, resolve_secret

T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)

tenants_cli = typer.Typer(help="Tenants (and a first key for each).", no_args_is_help=True)
keys_cli = typer.Typer(help="API keys: create, list, rotate, revoke.", no_args_is_help=True)
quotas_cli = typer.Typer(help="Quotas of a tenant or of one key.", no_args_is_help=True)

Json = Annotated[bool, typer.Option("--json", help="print the API's JSON response")]
Quiet = Annotated[bool, typer.Option(help="print the key's value alone (for scripts)")]
SloOption = Annotated[str, typer.Option(help="interactive or batch")]


class UsageQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``GET /admin/v1/usage``'s query parameters that the CLI passes through."""

    bucket_width: BucketWidth = "1d"
    group_by: list[GroupBy] = msgspec.field(default_factory=list)


def body(struct: type[S], fields: dict[str, Any]) -> S:
    """``fields`` (None values left out) as the API's request body, or the API's error."""
    try:
        return msgspec.convert({k: v for k, v in fields.items() if v is not None}, struct)
    except msgspec.ValidationError as exc:
        raise fail(f"error: {struct_error(exc).message}", code=1) from None


def run_admin(work: Callable[[AdminService], Awaitable[T]]) -> T:
    """``work`` with the admin service on the configured database, as actor ``cli``."""

    settings = ready_database()

    async def go() -> T:
        engine = make_engine(settings.database_url)
        try:
            async with make_sessionmaker(engine)() as session:
                hasher = KeyHasher(await resolve_secret(settings, session))
                return await work(AdminService(session, hasher, actor="cli"))
        finally:
            await engine.dispose()

    try:
        return asyncio.run(go())
    except ApiError as exc:
        raise fail(f"error: {exc.message}", code=1) from None
    except SecretError as exc:
        raise fail(f"error: {exc}") from None


def run_usage(work: Callable[[UsageService], Awaitable[T]]) -> T:
    settings = ready_database()

    async def go() -> T:
        engine = make_engine(settings.database_url)
        try:
            async with make_sessionmaker(engine)() as session:
                return await work(UsageService(session))
        finally:
            await engine.dispose()

    return asyncio.run(go())


def emit(result: msgspec.Struct, as_json: bool, text: Callable[[], str]) -> None:
    typer.echo(msgspec.json.encode(result).decode() if as_json else text())


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _tenant_line(t: TenantOut) -> str:
    return f"{t.id}  {t.name}  {t.status}  weight={t.weight:g}"


def _key_line(k: KeyOut) -> str:
    return (
        f"{k.id}  {k.redacted_value}  {k.slo_class}  {k.status}  name={k.name or '-'}  "
        f"expires={_when(k.expires_at)}  last_used={_when(k.last_used_at)}"
    )


def _new_key(k: KeyOut, quiet: bool, as_json: bool) -> None:
    if quiet:
        typer.echo(k.value)
    elif as_json:
        emit(k, True, str)
    else:
        typer.echo(f"key {k.id} ({k.slo_class})")
        typer.echo(f"api key (shown once): {k.value}")


# ---- tenants ----


@tenants_cli.command("create")
def create_tenant(
    name: Annotated[str, typer.Argument(help="the tenant's unique name")],
    weight: Annotated[float, typer.Option(help="share of service within its class")] = 1.0,
    slo_class: SloOption = "interactive",
    key_name: Annotated[str, typer.Option(help="the first key's name")] = "default",
    exist_ok: Annotated[
        bool, typer.Option(help="a tenant of that name exists: give it a new key instead")
    ] = False,
    quiet: Quiet = False,
    as_json: Json = False,
) -> None:
    """Create a tenant with one API key, and print the key (shown once)."""
    tenant_body = body(TenantCreate, {"name": name, "weight": weight})
    key_body = body(KeyCreate, {"name": key_name, "slo_class": slo_class})

    async def work(admin: AdminService) -> tuple[TenantOut, KeyOut]:
        try:
            tenant = await admin.create_tenant(tenant_body)
        except Conflict:
            if not exist_ok:
                raise
            tenant = await admin.find_tenant(name)
        return tenant, await admin.create_key(tenant.id, key_body)

    tenant, key = run_admin(work)
    if quiet or as_json:
        _new_key(key, quiet, as_json)
        return
    typer.echo(f"tenant {tenant.name} ({tenant.id})")
    _new_key(key, False, False)


@tenants_cli.command("list")
def list_tenants(as_json: Json = False) -> None:
    """List tenants: id, name, status, weight."""

    async def work(admin: AdminService) -> list[TenantOut]:
        found: list[TenantOut] = []
        after = None
        while True:
            page = await admin.list_tenants(100, after)
            found += page.data
            if not page.has_more:
                return found
            after = page.last_id

    tenants = run_admin(work)
    if as_json:
        typer.echo(msgspec.json.encode(tenants).decode())
        return
    for t in tenants:
        typer.echo(_tenant_line(t))


@tenants_cli.command("show")
def show_tenant(
    tenant: Annotated[str, typer.Argument(help="name or id")], as_json: Json = False
) -> None:
    """One tenant."""
    t = run_admin(lambda admin: admin.find_tenant(tenant))
    emit(t, as_json, lambda: _tenant_line(t))


def _update_tenant(tenant: str, fields: dict[str, Any], as_json: bool) -> None:
    data = body(TenantUpdate, fields)

    async def work(admin: AdminService) -> TenantOut:
        return await admin.update_tenant((await admin.find_tenant(tenant)).id, data)

    t = run_admin(work)
    emit(t, as_json, lambda: _tenant_line(t))


@tenants_cli.command("update")
def update_tenant(
    tenant: Annotated[str, typer.Argument(help="name or id")],
    name: Annotated[str | None, typer.Option(help="a new name")] = None,
    weight: Annotated[float | None, typer.Option(help="a new weight")] = None,
    as_json: Json = False,
) -> None:
    """Rename a tenant or change its weight."""
    _update_tenant(tenant, {"name": name, "weight": weight}, as_json)


@tenants_cli.command("suspend")
def suspend_tenant(
    tenant: Annotated[str, typer.Argument(help="name or id")], as_json: Json = False
) -> None:
    """Refuse the tenant's requests (403) until it is resumed."""
    _update_tenant(tenant, {"status": "suspended"}, as_json)


@tenants_cli.command("resume")
def resume_tenant(
    tenant: Annotated[str, typer.Argument(help="name or id")], as_json: Json = False
) -> None:
    """Serve a suspended tenant again."""
    _update_tenant(tenant, {"status": "active"}, as_json)


@tenants_cli.command("delete")
def delete_tenant(tenant: Annotated[str, typer.Argument(help="name or id")]) -> None:
    """Delete a tenant, its keys and quotas (its usage stays)."""

    async def work(admin: AdminService) -> str:
        t = await admin.find_tenant(tenant)
        await admin.delete_tenant(t.id)
        return t.id

    typer.echo(f"deleted tenant {run_admin(work)}")


# ---- keys ----


@keys_cli.command("create")
def create_key(
    tenant: Annotated[str, typer.Argument(help="the tenant's name or id")],
    name: Annotated[str | None, typer.Option(help="the key's name")] = None,
    slo_class: SloOption = "interactive",
    expires_at: Annotated[float | None, typer.Option(help="Unix seconds")] = None,
    quiet: Quiet = False,
    as_json: Json = False,
) -> None:
    """A new key for an existing tenant, printed once."""
    data = body(KeyCreate, {"name": name, "slo_class": slo_class, "expires_at": expires_at})

    async def work(admin: AdminService) -> KeyOut:
        return await admin.create_key((await admin.find_tenant(tenant)).id, data)

    _new_key(run_admin(work), quiet, as_json)


@keys_cli.command("list")
def list_keys(
    tenant: Annotated[str, typer.Argument(help="the tenant's name or id")], as_json: Json = False
) -> None:
    """The tenant's keys, redacted."""

    async def work(admin: AdminService) -> list[KeyOut]:
        tenant_id = (await admin.find_tenant(tenant)).id
        found: list[KeyOut] = []
        after = None
        while True:
            page = await admin.list_keys(tenant_id, 100, after)
            found += page.data
            if not page.has_more:
                return found
            after = page.last_id

    keys = run_admin(work)
    if as_json:
        typer.echo(msgspec.json.encode(keys).decode())
        return
    for k in keys:
        typer.echo(_key_line(k))


@keys_cli.command("show")
def show_key(key_id: Annotated[str, typer.Argument()], as_json: Json = False) -> None:
    """One key, redacted."""
    k = run_admin(lambda admin: admin.get_key(key_id))
    emit(k, as_json, lambda: _key_line(k))


@keys_cli.command("update")
def update_key(
    key_id: Annotated[str, typer.Argument()],
    name: Annotated[str | None, typer.Option(help="a new name")] = None,
    slo_class: Annotated[str | None, typer.Option(help="interactive or batch")] = None,
    expires_at: Annotated[float | None, typer.Option(help="Unix seconds")] = None,
    as_json: Json = False,
) -> None:
    """Rename a key, or change its class or expiry."""
    data = body(KeyUpdate, {"name": name, "slo_class": slo_class, "expires_at": expires_at})
    k = run_admin(lambda admin: admin.update_key(key_id, data))
    emit(k, as_json, lambda: _key_line(k))


@keys_cli.command("rotate")
def rotate_key(
    key_id: Annotated[str, typer.Argument()],
    grace: Annotated[
        int, typer.Option(help="seconds the old value keeps working (0: none)")
    ] = 3600,
    quiet: Quiet = False,
    as_json: Json = False,
) -> None:
    """A new value for the key, printed once; the old one works for the grace period."""
    data = body(KeyRotate, {"grace_period_s": grace})
    _new_key(run_admin(lambda admin: admin.rotate_key(key_id, data)), quiet, as_json)


@keys_cli.command("revoke")
def revoke_key(key_id: Annotated[str, typer.Argument()], as_json: Json = False) -> None:
    """Revoke a key, at once."""
    k = run_admin(lambda admin: admin.revoke_key(key_id))
    emit(k, as_json, lambda: _key_line(k))


# ---- quotas ----

Target = Annotated[str, typer.Argument(help="a tenant (name or id), or a key id (key_…)")]


async def _owner(admin: AdminService, target: str) -> tuple[Literal["tenant", "key"], str]:
    if target.startswith("key_"):
        return "key", target
    return "tenant", (await admin.find_tenant(target)).id


def _quota_line(q: QuotaOut) -> str:
    def value(v: int | None) -> str:
        return "unlimited" if v is None else str(v)

    return (
        f"requests/min={value(q.max_requests_per_1_minute)}  "
        f"tokens/min={value(q.max_tokens_per_1_minute)}  "
        f"tokens/day={value(q.max_tokens_per_1_day)}  "
        f"concurrent={value(q.max_concurrent_requests)}"
    )


@quotas_cli.command("show")
def show_quota(target: Target, as_json: Json = False) -> None:
    """The quota of a tenant or of a key."""

    async def work(admin: AdminService) -> QuotaOut:
        return await admin.get_quota(*await _owner(admin, target))

    q = run_admin(work)
    emit(q, as_json, lambda: _quota_line(q))


@quotas_cli.command("set")
def set_quota(
    target: Target,
    requests_per_minute: Annotated[int | None, typer.Option()] = None,
    tokens_per_minute: Annotated[int | None, typer.Option()] = None,
    tokens_per_day: Annotated[int | None, typer.Option()] = None,
    concurrent: Annotated[int | None, typer.Option(help="requests at once")] = None,
    as_json: Json = False,
) -> None:
    """Set a quota (a limit left out is unlimited), replacing the one there was."""
    data = body(
        QuotaIn,
        {
            "max_requests_per_1_minute": requests_per_minute,
            "max_tokens_per_1_minute": tokens_per_minute,
            "max_tokens_per_1_day": tokens_per_day,
            "max_concurrent_requests": concurrent,
        },
    )

    async def work(admin: AdminService) -> QuotaOut:
        return await admin.put_quota(*await _owner(admin, target), data)

    q = run_admin(work)
    emit(q, as_json, lambda: _quota_line(q))


@quotas_cli.command("delete")
def delete_quota(target: Target) -> None:
    """Remove a quota (unlimited)."""

    async def work(admin: AdminService) -> None:
        await admin.delete_quota(*await _owner(admin, target))

    run_admin(work)
    typer.echo(f"deleted the quota of {target}")


# ---- usage and audit ----


def usage(
    bucket_width: Annotated[str, typer.Option(help="1m, 1h or 1d")] = "1d",
    start_time: Annotated[int | None, typer.Option(help="Unix seconds")] = None,
    end_time: Annotated[int | None, typer.Option(help="Unix seconds")] = None,
    group_by: Annotated[str, typer.Option(help="tenant, key, class (comma-separated)")] = "",
    tenant: Annotated[str | None, typer.Option(help="one tenant (name or id)")] = None,
    key_id: Annotated[str | None, typer.Option(help="one key")] = None,
    as_json: Json = False,
) -> None:
    """Usage in 1m/1h/1d buckets (as GET /admin/v1/usage)."""
    groups = [g.strip() for g in group_by.split(",") if g.strip()]
    query = body(UsageQuery, {"bucket_width": bucket_width, "group_by": groups})
    tenant_id = run_admin(lambda admin: admin.find_tenant(tenant)).id if tenant else None
    page = run_usage(
        lambda u: u.usage(
            query.bucket_width, start_time, end_time, query.group_by, tenant_id, key_id
        )
    )
    if as_json:
        emit(page, True, str)
        return
    for b in page.data:
        who = "  ".join(x for x in (b.tenant_id, b.key_id, b.slo_class) if x)
        typer.echo(
            f"{_when(b.start_time)}  {who or 'all'}  requests={b.requests}  "
            f"prompt={b.prompt_tokens}  cached={b.cached_tokens}  "
            f"completion={b.completion_tokens}"
        )


def audit(
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    after: Annotated[int | None, typer.Option(help="entries older than this id")] = None,
    as_json: Json = False,
) -> None:
    """Admin actions, newest first (as GET /admin/v1/audit_log)."""
    page = run_usage(lambda u: u.audit_log(limit, after))
    if as_json:
        emit(page, True, str)
        return
    for a in page.data:
        details = msgspec.json.encode(a.details).decode()
        typer.echo(f"{a.id}  {_when(a.at)}  {a.actor}  {a.action}  {a.target_id}  {details}")
