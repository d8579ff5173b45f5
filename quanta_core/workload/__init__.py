"""Workloads as pure data: tenants, length distributions, arrival processes, trace replay.

Shared by ``quanta bench`` (which sends the plan over HTTP) and the simulator (which feeds
the same plan to the scheduler on the virtual clock).
"""

from quanta_core.workload.arrivals import arrival_times, gamma_gap
from quanta_core.workload.lengths import DistKind, LengthDist, fixed, parse_length
from quanta_core.workload.loader import (
    PRESETS,
    WorkloadError,
    load_workload,
    preset,
    workload_from_dict,
)
from quanta_core.workload.plan import PlannedRequest, build_plan
from quanta_core.workload.spec import Endpoint, TenantSpec, TraceSpec, WorkloadSpec
from quanta_core.workload.trace import TraceRow, parse_azure_csv, read_trace, replay

__all__ = [
    "PRESETS",
    "DistKind",
    "Endpoint",
    "LengthDist",
    "PlannedRequest",
    "TenantSpec",
    "TraceRow",
    "TraceSpec",
    "WorkloadError",
    "WorkloadSpec",
    "arrival_times",
    "build_plan",
    "fixed",
    "gamma_gap",
    "load_workload",
    "parse_azure_csv",
    "parse_length",
    "preset",
    "read_trace",
    "replay",
    "workload_from_dict",
]
