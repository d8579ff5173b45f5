"""The usage ledger, written in batches off the request path, ahead in a journal.

    a write to the client ─▶ ahead(row): the request's service so far, to the journal
    request ends          ─▶ ahead(total), record(row): a list append
    in flight             ─▶ watch(progress): each flush asks it for what it sent since the last
    authenticated         ─▶ touch(key, t)
                             every 0.5 s or 500 rows, one transaction:
                               ├ usage_ledger += the rows
                               ├ usage_daily  += the rows summed per UTC day, tenant, key, class
                               └ api_keys.last_used_at
                             then the journal's segments it covers are deleted

A request's service is the sum of its rows: ``partial`` rows while it streams (tokens sent
since the previous flush; counted as no request), then one row with its final status and
the rest. What a request is charged is what was written to its client (``Progress``).

A ``kill -9`` of the server loses nothing: at the next start ``replay`` adds to the ledger
whatever the journal (app/tenancy/journal.py, which says what it guarantees) holds beyond
it, and ``close_interrupted`` gives each request left with only partial rows its closing
``interrupted`` row. ``stop()`` flushes what is left, so a clean shutdown leaves the journal
empty. A failed flush keeps its rows (and the journal its segments) for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Protocol, cast

from sqlalchemy import Table, bindparam, case, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import ApiKey, DailyUsage, UsageRecord

if TYPE_CHECKING:
    from app.tenancy.journal import Journal

log = logging.getLogger("quanta.ledger")


@dataclass(frozen=True, slots=True)
class UsageRow:
    request_id: str
    tenant_id: str
    key_id: str
    slo_class: str
    status: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    charged_tokens: int
    queue_s: float | None
    ttft_s: float | None
    duration_s: float | None
    started_at: float
    finished_at: float


_COLUMNS = tuple(f.name for f in fields(UsageRow))


def as_values(row: UsageRow) -> dict[str, object]:
    """``row`` as an insert's values (``asdict`` copies each field deeply: ~10x the time, in
    the event loop, for every row of every flush)."""
    return {name: getattr(row, name) for name in _COLUMNS}


PARTIAL = "partial"  # a streaming request's tokens so far; its final row counts the request
INTERRUPTED = "interrupted"  # the server died while it was in flight


class Progress(Protocol):
    def progress(self) -> UsageRow | None:
        """What was sent since the last call, as a partial row; ``None`` if nothing new."""


def utc_day(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


class LedgerWriter:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        every_s: float = 0.5,
        max_batch: int = 500,
        clock: Callable[[], float] = time.time,
        journal: Journal | None = None,
    ) -> None:
        self._clock = clock
        self._journal = journal
        self._sessions = sessions
        self._every_s = every_s
        self._max_batch = max_batch
        self._rows: list[UsageRow] = []
        self._touched: dict[str, float] = {}
        self._watched: dict[int, Progress] = {}
        self.failing_since: float | None = None  # the first failed flush of an outage
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._lock = asyncio.Lock()

    def ahead(self, total: UsageRow) -> None:
        """A request's whole service so far (cumulative), before the client is sent it."""
        if self._journal is not None:
            self._journal.append(total)

    def record(self, row: UsageRow) -> None:
        self._rows.append(row)
        if len(self._rows) >= self._max_batch:
            self._wake.set()

    def watch(self, progress: Progress) -> None:
        self._watched[id(progress)] = progress

    def unwatch(self, progress: Progress) -> None:
        self._watched.pop(id(progress), None)

    def touch(self, key_id: str, at: float) -> None:
        self._touched[key_id] = at

    @property
    def pending(self) -> int:
        return len(self._rows)

    async def recover(self) -> int:
        """Replay into the ledger what the journal holds beyond it (left by a server that
        died), empty the journal and open it for writing; the rows added."""
        if self._journal is None:
            return 0
        added = await replay(self._sessions, self._journal.rows())
        self._journal.discard_through(_ALL)
        self._journal.open()
        return added

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Flush what is left. A flush under way is let finish, never cancelled: cancelled
        in its transaction, its rows would be neither restored (the commit may have gone
        through in the driver's thread) nor known written, and the journal segment that
        holds them is discarded by the next flush."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            await self._task
            self._task = None
        await self.flush()
        if self._journal is not None:
            self._journal.close()

    async def _run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._every_s)
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self.flush()
            except Exception as exc:
                if self.failing_since is None:
                    self.failing_since = self._clock()
                    # One line per outage (a database away is no bug: no traceback).
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    log.warning(
                        "ledger flush failed (%s: %s); keeping the rows, retrying",
                        type(exc).__name__,
                        first,
                    )
            else:
                if self.failing_since is not None:
                    log.warning(
                        "ledger written again after %.1f s", time.time() - self.failing_since
                    )
                self.failing_since = None

    async def flush(self) -> None:
        async with self._lock:
            for progress in list(self._watched.values()):
                if (row := progress.progress()) is not None:
                    self._rows.append(row)
            # Every journal row so far is in the rows taken now (or in the ledger already).
            # While flushes fail the segment is kept open: one file per outage, not per try.
            covered = None
            if self._journal is not None and self.failing_since is None:
                covered = self._journal.rotate()
            rows, self._rows = self._rows, []
            touched, self._touched = self._touched, {}
            if not rows and not touched:
                self._discard(covered)
                return
            try:
                async with self._sessions.begin() as session:
                    if rows:
                        await session.execute(insert(UsageRecord), [as_values(r) for r in rows])
                        await _roll_up(session, rows)
                    if touched:
                        # Core executemany: a key deleted meanwhile matches no row, no error.
                        keys = cast(Table, ApiKey.__table__)
                        await session.execute(
                            update(keys)
                            .where(keys.c.id == bindparam("b_id"))
                            .values(last_used_at=bindparam("b_at")),
                            [{"b_id": k, "b_at": at} for k, at in touched.items()],
                        )
            except Exception:
                self._rows[:0] = rows
                for key_id, at in touched.items():
                    self._touched.setdefault(key_id, at)
                raise
            self._discard(covered)

    def _discard(self, covered: int | None) -> None:
        if self._journal is not None and covered is not None:
            self._journal.discard_through(covered)


