"""``quanta sim``: one workload through one policy on the virtual clock, in the bench's format.

quanta sim --preset twenty-at-once --policy fcfs
quanta sim --workload bench/workloads/two_tenants.toml --policy vtc --out bench/results/x.json
quanta sim --trace bench/traces/azure_llm_2023_conv.csv --requests 10000 --rate-scale 0.05 \
    --length-scale 0.25 --policy fcfs
quanta sim --workload w.toml --probe probe.json   # the machine as fast as the probe says
quanta sim --workload w.toml --speed-profile steps.json   # as fast as a real run's steps were
quanta bench compare bench/results/real.json bench/results/sim.json

The scheduler is built from the server's settings by the server's own code
(``app.server.assemble.scheduler_config``), so a simulation runs with exactly the defaults of
``quanta run``; the flags override them the way ``quanta run``'s environment would.

``--speed-factor F`` multiplies every simulated step time by F: how many times slower the
machine runs the reference probe now than when the cost model was calibrated (this VM's
speed drifts by ±30 % over minutes). ``--probe FILE`` takes F from a probe file
(``quanta calibrate --probe-only --out FILE``) and the cost model's own probe time.
``--speed-profile FILE`` (a ``quanta step-report --out`` file) times each step by the factor
a real run's own steps had at the same time from the start (its ``speed_profile``).

``--server-cycle-ms A --server-token-ms B`` add the server's own time around every step
(A per cycle, B per token handed to a stream; ``quanta_core.sim.server_cost``), which the
real inter-token gap includes and the engine's cost model does not;
``quanta bench http-overhead`` measures both (its ``server_cost``).
``--server-request-ms C``: each request's intake by the server (its HTTP handler, one at a
time) before the scheduler has it, so a burst of N reaches the scheduler over N * C.
Default, each: what the cost model measured on its machine (``meta["server_cost_ms"]``), else 0.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import platform
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from pydantic import ValidationError
from rich.console import Console

from app.lab.bench.cells import last_attempts
from app.lab.bench.report import build_result, git_commit, package_version, write_result
from app.lab.bench.table import print_result
from app.lab.bench.workloads import apply_overrides, make_plan, resolve_workload
from app.lab.calibrate.machine import machine_slug
from app.lab.calibrate.probe import load_probe_total, speed_factor
from app.server.scheduling import scheduler_config
from app.server.settings import ModelNotFoundError, Settings
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.types import EngineInfo
from quanta_core.metrics import summarize
from quanta_core.scheduler import SchedulerConfig
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.run import SimOutcome, sim_engine_info, simulate
from quanta_core.sim.server_cost import ServerCost
from quanta_core.sim.step_trace import SpeedProfile
from quanta_core.workload import (
    Endpoint,
    TenantSpec,
    TraceSpec,
    WorkloadError,
    WorkloadSpec,
)

COST_MODELS_DIR = Path("config/cost_models")
console = Console()


class CostModelMissing(RuntimeError):
    pass


def default_cost_model_path(folder: Path = COST_MODELS_DIR) -> Path:
    """``<model>__<machine>.json`` for the server's default model and KV layout
    (``__streams`` for a stream per sequence): this machine's (named as ``quanta calibrate``
    names it) if there are several, the only one if there is one."""
    settings = Settings()
    try:
        stem = settings.resolved_model_path().stem
    except ModelNotFoundError:
        stem = ""
    found = sorted(folder.glob(f"{stem}__*.json")) if stem else sorted(folder.glob("*.json"))
    # A model prices the layout it was calibrated on: only those of the server's layout.
    streams = [p for p in found if p.stem.endswith("__streams")]
    found = [p for p in found if p not in streams] if settings.kv_unified else streams
    if len(found) == 1:
        return found[0]
    layout = "" if settings.kv_unified else "__streams"
    here = folder / f"{stem}__{machine_slug(settings.threads)}{layout}.json"
    if here in found:
        return here
    if found:
        names = ", ".join(p.name for p in found)
        raise CostModelMissing(f"several cost models in {folder} ({names}): pick one")
    kind = "one KV buffer" if settings.kv_unified else "a KV stream per sequence"
    raise CostModelMissing(
        f"no cost model for {stem or 'the default model'} with {kind} in {folder}/: run "
        "`quanta calibrate` first, or pass --cost-model FILE"
    )


def sim_setup(
    settings: Settings, cost_model: CostModel, kv_blocks: int | None = None
) -> tuple[SchedulerConfig, EngineInfo]:
    """The scheduler config and engine facts ``quanta run`` would have with ``settings``."""
    config = scheduler_config(settings)
    if kv_blocks is not None:
        config = dataclasses.replace(config, num_kv_blocks=kv_blocks)
    layout = settings.layout
    engine = EngineConfig(
        model_path="",
        n_ctx=layout.n_ctx,
        n_seq_max=layout.n_seq_max,
        n_batch=layout.n_batch,
        kv_unified=layout.kv_unified,
    )
    info = sim_engine_info(
        n_ctx=engine.n_ctx,
        n_seq_max=engine.n_seq_max,
        n_batch=engine.n_batch,
        meta=dict(cost_model.meta),
        kv_unified=engine.kv_unified,
    )
    return config, info


def trace_workload(path: Path) -> WorkloadSpec:
    """A bare trace replay: one interactive tenant, the trace's own times and lengths."""
    return WorkloadSpec(
        name=path.stem,
        tenants=(TenantSpec(name="trace"),),
        requests=None,
        trace=TraceSpec(path=str(path)),
    )


