"""The measurement maths: per-request rows in, figures out. No web, no IO, no clock.

Shared by ``quanta bench`` (rows from HTTP streams) and the simulator (rows from the virtual
clock), so both write the same figures through the same code.
"""

from quanta_core.metrics.fairness import Fairness, Window, cumulative_service, fairness, jain_index
from quanta_core.metrics.histogram import Distribution, distribution
from quanta_core.metrics.records import RequestRecord
from quanta_core.metrics.slo import (
    SloTargets,
    default_targets,
    meets_slo,
    meets_smooth_slo,
    never_stalls,
    tokens_on_time,
)
from quanta_core.metrics.summary import GroupSummary, RunSummary, summarize

__all__ = [
    "Distribution",
    "Fairness",
    "GroupSummary",
    "RequestRecord",
    "RunSummary",
    "SloTargets",
    "Window",
    "cumulative_service",
    "default_targets",
    "distribution",
    "fairness",
    "jain_index",
    "meets_slo",
    "meets_smooth_slo",
    "never_stalls",
    "summarize",
    "tokens_on_time",
]
