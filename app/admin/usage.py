"""Usage in time buckets (1m and 1h from the ledger, 1d from the daily rollup), and the
audit log. Read-only; rate-limited requests are never in the ledger."""

from __future__ import annotations

import calendar
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.admin.schemas import AuditOut, Page, UsageBucket, UsagePage
from app.db.models import AuditEntry, DailyUsage, UsageRecord
from app.tenancy.ledger import PARTIAL, utc_day

BucketWidth = Literal["1m", "1h", "1d"]
GroupBy = Literal["tenant", "key", "class"]
WIDTH_S = {"1m": 60, "1h": 3600, "1d": 86_400}
DEFAULT_SPAN_S = {"1m": 3600, "1h": 86_400, "1d": 30 * 86_400}

Group = tuple[int, str | None, str | None, str | None]


def _day_start(day: str) -> int:
    return calendar.timegm(time.strptime(day, "%Y-%m-%d"))


class UsageService:
    def __init__(self, session: AsyncSession) -> None:
        self._s = session

    async def usage(
        self,
        width: BucketWidth,
        start: int | None,
        end: int | None,
        group_by: Sequence[GroupBy],
        tenant_id: str | None,
        key_id: str | None,
    ) -> UsagePage:
        step = WIDTH_S[width]
        end = end if end is not None else int(time.time()) + 1
        start = start if start is not None else end - DEFAULT_SPAN_S[width]
        sums: dict[Group, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        by_tenant, by_key, by_class = "tenant" in group_by, "key" in group_by, "class" in group_by

        def add(at: int, t: str, k: str, c: str, n: int, p: int, cached: int, o: int) -> None:
            group = (
                at - at % step,
                t if by_tenant else None,
                k if by_key else None,
                c if by_class else None,
            )
            s = sums[group]
            s[0] += n
            s[1] += p
            s[2] += cached
            s[3] += o

        if width == "1d":
            q = select(DailyUsage).where(
                DailyUsage.day >= utc_day(start), DailyUsage.day < utc_day(end + 86_399)
            )
            if tenant_id is not None:
                q = q.where(DailyUsage.tenant_id == tenant_id)
            if key_id is not None:
                q = q.where(DailyUsage.key_id == key_id)
            for d in await self._s.scalars(q):
                add(
                    _day_start(d.day),
                    d.tenant_id,
                    d.key_id,
                    d.slo_class,
                    d.requests,
                    d.prompt_tokens,
                    d.cached_tokens,
                    d.completion_tokens,
                )
        else:
            r = UsageRecord
            q2 = select(
                r.started_at,
                r.tenant_id,
                r.key_id,
                r.slo_class,
                r.status,
                r.prompt_tokens,
                r.cached_tokens,
                r.completion_tokens,
            ).where(r.started_at >= start, r.started_at < end)
            if tenant_id is not None:
                q2 = q2.where(r.tenant_id == tenant_id)
            if key_id is not None:
                q2 = q2.where(r.key_id == key_id)
            for at, t, k, c, status, p, cached, o in await self._s.execute(q2):
                add(int(at), t, k, c, int(status != PARTIAL), p, cached, o)
        data = [
            UsageBucket(
                start_time=g[0],
                end_time=g[0] + step,
                tenant_id=g[1],
                key_id=g[2],
                slo_class=g[3],
                requests=s[0],
                prompt_tokens=s[1],
                cached_tokens=s[2],
                completion_tokens=s[3],
                total_tokens=s[1] + s[3],
            )
            for g, s in sorted(sums.items(), key=lambda i: (i[0][0], *(x or "" for x in i[0][1:])))
        ]
        return UsagePage(bucket_width=width, data=data)

    async def audit_log(self, limit: int, after: int | None) -> Page[AuditOut]:
        q = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit + 1)
        if after is not None:
            q = q.where(AuditEntry.id < after)
        rows = list(await self._s.scalars(q))
        data = [
            AuditOut(
                id=str(a.id),
                at=a.at,
                actor=a.actor,
                action=a.action,
                target_type=a.target_type,
                target_id=a.target_id,
                details=json.loads(a.details),
            )
            for a in rows[:limit]
        ]
        return Page(
            data=data,
            has_more=len(rows) > limit,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
        )