def scale_trace(spec: WorkloadSpec, rate_scale: float, length_scale: float) -> WorkloadSpec:
    if spec.trace is None:
        if rate_scale != 1.0 or length_scale != 1.0:
            raise WorkloadError("--rate-scale and --length-scale apply to a trace replay")
        return spec
    t = spec.trace
    trace = dataclasses.replace(
        t,
        time_scale=t.time_scale / rate_scale,
        prompt_scale=t.prompt_scale * length_scale,
        output_scale=t.output_scale * length_scale,
    )
    return dataclasses.replace(spec, trace=trace)


def sim_environment(
    cost_model_path: Path, cost_model: CostModel, outcome: SimOutcome, speed: dict[str, Any]
) -> dict[str, Any]:
    return {
        "simulated": True,
        "cost_model": {
            "path": str(cost_model_path),
            "coefficients": cost_model.coefficients(),  # as calibrated: before speed_factor
            "meta": dict(cost_model.meta),
        },
        "speed_factor": speed,
        "sim": outcome.counts(),
        "time_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "quanta": package_version("quanta"),
        "git_commit": git_commit(),
    }


def resolve_speed(factor: float | None, probe: Path | None, model: CostModel) -> dict[str, Any]:
    """The speed factor and where it came from: ``--speed-factor``, ``--probe`` or neither."""
    if factor is not None and probe is not None:
        raise ValueError("give --speed-factor or --probe, not both")
    if probe is not None:
        now = load_probe_total(probe)
        return {"factor": speed_factor(now, model), "from": str(probe), "probe_s": now}
    if factor is not None:
        return {"factor": factor, "from": "--speed-factor"}
    return {"factor": 1.0, "from": None}


def server_cost(
    model: CostModel, cycle_ms: float | None, token_ms: float | None, request_ms: float | None
) -> ServerCost:
    """The flags where given, else what the cost model measured on its machine, else 0."""
    measured = ServerCost.of_meta(model.meta) or ServerCost()
    return ServerCost(
        measured.per_cycle_s if cycle_ms is None else cycle_ms / 1e3,
        measured.per_token_s if token_ms is None else token_ms / 1e3,
        measured.per_request_s if request_ms is None else request_ms / 1e3,
    )


def load_speed_profile(path: Path) -> SpeedProfile:
    """The ``speed_profile`` of a ``quanta step-report --out`` file."""
    try:
        doc = msgspec.json.decode(path.read_bytes())
        return msgspec.convert(doc["speed_profile"], SpeedProfile)
    except (OSError, KeyError, TypeError, msgspec.MsgspecError) as exc:
        raise ValueError(f"{path}: no speed profile of a step report ({exc})") from None


