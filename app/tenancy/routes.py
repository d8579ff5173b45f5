"""``GET /v1/key``: a key reads its own limits and usage — never anyone else's."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get

from app.admin.schemas import KeyLimits, LiveCounters, OwnKey, QuotaIn
from app.tenancy.gate import ApiKeyAuthentication, tenancy_of
from app.tenancy.keys import redacted
from app.tenancy.quotas import Limits
from app.tenancy.service import Principal, Tenancy


def _quota(limits: Limits) -> QuotaIn:
    return QuotaIn(
        max_requests_per_1_minute=limits.max_requests_per_1_minute,
        max_tokens_per_1_minute=limits.max_tokens_per_1_minute,
        max_tokens_per_1_day=limits.max_tokens_per_1_day,
        max_concurrent_requests=limits.max_concurrent_requests,
    )


def _live(tenancy: Tenancy, scope: str) -> LiveCounters:
    u = tenancy.live(scope)
    return LiveCounters(
        u.requests_last_minute, u.tokens_last_minute, u.tokens_today, u.concurrent_requests
    )


def own_key(tenancy: Tenancy, p: Principal) -> OwnKey:
    key, tenant = p.key, p.tenant
    return OwnKey(
        id=key.id,
        tenant_id=tenant.id,
        tenant_name=tenant.name,
        name=key.name,
        redacted_value=redacted(key.prefix),
        slo_class=key.slo_class.value,
        expires_at=key.expires_at,
        limits=KeyLimits(
            tenant=_quota(tenant.limits),
            key=None if key.limits is None else _quota(key.limits),
        ),
        tenant_usage=_live(tenancy, f"tenant {tenant.id}"),
        key_usage=_live(tenancy, f"key {key.id}"),
    )


class OwnKeyController(Controller):
    path = "/v1/key"
    tags = ("OpenAI",)
    middleware = [ApiKeyAuthentication]  # noqa: RUF012

    @get("/", summary="This key's limits and usage, and its tenant's")
    async def own(self, request: Request[Principal, str, Any]) -> OwnKey:
        return own_key(tenancy_of(request), request.user)
