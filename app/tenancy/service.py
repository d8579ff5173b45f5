"""``Tenancy``: who is asking, may they, and what did they use — without waiting on the DB.

    authenticate(header)  HMAC → Directory (memory)        401 / 403, or a Principal
                          an unknown key: KeyFloodBound, then one DB lookup   429 / 401
    reserve(principal, …) Limiter.check, then .charge       429, or the request's Meter
                          (fleet quotas: a grant first where this replica holds too little)
    Meter.allows(n)       output past the reservation, charged as it comes (memory)
    Meter.close()         Limiter.settle + LedgerWriter.record (a list append)

Started by the app's lifespan: checks the schema is at head, loads the directory, rebuilds
the counters from the ledger, starts the ledger writer; stopping flushes the ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from app.db.engine import make_engine, make_sessionmaker
from app.db.migrate import check_at_head
from app.db.models import AdminCredential, ApiKey, AuditEntry, DailyUsage, UsageRecord
from app.server.errors import DatabaseUnavailable, InvalidApiKey, RateLimited, TenantSuspended
from app.server.settings import Settings
from app.tenancy.directory import Directory, KeyView, TenantView
from app.tenancy.fleet import Fleet, FleetConfig
from app.tenancy.journal import Journal
from app.tenancy.key_flood import KeyFloodBound, retry_after_s
from app.tenancy.keys import (
    KeyHasher,
    prepare_data_dir,
    resolve_secret,
    same_digest,
    sha256_hex,
)
from app.tenancy.ledger import PARTIAL, LedgerWriter, close_interrupted, utc_day
from app.tenancy.limiter import MINUTE, Limiter, Remaining, Scope
from app.tenancy.listener import TenancyListener
from app.tenancy.meter import Meter
from app.tenancy.quotas import UNLIMITED, Ask, Denial, duration

log = logging.getLogger("quanta.tenancy")

JOURNAL_DIR = "ledger-journal"  # in data_dir: the ledger's write-ahead file
NEGATIVE_TTL_S = 5.0  # an unknown key is looked up in the DB at most this often
NEGATIVE_MAX = 10_000
CHANGES_EVERY_S = 1.0  # how soon another process's admin change (the CLI's) is in force
# Statuses whose row does not count a request against RPM (a partial row's request is
# counted by its final row).
NOT_COUNTED = ("rejected", PARTIAL)


@dataclass(frozen=True, slots=True)
class Principal:
    key: KeyView
    tenant: TenantView

    def scopes(self) -> tuple[Scope, ...]:
        # The key's scope is charged even without a policy of its own: its live counters.
        key = Scope(f"key {self.key.id}", self.key.limits or UNLIMITED)
        return (key, Scope(f"tenant {self.tenant.id}", self.tenant.limits))


@dataclass(frozen=True, slots=True)
class LiveUsage:
    requests_last_minute: int
    tokens_last_minute: int
    tokens_today: int
    concurrent_requests: int


def bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value else None


def _masked(value: str) -> str:
    return f"{value[:6]}***{value[-4:]}" if len(value) > 12 else "***"


def rate_headers(r: Remaining) -> dict[str, str]:
    headers: dict[str, str] = {}
    if r.limit_requests is not None:
        headers["x-ratelimit-limit-requests"] = str(r.limit_requests)
        headers["x-ratelimit-remaining-requests"] = str(r.remaining_requests)
        headers["x-ratelimit-reset-requests"] = duration(r.reset_requests_s)
    if r.limit_tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(r.limit_tokens)
        headers["x-ratelimit-remaining-tokens"] = str(r.remaining_tokens)
        headers["x-ratelimit-reset-tokens"] = duration(r.reset_tokens_s)
    return headers


def rate_limited(denial: Denial) -> RateLimited:
    headers = {
        "retry-after": str(max(1, math.ceil(denial.retry_after_s))),
        "retry-after-ms": str(max(1, math.ceil(denial.retry_after_s * 1000))),
    }
    if not denial.should_retry:
        headers["x-should-retry"] = "false"
    if denial.is_quota:
        kind = code = "insufficient_quota"
    else:
        kind = "tokens" if "token" in denial.limit.value else "requests"
        code = "rate_limit_exceeded"
    return RateLimited(denial.message(), kind=kind, code=code, headers=headers)


def too_many_failures(wait_s: float) -> RateLimited:
    return RateLimited(
        "Too many requests with unknown API keys; try again later.",
        kind="requests",
        code="rate_limit_exceeded",
        headers={
            "retry-after": str(retry_after_s(wait_s)),
            "retry-after-ms": str(max(1, math.ceil(wait_s * 1000))),
        },
    )


class Tenancy:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.engine = make_engine(settings.database_url)
        self.sessions = make_sessionmaker(self.engine)
        self._hasher: KeyHasher | None = None  # the secret is checked against the database
        self._seen_change = 0  # the newest audit entry applied to the directory
        self._following: asyncio.Task[None] | None = None
        self.directory = Directory()
        self.limiter = Limiter()
        journal = Journal(Path(settings.data_dir) / JOURNAL_DIR)
        self.ledger = LedgerWriter(self.sessions, clock=clock, journal=journal)
        self.admin_hash: str | None = None
        self._unknown: dict[str, float] = {}
        self.key_flood = KeyFloodBound(
            settings.auth_failures_per_minute, settings.unknown_key_lookups_per_s
        )
        self.fleet: Fleet | None = None
        self.listener: TenancyListener | None = None
        postgres = make_url(settings.database_url).get_backend_name() == "postgresql"
        fleet = settings.fleet_quotas if settings.fleet_quotas is not None else postgres
        if fleet:
            if not postgres:
                raise ValueError("fleet quotas need PostgreSQL (QUANTA_DATABASE_URL)")
            replica = settings.replica_id or f"{socket.gethostname()}:{settings.port}:{os.getpid()}"
            self.fleet = Fleet(self.engine, self.limiter, FleetConfig(replica), clock)
            self.listener = TenancyListener(
                settings.database_url, self._reload_tenant, self._reload_directory
            )

    @property
    def hasher(self) -> KeyHasher:
        if self._hasher is None:
            raise RuntimeError("the tenancy is not started")
        return self._hasher

    @asynccontextmanager
    async def lifespan(self, _: Any) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def start(self) -> None:
        await check_at_head(self.settings.database_url)
        prepare_data_dir(self.settings.data_dir)
        async with self.sessions() as session:
            self._hasher = KeyHasher(await resolve_secret(self.settings, session))
            await self.directory.load_all(session)
            if self.settings.admin_key is not None:
                self.admin_hash = sha256_hex(self.settings.admin_key.get_secret_value())
            else:
                self.admin_hash = await session.scalar(
                    select(AdminCredential.hashed).order_by(AdminCredential.id.desc()).limit(1)
                )
        async with self.sessions() as session:
            self._seen_change = await session.scalar(select(func.max(AuditEntry.id))) or 0
        self._following = asyncio.create_task(self._follow_changes())
        recovered = await self.ledger.recover()
        if recovered:
            log.warning("%d usage rows recovered from the ledger's journal", recovered)
        closed = await close_interrupted(self.sessions, self.clock())
        if closed:
            log.warning("%d requests were in flight when the server last died", closed)
        await self.rebuild_counters()
        self.ledger.start()
        if self.fleet is not None:
            self.fleet.start()
        if self.listener is not None:
            self.listener.start()

    async def stop(self) -> None:
        if self._following is not None:
            self._following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._following
        if self.listener is not None:
            await self.listener.stop()
        if self.fleet is not None:
            await self.fleet.stop()
        await self.ledger.stop()
        await self.engine.dispose()

    async def _reload_tenant(self, tenant_id: str) -> None:
        async with self.sessions() as session:
            await self.directory.reload_tenant(session, tenant_id)

    async def _reload_directory(self) -> None:
        async with self.sessions() as session:
            await self.directory.load_all(session)

    async def _follow_changes(self) -> None:
        """Admin changes made by another process (``quanta keys revoke`` …) reach this one
        within ``CHANGES_EVERY_S``: every change writes an audit entry, and the tenants that
        newer entries touched are reloaded."""
        failing = False
        while True:
            await asyncio.sleep(CHANGES_EVERY_S)
            try:
                await self.apply_changes()
            except Exception as exc:
                if not failing:  # one line per outage
                    log.warning("admin changes not followed (%s); retrying", type(exc).__name__)
                failing = True
            else:
                failing = False

    async def apply_changes(self) -> None:
        async with self.sessions() as session:
            rows = (
                await session.execute(
                    select(AuditEntry.id, AuditEntry.target_type, AuditEntry.target_id)
                    .where(AuditEntry.id > self._seen_change)
                    .order_by(AuditEntry.id)
                )
            ).all()
            if not rows:
                return
            tenants = set()
            for _, target_type, target_id in rows:
                if target_type == "tenant":
                    tenants.add(target_id)
                    continue
                owner = await session.scalar(select(ApiKey.tenant_id).where(ApiKey.id == target_id))
                known = self.directory.keys.get(target_id)
                tenants.update(t for t in (owner, known.tenant_id if known else None) if t)
            for tenant_id in tenants:
                await self.directory.reload_tenant(session, tenant_id)
            self._seen_change = rows[-1][0]

    async def rebuild_counters(self) -> None:
        """Set (never add to) the counters from the ledger: its last minute and today."""
        now = self.clock()
        async with self.sessions() as session:
            recent = await session.execute(
                select(
                    UsageRecord.tenant_id,
                    UsageRecord.key_id,
                    UsageRecord.started_at,
                    UsageRecord.charged_tokens,
                    UsageRecord.status,
                )
                .where(UsageRecord.started_at > now - MINUTE)
                .order_by(UsageRecord.started_at)
            )
            today = await session.execute(
                select(DailyUsage.tenant_id, DailyUsage.key_id, func.sum(DailyUsage.charged_tokens))
                .where(DailyUsage.day == utc_day(now))
                .group_by(DailyUsage.tenant_id, DailyUsage.key_id)
            )
            minute: list[tuple[str, float, int, bool]] = []
            for tenant_id, key_id, at, tokens, status in recent:
                counted = status not in NOT_COUNTED
                minute.append((f"tenant {tenant_id}", at, tokens, counted))
                minute.append((f"key {key_id}", at, tokens, counted))
            day: list[tuple[str, int]] = []
            for tenant_id, key_id, tokens in today:
                day.append((f"tenant {tenant_id}", int(tokens or 0)))
                day.append((f"key {key_id}", int(tokens or 0)))
        self.limiter.rebuild(minute, day, now)

    # ---- the hot path ----

    async def authenticate(self, authorization: str | None, client: str = "") -> Principal:
        """The key's Principal, or 401/403; ``client`` (its address) bounds what failures
        cost (``KeyFloodBound``)."""
        now = self.clock()
        try:
            return await self._authenticate(authorization, client, now)
        except InvalidApiKey:
            self.key_flood.failed(client, now)
            raise

    async def _authenticate(self, authorization: str | None, client: str, now: float) -> Principal:
        value = bearer(authorization)
        if value is None:
            raise InvalidApiKey(
                "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'."
            )
        hashed = self.hasher.hash(value)
        key = self.directory.find(hashed)
        if key is None:
            key = await self._find_new(hashed, client, now)
        if key is None:
            raise InvalidApiKey(f"Incorrect API key provided: {_masked(value)}.")
        if key.status != "active":
            raise InvalidApiKey("This API key has been revoked.")
        if key.expires_at is not None and now >= key.expires_at:
            raise InvalidApiKey("This API key has expired.")
        if hashed != key.hashed and (key.previous_expires_at or 0.0) <= now:
            raise InvalidApiKey("This API key was rotated and its grace period is over.")
        tenant = self.directory.tenants[key.tenant_id]
        if tenant.status != "active":
            raise TenantSuspended(tenant.name)
        self.ledger.touch(key.id, now)
        return Principal(key, tenant)

    async def _find_new(self, hashed: str, client: str, now: float) -> KeyView | None:
        """A key created outside this process (the CLI): one DB lookup, negatively cached,
        within the key-flood bounds."""
        if self._unknown.get(hashed, 0.0) > now:
            return None
        wait = self.key_flood.blocked_for(client, now)
        if wait is None:
            wait = self.key_flood.take_lookup(now)
        if wait is not None:
            raise too_many_failures(wait)
        async with self.sessions() as session:
            key = await self.directory.load_key_by_hash(session, hashed)
        if key is None:
            if len(self._unknown) >= NEGATIVE_MAX:
                self._unknown.clear()
            self._unknown[hashed] = now + NEGATIVE_TTL_S
        return key

    def headers(self, principal: Principal) -> dict[str, str]:
        return rate_headers(self.limiter.remaining(principal.scopes(), self.clock()))

    async def reserve(self, principal: Principal, request_id: str, ask: Ask) -> Meter:
        now = self.clock()
        down = self.ledger.failing_since
        if down is not None and now - down > self.settings.ledger_outage_s:
            # Known keys were served from memory this long; past it, service would go
            # unrecorded for longer than the operator allowed.
            raise DatabaseUnavailable("the usage ledger cannot be written; try again shortly")
        scopes = principal.scopes()
        if self.fleet is not None:
            await self.fleet.prepare(scopes, ask)
            now = self.clock()
        denial = self.limiter.check(scopes, ask, now)
        if denial is not None:
            raise rate_limited(denial)
        charge = self.limiter.charge(scopes, ask, now)
        return Meter(
            self.limiter, self.ledger, self.clock, principal.key, request_id, charge, ask.prompt
        )

    def live(self, scope: str) -> LiveUsage:
        """The scope's use on this replica, plus the other replicas' as of their last
        heartbeat (fleet quotas: a second old at most)."""
        now = self.clock()
        c = self.limiter.counters(scope)
        r, t, _, n = (0, 0, 0, 0) if self.fleet is None else self.fleet.others.get(scope, (0,) * 4)
        # tokens_today holds the others' already (the day quota is checked against it)
        return LiveUsage(
            c.requests.used(now) + r, c.tokens.used(now) + t, c.tokens_today(now), c.in_flight + n
        )

    def check_admin(self, authorization: str | None) -> None:
        value = bearer(authorization)
        wanted = self.admin_hash
        if wanted is None:
            raise InvalidApiKey("the admin API has no key configured", code="invalid_admin_key")
        if value is None or not same_digest(sha256_hex(value), wanted):
            raise InvalidApiKey("Incorrect admin key.", code="invalid_admin_key")
