"""Latency distributions: exact order statistics over every recorded value.

A percentile is the nearest-rank one (the smallest recorded value with at least p% of the
values at or below it), so it is a latency someone actually saw and never an interpolation;
the mean is exact. Figures are in milliseconds. numpy sorts a run's half-million inter-token
gaps in milliseconds, where recording them one by one into a histogram took seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True, slots=True)
class Distribution:
    """One latency's summary, in milliseconds; all ``None`` when nothing was recorded."""

    count: int
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "count": self.count,
            "mean_ms": self.mean_ms,
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
        }


def nearest_rank(sorted_values: np.ndarray, p: float) -> float:
    """The p-th percentile of ascending ``sorted_values`` (non-empty), by nearest rank."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def distribution(seconds: Iterable[float] | np.ndarray) -> Distribution:
    if isinstance(seconds, np.ndarray):
        values = np.sort(seconds.astype(np.float64, copy=False))
    else:
        values = np.sort(np.fromiter(seconds, dtype=np.float64))
    n = len(values)
    if n == 0:
        return Distribution(0, None, None, None, None, None)
    p50, p90, p99 = (1000 * nearest_rank(values, p) for p in PERCENTILES)
    return Distribution(
        count=n,
        mean_ms=1000 * float(values.mean()),
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        max_ms=1000 * float(values[-1]),
    )
