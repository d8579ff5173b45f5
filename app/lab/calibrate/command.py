"""``quanta calibrate``: measure the real engine over a grid of steps and fit a cost model.

    quanta calibrate                      # full grid + served phase, about 9 min (2 cores)
    quanta calibrate --no-served          # the grid alone, about 6 min
    quanta calibrate --quick              # small grid, about 30 s (tests, smoke runs)
    quanta calibrate --samples s.json     # also keep the raw samples ...
    quanta calibrate --refit s.json       # ... and fit them again, no engine needed
    quanta calibrate --refit a.json --refit b.json   # two calibrations fitted together
    quanta calibrate --probe-only --out probe.json   # how fast is the machine now? (~5 s)

The grid and its runner are in ``app.lab.calibrate.grid`` (filled once, then repeat-major
passes in shuffled order), the served phase between its visits in ``app.lab.calibrate.served``
(the scheduler's own steps on the engine), the reference probe in ``app.lab.calibrate.probe``:
measured during the calibration and kept in the cost model (``meta.probe``), measured alone
by ``--probe-only``, whose speed factor ``quanta sim --speed-factor`` takes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.lab.bench.report import package_version
from app.lab.calibrate.grid import (
    FULL,
    GPU,
    QUICK,
    STREAMS,
    GridRunner,
    Point,
    build_grid,
    visit_order,
)
from app.lab.calibrate.machine import cpu_model, machine_slug
from app.lab.calibrate.probe import (
    PARTS,
    ProbeResult,
    calibrated_probe_s,
    measure_probe,
    merge_summaries,
    probe_report,
    summarise,
)
from app.lab.calibrate.served import FULL_SERVED, QUICK_SERVED, ServedRunner
from app.server.settings import ModelNotFoundError, Settings
from quanta_core.engine import EngineInfo, StepPlan
from quanta_core.engine.errors import EngineError
from quanta_core.sim.cost_model import COEFFICIENTS, CostModel, StepFeatures
from quanta_core.sim.fit import (
    Group,
    Sample,
    fit_points,
    fit_samples,
    group_of,
    load_samples,
    save_samples,
)

COST_MODELS_DIR = Path("config/cost_models")
# On 2 cores, llama.cpp's threads wait for each other at every barrier: one busy core from
# someone else made steps 2-8x slower here. A 1-minute load average above this gets a warning.
BUSY_LOAD = 0.5
console = Console()


# ---- where the file goes ----


def default_out(model_stem: str, machine: str, kv_unified: bool = True) -> Path:
    """``<model>__<machine>.json`` for one KV buffer, ``<model>__<machine>__streams.json``
    for a stream per sequence: a model prices one layout, and both may be kept."""
    layout = "" if kv_unified else "__streams"
    return COST_MODELS_DIR / f"{model_stem}__{machine}{layout}.json"


# ---- measuring ----
# ---- measuring ----


def grid_name(settings: Settings, quick: bool) -> str:
    """Which grid measures this engine: a GPU's, a stream per sequence's, or the CPU's."""
    if quick:
        return "quick"
    if settings.layout.on_gpu:
        return "gpu"
    return "full" if settings.layout.kv_unified else "streams"


