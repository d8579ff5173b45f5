"""The grid of a sweep: policies × arrival rates × scheduler knobs, expanded into points.

    grid = Grid(policies=("fcfs", "vtc"), rates=(0.2, 0.4), max_running=(8, 16))
    points = expand(grid)          # 2 × 2 × 2 = 8 points, rates innermost

A grid comes from flags, from a TOML file, or both (flags win, axis by axis):

    [grid]
    policies = ["fcfs", "vtc", "slo"]
    rates = [0.2, 0.4, 0.8]        # or: rates = { from = 0.1, to = 1.2, n = 8 }
    max_running = [8, 16, 32]
    token_budget = [128]
    block_size = [16]
    kv_blocks = [256, 512]         # KV pool size in blocks; absent: n_ctx // block_size

A rate is requests/s in all for a synthetic workload, and a multiple of the recorded arrival
rate for a trace replay (2 = arrivals twice as fast).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

from quanta_core.scheduler import PolicyName, SchedulerConfig
from quanta_core.workload import WorkloadError, WorkloadSpec

# A rate is swept, the knobs keep the server's defaults unless given.
DEFAULT_POLICIES = ("sequential", "static", "fcfs", "vtc", "slo", "horizon")
# Sized for the default workload on the 2-core reference machine, whose capacity for it is
# about 0.6 requests/s: from light load to twice overload.
DEFAULT_RATES = (0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.05, 1.2)

_AXES = ("policies", "rates", "max_running", "token_budget", "block_size", "kv_blocks")
_FILE_KEYS = {"grid", "workload", "preset", "trace", "requests", "seed"}


class GridError(ValueError):
    """A grid that cannot be run: the message says which flag or key is wrong."""


@dataclass(frozen=True, slots=True)
class Grid:
    """Each axis is a tuple of values; an empty knob axis keeps the base config's value."""

    policies: tuple[str, ...] = DEFAULT_POLICIES
    rates: tuple[float, ...] = DEFAULT_RATES
    max_running: tuple[int, ...] = ()
    token_budget: tuple[int, ...] = ()
    block_size: tuple[int, ...] = ()
    kv_blocks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One simulation: plain data, so it crosses to a worker process as a pickle."""

    index: int  # its row in sweep.csv
    policy: str
    rate: float
    max_running: int
    token_budget: int
    block_size: int
    kv_blocks: int | None  # None: n_ctx // block_size

    def config(self, base: SchedulerConfig) -> SchedulerConfig:
        return dataclasses.replace(
            base,
            policy=PolicyName(self.policy),
            max_running=self.max_running,
            token_budget=self.token_budget,
            block_size=self.block_size,
            num_kv_blocks=self.kv_blocks,
        )


def expand(grid: Grid, base: SchedulerConfig) -> list[SweepPoint]:
    """Every combination, policies outermost and rates innermost (one curve = a run of rows)."""
    check(grid)
    knobs = product(
        grid.policies,
        grid.max_running or (base.max_running,),
        grid.token_budget or (base.token_budget,),
        grid.block_size or (base.block_size,),
        grid.kv_blocks or (base.num_kv_blocks,),
        grid.rates,
    )
    return [
        SweepPoint(k, policy, rate, mr, tb, bs, kv)
        for k, (policy, mr, tb, bs, kv, rate) in enumerate(knobs)
    ]


def check(grid: Grid) -> None:
    known = [p.value for p in PolicyName]
    for policy in grid.policies:
        if policy not in known:
            raise GridError(f"unknown policy {policy!r}; known: {', '.join(known)}")
    if not grid.policies or not grid.rates:
        raise GridError("empty grid: give at least one policy and one rate")
    if any(not math.isfinite(r) or r <= 0 for r in grid.rates):
        raise GridError(f"rates must be positive and finite: {grid.rates}")
    for axis in ("max_running", "token_budget", "block_size", "kv_blocks"):
        if any(v < 1 for v in getattr(grid, axis)):
            raise GridError(f"{axis} values must be >= 1: {getattr(grid, axis)}")


def linspace(start: float, stop: float, n: int) -> tuple[float, ...]:
    if n < 1 or start <= 0 or stop < start:
        raise GridError(f"rates from {start} to {stop} in {n} steps: need 0 < from <= to, n >= 1")
    if n == 1:
        return (start,)
    # Rounded so the CSV shows 0.3, not 0.30000000000000004.
    return tuple(round(start + (stop - start) * k / (n - 1), 9) for k in range(n))


def parse_list(text: str, kind: type[int] | type[float], flag: str) -> tuple[Any, ...]:
    """``"8,16,32"`` → ``(8, 16, 32)``; a clear error naming the flag otherwise."""
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise GridError(
            f"{flag}: expected comma-separated {kind.__name__}s, got {text!r}"
        ) from None


def _axis(table: dict[str, Any], key: str) -> tuple[Any, ...] | None:
    value = table.get(key)
    if value is None:
        return None
    if key == "rates" and isinstance(value, dict):
        try:
            return linspace(float(value["from"]), float(value["to"]), int(value["n"]))
        except KeyError as exc:
            raise GridError(f"grid.rates: a range needs from, to and n (missing {exc})") from None
    if not isinstance(value, list):
        raise GridError(f"grid.{key}: expected a list, got {value!r}")
    kind: type[Any] = str if key == "policies" else float if key == "rates" else int
    return tuple(kind(v) for v in value)


def load_grid_file(path: Path) -> tuple[dict[str, tuple[Any, ...]], dict[str, Any]]:
    """(the axes the file sets, its other settings: workload, preset, trace, requests, seed)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise GridError(f"cannot read grid file {path}: {exc}") from None
    unknown = sorted(set(data) - _FILE_KEYS)
    table = data.get("grid", {})
    unknown += [f"grid.{k}" for k in sorted(set(table) - set(_AXES))]
    if unknown:
        raise GridError(f"{path}: unknown key(s) {', '.join(unknown)}")
    axes = {k: v for k in _AXES if (v := _axis(table, k)) is not None}
    settings = {k: v for k, v in data.items() if k != "grid"}
    for key in ("workload", "trace"):  # relative to the grid file, like a workload's trace
        if key in settings:
            settings[key] = path.parent / settings[key]
    return axes, settings


