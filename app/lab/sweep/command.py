"""``quanta sweep``: policies × arrival rates × scheduler knobs on the virtual clock.

quanta sweep --cost-model config/cost_models/m.json                  # the default sweep
quanta sweep --policies fcfs,vtc --rates 0.2,0.4,0.8 --max-running 8,16,32 --out /tmp/s
quanta sweep --grid bench/sweeps/knobs.toml --jobs 2

Every point is one ``simulate()`` of the same plan shape (the workload at that rate, from
the same seed) through the same ``Scheduler`` the server runs, with the server's own costs
where the cost model measured them (``meta["server_cost_ms"]``). Points run in worker processes;
each worker loads the cost model once. Results are keyed by the point's index, so the CSV is
the same whatever ``--jobs`` is (only the ``wall_s`` column measures this machine).

Writes to ``--out``: ``sweep.csv`` (a row per point), the PNG curves and ``summary.md``.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from app.lab.bench.workloads import make_plan, resolve_workload
from app.lab.sim.command import (
    CostModelMissing,
    default_cost_model_path,
    scale_trace,
    sim_setup,
    trace_workload,
)
from app.lab.sweep.grid import (
    Grid,
    GridError,
    SweepPoint,
    describe,
    expand,
    linspace,
    load_grid_file,
    merge,
    parse_list,
    with_rate,
    with_requests,
)
from app.server.settings import Settings
from quanta_core.engine.types import EngineInfo
from quanta_core.metrics import RunSummary, never_stalls, summarize
from quanta_core.requests import SloClass
from quanta_core.scheduler import SchedulerConfig
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.run import SimOutcome, simulate
from quanta_core.sim.server_cost import ServerCost
from quanta_core.workload import WorkloadError, WorkloadSpec

REPO = Path(__file__).resolve().parents[3]
DEFAULT_WORKLOAD = REPO / "bench/workloads/sweep_default.toml"
TRACE_REQUESTS = 400
COST_MODELS = REPO / "config/cost_models"

console = Console()


@dataclass(frozen=True, slots=True)
class SweepJob:
    """What every point shares; sent once to each worker."""

    spec: WorkloadSpec  # the base workload; each point sets its rate
    base: SchedulerConfig  # each point sets its policy and knobs
    engine: EngineInfo
    cost_model: Path


# ---- one point (runs in a worker) ----

_worker: tuple[SweepJob, CostModel] | None = None


def init_worker(job: SweepJob) -> None:
    global _worker
    _worker = (job, CostModel.load(job.cost_model))


def run_point(point: SweepPoint) -> dict[str, Any]:
    assert _worker is not None, "init_worker() first"
    job, cost_model = _worker
    spec = with_rate(job.spec, point.rate)
    config = point.config(job.base)
    started = time.perf_counter()
    # The server's own costs where the cost model measured them on its machine, as quanta sim.
    server = ServerCost.of_meta(cost_model.meta)
    outcome = simulate(spec, make_plan(spec), config, job.engine, cost_model, server)
    summary = summarize(outcome.records, spec.targets, window_s=spec.window_s)
    wall_s = time.perf_counter() - started  # the simulation and its figures, as a user waits
    return row(point, job, summary, outcome, wall_s)


def row(
    point: SweepPoint,
    job: SweepJob,
    summary: RunSummary,
    outcome: SimOutcome,
    wall_s: float,
) -> dict[str, Any]:
    o = summary.overall
    interactive = summary.classes.get(SloClass.INTERACTIVE.value)
    windows = [w for f in summary.fairness.values() for w in f.windows]
    jains = [w.jain for w in windows]
    kv_blocks = point.kv_blocks or job.engine.n_ctx // point.block_size
    return {
        "policy": point.policy,
        "rate": point.rate,
        "max_running": point.max_running,
        "token_budget": point.token_budget,
        "block_size": point.block_size,
        "kv_blocks": kv_blocks,
        "requests": o.requests,
        "completed": o.completed,
        "rejected": o.rejected,
        "failed": o.failed - o.rejected,
        "preemptions": outcome.preemptions,
        # streams whose every inter-token gap stayed within 1 s (a KV-bound burst's figure)
        "never_stalled": sum(1 for r in outcome.records if never_stalls(r, 1.0)),
        "throughput_rps": o.requests_per_s,
        "output_tps": o.output_tokens_per_s,
        "ttft_mean_s": _s(o.ttft.mean_ms),
        "ttft_p50_s": _s(o.ttft.p50_ms),
        "ttft_p99_s": _s(o.ttft.p99_ms),
        "itl_mean_s": _s(o.itl.mean_ms),
        "itl_p99_s": _s(o.itl.p99_ms),
        # The class the TTFT and ITL targets are for: the knee in summary.md is read here.
        "interactive_ttft_p99_s": _s(interactive.ttft.p99_ms) if interactive else None,
        "interactive_itl_p99_s": _s(interactive.itl.p99_ms) if interactive else None,
        "goodput_rps": o.goodput_per_s,
        "goodput_fraction": o.goodput_fraction,
        "service_diff_max": max((w.difference for w in windows), default=None),
        "jain_mean": sum(jains) / len(jains) if jains else None,
        "jain_min": min(jains, default=None),
        "backlogged_windows": len(windows),
        "steps": outcome.steps,
        "virtual_s": outcome.virtual_s,
        "sim_wall_s": outcome.wall_s,  # the simulation alone
        "wall_s": wall_s,  # with its figures: what the sweep waits for
    }


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


# ---- the whole grid ----


def run_points(
    job: SweepJob,
    points: Sequence[SweepPoint],
    jobs: int,
    on_done: Callable[[SweepPoint], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Rows in the points' order, whatever order the workers finish in."""
    rows: dict[int, dict[str, Any]] = {}
    if jobs <= 1:
        init_worker(job)
        for point in points:
            rows[point.index] = _result(point, functools.partial(run_point, point))
            on_done(point)
    else:
        # forkserver: workers fork from a clean process that imported this module once, not
        # from this one, whose progress bar runs a thread (forking a threaded process is unsafe).
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        with ProcessPoolExecutor(
            jobs, mp_context=context, initializer=init_worker, initargs=(job,)
        ) as pool:
            futures = {pool.submit(run_point, p): p for p in points}
            try:
                for future in as_completed(futures):
                    point = futures[future]
                    rows[point.index] = _result(point, future.result)
                    on_done(point)
            except PointFailed:
                pool.shutdown(cancel_futures=True)  # do not run the rest of a broken sweep
                raise
    return [rows[p.index] for p in points]


