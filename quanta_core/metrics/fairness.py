"""Fairness between tenants: VTC's service difference and Jain's index over backlogged windows.

Service is counted as VTC counts it (Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024): an input token costs 1, an output token 2, divided by the tenant's weight.
Seen from outside the server, a request's input tokens are served when its first token
arrives (prefill is done) and each output token when it arrives.

Time is cut into windows of ``window_s``. A tenant is backlogged in a window when it had a
request outstanding (sent, not finished) at every moment of it — only then does a fair
scheduler owe it a share. For each window with at least two backlogged tenants:

    service difference = max − min of their services in the window
    Jain's index       = (Σ x)² / (n · Σ x²)      (1 = equal shares, 1/n = one tenant got all)

Windows where nobody was served count as perfectly fair (Jain 1, difference 0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quanta_core.metrics.records import RequestRecord

INPUT_COST = 1.0
OUTPUT_COST = 2.0


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float
    service: dict[str, float]  # backlogged tenant → weighted service in the window

    @property
    def difference(self) -> float:
        return max(self.service.values()) - min(self.service.values())

    @property
    def jain(self) -> float:
        return jain_index(list(self.service.values()))


@dataclass(frozen=True, slots=True)
class Fairness:
    window_s: float
    windows: tuple[Window, ...] = field(default=())

    @property
    def max_difference(self) -> float | None:
        return max((w.difference for w in self.windows), default=None)

    @property
    def mean_difference(self) -> float | None:
        return _mean([w.difference for w in self.windows])

    @property
    def mean_jain(self) -> float | None:
        return _mean([w.jain for w in self.windows])

    @property
    def min_jain(self) -> float | None:
        return min((w.jain for w in self.windows), default=None)

    def as_dict(self) -> dict[str, object]:
        return {
            "window_s": self.window_s,
            "backlogged_windows": len(self.windows),
            "max_service_difference": self.max_difference,
            "mean_service_difference": self.mean_difference,
            "mean_jain": self.mean_jain,
            "min_jain": self.min_jain,
            "windows": [
                {"start": w.start, "end": w.end, "service": w.service} for w in self.windows
            ],
        }


def jain_index(values: Sequence[float]) -> float:
    square_sum = sum(v * v for v in values)
    if not values or square_sum == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * square_sum)


def service_events(record: RequestRecord) -> list[tuple[float, float]]:
    """(time, weighted service) for everything this request was served."""
    if not record.token_times:
        return []
    w = record.weight
    events = [(record.token_times[0], INPUT_COST * record.prompt_tokens / w)]
    events += [(t, OUTPUT_COST / w) for t in record.token_times]
    return events


def _outstanding(records: Sequence[RequestRecord]) -> list[tuple[float, float]]:
    """Merged [sent, end) intervals during which at least one request was outstanding."""
    spans = sorted((r.sent, _end(r)) for r in records)
    merged: list[tuple[float, float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _end(record: RequestRecord) -> float:
    if record.finished is not None:
        return record.finished
    return record.token_times[-1] if record.token_times else record.sent


def _covers(spans: list[tuple[float, float]], start: float, end: float) -> bool:
    return any(a <= start and end <= b for a, b in spans)


def fairness(records: Sequence[RequestRecord], window_s: float) -> Fairness:
    """Service difference and Jain's index between the tenants of ``records`` (one class)."""
    if window_s <= 0:
        raise ValueError("window_s must be positive")
    by_tenant: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        by_tenant[r.tenant].append(r)
    if len(by_tenant) < 2:
        return Fairness(window_s)
    origin = min(r.sent for r in records)
    horizon = max(_end(r) for r in records)
    spans = {t: _outstanding(rs) for t, rs in by_tenant.items()}
    events = {t: [e for r in rs for e in service_events(r)] for t, rs in by_tenant.items()}
    windows: list[Window] = []
    k = 0
    while origin + (k + 1) * window_s <= horizon + 1e-12:
        a, b = origin + k * window_s, origin + (k + 1) * window_s
        k += 1
        backlogged = [t for t in by_tenant if _covers(spans[t], a, b)]
        if len(backlogged) < 2:
            continue
        service = {t: sum(s for when, s in events[t] if a <= when < b) for t in backlogged}
        windows.append(Window(a, b, service))
    return Fairness(window_s, tuple(windows))


def cumulative_service(
    records: Sequence[RequestRecord], bin_s: float, origin: float = 0.0
) -> dict[str, list[float]]:
    """Per tenant, weighted service received by the end of each bin (for plots)."""
    horizon = max((_end(r) for r in records), default=origin)
    n_bins = max(1, int((horizon - origin) / bin_s) + 1)
    when: dict[str, list[np.ndarray]] = {}
    service: dict[str, list[np.ndarray]] = {}
    for r in records:
        when.setdefault(r.tenant, [])
        service.setdefault(r.tenant, [])
        if not r.token_times:
            continue
        # service_events(r), as arrays: the prompt at the first token, then each token
        times = np.asarray(r.token_times, dtype=np.float64)
        w = r.weight
        when[r.tenant] += [times[:1], times]
        service[r.tenant] += [
            np.array([INPUT_COST * r.prompt_tokens / w]),
            np.full(len(times), OUTPUT_COST / w),
        ]
    out: dict[str, list[float]] = {}
    for tenant, parts in when.items():
        if not parts:
            out[tenant] = [0.0] * n_bins
            continue
        t = np.concatenate(parts)
        idx = np.minimum(n_bins - 1, ((t - origin) / bin_s).astype(np.int64))
        # bincount and cumsum add in order, as the loops they replace: the same sums
        per_bin = np.bincount(idx, weights=np.concatenate(service[tenant]), minlength=n_bins)
        out[tenant] = [float(v) for v in np.cumsum(per_bin)]
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
