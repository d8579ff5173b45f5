"""Fleet-wide quotas: this replica's leases of every limited scope, kept in step with the
database off the request path.

    door      prepare(scopes, ask)   memory, unless this replica holds too little: then one
                                     grant (a short transaction) before the check
    tokens    Limiter.grow / settle  memory only (app/tenancy/share.py)
    sync      every sync_s           retire spent or old leases, close drained ones (what
                                     was unused goes back), top up active scopes, give back
                                     idle slots; every heartbeat_s renew this replica's
                                     leases and count the replicas alive

The database unreachable: every share turns ``degraded`` and the scope's limits are divided
by the replicas last seen alive, checked on this replica's own window (so a fleet of N cut
off from its database still serves at most the limit), until a sync succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.tenancy.leases import Grant, LeaseStore, Want, new_lease_id
from app.tenancy.limiter import Limiter, Scope
from app.tenancy.quotas import Ask, Limits
from app.tenancy.share import Lease, Share

log = logging.getLogger("quanta.fleet")


@dataclass(frozen=True, slots=True)
class FleetConfig:
    replica: str  # this replica's name in the database (unique in the fleet)
    sync_s: float = 0.2
    heartbeat_s: float = 1.0
    ttl_s: float = 3.0  # a lease not renewed this long is a dead replica's: its slots free
    rotate_s: float = 2.0  # a lease takes charges this long at most, then drains and closes
    lease_idle_s: float = 0.3  # a lease with nothing in flight this long is closed
    slice_fraction: float = 0.05  # a lease asks this share of a minute's limit
    slot_linger_s: float = 0.5  # an idle slot is given back after this long
    grant_timeout_s: float = 1.0  # the door waits this long for a grant, then degrades
    active_s: float = 5.0  # a scope charged this recently is topped up ahead of need


def is_fleet_scope(limits: Limits) -> bool:
    return (
        limits.max_tokens_per_1_minute is not None
        or limits.max_requests_per_1_minute is not None
        or limits.max_concurrent_requests is not None
    )


class Fleet:
    def __init__(
        self,
        engine: AsyncEngine,
        limiter: Limiter,
        config: FleetConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = LeaseStore(engine, config.replica, config.ttl_s)
        self.limiter = limiter
        self.clock = clock
        self.shares: dict[str, Share] = {}
        self._slot_rows: dict[str, str] = {}  # scope → this replica's slot row
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None
        self._last_heartbeat = 0.0
        self.fleet_size = 1
        # The other replicas' live counters by scope (requests and tokens of the last minute,
        # tokens today, in flight), as of the last heartbeat.
        self.others: dict[str, tuple[int, int, int, int]] = {}
        self.degraded = False
        self.grants = 0  # grants asked of the database (a measure of its load)

    # ---- the door ----

    def share(self, scope: Scope) -> Share | None:
        if not is_fleet_scope(scope.limits):
            return None
        share = self.shares.get(scope.name)
        if share is None:
            share = self.shares[scope.name] = Share(scope.name, scope.limits)
            share.fleet_size = self.fleet_size
            share.degraded = self.degraded
        share.limits = scope.limits
        self.limiter.counters(scope.name).share = share
        return share

    async def prepare(self, scopes: Sequence[Scope], ask: Ask) -> None:
        """Make sure this replica holds enough of every fleet scope for ``ask``, asking the
        database only where it does not."""
        for scope in scopes:
            share = self.share(scope)
            if share is None or share.degraded or self._enough(share, ask):
                continue
            lock = self._locks.setdefault(scope.name, asyncio.Lock())
            async with lock:
                if self._enough(share, ask):  # another request's grant covered this one
                    continue
                try:
                    await asyncio.wait_for(
                        self._grant(share, ask.least, ask.likely_total, slot=True),
                        self.config.grant_timeout_s,
                    )
                except TimeoutError:
                    # A slow database refuses this request (429, retry-after); only a failed
                    # sync (the database unreachable) turns the shares degraded.
                    log.info(
                        "fleet quotas: a grant for %s took over %.1f s",
                        scope.name,
                        self.config.grant_timeout_s,
                    )
                except (SQLAlchemyError, OSError) as exc:
                    self._set_degraded(True, exc)

    @staticmethod
    def _enough(share: Share, ask: Ask) -> bool:
        return (
            share.tokens_left() >= ask.least
            and share.requests_left() >= 1
            and share.slots_free() >= 1
        )

    async def _grant(self, share: Share, least: int, wanted: int, *, slot: bool) -> None:
        lim = share.limits
        want_tokens = want_requests = 0
        tokens_least = 0
        if share.leases_tokens and (share.tokens_left() < least or share.requests_left() < 1):
            if (tpm := lim.max_tokens_per_1_minute) is not None:
                tokens_least = least
                want_tokens = max(wanted, int(tpm * self.config.slice_fraction))
            if (rpm := lim.max_requests_per_1_minute) is not None:
                want_requests = max(1, int(rpm * self.config.slice_fraction))
            else:
                want_requests = 1 << 30  # unlimited requests: a lease takes any number
        want_slots = 1 if slot and share.slots_free() < 1 else 0
        if not (want_tokens or want_requests or want_slots):
            return
        slot_row = self._slot_rows.setdefault(share.scope, new_lease_id())
        now = self.clock()
        self.grants += 1
        grant = await self.store.grant(
            share.scope,
            lim,
            Want(tokens_least, want_tokens, want_requests, want_slots),
            slot_row,
            now,
        )
        self._take(share, grant, now)

    @staticmethod
    def _take(share: Share, grant: Grant, now: float) -> None:
        if grant.lease_id is not None:
            share.add(Lease(grant.lease_id, grant.tokens, grant.requests, now))
        share.slots += grant.slots
        share.retry_after_s = grant.retry_after_s
        share.fleet_used = grant.used_tokens

    # ---- the sync ----

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="quanta-fleet")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(SQLAlchemyError, OSError):
            await self.sync_once(final=True)
            await self.store.close_all(self.clock())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.sync_s)
            try:
                await self.sync_once()
                self._set_degraded(False)
            except (SQLAlchemyError, OSError) as exc:
                self._set_degraded(True, exc)

    async def sync_once(self, *, final: bool = False) -> None:
        cfg = self.config
        now = self.clock()
        closes: list[tuple[str, int, int, float]] = []
        releases: list[tuple[str, int]] = []
        for share in self.shares.values():
            if final and (lease := share.current()) is not None:
                lease.taking = False
            share.retire(now, cfg.rotate_s, cfg.lease_idle_s)
            for lease in share.closable():
                closes.append((lease.id, lease.used_tokens, lease.used_requests, lease.last_at))
            idle = share.slots - max(share.in_flight, 0)
            lingered = share.idle_since is not None and now - share.idle_since >= cfg.slot_linger_s
            if idle > 0 and (lingered or final):
                releases.append((self._slot_rows[share.scope], idle))
                share.slots -= idle
        heartbeat = final or now - self._last_heartbeat >= cfg.heartbeat_s
        live = self.limiter.live(now) if heartbeat and not final else None
        alive, others = await self.store.sync(closes, releases, now, heartbeat=heartbeat, live=live)
        if heartbeat:
            self._last_heartbeat = now
            self.others = others
            for name, c in self.limiter.counters_by_scope().items():
                c.others_today = others[name][2] if name in others else 0
            for name in others.keys() - self.limiter.counters_by_scope().keys():
                self.limiter.counters(name).others_today = others[name][2]
            self.fleet_size = max(alive, 1)
            for share in self.shares.values():
                share.fleet_size = self.fleet_size
        if final:
            return
        for share in list(self.shares.values()):
            await self._top_up(share, now)

    async def _top_up(self, share: Share, now: float) -> None:
        """An active scope gets its next lease before its current one runs out, so that the
        door seldom waits and a running request's output seldom finds nothing left."""
        if not share.leases_tokens or now - share.used_at > self.config.active_s:
            return
        tpm = share.limits.max_tokens_per_1_minute
        low = 0 if tpm is None else int(tpm * self.config.slice_fraction) // 2
        if share.tokens_left() > low and share.requests_left() > 0:
            return
        lock = self._locks.setdefault(share.scope, asyncio.Lock())
        if lock.locked():
            return
        async with lock:
            await self._grant(share, max(low, 1), max(low, 1), slot=False)

    def _set_degraded(self, degraded: bool, exc: BaseException | None = None) -> None:
        if degraded and not self.degraded:
            log.warning(
                "fleet quotas: the database is unreachable (%s); each replica serves 1/%d "
                "of every limit until it is back",
                exc,
                self.fleet_size,
            )
        elif not degraded and self.degraded:
            log.warning("fleet quotas: the database is back; leases resume")
        self.degraded = degraded
        for share in self.shares.values():
            share.degraded = degraded