class PointFailed(RuntimeError):
    def __init__(self, point: SweepPoint, cause: BaseException) -> None:
        super().__init__(f"point {point.index} ({point}) failed: {cause!r}")


def _result(point: SweepPoint, get: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    # A scheduler error at one point must name the point: it is the only way to reproduce it.
    try:
        return get()
    except Exception as exc:
        raise PointFailed(point, exc) from exc


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in r.items()} for r in rows)
    return path


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"  # six digits: far finer than any figure here is accurate
    return str(value)


# ---- from flags to a job ----


def find_cost_model(given: Path | None) -> Path:
    if given is None:
        return default_cost_model_path(COST_MODELS)  # the rule of `quanta sim`
    if not given.is_file():
        raise GridError(f"cost model {given} not found; run `quanta calibrate` to fit one")
    return given


def base_workload(
    workload: Path | None, preset_name: str | None, trace: Path | None, length_scale: float
) -> WorkloadSpec:
    """The workload every point starts from, chosen as `quanta sim` chooses it."""
    if trace is not None:
        if workload is not None or preset_name is not None:
            raise WorkloadError("give --trace, --workload or --preset, not several")
        return scale_trace(trace_workload(trace), 1.0, length_scale)
    if workload is None and preset_name is None:
        workload = DEFAULT_WORKLOAD
    return scale_trace(resolve_workload(workload, preset_name), 1.0, length_scale)


def point_count(spec: WorkloadSpec, requests: int | None) -> int | None:
    """The flag's count; else the workload's, except that a trace without a limit would
    replay all of its ~20,000 requests at every point."""
    if requests is None and spec.trace is not None and spec.trace.limit is None:
        return TRACE_REQUESTS
    return requests


def _axes_from_flags(**flags: Any) -> dict[str, tuple[Any, ...]]:
    parsed = {
        "policies": _maybe(flags["policies"], str, "--policies"),
        "rates": _maybe(flags["rates"], float, "--rates"),
        "max_running": _maybe(flags["max_running"], int, "--max-running"),
        "token_budget": _maybe(flags["token_budget"], int, "--token-budget"),
        "block_size": _maybe(flags["block_size"], int, "--block-size"),
        "kv_blocks": _maybe(flags["kv_blocks"], int, "--kv-blocks"),
    }
    ranged = (flags["rates_from"], flags["rates_to"], flags["rates_n"])
    if any(v is not None for v in ranged):
        if parsed["rates"] is not None or any(v is None for v in ranged):
            raise GridError("give --rates, or all of --rates-from, --rates-to and --rates-n")
        parsed["rates"] = linspace(*ranged)
    return {k: v for k, v in parsed.items() if v is not None}


def _maybe(text: str | None, kind: type[Any], flag: str) -> tuple[Any, ...] | None:
    return None if text is None else parse_list(text, kind, flag)


