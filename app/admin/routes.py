"""``/admin/v1``: each handler is one call into the admin or usage service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import MappingProxyType
from typing import Annotated, Any

from litestar import Controller, delete, get, patch, post, put
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter
from sqlalchemy.ext.asyncio import AsyncSession

from app.admin.schemas import (
    MAX_ID_LENGTH,
    MAX_INTEGER,
    MAX_UNIX_TIME,
    AuditOut,
    KeyCreate,
    KeyOut,
    KeyRotate,
    KeyUpdate,
    LiveCounters,
    Page,
    QuotaIn,
    QuotaOut,
    TenantCreate,
    TenantOut,
    TenantUpdate,
    UsagePage,
)
from app.admin.service import AdminService
from app.admin.usage import BucketWidth, GroupBy, UsageService
from app.tenancy.gate import require_admin
from app.tenancy.service import Tenancy

PageSize = Annotated[int, QueryParameter(ge=1, le=100)]
# Unix seconds up to the end of year 9999: past it Python's time functions and SQLite's
# 64-bit integers give up (a 500, not a 400).
# (The bounds sit on the optional type: litestar does not check them on ``Bounded | None``.
# Nor does it write a bound of 0 into the document, so ``NOT_NEGATIVE`` states it there.)
NOT_NEGATIVE = {"minimum": 0}
UnixTime = Annotated[int | None, QueryParameter(ge=0, le=MAX_UNIX_TIME, schema_extra=NOT_NEGATIVE)]
Id = Annotated[str | None, QueryParameter(min_length=1, max_length=MAX_ID_LENGTH)]
AuditCursor = Annotated[int | None, QueryParameter(ge=0, le=MAX_INTEGER, schema_extra=NOT_NEGATIVE)]


async def provide_db(state: State) -> AsyncIterator[AsyncSession]:
    tenancy: Tenancy = state["tenancy"]
    async with tenancy.sessions() as session:
        yield session


def provide_admin(db: NamedDependency[AsyncSession], state: State) -> AdminService:
    tenancy: Tenancy = state["tenancy"]

    def live(scope: str) -> LiveCounters:
        u = tenancy.live(scope)
        return LiveCounters(
            u.requests_last_minute, u.tokens_last_minute, u.tokens_today, u.concurrent_requests
        )

    return AdminService(db, tenancy.hasher, on_change=tenancy.directory.reload_tenant, live=live)


def provide_usage(db: NamedDependency[AsyncSession]) -> UsageService:
    return UsageService(db)


_ADMIN_DEPS: MappingProxyType[str, Provide] = MappingProxyType(
    {
        "db": Provide(provide_db),
        "admin": Provide(provide_admin, sync_to_thread=False),
        "usage": Provide(provide_usage, sync_to_thread=False),
    }
)


class TenantsController(Controller):
    path = "/admin/v1/tenants"
    tags = ("Admin",)
    guards = [require_admin]  # noqa: RUF012
    dependencies = _ADMIN_DEPS

    @post("/", status_code=201, summary="Create a tenant")
    async def create(
        self, data: JSONBody[TenantCreate], admin: NamedDependency[AdminService]
    ) -> TenantOut:
        return await admin.create_tenant(data)

    @get("/", summary="List tenants (cursor pagination: limit, after)")
    async def list_tenants(
        self,
        admin: NamedDependency[AdminService],
        limit: PageSize = 20,
        after: Id = None,
    ) -> Page[TenantOut]:
        return await admin.list_tenants(limit, after)

    @get("/{tenant_id:str}", summary="A tenant with its live counters")
    async def get_tenant(
        self, tenant_id: FromPath[str], admin: NamedDependency[AdminService]
    ) -> TenantOut:
        return await admin.get_tenant(tenant_id)

    @patch("/{tenant_id:str}", summary="Update a tenant: name, weight, status (suspend)")
    async def update(
        self,
        tenant_id: FromPath[str],
        data: JSONBody[TenantUpdate],
        admin: NamedDependency[AdminService],
    ) -> TenantOut:
        return await admin.update_tenant(tenant_id, data)

    @delete("/{tenant_id:str}", summary="Delete a tenant, its keys and quotas (usage stays)")
    async def remove(self, tenant_id: FromPath[str], admin: NamedDependency[AdminService]) -> None:
        await admin.delete_tenant(tenant_id)

    @put("/{tenant_id:str}/quota", summary="Set the tenant's quota (all its keys together)")
    async def put_quota(
        self,
        tenant_id: FromPath[str],
        data: JSONBody[QuotaIn],
        admin: NamedDependency[AdminService],
    ) -> QuotaOut:
        return await admin.put_quota("tenant", tenant_id, data)

    @get("/{tenant_id:str}/quota", summary="The tenant's quota")
    async def get_quota(
        self, tenant_id: FromPath[str], admin: NamedDependency[AdminService]
    ) -> QuotaOut:
        return await admin.get_quota("tenant", tenant_id)

    @delete("/{tenant_id:str}/quota", summary="Remove the tenant's quota (unlimited)")
    async def delete_quota(
        self, tenant_id: FromPath[str], admin: NamedDependency[AdminService]
    ) -> None:
        await admin.delete_quota("tenant", tenant_id)

    @post("/{tenant_id:str}/keys", status_code=201, summary="Create a key: its value is shown once")
    async def create_key(
        self,
        tenant_id: FromPath[str],
        data: JSONBody[KeyCreate],
        admin: NamedDependency[AdminService],
    ) -> KeyOut:
        return await admin.create_key(tenant_id, data)

    @get("/{tenant_id:str}/keys", summary="The tenant's keys, redacted")
    async def list_keys(
        self,
        tenant_id: FromPath[str],
        admin: NamedDependency[AdminService],
        limit: PageSize = 20,
        after: Id = None,
    ) -> Page[KeyOut]:
        return await admin.list_keys(tenant_id, limit, after)


class KeysController(Controller):
    path = "/admin/v1/keys"
    tags = ("Admin",)
    guards = [require_admin]  # noqa: RUF012
    dependencies = _ADMIN_DEPS

    @get("/{key_id:str}", summary="A key, redacted")
    async def get_key(self, key_id: FromPath[str], admin: NamedDependency[AdminService]) -> KeyOut:
        return await admin.get_key(key_id)

    @patch("/{key_id:str}", summary="Update a key: name, slo_class, expires_at")
    async def update(
        self, key_id: FromPath[str], data: JSONBody[KeyUpdate], admin: NamedDependency[AdminService]
    ) -> KeyOut:
        return await admin.update_key(key_id, data)

    @post(
        "/{key_id:str}/rotate",
        status_code=200,
        summary="New value; the old one works for the grace period",
    )
    async def rotate(
        self, key_id: FromPath[str], data: JSONBody[KeyRotate], admin: NamedDependency[AdminService]
    ) -> KeyOut:
        return await admin.rotate_key(key_id, data)

    @post("/{key_id:str}/revoke", status_code=200, summary="Revoke a key, at once")
    async def revoke(self, key_id: FromPath[str], admin: NamedDependency[AdminService]) -> KeyOut:
        return await admin.revoke_key(key_id)

    @put("/{key_id:str}/quota", summary="Set the key's own quota (on top of its tenant's)")
    async def put_quota(
        self, key_id: FromPath[str], data: JSONBody[QuotaIn], admin: NamedDependency[AdminService]
    ) -> QuotaOut:
        return await admin.put_quota("key", key_id, data)

    @get("/{key_id:str}/quota", summary="The key's own quota")
    async def get_quota(
        self, key_id: FromPath[str], admin: NamedDependency[AdminService]
    ) -> QuotaOut:
        return await admin.get_quota("key", key_id)

    @delete("/{key_id:str}/quota", summary="Remove the key's own quota")
    async def delete_quota(
        self, key_id: FromPath[str], admin: NamedDependency[AdminService]
    ) -> None:
        await admin.delete_quota("key", key_id)


class UsageController(Controller):
    path = "/admin/v1"
    tags = ("Admin",)
    guards = [require_admin]  # noqa: RUF012
    dependencies = _ADMIN_DEPS

    @get("/usage", summary="Usage in 1m/1h/1d buckets, grouped by tenant, key, class")
    async def usage(
        self,
        usage: NamedDependency[UsageService],
        bucket_width: FromQuery[BucketWidth] = "1d",
        start_time: UnixTime = None,
        end_time: UnixTime = None,
        group_by: FromQuery[list[GroupBy] | None] = None,
        tenant_id: Id = None,
        key_id: Id = None,
    ) -> UsagePage:
        return await usage.usage(
            bucket_width, start_time, end_time, group_by or [], tenant_id, key_id
        )

    @get("/audit_log", summary="Admin actions, newest first (cursor pagination: limit, after)")
    async def audit_log(
        self,
        usage: NamedDependency[UsageService],
        limit: PageSize = 20,
        after: AuditCursor = None,
    ) -> Page[AuditOut]:
        return await usage.audit_log(limit, after)


ADMIN_CONTROLLERS: list[Any] = [TenantsController, KeysController, UsageController]
