"""Tables of tenancy: tenants, API keys, quota policies, the usage ledger, its daily rollup,
the audit log, the generated admin credential, the tenants' stored responses and the
fleet's quota leases.

Times are Unix seconds (floats): one portable type for SQLite and PostgreSQL alike, and the
unit the API speaks. Ids are prefixed and sort by creation (``ten_``, ``key_``).
The ledger and the rollup name tenants and keys by id without foreign keys: usage history
outlives a deleted tenant.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID = String(40)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    status: Mapped[str] = mapped_column(String(16))  # active | suspended
    weight: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class ApiKey(Base):
    """A key is stored as HMAC-SHA256(server secret, value); the value is shown once.

    A rotated key keeps its id: the old hash stays valid until ``previous_expires_at``.
    """

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        ID, ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str | None] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16))
    hashed: Mapped[str] = mapped_column(String(64), unique=True)
    previous_hashed: Mapped[str | None] = mapped_column(String(64), unique=True)
    previous_expires_at: Mapped[float | None] = mapped_column(Float)
    slo_class: Mapped[str] = mapped_column(String(16))  # interactive | batch
    status: Mapped[str] = mapped_column(String(16))  # active | revoked
    expires_at: Mapped[float | None] = mapped_column(Float)
    last_used_at: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)


class QuotaPolicy(Base):
    """Limits of one tenant (all its keys together) or of one key; null is unlimited."""

    __tablename__ = "quota_policies"
    __table_args__ = (CheckConstraint("(tenant_id IS NULL) <> (key_id IS NULL)", name="one_owner"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str | None] = mapped_column(
        ID, ForeignKey("tenants.id", ondelete="CASCADE"), unique=True
    )
    key_id: Mapped[str | None] = mapped_column(
        ID, ForeignKey("api_keys.id", ondelete="CASCADE"), unique=True
    )
    max_requests_per_1_minute: Mapped[int | None] = mapped_column(Integer)
    max_tokens_per_1_minute: Mapped[int | None] = mapped_column(Integer)
    max_tokens_per_1_day: Mapped[int | None] = mapped_column(Integer)
    max_concurrent_requests: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[float] = mapped_column(Float)


class UsageRecord(Base):
    """One row per request that reached the quota check. Never the prompt text."""

    __tablename__ = "usage_ledger"
    __table_args__ = (
        Index("ix_usage_ledger_tenant_started", "tenant_id", "started_at"),
        Index("ix_usage_ledger_key_started", "key_id", "started_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64))
    tenant_id: Mapped[str] = mapped_column(ID)
    key_id: Mapped[str] = mapped_column(ID)
    slo_class: Mapped[str] = mapped_column(String(16))
    # completed | cancelled | error | rejected (by the core) | rate_limited
    status: Mapped[str] = mapped_column(String(16))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    charged_tokens: Mapped[int] = mapped_column(Integer)  # what the quotas counted
    queue_s: Mapped[float | None] = mapped_column(Float)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    duration_s: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float, index=True)
    finished_at: Mapped[float] = mapped_column(Float)


class DailyUsage(Base):
    """The ledger summed per UTC day (of ``started_at``), tenant, key and class."""

    __tablename__ = "usage_daily"

    day: Mapped[str] = mapped_column(String(10), primary_key=True)  # YYYY-MM-DD, UTC
    tenant_id: Mapped[str] = mapped_column(ID, primary_key=True)
    key_id: Mapped[str] = mapped_column(ID, primary_key=True)
    slo_class: Mapped[str] = mapped_column(String(16), primary_key=True)
    requests: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    charged_tokens: Mapped[int] = mapped_column(Integer)


class AuditEntry(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(32))  # admin (the REST API) | cli
    action: Mapped[str] = mapped_column(String(64))  # tenant.create, key.revoke, …
    target_type: Mapped[str] = mapped_column(String(16))
    target_id: Mapped[str] = mapped_column(ID)
    details: Mapped[str] = mapped_column(Text)  # JSON; never a key's value


class StoredResponse(Base):
    """A response kept by ``POST /v1/responses`` (``store: true``), readable only by its
    tenant: the response as sent, and the conversation that ``previous_response_id``
    continues (the input messages and the answer, without ``instructions``)."""

    __tablename__ = "stored_responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        ID, ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[float] = mapped_column(Float)
    conversation: Mapped[str] = mapped_column(Text)  # JSON: chat messages
    response: Mapped[str] = mapped_column(Text)  # JSON: the response object


class AdminCredential(Base):
    """The admin key generated on a first run, as SHA-256 (it is 256 random bits)."""

    __tablename__ = "admin_credentials"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    hashed: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


class FleetLease(Base):
    """A part of a scope's fleet-wide quota held by one replica (app/tenancy/fleet.py).

    Open: ``tokens`` and ``requests`` granted and ``slots`` held, all counted until
    ``expires_at`` (renewed while the replica lives). Closed: what the replica used,
    counted at ``counted_at`` (its last charge) for a minute."""

    __tablename__ = "fleet_leases"
    __table_args__ = (Index("ix_fleet_leases_scope", "scope"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    scope: Mapped[str] = mapped_column(String(64))  # "tenant ten_…" / "key key_…"
    replica: Mapped[str] = mapped_column(String(128), index=True)
    open: Mapped[bool] = mapped_column(Boolean)
    tokens: Mapped[int] = mapped_column(Integer)
    requests: Mapped[int] = mapped_column(Integer)
    slots: Mapped[int] = mapped_column(Integer)
    granted_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    counted_at: Mapped[float] = mapped_column(Float)


class FleetLive(Base):
    """A replica's live counters of a scope, as of its last heartbeat: the admin API and
    ``/v1/key`` of any replica add the others' to their own."""

    __tablename__ = "fleet_live"

    replica: Mapped[str] = mapped_column(String(128), primary_key=True)
    scope: Mapped[str] = mapped_column(String(64), primary_key=True)
    requests_last_minute: Mapped[int] = mapped_column(Integer)
    tokens_last_minute: Mapped[int] = mapped_column(Integer)
    tokens_today: Mapped[int] = mapped_column(Integer)
    concurrent_requests: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)


class FleetReplica(Base):
    """A replica of the fleet, as it last said it was alive."""

    __tablename__ = "fleet_replicas"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    seen_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float)


class SecretCheck(Base):
    """HMAC(secret, CHECK_MESSAGE) of the secret the API keys are hashed with: a server or CLI
    started with another secret (or none) while keys exist stops instead of refusing every key
    (app/tenancy/keys.py)."""

    __tablename__ = "secret_check"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    check: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