def merge(*layers: dict[str, tuple[Any, ...]]) -> Grid:
    """A grid from axis layers, later layers winning (defaults ← file ← flags)."""
    axes: dict[str, tuple[Any, ...]] = {}
    for layer in layers:
        axes.update(layer)
    return Grid(**axes)


# ---- the rate knob ----


def with_rate(spec: WorkloadSpec, rate: float) -> WorkloadSpec:
    """The workload with its arrival rate set to ``rate`` (see the module's doc)."""
    if spec.closed_loop:
        raise WorkloadError("a closed-loop workload (users = …) has no arrival rate to sweep")
    if spec.trace is not None:
        return dataclasses.replace(
            spec, trace=dataclasses.replace(spec.trace, time_scale=spec.trace.time_scale / rate)
        )
    if all(t.rate is None for t in spec.tenants):
        return dataclasses.replace(spec, rate=rate)
    # Tenants with rates of their own: scale every tenant's rate by the same factor, so the
    # mix stays the workload's and only the load changes.
    base = _tenant_rates(spec)
    total = sum(base)
    if not math.isfinite(total):
        raise WorkloadError("cannot scale a workload whose tenants' rates are infinite")
    factor = rate / total
    tenants = tuple(
        dataclasses.replace(t, rate=r * factor) for t, r in zip(spec.tenants, base, strict=True)
    )
    return dataclasses.replace(spec, tenants=tenants)


def _tenant_rates(spec: WorkloadSpec) -> list[float]:
    shares = sum(t.share for t in spec.tenants)
    return [t.rate if t.rate is not None else spec.rate * t.share / shares for t in spec.tenants]


def with_requests(spec: WorkloadSpec, requests: int | None) -> WorkloadSpec:
    """``requests`` in all; the count then bounds the run, not a duration, so every rate of a
    sweep serves the same requests (a duration would serve more of them at higher rates)."""
    if requests is None:
        return spec
    if spec.trace is not None:
        return dataclasses.replace(spec, trace=dataclasses.replace(spec.trace, limit=requests))
    tenants = tuple(dataclasses.replace(t, requests=None) for t in spec.tenants)
    return dataclasses.replace(spec, requests=requests, duration_s=None, tenants=tenants)


def floats(values: Iterable[float]) -> str:
    return ",".join(f"{v:g}" for v in values)


def describe(grid: Grid, points: Sequence[SweepPoint]) -> str:
    return (
        f"{len(points)} points: {len(grid.policies)} policies × {len(grid.rates)} rates"
        f" ({floats(grid.rates)})"
    )