def measurement_meta(
    settings: Settings, info: EngineInfo, budget: int, quick: bool, repeats: int
) -> dict[str, Any]:
    model = settings.resolved_model_path()
    return {
        "model": model.name,
        "model_stem": model.stem,
        "machine": machine_slug(settings.threads),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "threads": settings.threads,
        "n_ctx": info.n_ctx,
        "n_seq_max": info.n_seq_max,
        "n_batch": info.n_batch,
        "n_ubatch": min(settings.layout.n_ubatch, info.n_batch),
        "kv_unified": info.kv_unified,
        "kv_bytes_per_token": info.kv_bytes_per_token,
        # What a simulated engine needs to stand in for this one (quanta_core.sim.run reads it).
        "n_vocab": info.n_vocab,
        "eog_tokens": list(info.eog_tokens),
        "model_desc": info.model_name,
        "token_budget": budget,
        "grid": grid_name(settings, quick),
        "n_gpu_layers": settings.layout.n_gpu_layers,
        "flash_attn": settings.layout.flash_attn,
        "repeats": repeats,
        "order": "each context filled once; then repeat-major passes, each shuffled (seed 0)",
        "llama_cpp_python": package_version("llama-cpp-python"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_avg_before": list(os.getloadavg()),
    }


class _Bar:
    """A progress bar over the visits that names what runs (a fill, a probe, a point)."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress = progress
        self.task = progress.add_task("", total=total)

    def starting(self, what: str) -> None:
        self.progress.update(self.task, description=what)

    def visited(self, point: Point) -> None:
        self.progress.update(self.task, advance=1)


@contextmanager
def _progress(visits: Sequence[Point]) -> Iterator[_Bar]:
    columns = (TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as progress:
        yield _Bar(progress, len(visits))


def _warn_if_busy() -> None:
    load = os.getloadavg()[0]
    if load > BUSY_LOAD:
        console.print(
            f"[yellow]the machine is busy (load average {load:.2f}): other work is measured "
            "as engine time; calibrate on a quiet machine for a cost model to keep[/yellow]"
        )


def measure(
    settings: Settings, quick: bool, repeats: int | None, served: bool = True
) -> tuple[list[Sample], dict[str, Any]]:
    """Start the engine, run the grid (the reference probe and, with ``served``, the served
    phase's segments between), stop the engine."""
    # The llama.cpp side is imported here only: --refit and the tests of the fit never need it.
    from app.server.scheduling import scheduler_config
    from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor

    spec = {"quick": QUICK, "gpu": GPU, "streams": STREAMS, "full": FULL}[
        grid_name(settings, quick)
    ]
    runs = repeats if repeats is not None else spec.repeats
    config = scheduler_config(settings)
    _warn_if_busy()
    with LlamaCppExecutor.start(settings.engine_config()) as ex:
        info = ex.info
        meta = measurement_meta(settings, info, config.token_budget, quick, runs)
        stream_cells = 0 if info.kv_unified else info.n_ctx // info.n_seq_max
        grid = build_grid(
            spec, info.n_ctx, info.n_seq_max, info.n_batch, config.token_budget, stream_cells
        )
        visits = visit_order(grid, runs)
        runner = GridRunner(ex, probe_every=spec.probe_every, n_ubatch=settings.layout.n_ubatch)
        serving = ServedRunner(ex, config, QUICK_SERVED if quick else FULL_SERVED, runner.t0)
        if served:
            runner.interlude = serving.segment
        with _progress(visits) as bar:
            runner.run(visits, bar)
    meta["load_avg_after"] = list(os.getloadavg())
    meta["probe"] = summarise(runner.probes)
    if served:
        meta["served"] = serving.describe()
    return runner.samples + serving.samples, meta


def measure_probe_alone(settings: Settings) -> ProbeResult:
    """Start the engine, run the reference probe once, stop the engine."""
    from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor

    _warn_if_busy()
    with LlamaCppExecutor.start(settings.engine_config()) as ex:

        def step(plan: StepPlan) -> float:
            t0 = time.perf_counter()
            ex.step(plan)
            return time.perf_counter() - t0

        return measure_probe(step, ex.info.n_vocab, share=ex.info.kv_unified)


# ---- showing it ----

_READING = {
    "per_pass": "per step that runs tokens (a forward pass)",
    "per_batched_pass": "more, if it runs more than one token",
    "per_decode": "per decode token",
    "per_prefill": "per prefill token",
    "per_attended": "per 1,000 attended (query, key) pairs",
    "per_batch_kv": "per million (batch token, KV cell held) pairs",
    "per_kv_held": "per 1,000 KV cells held",
    "per_stash": "per stashed token",
    "per_restore": "per restored token",
    "per_idle_kv": "per 1,000 KV cells held outside the batch",
    "per_batch_idle": "per million (batch token, idle KV cell) pairs",
    "per_stream_read": "per 1,000 cells of the streams a micro-batch spans (n_kv each)",
    "per_stream_kv": "per million (micro-batch token, its streams' n_kv) pairs",
    "per_extra_pass": "per forward pass beyond the first (micro-batches)",
}


def print_model(model: CostModel) -> None:
    fit = model.meta.get("fit", {})
    zeroed = {n: "not exercised" for n in fit.get("unexercised", ())}
    zeroed |= {n: "not identifiable from the grid" for n in fit.get("unidentified", ())}
    table = Table(title="cost model (step time = the sum)")
    for col, justify in (("coefficient", "left"), ("ms", "right"), ("", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for name in COEFFICIENTS:
        ms = 1e3 * getattr(model, name)
        table.add_row(name, f"{ms:.4g}", zeroed.get(name, _READING[name]))
    console.print(table)
    table = Table(title=f"fit error over {fit.get('points', '?')} points (relative, %)")
    for col in ("group", "points", "R²", "MAPE", "p50", "p90", "max"):
        table.add_column(col, justify="right")
    rows = dict(fit.get("errors", {}))
    if "served" in fit:
        rows["served bins"] = fit["served"]
    for group, e in rows.items():
        r2 = "-" if e["r2"] is None else f"{e['r2']:.3f}"
        figures = (f"{e[k]:.1f}" for k in ("mape", "p50", "p90", "max"))
        table.add_row(group, str(e["n"]), r2, *figures)
    console.print(table)


def plot_fit(model: CostModel, points: Sequence[tuple[StepFeatures, float]], path: Path) -> None:
    """Measured vs predicted step time, log axes, one colour per group, and the line y = x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6), constrained_layout=True)
    for group in Group:
        mine = [(s, model.predict(f)) for f, s in points if group_of(f) is group]
        if mine:
            measured, predicted = zip(*mine, strict=True)
            ax.scatter(measured, predicted, s=18, alpha=0.8, label=group.value)
    every = [s for _, s in points] + [model.predict(f) for f, _ in points]
    low, high = min(x for x in every if x > 0), max(every)
    ax.plot([low, high], [low, high], "k--", linewidth=1, label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    mape = model.meta.get("fit", {}).get("errors", {}).get("all", {}).get("mape")
    title = f"{model.meta.get('model', '')} on {model.meta.get('machine', '')}"
    ax.set_title(title if mape is None else f"{title}\nMAPE {mape:.1f}%", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_probe(result: ProbeResult, report: dict[str, Any]) -> None:
    table = Table(title="reference probe (app/calibration_probe.py)")
    for col in ("part", "runs", "x", "median ms"):
        table.add_column(col, justify="left" if col == "part" else "right")
    for part in PARTS:
        ms = 1e3 * result.parts[part.name]
        table.add_row(part.name, str(part.runs), str(part.weight), f"{ms:.1f}")
    console.print(table)
    now, then = result.total_s, report["calibrated_total_s"]
    line = f"this machine now runs the probe in {now:.3f} s"
    if then is None:
        where = report["cost_model"] or "no cost model"
        console.print(f"{line}; {where} has no reference probe: no speed factor")
    else:
        factor = report["speed_factor"]
        console.print(
            f"{line}; the cost model was calibrated at {then:.3f} s: "
            f"speed factor {now:.3f}/{then:.3f} = {factor:.3f}"
        )


# ---- the command ----


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code=code)


def _settings(model: Path | None, threads: int | None, n_ctx: int | None) -> Settings:
    flags: dict[str, Any] = {"model_path": model, "threads": threads, "n_ctx": n_ctx}
    try:
        return Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        raise _fail(f"invalid settings: {exc}") from None


def _load(paths: Sequence[Path]) -> tuple[list[Sample], dict[str, Any]]:
    """The samples of every file, and the first one's meta: several calibrations of one model
    on one machine fitted together (their probes' measurements too)."""
    measured: list[Sample] = []
    metas: list[dict[str, Any]] = []
    for path in paths:
        try:
            samples, meta = load_samples(path)
        except ValueError as exc:
            raise _fail(str(exc)) from None
        measured += samples
        metas.append(meta)
    meta = {**metas[0], "refit_from": [str(p) for p in paths]}
    if len(metas) > 1:
        for key in ("model", "machine", "threads", "n_ctx"):
            if len({json.dumps(m.get(key)) for m in metas}) > 1:
                raise _fail(f"the samples files differ in {key}: they cannot be fitted together")
        meta["calibrations"] = [m.get("date") for m in metas]
        meta["served"] = [m.get("served") for m in metas]  # each calibration's, if it served
        meta["probe"] = merge_summaries([m.get("probe") for m in metas])
    return measured, meta


def _measure(
    settings: Settings, quick: bool, repeats: int | None, served: bool
) -> tuple[list[Sample], dict[str, Any]]:
    try:
        return measure(settings, quick, repeats, served)
    except (ModelNotFoundError, EngineError) as exc:
        raise _fail(f"engine: {exc}", code=1) from None


def probe_only(settings: Settings, cost_model: Path | None, out: Path | None) -> None:
    """Measure the reference probe alone; compare it with ``cost_model``'s calibration."""
    try:
        stem = settings.resolved_model_path().stem
    except ModelNotFoundError as exc:
        raise _fail(f"engine: {exc}", code=1) from None
    path = cost_model or default_out(stem, machine_slug(settings.threads), settings.kv_unified)
    reference = None
    if cost_model is not None or path.exists():
        try:
            reference = CostModel.load(path)
        except ValueError as exc:
            raise _fail(f"cost model: {exc}") from None
    try:
        result = measure_probe_alone(settings)
    except EngineError as exc:
        raise _fail(f"engine: {exc}", code=1) from None
    report = probe_report(
        result,
        reference,
        path if reference is not None else None,
        {
            "model": settings.resolved_model_path().name,
            "machine": machine_slug(settings.threads),
            "threads": settings.threads,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "load_avg": list(os.getloadavg()),
        },
    )
    print_probe(result, report)
    if reference is not None and calibrated_probe_s(reference) is None:
        console.print("[yellow]calibrate again (`quanta calibrate`) for a reference[/yellow]")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        console.print(f"probe written to {out}")


def calibrate(
    model: Annotated[Path | None, typer.Option(help="GGUF file (default: SmolLM2-135M)")] = None,
    threads: Annotated[int | None, typer.Option(help="llama.cpp threads")] = None,
    n_ctx: Annotated[
        int | None, typer.Option(help="the longest request: each sequence slot's KV cells")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="cost model file (default: config/cost_models/<model>__<machine>.json); "
            "with --probe-only, the probe's JSON"
        ),
    ] = None,
    quick: Annotated[bool, typer.Option(help="a small grid: about 30 s")] = False,
    served: Annotated[
        bool,
        typer.Option(
            help="also serve short workloads through the scheduler between the grid's visits "
            "and fit their steps (about 3 minutes more)"
        ),
    ] = True,
    repeats: Annotated[
        int | None, typer.Option(min=1, help="passes over the grid: measured runs per point")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="measured vs predicted PNG (default: next to --out)")
    ] = None,
    samples: Annotated[Path | None, typer.Option(help="also write the raw samples here")] = None,
    refit: Annotated[
        list[Path] | None,
        typer.Option(
            help="fit a samples file again, no engine started; repeated: several calibrations "
            "fitted together"
        ),
    ] = None,
    probe: Annotated[
        bool,
        typer.Option(
            "--probe-only", help="measure the reference probe alone (~5 s) and its speed factor"
        ),
    ] = False,
    cost_model: Annotated[
        Path | None,
        typer.Option(help="--probe-only: the cost model to compare with (default: this machine's)"),
    ] = None,
) -> None:
    """Fit a cost model of step time from the real engine (or samples, with --refit).

    Full grid and served phase: about 9 minutes on a quiet 2-core machine with SmolLM2-135M
    (--no-served: about 6). --quick: about 30 s. Calibrate on a quiet machine: other work
    counts as engine time.
    --probe-only: how many times slower the machine runs the reference probe now than when
    the cost model was calibrated (the factor for `quanta sim --speed-factor`).
    """
    if probe:
        if refit or samples is not None or plot is not None or repeats or quick:
            raise _fail("--probe-only measures the probe alone: drop --refit/--samples/--plot/…")
        probe_only(_settings(model, threads, n_ctx), cost_model, out)
        return
    if cost_model is not None:
        raise _fail("--cost-model goes with --probe-only")
    if refit:
        if any(v is not None for v in (model, threads, n_ctx, repeats)) or quick:
            raise _fail("--refit fits a samples file again: drop --model/--threads/--n-ctx/…")
        measured, meta = _load(refit)
        if not served:  # the grid's samples alone: what the served phase changes
            measured = [s for s in measured if not s.served]
    else:
        measured, meta = _measure(_settings(model, threads, n_ctx), quick, repeats, served)
        if samples is not None:
            save_samples(samples, measured, meta)
            console.print(f"samples written to {samples}")
    if out is None:
        if "model_stem" not in meta or "machine" not in meta:
            raise _fail("the samples file does not name its model and machine: give --out")
        out = default_out(meta["model_stem"], meta["machine"], bool(meta.get("kv_unified", True)))
    fitted = fit_samples(measured, meta=meta)
    fitted.save(out)
    plot_path = plot if plot is not None else out.with_suffix(".png")
    plot_fit(fitted, fit_points(measured), plot_path)
    print_model(fitted)
    if calibrated_probe_s(fitted) is None:
        console.print("no reference probe in these samples: `--probe-only` cannot compare")
    console.print(f"cost model written to {out}; plot {plot_path}")
