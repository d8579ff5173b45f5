"""Workload files (TOML, or YAML when PyYAML is installed) and the named presets.

name = "two-tenants"
seed = 7
requests = 40
rate = 2.0            # requests/s in all; inf (or "inf"): all at once
burstiness = 1.0      # gamma shape: 1 = Poisson, < 1 burstier
concurrency = 8       # optional cap on requests in flight
# users = 4           # closed loop instead: 4 users, each waits for its answer
endpoint = "completions"
window_s = 5.0        # fairness windows

[slo.interactive]     # targets for goodput; the defaults are in quanta_core.metrics.slo
ttft_s = 2.0
tpot_s = 0.25
[slo.batch]
deadline_s = 120

[[tenants]]
name = "alice"
api_key = "qk-..."    # optional; else the bench's --api-key
class = "interactive"
share = 3
prompt = { dist = "uniform", min = 32, max = 128 }
output = 64

[trace]               # optional: replay a trace instead of drawing arrivals and lengths
path = "../shared/traces/azure_llm_2023_conv.csv"
time_scale = 20
prompt_scale = 0.25
output_scale = 0.5
max_prompt = 512
max_output = 256
limit = 50
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from quanta_core.metrics.slo import SloTargets, default_targets
from quanta_core.requests import SloClass
from quanta_core.workload.lengths import fixed, parse_length
from quanta_core.workload.spec import Endpoint, TenantSpec, TraceSpec, WorkloadSpec

_TOP = {
    "name",
    "seed",
    "requests",
    "duration_s",
    "rate",
    "burstiness",
    "concurrency",
    "users",
    "think_s",
    "endpoint",
    "ignore_eos",
    "temperature",
    "window_s",
    "slo",
    "tenants",
    "trace",
}
_TENANT = {
    "name",
    "api_key",
    "class",
    "weight",
    "share",
    "rate",
    "requests",
    "prompt",
    "output",
    "prefix_tokens",
}


class WorkloadError(ValueError):
    pass


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise WorkloadError(f"{where}: unknown key(s) {', '.join(unknown)}")


def _rate(value: Any) -> float:
    rate = float(value)  # "inf" parses too
    if rate <= 0 or math.isnan(rate):
        raise WorkloadError("rate must be positive")
    return rate


def _opt(table: dict[str, Any], key: str, kind: type[int] | type[float]) -> Any:
    value = table.get(key)
    return None if value is None else kind(value)


def _tenant(table: dict[str, Any], k: int) -> TenantSpec:
    _check_keys(table, _TENANT, f"tenants[{k}]")
    return TenantSpec(
        name=str(table.get("name", f"tenant{k}")),
        api_key=table.get("api_key"),
        slo_class=SloClass(table.get("class", "interactive")),
        weight=float(table.get("weight", 1.0)),
        share=float(table.get("share", 1.0)),
        rate=None if table.get("rate") is None else _rate(table["rate"]),
        requests=_opt(table, "requests", int),
        prompt=parse_length(table.get("prompt", 32)),
        output=parse_length(table.get("output", 128)),
        prefix_tokens=int(table.get("prefix_tokens", 0)),
    )


def _targets(table: dict[str, Any]) -> dict[SloClass, SloTargets]:
    targets = default_targets()
    for name, values in table.items():
        cls = SloClass(name)
        _check_keys(values, {"ttft_s", "tpot_s", "itl_s", "deadline_s"}, f"slo.{name}")
        # A class's table replaces its defaults whole: a batch class given only a TTFT
        # target must not keep a deadline it never asked for.
        targets[cls] = SloTargets(
            ttft_s=_opt(values, "ttft_s", float),
            tpot_s=_opt(values, "tpot_s", float),
            itl_s=_opt(values, "itl_s", float),
            deadline_s=_opt(values, "deadline_s", float),
        )
    return targets


def _trace(table: dict[str, Any], base: Path | None) -> TraceSpec:
    allowed = set(TraceSpec.__dataclass_fields__)
    _check_keys(table, allowed, "trace")
    path = Path(table["path"])
    if base is not None and not path.is_absolute():
        path = base / path
    return TraceSpec(
        path=str(path),
        time_scale=float(table.get("time_scale", 1.0)),
        prompt_scale=float(table.get("prompt_scale", 1.0)),
        output_scale=float(table.get("output_scale", 1.0)),
        max_prompt=_opt(table, "max_prompt", int),
        max_output=_opt(table, "max_output", int),
        start_s=float(table.get("start_s", 0.0)),
        duration_s=_opt(table, "duration_s", float),
        limit=_opt(table, "limit", int),
    )


def workload_from_dict(data: dict[str, Any], base: Path | None = None) -> WorkloadSpec:
    """``base``: the directory relative trace paths are resolved against."""
    _check_keys(data, _TOP, "workload")
    try:
        tenants = tuple(_tenant(t, k) for k, t in enumerate(data.get("tenants", [{}])))
        if len({t.name for t in tenants}) != len(tenants):
            raise WorkloadError("tenant names must be distinct")
        users = _opt(data, "users", int)
        return WorkloadSpec(
            name=str(data.get("name", "workload")),
            tenants=tenants,
            seed=int(data.get("seed", 0)),
            # Without a count a duration bounds the run; without either, 20 requests.
            requests=_opt(data, "requests", int)
            if "requests" in data or "duration_s" in data
            else 20,
            duration_s=_opt(data, "duration_s", float),
            rate=_rate(data.get("rate", math.inf)),
            burstiness=float(data.get("burstiness", 1.0)),
            concurrency=_opt(data, "concurrency", int),
            users=users,
            think_s=float(data.get("think_s", 0.0)),
            endpoint=Endpoint(data.get("endpoint", "completions")),
            ignore_eos=bool(data.get("ignore_eos", True)),
            temperature=float(data.get("temperature", 0.0)),
            targets=_targets(data.get("slo", {})),
            window_s=float(data.get("window_s", 5.0)),
            trace=None if "trace" not in data else _trace(data["trace"], base),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, WorkloadError):
            raise
        raise WorkloadError(f"invalid workload: {exc}") from exc


def load_workload(path: Path) -> WorkloadSpec:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError as exc:  # pragma: no cover - PyYAML is optional
            raise WorkloadError("YAML workloads need PyYAML (pip install pyyaml)") from exc
        data = yaml.safe_load(text)
    else:
        data = tomllib.loads(text)
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}: expected a table at the top")
    return workload_from_dict(data, base=path.parent)


# ---- presets ----


def twenty_at_once() -> WorkloadSpec:
    """Twenty people ask at once for a 128-token answer (DESIGN.md, "Why a scheduler")."""
    return WorkloadSpec(
        name="twenty-at-once",
        tenants=(TenantSpec(name="people", prompt=fixed(32), output=fixed(128)),),
        requests=20,
        rate=math.inf,
    )


PRESETS = {"twenty-at-once": twenty_at_once}


def preset(name: str) -> WorkloadSpec:
    try:
        return PRESETS[name]()
    except KeyError:
        raise WorkloadError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