def sim(
    policy: Annotated[
        str | None, typer.Option(help="scheduling policy (default: the server's)")
    ] = None,
    workload: Annotated[Path | None, typer.Option(help="workload file (TOML or YAML)")] = None,
    preset_name: Annotated[
        str | None, typer.Option("--preset", help="a named workload: twenty-at-once")
    ] = None,
    trace: Annotated[Path | None, typer.Option(help="an Azure trace CSV to replay")] = None,
    requests: Annotated[int | None, typer.Option(help="override: request count")] = None,
    rate: Annotated[float | None, typer.Option(help="override: requests/s (inf)")] = None,
    rate_scale: Annotated[float, typer.Option(help="trace: arrivals this many times faster")] = 1.0,
    length_scale: Annotated[float, typer.Option(help="trace: prompts and answers × this")] = 1.0,
    users: Annotated[int | None, typer.Option(help="override: closed loop, N users")] = None,
    concurrency: Annotated[int | None, typer.Option(help="override: cap in flight")] = None,
    retries: Annotated[
        int, typer.Option(min=0, help="a refused request is sent again at its retry-after")
    ] = 0,
    seed: Annotated[int | None, typer.Option(help="override: seed")] = None,
    endpoint: Annotated[Endpoint | None, typer.Option(help="override: endpoint")] = None,
    cost_model: Annotated[
        Path | None, typer.Option(help="cost model JSON (default: config/cost_models/)")
    ] = None,
    speed_factor_: Annotated[
        float | None,
        typer.Option(
            "--speed-factor",
            help="every step time x F: the machine's speed now vs the calibration's",
        ),
    ] = None,
    probe: Annotated[
        Path | None,
        typer.Option(help="the speed factor from a `quanta calibrate --probe-only` file"),
    ] = None,
    speed_profile: Annotated[
        Path | None,
        typer.Option(help="each step x a real run's speed then (a `quanta step-report --out`)"),
    ] = None,
    server_cycle_ms: Annotated[
        float | None,
        typer.Option(min=0, help="the server's own time per step (ms); default: the model's"),
    ] = None,
    server_token_ms: Annotated[
        float | None,
        typer.Option(min=0, help="the server's own time per streamed token (ms); as above"),
    ] = None,
    server_request_ms: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="the server's intake of each request, one at a time (ms); as above",
        ),
    ] = None,
    max_running: Annotated[int | None, typer.Option(help="choices running at once")] = None,
    token_budget: Annotated[int | None, typer.Option(help="tokens per step")] = None,
    block_size: Annotated[int | None, typer.Option(help="tokens per KV block")] = None,
    kv_blocks: Annotated[int | None, typer.Option(help="KV pool size in blocks")] = None,
    out: Annotated[Path | None, typer.Option(help="results file (.json)")] = None,
    label: Annotated[str | None, typer.Option(help="the run's name in tables")] = None,
    plots: Annotated[bool, typer.Option(help="write PNG plots next to --out")] = False,
) -> None:
    """Simulate a workload on the virtual clock; print and write the bench's figures."""
    try:
        if trace is not None and (workload is not None or preset_name is not None):
            raise WorkloadError("give --trace, --workload or --preset, not several")
        base = (
            trace_workload(trace) if trace is not None else resolve_workload(workload, preset_name)
        )
        spec = apply_overrides(
            scale_trace(base, rate_scale, length_scale),
            {
                "requests": requests,
                "rate": rate,
                "users": users,
                "concurrency": concurrency,
                "seed": seed,
                "endpoint": endpoint,
            },
        )
        plan = make_plan(spec)
    except (WorkloadError, ValueError, OSError) as exc:
        console.print(f"[red]workload: {exc}")
        raise typer.Exit(code=2) from None
    try:
        model_path = cost_model or default_cost_model_path()
        model = CostModel.load(model_path)
    except (CostModelMissing, ValueError) as exc:
        console.print(f"[red]cost model: {exc}")
        raise typer.Exit(code=2) from None
    try:
        speed = resolve_speed(speed_factor_, probe, model)
        profile = None
        if speed_profile is not None:
            if speed["from"] is not None:
                raise ValueError("give --speed-profile or a speed factor, not both")
            profile = load_speed_profile(speed_profile)
            speed = {
                "factor": 1.0,
                "from": str(speed_profile),
                "bin_s": profile.bin_s,
                "profile": list(profile.factors),
            }
        timed = model.scaled(speed["factor"]) if speed["factor"] != 1.0 else model
    except ValueError as exc:
        console.print(f"[red]speed factor: {exc}")
        raise typer.Exit(code=2) from None
    knobs: dict[str, Any] = {
        "policy": policy,
        "max_running": max_running,
        "token_budget": token_budget,
        "block_size": block_size,
    }
    try:
        settings = Settings(**{k: v for k, v in knobs.items() if v is not None})
        config, info = sim_setup(settings, model, kv_blocks)
    except (ValidationError, ValueError) as exc:
        console.print(f"[red]settings: {exc}")
        raise typer.Exit(code=2) from None
    try:
        server = server_cost(model, server_cycle_ms, server_token_ms, server_request_ms)
    except ValueError as exc:
        console.print(f"[red]cost model: {exc}")
        raise typer.Exit(code=2) from None
    outcome = simulate(spec, plan, config, info, timed, server, profile, retries=retries)
    name = label or f"{spec.name}-sim-{config.policy.value}"
    out = out or Path("bench/results") / f"{name}.json"
    # Every attempt is a record; a request's figures are its last attempt's (as the suite's).
    summary = summarize(last_attempts(outcome.records), spec.targets, window_s=spec.window_s)
    flags = {
        "simulated": True,
        "retries": retries,
        "policy": config.policy.value,
        "cost_model": str(model_path),
        "speed_factor": speed["factor"],
        "server_cost_ms": {
            "per_cycle": 1e3 * server.per_cycle_s,
            "per_token": 1e3 * server.per_token_s,
            "per_request": 1e3 * server.per_request_s,
        },
        "scheduler": {
            "max_running": config.max_running,
            "token_budget": config.token_budget,
            "block_size": config.block_size,
            "num_kv_blocks": config.num_kv_blocks,
            "prefix_cache": config.enable_prefix_cache,
        },
        "engine": {"n_ctx": info.n_ctx, "n_seq_max": info.n_seq_max, "n_batch": info.n_batch},
        "workload": None if workload is None else str(workload),
        "preset": preset_name,
        "trace": None if trace is None else str(trace),
    }
    env = sim_environment(model_path, model, outcome, speed)
    result = build_result(
        label=name, spec=spec, flags=flags, env=env, records=outcome.records, summary=summary
    )
    write_result(result, out)
    print_result(result, console)
    console.print(
        f"simulated {len(outcome.records)} requests: {outcome.steps} steps, "
        f"{outcome.virtual_s:.1f} virtual s in {outcome.wall_s:.2f} wall s"
    )
    console.print(f"results: {out}")
    if plots:
        from app.lab.bench.plots import plot_all

        for path in plot_all(result, outcome.records, out):
            console.print(f"plot: {path}")