def sweep(
    cost_model: Annotated[
        Path | None, typer.Option(help="cost model file (default: the one in config/cost_models)")
    ] = None,
    grid_file: Annotated[Path | None, typer.Option("--grid", help="grid TOML file")] = None,
    workload: Annotated[Path | None, typer.Option(help="workload file (TOML or YAML)")] = None,
    preset_name: Annotated[str | None, typer.Option("--preset", help="a named workload")] = None,
    trace: Annotated[Path | None, typer.Option(help="Azure trace CSV to replay")] = None,
    requests: Annotated[
        int | None, typer.Option(help="requests per point (default: the workload's)")
    ] = None,
    length_scale: Annotated[float, typer.Option(help="trace: prompts and answers × this")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="override: the workload's seed")] = None,
    policies: Annotated[str | None, typer.Option(help="e.g. fcfs,vtc,slo")] = None,
    rates: Annotated[str | None, typer.Option(help="requests/s (trace: ×), e.g. 0.2,0.4")] = None,
    rates_from: Annotated[float | None, typer.Option(help="rate range: first")] = None,
    rates_to: Annotated[float | None, typer.Option(help="rate range: last")] = None,
    rates_n: Annotated[int | None, typer.Option(help="rate range: how many")] = None,
    max_running: Annotated[str | None, typer.Option(help="max running sequences")] = None,
    token_budget: Annotated[str | None, typer.Option(help="tokens per step")] = None,
    block_size: Annotated[str | None, typer.Option(help="tokens per KV block")] = None,
    kv_blocks: Annotated[str | None, typer.Option(help="KV pool sizes, in blocks")] = None,
    jobs: Annotated[int, typer.Option(help="worker processes (default: cores)")] = 0,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("bench/results/sweep"),
    plots: Annotated[bool, typer.Option(help="write the PNG curves")] = True,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
) -> None:
    """Simulate policies × arrival rates × knobs; write sweep.csv, PNG curves and summary.md."""
    try:
        file_axes, file_settings = load_grid_file(grid_file) if grid_file else ({}, {})
        flag_axes = _axes_from_flags(
            policies=policies,
            rates=rates,
            rates_from=rates_from,
            rates_to=rates_to,
            rates_n=rates_n,
            max_running=max_running,
            token_budget=token_budget,
            block_size=block_size,
            kv_blocks=kv_blocks,
        )
        grid = merge(dataclasses.asdict(Grid()), file_axes, flag_axes)
        spec = base_workload(
            workload or file_settings.get("workload"),
            preset_name or file_settings.get("preset"),
            trace or file_settings.get("trace"),
            length_scale,
        )
        spec = with_requests(spec, point_count(spec, requests or file_settings.get("requests")))
        if (s := seed if seed is not None else file_settings.get("seed")) is not None:
            spec = dataclasses.replace(spec, seed=int(s))
        with_rate(spec, grid.rates[0])  # a closed-loop workload fails here, not in a worker
        model_path = find_cost_model(cost_model)
        model = CostModel.load(model_path)
        base, engine = sim_setup(Settings(), model)  # the defaults of `quanta run`
        points = expand(grid, base)
    except (GridError, WorkloadError, CostModelMissing, ValueError, OSError) as exc:
        console.print(f"[red]sweep: {exc}")
        raise typer.Exit(code=2) from None
    job = SweepJob(spec, base, engine, model_path)
    jobs = jobs or os.cpu_count() or 1
    console.print(f"{spec.name}: {describe(grid, points)}, {jobs} job(s), cost model {model_path}")
    started = time.perf_counter()
    try:
        rows = _run_with_progress(job, points, jobs, quiet=quiet)
    except PointFailed as exc:
        console.print(f"[red]sweep: {exc}")
        raise typer.Exit(code=1) from None
    wall = time.perf_counter() - started
    for path in write_outputs(rows, spec, out, plots=plots):
        console.print(f"wrote {path}")
    console.print(f"{len(points)} points in {wall:.1f} s")


def _run_with_progress(
    job: SweepJob, points: Sequence[SweepPoint], jobs: int, *, quiet: bool
) -> list[dict[str, Any]]:
    with Progress(
        TextColumn("[bold]sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
    ) as progress:
        task = progress.add_task("sweep", total=len(points), last="")

        def done(p: SweepPoint) -> None:
            progress.update(task, advance=1, last=f"{p.policy} @ {p.rate:g}")

        return run_points(job, points, jobs, done)


def write_outputs(
    rows: Sequence[dict[str, Any]], spec: WorkloadSpec, out: Path, *, plots: bool
) -> list[Path]:
    from app.lab.sweep.plots import plot_all, write_summary

    written = [write_csv(rows, out / "sweep.csv"), write_summary(rows, spec, out / "summary.md")]
    if plots:
        written += plot_all(rows, out, spec)
    return written
