"""Open-loop arrival times: gamma inter-arrival gaps, as vLLM's serving benchmark draws them.

The gap has mean ``1 / rate`` and shape ``burstiness``: 1 is a Poisson process, below 1 the
arrivals come in bursts (coefficient of variation 1/√burstiness), above 1 they are more
regular than Poisson. An infinite rate sends everything at time 0.
"""

from __future__ import annotations

import math
import random


def gamma_gap(rng: random.Random, rate: float, burstiness: float) -> float:
    if math.isinf(rate):
        return 0.0
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be positive")
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def arrival_times(
    rng: random.Random,
    rate: float,
    burstiness: float = 1.0,
    *,
    count: int | None = None,
    duration_s: float | None = None,
) -> list[float]:
    """Arrival times from 0: ``count`` of them, or all that fall before ``duration_s``.

    The first request arrives at 0 (a run starts with work, not with a wait).
    """
    if count is None and duration_s is None:
        raise ValueError("give a count or a duration")
    if count is None and math.isinf(rate):
        raise ValueError("an infinite rate needs a request count")
    times: list[float] = []
    t = 0.0
    while count is None or len(times) < count:
        if duration_s is not None and t >= duration_s:
            break
        times.append(t)
        t += gamma_gap(rng, rate, burstiness)
    return times
