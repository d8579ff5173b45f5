"""The fleet's quota leases in PostgreSQL: grant, close, renew, release (``fleet_leases``).

A grant is one short transaction under a lock of its scope (``pg_advisory_xact_lock``):

    counted = open leases, in full, until they expire   (granted, not yet used or returned)
            + closed leases' use, for 60 s after their last charge or settlement
    grant   = min(asked, limit − counted)   refused where less than the request needs

So the tokens the whole fleet serves in any 60 s never exceed the limit, counted by when
they were served (a request's prompt at its start, each output token as it streams): take
the leases that served a token in the window and the last of them granted, at g; every other
one was counted at g, in full if open, else its use, since it served a token in the window
(so settled no earlier) and g is at most 60 s after that token; and g granted at most the
limit less what it counted. Requests likewise. Concurrency: the slots held by open leases,
at most the limit. A replica that dies stops renewing: its slots are free ``ttl_s`` later,
its leases' tokens counted a minute more.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.tenancy.quotas import Limits

MINUTE = 60.0
FORGET_S = 120.0  # rows older than this no longer count: deleted

_COUNTED = text(
    """
    SELECT
      coalesce(sum(tokens) FILTER (WHERE counted), 0),
      coalesce(sum(requests) FILTER (WHERE counted), 0),
      coalesce(sum(slots) FILTER (WHERE open AND expires_at > :now), 0),
      min(counted_at) FILTER (WHERE counted AND NOT open)
    FROM (
      SELECT tokens, requests, slots, open, expires_at, counted_at,
             (CASE WHEN open THEN expires_at ELSE counted_at END) > :horizon AS counted
      FROM fleet_leases WHERE scope = :scope
    ) AS rows
    """
)
_INSERT = text(
    """
    INSERT INTO fleet_leases
      (id, scope, replica, open, tokens, requests, slots, granted_at, expires_at, counted_at)
    VALUES (:id, :scope, :replica, true, :tokens, :requests, :slots, :now, :expires, :expires)
    """
)


@dataclass(frozen=True, slots=True)
class Want:
    """What a replica asks of a scope: tokens and requests for a new lease (the least it
    needs and the most it takes), and slots."""

    tokens_least: int = 0
    tokens: int = 0
    requests: int = 0
    slots: int = 0


@dataclass(frozen=True, slots=True)
class Grant:
    lease_id: str | None  # the new lease (None: no tokens or requests were granted)
    tokens: int
    requests: int
    slots: int
    retry_after_s: float  # where refused: when enough of the minute will have aged out
    used_tokens: int  # the minute's tokens counted before this grant


def new_lease_id() -> str:
    return "lse_" + secrets.token_hex(12)


class LeaseStore:
    def __init__(self, engine: AsyncEngine, replica: str, ttl_s: float) -> None:
        self.engine = engine
        self.replica = replica
        self.ttl_s = ttl_s

    async def grant(
        self, scope: str, limits: Limits, want: Want, slot_lease: str | None, now: float
    ) -> Grant:
        """Grant what fits of ``want``; slots are added to ``slot_lease`` (this replica's
        slot row for the scope, made by the caller's first grant: pass its id)."""
        async with self.engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:s))"), {"s": scope})
            row = (
                await conn.execute(_COUNTED, {"scope": scope, "now": now, "horizon": now - MINUTE})
            ).one()
            used_tokens, used_requests, used_slots, oldest = row
            tokens = requests = slots = 0
            tpm = limits.max_tokens_per_1_minute
            if want.tokens or want.requests:
                room_t = want.tokens if tpm is None else min(want.tokens, tpm - used_tokens)
                rpm = limits.max_requests_per_1_minute
                room_r = want.requests if rpm is None else min(want.requests, rpm - used_requests)
                if room_t >= want.tokens_least and room_r >= min(want.requests, 1):
                    tokens, requests = max(room_t, 0), max(room_r, 0)
            if want.slots and (most := limits.max_concurrent_requests) is not None:
                slots = max(0, min(want.slots, most - int(used_slots)))
            expires = now + self.ttl_s
            lease_id = None
            if tokens or requests:
                lease_id = new_lease_id()
                await conn.execute(
                    _INSERT,
                    {
                        "id": lease_id,
                        "scope": scope,
                        "replica": self.replica,
                        "tokens": tokens,
                        "requests": requests,
                        "slots": 0,
                        "now": now,
                        "expires": expires,
                    },
                )
            if slots:
                assert slot_lease is not None
                done = await conn.execute(
                    text(
                        "UPDATE fleet_leases SET slots = slots + :n, expires_at = :expires "
                        "WHERE id = :id AND open"
                    ),
                    {"n": slots, "id": slot_lease, "expires": expires},
                )
                if done.rowcount == 0:  # type: ignore[attr-defined]
                    await conn.execute(
                        _INSERT,
                        {
                            "id": slot_lease,
                            "scope": scope,
                            "replica": self.replica,
                            "tokens": 0,
                            "requests": 0,
                            "slots": slots,
                            "now": now,
                            "expires": expires,
                        },
                    )
        wait = 1.0 if oldest is None else max(1.0, float(oldest) + MINUTE - now)
        return Grant(lease_id, tokens, requests, slots, wait, int(used_tokens))

    async def sync(
        self,
        closes: list[tuple[str, int, int, float]],
        releases: list[tuple[str, int]],
        now: float,
        *,
        heartbeat: bool,
        live: list[tuple[str, int, int, int, int]] | None = None,
    ) -> tuple[int, dict[str, tuple[int, int, int, int]]]:
        """Close leases ``(id, used tokens, used requests, last charge)``, give back slots
        ``(slot lease id, count)``; with ``heartbeat``, renew this replica's open leases,
        publish its ``live`` counters ``(scope, requests, tokens, today, in flight)`` and
        forget old rows. Returns, on a heartbeat, the replicas alive (this one included)
        and the other live replicas' counters summed by scope."""
        alive = 0
        others: dict[str, tuple[int, int, int, int]] = {}
        async with self.engine.begin() as conn:
            for lease_id, used_tokens, used_requests, last_at in closes:
                await conn.execute(
                    text(
                        "UPDATE fleet_leases SET open = false, tokens = :t, requests = :r, "
                        "counted_at = :at WHERE id = :id"
                    ),
                    {"id": lease_id, "t": used_tokens, "r": used_requests, "at": last_at},
                )
            for slot_lease, count in releases:
                await conn.execute(
                    text("UPDATE fleet_leases SET slots = slots - :n WHERE id = :id"),
                    {"id": slot_lease, "n": count},
                )
            if heartbeat:
                await conn.execute(
                    text(
                        "UPDATE fleet_leases SET expires_at = :expires, "
                        "counted_at = :expires WHERE replica = :me AND open"
                    ),
                    {"me": self.replica, "expires": now + self.ttl_s},
                )
                await conn.execute(
                    text(
                        "INSERT INTO fleet_replicas (id, seen_at, started_at) "
                        "VALUES (:me, :now, :now) "
                        "ON CONFLICT (id) DO UPDATE SET seen_at = :now"
                    ),
                    {"me": self.replica, "now": now},
                )
                await conn.execute(
                    text(
                        "DELETE FROM fleet_leases WHERE "
                        "(CASE WHEN open THEN expires_at ELSE counted_at END) < :old"
                    ),
                    {"old": now - FORGET_S},
                )
                recent = now - 3 * self.ttl_s
                alive = int(
                    await conn.scalar(
                        text("SELECT count(*) FROM fleet_replicas WHERE seen_at > :recent"),
                        {"recent": recent},
                    )
                    or 1
                )
                await conn.execute(
                    text("DELETE FROM fleet_live WHERE replica = :me OR at < :old"),
                    {"me": self.replica, "old": now - FORGET_S},
                )
                if live:
                    await conn.execute(
                        text(
                            "INSERT INTO fleet_live (replica, scope, requests_last_minute, "
                            "tokens_last_minute, tokens_today, concurrent_requests, at) "
                            "VALUES (:me, :scope, :r, :t, :d, :c, :now)"
                        ),
                        [
                            {"me": self.replica, "scope": s, "r": r, "t": t, "d": d, "c": c}
                            | {"now": now}
                            for s, r, t, d, c in live
                        ],
                    )
                rows = await conn.execute(
                    text(
                        "SELECT scope, sum(requests_last_minute), sum(tokens_last_minute), "
                        "sum(tokens_today), sum(concurrent_requests) FROM fleet_live "
                        "WHERE replica != :me AND at > :recent GROUP BY scope"
                    ),
                    {"me": self.replica, "recent": recent},
                )
                others = {
                    row[0]: (int(row[1]), int(row[2]), int(row[3]), int(row[4])) for row in rows
                }
        return alive, others

    async def close_all(self, now: float) -> None:
        """This replica stops: its open leases are closed as they stand (slots freed)."""
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE fleet_leases SET open = false, slots = 0, counted_at = :now "
                    "WHERE replica = :me AND open"
                ),
                {"me": self.replica, "now": now},
            )
            await conn.execute(
                text("DELETE FROM fleet_replicas WHERE id = :me"), {"me": self.replica}
            )
