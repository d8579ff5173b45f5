"""Latency distributions in HDR histograms.

Values are recorded in microseconds with 3 significant digits: every reported figure is
within 0.1% of the exact order statistic (HDR reports the highest value equivalent to it,
so a percentile never under-states a latency); the mean is exact. Figures are in milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 24 * 3600 * 1_000_000  # a day
SIGNIFICANT_DIGITS = 3
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


def histogram(seconds: Iterable[float]) -> HdrHistogram:
    h = HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)
    for s in seconds:
        h.record_value(min(HIGHEST_US, max(LOWEST_US, round(s * 1_000_000))))
    return h


def distribution(seconds: Iterable[float]) -> Distribution:
    values = list(seconds)
    h = histogram(values)
    n = h.get_total_count()
    if n == 0:
        return Distribution(0, None, None, None, None, None)
    at = h.get_percentile_to_value_dict(list(PERCENTILES))  # one pass over the counts
    p50, p90, p99 = (at[p] / 1000 for p in PERCENTILES)
    return Distribution(
        count=n,
        # The exact mean: hdrh's walks every bucket in Python, seconds for one histogram.
        mean_ms=1000 * sum(values) / n,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        max_ms=h.get_max_value() / 1000,
    )
