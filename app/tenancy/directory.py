"""Every tenant, key and quota in memory: the hot path's only source of who is who.

Loaded whole at start (10,000 keys are a few MB); the admin service reloads a tenant right
after each change it commits, so revocation, suspension and new limits apply to the very
next request. A hash not found here may be a key made by ``quanta tenants create`` while the
server runs: ``Tenancy`` looks those up once in the database and adds them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import ApiKey, QuotaPolicy, Tenant
from app.tenancy.keys import same_digest
from app.tenancy.quotas import UNLIMITED, Limits
from quanta_core.requests import SloClass


@dataclass(frozen=True, slots=True)
class TenantView:
    id: str
    name: str
    status: str
    weight: float
    limits: Limits


@dataclass(frozen=True, slots=True)
class KeyView:
    id: str
    tenant_id: str
    name: str | None
    prefix: str
    hashed: str
    previous_hashed: str | None
    previous_expires_at: float | None
    slo_class: SloClass
    status: str
    expires_at: float | None
    limits: Limits | None  # the key's own policy, if it has one


def limits_of(policy: QuotaPolicy | None) -> Limits | None:
    if policy is None:
        return None
    return Limits(
        policy.max_requests_per_1_minute,
        policy.max_tokens_per_1_minute,
        policy.max_tokens_per_1_day,
        policy.max_concurrent_requests,
    )


class Directory:
    def __init__(self) -> None:
        self.tenants: dict[str, TenantView] = {}
        self.keys: dict[str, KeyView] = {}
        self._by_hash: dict[str, str] = {}  # current and in-grace previous hashes → key id
        self._lock = asyncio.Lock()

    def find(self, hashed: str) -> KeyView | None:
        # The dict finds the candidate by the key's HMAC, which nobody can aim at without
        # the secret; the match itself is confirmed in constant time.
        key_id = self._by_hash.get(hashed)
        key = None if key_id is None else self.keys.get(key_id)
        if key is None:
            return None
        if same_digest(hashed, key.hashed):
            return key
        if key.previous_hashed is not None and same_digest(hashed, key.previous_hashed):
            return key
        return None

    # Every row is read before anything changes, and the change is made with no await in
    # between: the requests authenticated meanwhile never see a key without its tenant.
    # Reloads (a notification, a new key's lookup, the admin API) run one at a time, so one
    # that read before a change never lands after one that read it.

    async def load_all(self, session: AsyncSession) -> None:
        async with self._lock:
            tenants, keys = await self._read(session, None)
            self.tenants, self.keys, self._by_hash = {}, {}, {}
            self._apply(tenants, keys)

    async def reload_tenant(self, session: AsyncSession, tenant_id: str) -> None:
        async with self._lock:
            tenants, keys = await self._read(session, tenant_id)
            self._forget(tenant_id)
            self._apply(tenants, keys)

    async def load_key_by_hash(self, session: AsyncSession, hashed: str) -> KeyView | None:
        found = await session.scalar(
            select(ApiKey.tenant_id).where(
                or_(ApiKey.hashed == hashed, ApiKey.previous_hashed == hashed)
            )
        )
        if found is None:
            return None
        await self.reload_tenant(session, found)
        return self.find(hashed)

    def _forget(self, tenant_id: str) -> None:
        self.tenants.pop(tenant_id, None)
        for key in [k for k in self.keys.values() if k.tenant_id == tenant_id]:
            del self.keys[key.id]
            self._by_hash.pop(key.hashed, None)
            if key.previous_hashed is not None:
                self._by_hash.pop(key.previous_hashed, None)

    async def _read(
        self, session: AsyncSession, tenant_id: str | None
    ) -> tuple[list[TenantView], list[KeyView]]:
        tenants = select(Tenant)
        keys = select(ApiKey)
        policies = select(QuotaPolicy)
        if tenant_id is not None:
            tenants = tenants.where(Tenant.id == tenant_id)
            keys = keys.where(ApiKey.tenant_id == tenant_id)
            key_ids = select(ApiKey.id).where(ApiKey.tenant_id == tenant_id)
            policies = policies.where(
                or_(QuotaPolicy.tenant_id == tenant_id, QuotaPolicy.key_id.in_(key_ids))
            )
        by_tenant: dict[str, Limits] = {}
        by_key: dict[str, Limits] = {}
        for policy in await session.scalars(policies):
            limits = limits_of(policy)
            assert limits is not None
            if policy.tenant_id is not None:
                by_tenant[policy.tenant_id] = limits
            elif policy.key_id is not None:
                by_key[policy.key_id] = limits
        tenant_views = [
            TenantView(t.id, t.name, t.status, t.weight, by_tenant.get(t.id, UNLIMITED))
            for t in await session.scalars(tenants)
        ]
        key_views = []
        for k in await session.scalars(keys):
            view = KeyView(
                k.id,
                k.tenant_id,
                k.name,
                k.prefix,
                k.hashed,
                k.previous_hashed,
                k.previous_expires_at,
                SloClass(k.slo_class),
                k.status,
                k.expires_at,
                by_key.get(k.id),
            )
            key_views.append(view)
        return tenant_views, key_views

    def _apply(self, tenants: list[TenantView], keys: list[KeyView]) -> None:
        for t in tenants:
            self.tenants[t.id] = t
        for k in keys:
            if k.tenant_id not in self.tenants:  # its tenant was made after the keys were read
                continue
            self.keys[k.id] = k
            self._by_hash[k.hashed] = k.id
            if k.previous_hashed is not None:
                self._by_hash[k.previous_hashed] = k.id
