"""The workload a command runs: a file or a preset, the command line's overrides, the plan.

Shared by ``quanta bench run``, ``quanta sim`` and ``quanta sweep``; kept apart from the
bench's HTTP client so that a simulation imports none of it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from quanta_core.workload import (
    PlannedRequest,
    WorkloadError,
    WorkloadSpec,
    build_plan,
    load_workload,
    preset,
    read_trace,
)


def resolve_workload(workload: Path | None, preset_name: str | None) -> WorkloadSpec:
    if workload is not None and preset_name is not None:
        raise WorkloadError("give --workload or --preset, not both")
    if workload is not None:
        return load_workload(workload)
    return preset(preset_name or "twenty-at-once")


def apply_overrides(spec: WorkloadSpec, overrides: dict[str, Any]) -> WorkloadSpec:
    given = {k: v for k, v in overrides.items() if v is not None}
    if spec.trace is not None and "requests" in given:
        # A trace replay is bounded by its limit, not by a request count.
        given["trace"] = dataclasses.replace(spec.trace, limit=given.pop("requests"))
    return dataclasses.replace(spec, **given) if given else spec


def make_plan(spec: WorkloadSpec) -> list[PlannedRequest]:
    rows = read_trace(spec.trace.path) if spec.trace is not None else None
    return build_plan(spec, rows)