async def _roll_up(session: AsyncSession, rows: list[UsageRow]) -> None:
    sums: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for r in rows:
        s = sums[(utc_day(r.started_at), r.tenant_id, r.key_id, r.slo_class)]
        s[0] += r.status != PARTIAL
        s[1] += r.prompt_tokens
        s[2] += r.cached_tokens
        s[3] += r.completion_tokens
        s[4] += r.charged_tokens
    # Read-modify-write: one server process is the only writer of the rollup. One SELECT,
    # then one executemany UPDATE and one executemany INSERT.
    days = {k[0] for k in sums}
    keys = {k[2] for k in sums}
    found = await session.execute(
        select(DailyUsage.day, DailyUsage.tenant_id, DailyUsage.key_id, DailyUsage.slo_class).where(
            DailyUsage.day.in_(days), DailyUsage.key_id.in_(keys)
        )
    )
    existing = {tuple(row) for row in found}
    updates, inserts = [], []
    for (day, tenant_id, key_id, slo_class), (n, p, c, o, charged) in sums.items():
        pk = {"day": day, "tenant_id": tenant_id, "key_id": key_id, "slo_class": slo_class}
        values = {
            "requests": n,
            "prompt_tokens": p,
            "cached_tokens": c,
            "completion_tokens": o,
            "charged_tokens": charged,
        }
        if (day, tenant_id, key_id, slo_class) in existing:
            updates.append((pk, values))
        else:
            inserts.append(pk | values)
    if inserts:
        await session.execute(insert(DailyUsage), inserts)
    table = cast(Table, DailyUsage.__table__)
    if updates:
        statement = (
            update(table)
            .where(
                table.c.day == bindparam("b_day"),
                table.c.tenant_id == bindparam("b_tenant_id"),
                table.c.key_id == bindparam("b_key_id"),
                table.c.slo_class == bindparam("b_slo_class"),
            )
            .values({name: table.c[name] + bindparam(f"b_{name}") for name in _SUMMED})
        )
        await session.execute(
            statement,
            [{f"b_{k}": v for k, v in (pk | values).items()} for pk, values in updates],
        )


_SUMMED = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "charged_tokens")


async def close_interrupted(sessions: async_sessionmaker[AsyncSession], now: float) -> int:
    """Give every request that has partial rows and no final one an ``interrupted`` row
    (no tokens: they are in its partial rows); the number closed."""
    r = UsageRecord
    async with sessions() as session:
        final = select(r.request_id).where(r.status != PARTIAL)
        open_ = await session.execute(
            select(r.request_id, r.tenant_id, r.key_id, r.slo_class, func.min(r.started_at))
            .where(r.status == PARTIAL, r.request_id.not_in(final))
            .group_by(r.request_id, r.tenant_id, r.key_id, r.slo_class)
        )
        rows = [
            UsageRow(
                request_id,
                tenant_id,
                key_id,
                slo_class,
                INTERRUPTED,
                0,
                0,
                0,
                0,
                None,
                None,
                None,
                started_at,
                now,
            )
            for request_id, tenant_id, key_id, slo_class, started_at in open_
        ]
    if rows:
        async with sessions.begin() as session:
            await session.execute(insert(UsageRecord), [as_values(row) for row in rows])
            await _roll_up(session, rows)
    return len(rows)


_ALL = 1 << 62  # every segment
_SUMS = ("prompt_tokens", "cached_tokens", "completion_tokens", "charged_tokens")


async def replay(sessions: async_sessionmaker[AsyncSession], totals: dict[str, UsageRow]) -> int:
    """Add to the ledger what ``totals`` (each request's cumulative service, from the
    journal) hold beyond its rows: a request with a final row is whole already; the others
    get one row of the difference, with the journal's status. The rows added."""
    r = UsageRecord
    have: dict[str, tuple[list[int], bool]] = {}
    ids = list(totals)
    async with sessions() as session:
        keys = set((await session.scalars(select(ApiKey.id))).all())
        for i in range(0, len(ids), 500):
            found = await session.execute(
                select(
                    r.request_id,
                    *(func.sum(getattr(r, name)) for name in _SUMS),
                    func.max(case((r.status != PARTIAL, 1), else_=0)),  # any final row
                )
                .where(r.request_id.in_(ids[i : i + 500]))
                .group_by(r.request_id)
            )
            for request_id, *sums, final in found:
                have[request_id] = ([int(x or 0) for x in sums], bool(final))
    rows = []
    for request_id, total in totals.items():
        sums, final = have.get(request_id, ([0, 0, 0, 0], False))
        if final or total.key_id not in keys:  # whole already, or a key the DB never had
            continue
        delta = [getattr(total, name) - s for name, s in zip(_SUMS, sums, strict=True)]
        if total.status == PARTIAL and not any(delta):
            continue
        rows.append(replace(total, **dict(zip(_SUMS, delta, strict=True))))
    if rows:
        async with sessions.begin() as session:
            await session.execute(insert(UsageRecord), [as_values(row) for row in rows])
            await _roll_up(session, rows)
    return len(rows)
