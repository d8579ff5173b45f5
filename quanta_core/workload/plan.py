"""A workload turned into the list of requests to send, deterministically from its seed.

    plan = build_plan(spec)                       # synthetic
    plan = build_plan(spec, trace_rows=rows)      # trace replay

Open loop: each request has an arrival time (seconds from the start). Closed loop: arrival
times are ``None`` and the users take the requests in order, one at a time each.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from quanta_core.requests import SloClass
from quanta_core.workload.arrivals import arrival_times
from quanta_core.workload.spec import TenantSpec, WorkloadSpec
from quanta_core.workload.trace import TraceRow, replay


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int  # position in the plan; also seeds its prompt
    arrival: float | None  # None: closed loop
    tenant: str
    slo_class: SloClass
    prompt_tokens: int  # including the tenant's shared prefix
    output_tokens: int  # max_tokens (with ignore_eos: exactly this many)
    prefix_tokens: int = 0


def _rng(seed: int, *parts: object) -> random.Random:
    # str seeds are hashed with SHA-512: the same on every run and machine.
    return random.Random(":".join(str(p) for p in (seed, *parts)))


def _split(total: int, shares: Sequence[float]) -> list[int]:
    """``total`` split by shares, rounding so the parts add up (largest remainders)."""
    whole = sum(shares)
    exact = [total * s / whole for s in shares]
    parts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(shares)), key=lambda i: parts[i] - exact[i])
    for i in by_remainder[: total - sum(parts)]:
        parts[i] += 1
    return parts


def _request(
    index: int, arrival: float | None, tenant: TenantSpec, rng: random.Random
) -> PlannedRequest:
    prompt = max(tenant.prompt.sample(rng), tenant.prefix_tokens + 1)
    return PlannedRequest(
        index=index,
        arrival=arrival,
        tenant=tenant.name,
        slo_class=tenant.slo_class,
        prompt_tokens=prompt,
        output_tokens=tenant.output.sample(rng),
        prefix_tokens=tenant.prefix_tokens,
    )


def _open_loop(spec: WorkloadSpec) -> list[PlannedRequest]:
    shares = [t.share for t in spec.tenants]
    counts: list[int | None] = [None] * len(shares)
    if spec.requests is not None:
        counts = list(_split(spec.requests, shares))
    timed: list[tuple[float, int, TenantSpec, random.Random]] = []
    for i, (tenant, count) in enumerate(zip(spec.tenants, counts, strict=True)):
        rate = tenant.rate if tenant.rate is not None else spec.rate * tenant.share / sum(shares)
        n = tenant.requests if tenant.requests is not None else count
        arrivals_rng = _rng(spec.seed, "arrivals", tenant.name)
        lengths_rng = _rng(spec.seed, "lengths", tenant.name)
        times = arrival_times(
            arrivals_rng, rate, spec.burstiness, count=n, duration_s=spec.duration_s
        )
        timed += [(t, i, tenant, lengths_rng) for t in times]
    # Lengths are drawn per tenant in its own arrival order, so adding a tenant does not
    # change another tenant's requests.
    drawn = [(t, i, _request(0, t, tenant, rng)) for t, i, tenant, rng in timed]
    drawn.sort(key=lambda x: (x[0], x[1]))
    return [_reindex(r, k) for k, (_, _, r) in enumerate(drawn)]


def _closed_loop(spec: WorkloadSpec) -> list[PlannedRequest]:
    if spec.requests is None:
        raise ValueError("a closed-loop workload needs a request count")
    rng = _rng(spec.seed, "closed")
    weights = [t.share for t in spec.tenants]
    out = []
    for k in range(spec.requests):
        tenant = rng.choices(spec.tenants, weights)[0]
        out.append(_request(k, None, tenant, rng))
    return out


def _from_trace(spec: WorkloadSpec, rows: Sequence[TraceRow]) -> list[PlannedRequest]:
    assert spec.trace is not None
    rng = _rng(spec.seed, "trace")
    weights = [t.share for t in spec.tenants]
    out = []
    for k, row in enumerate(replay(rows, spec.trace)):
        tenant = rng.choices(spec.tenants, weights)[0]
        out.append(
            PlannedRequest(
                index=k,
                arrival=None if spec.closed_loop else row.arrival,
                tenant=tenant.name,
                slo_class=tenant.slo_class,
                prompt_tokens=max(row.prompt_tokens, tenant.prefix_tokens + 1),
                output_tokens=row.output_tokens,
                prefix_tokens=tenant.prefix_tokens,
            )
        )
    return out


def _reindex(r: PlannedRequest, index: int) -> PlannedRequest:
    return PlannedRequest(
        index, r.arrival, r.tenant, r.slo_class, r.prompt_tokens, r.output_tokens, r.prefix_tokens
    )


def build_plan(
    spec: WorkloadSpec, trace_rows: Sequence[TraceRow] | None = None
) -> list[PlannedRequest]:
    if not spec.tenants:
        raise ValueError("a workload needs at least one tenant")
    if spec.trace is not None:
        if trace_rows is None:
            raise ValueError("a trace workload needs the trace's rows")
        return _from_trace(spec, trace_rows)
    return _closed_loop(spec) if spec.closed_loop else _open_loop(spec)
