"""Admin request and response bodies. Requests are strict: an unknown field is a 400."""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, UnsetType

MAX_INTEGER = 2**63 - 1  # the database's integers are 64-bit
MAX_UNIX_TIME = 253_402_300_799  # 9999-12-31T23:59:59Z: Python's datetime ends there
MAX_ID_LENGTH = 64
MAX_LIMIT = 10**15  # a quota past it is no quota; the sums stay far from 64 bits

Name = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")]
KeyName = Annotated[str, Meta(min_length=1, max_length=128)]
Weight = Annotated[float, Meta(gt=0.0, le=1000.0)]
Limit = Annotated[int, Meta(ge=0, le=MAX_LIMIT)]
Seconds = Annotated[float, Meta(gt=0.0, le=MAX_UNIX_TIME)]
GraceSeconds = Annotated[int, Meta(ge=0, le=30 * 86_400)]
SloClassName = Literal["interactive", "batch"]
TenantStatus = Literal["active", "suspended"]

T = TypeVar("T")


class _In(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class TenantCreate(_In):
    name: Name
    weight: Weight = 1.0


class TenantUpdate(_In):
    name: Name | UnsetType = UNSET
    weight: Weight | UnsetType = UNSET
    status: TenantStatus | UnsetType = UNSET


class KeyCreate(_In):
    name: KeyName | None = None
    slo_class: SloClassName = "interactive"
    expires_at: Seconds | None = None  # Unix seconds


class KeyUpdate(_In):
    name: KeyName | UnsetType | None = UNSET
    slo_class: SloClassName | UnsetType = UNSET
    expires_at: Seconds | UnsetType | None = UNSET


class KeyRotate(_In):
    grace_period_s: GraceSeconds = 3600  # the old value keeps working this long


class QuotaIn(_In):
    """Every field, null (or absent) meaning unlimited."""

    max_requests_per_1_minute: Limit | None = None
    max_tokens_per_1_minute: Limit | None = None
    max_tokens_per_1_day: Limit | None = None
    max_concurrent_requests: Limit | None = None


class LiveCounters(msgspec.Struct):
    requests_last_minute: int
    tokens_last_minute: int
    tokens_today: int
    concurrent_requests: int


class TenantOut(msgspec.Struct, kw_only=True):
    object: str = "tenant"
    id: str
    name: str
    status: str
    weight: float
    created_at: float
    updated_at: float
    counters: LiveCounters | UnsetType = UNSET


class KeyOut(msgspec.Struct, kw_only=True):
    object: str = "api_key"
    id: str
    tenant_id: str
    name: str | None
    redacted_value: str
    slo_class: str
    status: str
    expires_at: float | None
    last_used_at: float | None
    created_at: float
    revoked_at: float | None
    previous_expires_at: float | None
    value: str | UnsetType = UNSET  # only in the answer that created or rotated the key


class QuotaOut(msgspec.Struct, kw_only=True):
    object: str = "quota"
    tenant_id: str | None
    key_id: str | None
    max_requests_per_1_minute: int | None
    max_tokens_per_1_minute: int | None
    max_tokens_per_1_day: int | None
    max_concurrent_requests: int | None
    updated_at: float


class Page(msgspec.Struct, Generic[T], kw_only=True):
    object: str = "list"
    data: list[T]
    has_more: bool
    first_id: str | None
    last_id: str | None


class UsageBucket(msgspec.Struct, kw_only=True):
    object: str = "usage.bucket"
    start_time: int
    end_time: int
    tenant_id: str | None = None
    key_id: str | None = None
    slo_class: str | None = None
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    total_tokens: int


class UsagePage(msgspec.Struct, kw_only=True):
    object: str = "list"
    bucket_width: str
    data: list[UsageBucket]


class AuditOut(msgspec.Struct, kw_only=True):
    object: str = "audit_log.entry"
    id: str
    at: float
    actor: str
    action: str
    target_type: str
    target_id: str
    details: dict[str, Any]


class KeyLimits(msgspec.Struct, kw_only=True):
    tenant: QuotaIn
    key: QuotaIn | None


class OwnKey(msgspec.Struct, kw_only=True):
    """``GET /v1/key``: a key's view of itself and its tenant, nothing else."""

    object: str = "api_key"
    id: str
    tenant_id: str
    tenant_name: str
    name: str | None
    redacted_value: str
    slo_class: str
    expires_at: float | None
    limits: KeyLimits
    tenant_usage: LiveCounters
    key_usage: LiveCounters
