"""Tenants, keys and quotas: every change commits with its audit entry, then the directory
reloads the tenant it touched, so the next request on ``/v1`` already sees it."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.admin.schemas import (
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
)
from app.db.models import ApiKey, AuditEntry, QuotaPolicy, Tenant
from app.server.errors import Conflict, InvalidParameter, NotFound
from app.tenancy.keys import KeyHasher, new_id, new_key_value, prefix_of, redacted

OnChange = Callable[[AsyncSession, str], Awaitable[None]]
Live = Callable[[str], LiveCounters]


def tenant_out(t: Tenant, counters: LiveCounters | None = None) -> TenantOut:
    out = TenantOut(
        id=t.id,
        name=t.name,
        status=t.status,
        weight=t.weight,
        created_at=t.created_at,
        updated_at=t.updated_at,
    )
    if counters is not None:
        out.counters = counters
    return out


def key_out(k: ApiKey, value: str | None = None) -> KeyOut:
    out = KeyOut(
        id=k.id,
        tenant_id=k.tenant_id,
        name=k.name,
        redacted_value=redacted(k.prefix),
        slo_class=k.slo_class,
        status=k.status,
        expires_at=k.expires_at,
        last_used_at=k.last_used_at,
        created_at=k.created_at,
        revoked_at=k.revoked_at,
        previous_expires_at=k.previous_expires_at,
    )
    if value is not None:
        out.value = value
    return out


def quota_out(q: QuotaPolicy) -> QuotaOut:
    return QuotaOut(
        tenant_id=q.tenant_id,
        key_id=q.key_id,
        max_requests_per_1_minute=q.max_requests_per_1_minute,
        max_tokens_per_1_minute=q.max_tokens_per_1_minute,
        max_tokens_per_1_day=q.max_tokens_per_1_day,
        max_concurrent_requests=q.max_concurrent_requests,
        updated_at=q.updated_at,
    )


class AdminService:
    def __init__(
        self,
        session: AsyncSession,
        hasher: KeyHasher,
        *,
        actor: str = "admin",
        on_change: OnChange | None = None,
        live: Live | None = None,
    ) -> None:
        self._s = session
        self._hasher = hasher
        self._actor = actor
        self._on_change = on_change
        self._live = live

    # ---- tenants ----

    async def create_tenant(self, data: TenantCreate) -> TenantOut:
        now = time.time()
        t = Tenant(
            id=new_id("ten"),
            name=data.name,
            status="active",
            weight=data.weight,
            created_at=now,
            updated_at=now,
        )
        self._s.add(t)
        self._audit("tenant.create", "tenant", t.id, msgspec.to_builtins(data))
        await self._commit(t.id, f"a tenant named '{data.name}' exists")
        return tenant_out(t)

    async def list_tenants(self, limit: int, after: str | None) -> Page[TenantOut]:
        query = select(Tenant).order_by(Tenant.id).limit(limit + 1)
        if after is not None:
            query = query.where(Tenant.id > after)
        rows = list(await self._s.scalars(query))
        data = [tenant_out(t) for t in rows[:limit]]
        return _page(data, len(rows) > limit)

    async def find_tenant(self, ref: str) -> TenantOut:
        """A tenant by id, else by name (the CLI's way of naming one)."""
        t = await self._s.get(Tenant, ref) or await self._s.scalar(
            select(Tenant).where(Tenant.name == ref)
        )
        if t is None:
            raise NotFound("tenant", ref)
        return tenant_out(t)

    async def get_tenant(self, tenant_id: str) -> TenantOut:
        t = await self._tenant(tenant_id)
        live = self._live(f"tenant {t.id}") if self._live is not None else None
        return tenant_out(t, live)

    async def update_tenant(self, tenant_id: str, data: TenantUpdate) -> TenantOut:
        t = await self._tenant(tenant_id)
        changes = _changes(data)
        if not changes:
            raise InvalidParameter("body", "nothing to update")
        for field, value in changes.items():
            setattr(t, field, value)
        t.updated_at = time.time()
        action = "tenant.suspend" if changes.get("status") == "suspended" else "tenant.update"
        self._audit(action, "tenant", t.id, changes)
        await self._commit(t.id, "a tenant with that name exists")
        return tenant_out(t)

    async def delete_tenant(self, tenant_id: str) -> None:
        t = await self._tenant(tenant_id)
        await self._s.delete(t)
        self._audit("tenant.delete", "tenant", t.id, {"name": t.name})
        await self._commit(t.id)

    # ---- keys ----

    async def create_key(self, tenant_id: str, data: KeyCreate) -> KeyOut:
        t = await self._tenant(tenant_id)
        now = time.time()
        _check_future(data.expires_at, now)
        value = new_key_value()
        k = ApiKey(
            id=new_id("key"),
            tenant_id=t.id,
            name=data.name,
            prefix=prefix_of(value),
            hashed=self._hasher.hash(value),
            slo_class=data.slo_class,
            status="active",
            expires_at=data.expires_at,
            created_at=now,
            updated_at=now,
        )
        self._s.add(k)
        self._audit("key.create", "api_key", k.id, msgspec.to_builtins(data) | {"tenant_id": t.id})
        await self._commit(t.id)
        return key_out(k, value)

    async def list_keys(self, tenant_id: str, limit: int, after: str | None) -> Page[KeyOut]:
        await self._tenant(tenant_id)
        query = select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id)
        if after is not None:
            query = query.where(ApiKey.id > after)
        rows = list(await self._s.scalars(query.limit(limit + 1)))
        return _page([key_out(k) for k in rows[:limit]], len(rows) > limit)

    async def get_key(self, key_id: str) -> KeyOut:
        return key_out(await self._key(key_id))

    async def update_key(self, key_id: str, data: KeyUpdate) -> KeyOut:
        k = await self._key(key_id)
        changes = _changes(data)
        if not changes:
            raise InvalidParameter("body", "nothing to update")
        now = time.time()
        if changes.get("expires_at") is not None:
            _check_future(changes["expires_at"], now)
        for field, value in changes.items():
            setattr(k, field, value)
        k.updated_at = now
        self._audit("key.update", "api_key", k.id, changes)
        await self._commit(k.tenant_id)
        return key_out(k)

    async def rotate_key(self, key_id: str, data: KeyRotate) -> KeyOut:
        k = await self._key(key_id)
        if k.status != "active":
            raise Conflict("a revoked key cannot be rotated")
        now = time.time()
        value = new_key_value()
        k.previous_hashed = k.hashed if data.grace_period_s > 0 else None
        k.previous_expires_at = now + data.grace_period_s if data.grace_period_s > 0 else None
        k.hashed, k.prefix, k.updated_at = self._hasher.hash(value), prefix_of(value), now
        self._audit("key.rotate", "api_key", k.id, msgspec.to_builtins(data))
        await self._commit(k.tenant_id)
        return key_out(k, value)

    async def revoke_key(self, key_id: str) -> KeyOut:
        k = await self._key(key_id)
        now = time.time()
        k.status, k.revoked_at, k.updated_at = "revoked", now, now
        k.previous_hashed = k.previous_expires_at = None
        self._audit("key.revoke", "api_key", k.id, {})
        await self._commit(k.tenant_id)
        return key_out(k)

    # ---- quotas ----

    async def put_quota(self, owner: str, owner_id: str, data: QuotaIn) -> QuotaOut:
        tenant_id = await self._owner_tenant(owner, owner_id)
        q = await self._quota(owner, owner_id)
        if q is None:
            q = QuotaPolicy(**{f"{owner}_id": owner_id})
            self._s.add(q)
        for field, value in msgspec.to_builtins(data).items():
            setattr(q, field, value)
        q.updated_at = time.time()
        self._audit("quota.put", owner, owner_id, msgspec.to_builtins(data))
        await self._commit(tenant_id)
        return quota_out(q)

    async def get_quota(self, owner: str, owner_id: str) -> QuotaOut:
        await self._owner_tenant(owner, owner_id)
        q = await self._quota(owner, owner_id)
        if q is None:
            raise NotFound("quota", owner_id)
        return quota_out(q)

    async def delete_quota(self, owner: str, owner_id: str) -> None:
        tenant_id = await self._owner_tenant(owner, owner_id)
        q = await self._quota(owner, owner_id)
        if q is None:
            raise NotFound("quota", owner_id)
        await self._s.delete(q)
        self._audit("quota.delete", owner, owner_id, {})
        await self._commit(tenant_id)

    # ---- helpers ----

    async def _tenant(self, tenant_id: str) -> Tenant:
        t = await self._s.get(Tenant, tenant_id)
        if t is None:
            raise NotFound("tenant", tenant_id)
        return t

    async def _key(self, key_id: str) -> ApiKey:
        k = await self._s.get(ApiKey, key_id)
        if k is None:
            raise NotFound("api_key", key_id)
        return k

    async def _owner_tenant(self, owner: str, owner_id: str) -> str:
        if owner == "tenant":
            return (await self._tenant(owner_id)).id
        return (await self._key(owner_id)).tenant_id

    async def _quota(self, owner: str, owner_id: str) -> QuotaPolicy | None:
        column = QuotaPolicy.tenant_id if owner == "tenant" else QuotaPolicy.key_id
        found: QuotaPolicy | None = await self._s.scalar(
            select(QuotaPolicy).where(column == owner_id)
        )
        return found

    def _audit(self, action: str, target_type: str, target_id: str, details: Any) -> None:
        self._s.add(
            AuditEntry(
                at=time.time(),
                actor=self._actor,
                action=action,
                target_type=target_type,
                target_id=target_id,
                details=json.dumps(details, sort_keys=True),
            )
        )

    async def _commit(self, tenant_id: str, conflict: str = "conflict") -> None:
        try:
            await self._s.commit()
        except IntegrityError:
            await self._s.rollback()
            raise Conflict(conflict) from None
        if self._on_change is not None:
            await self._on_change(self._s, tenant_id)


def _changes(data: msgspec.Struct) -> dict[str, Any]:
    return {
        f: getattr(data, f) for f in data.__struct_fields__ if getattr(data, f) is not msgspec.UNSET
    }


def _check_future(expires_at: float | None, now: float) -> None:
    if expires_at is not None and expires_at <= now:
        raise InvalidParameter("expires_at", "expires_at must be in the future (Unix seconds)")


def _page(data: list[Any], has_more: bool) -> Page[Any]:
    return Page(
        data=data,
        has_more=has_more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )
