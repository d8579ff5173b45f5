"""``quanta calibrate``: measure the real engine over a grid of steps and fit a cost model.

    quanta calibrate                      # full grid, about 4 min on a quiet 2-core machine
    quanta calibrate --quick              # small grid, about 20 s (tests, smoke runs)
    quanta calibrate --samples s.json     # also keep the raw samples ...
    quanta calibrate --refit s.json       # ... and fit them again, no engine needed

The grid is run in order of context, then batch size, so each context is filled once:

    context 0      prefill chunks on an empty sequence
    context C      sequence 0 holds C:  prefill chunks appended at C, stash + restore of C
                   sequences 0..B-1 hold C (B ascending, filled as B grows):
                       decode of all B, mixed = B decodes + one chunk of (budget - B) new tokens

Only the point's own sequences hold KV while it runs: with ``kv_unified`` every token attends
over the whole shared buffer, so bystanders would slow the step. Each run is undone (Truncate
back to C) so repeats are identical; the first run of a point is a warm-up, not fitted. The
fill steps are real multi-sequence prefill steps and are kept as single-run samples.
"""

from __future__ import annotations

import os
import platform
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.bench.report import package_version
from app.settings import ModelNotFoundError, Settings
from quanta_core.engine import EngineInfo, Executor, Restore, SeqSlice, Stash, StepPlan, Truncate
from quanta_core.engine.errors import EngineError
from quanta_core.engine.kv_mirror import KvMirror
from quanta_core.sim.cost_model import COEFFICIENTS, CostModel, StepFeatures, features_of
from quanta_core.sim.fit import (
    Group,
    Sample,
    fit_samples,
    group_of,
    load_samples,
    median_points,
    save_samples,
)

COST_MODELS_DIR = Path("config/cost_models")
# On 2 cores, llama.cpp's threads wait for each other at every barrier: one busy core from
# someone else made steps 2-8x slower here. A 1-minute load average above this gets a warning.
BUSY_LOAD = 0.5
console = Console()


# ---- the grid ----


class Kind(StrEnum):
    PREFILL = "prefill"
    STASH = "stash"
    DECODE = "decode"
    MIXED = "mixed"


_KIND_ORDER = {Kind.PREFILL: 0, Kind.STASH: 1, Kind.DECODE: 2, Kind.MIXED: 3}


@dataclass(frozen=True, slots=True)
class Point:
    """One grid point: sequences ``0..batch-1`` hold ``context`` tokens while it runs."""

    kind: Kind
    batch: int
    context: int
    chunk: int = 0  # new prefill tokens: appended to sequence 0 (PREFILL) or a new one (MIXED)

    @property
    def label(self) -> str:
        match self.kind:
            case Kind.PREFILL:
                return f"prefill {self.chunk} at {self.context}"
            case Kind.STASH:
                return f"stash/restore {self.context}"
            case Kind.DECODE:
                return f"decode {self.batch} at {self.context}"
            case Kind.MIXED:
                return f"mixed {self.batch} at {self.context} + {self.chunk}"


@dataclass(frozen=True, slots=True)
class GridSpec:
    contexts: tuple[int, ...]  # tokens each decode sequence holds
    batches: tuple[int, ...]  # decode batch sizes
    prefill_starts: tuple[int, ...]
    prefill_chunks: tuple[int, ...]
    mixed_batches: tuple[int, ...]  # decodes beside one chunk of (token budget - batch)
    max_held: int  # KV tokens a context's fill may reach: bounds the time spent filling
    repeats: int  # measured runs per point, after one warm-up


# Time on this 2-core machine is mostly filling: 4 contexts x 4096 tokens at ~155 tokens/s.
FULL = GridSpec(
    contexts=(64, 256, 1024, 2048),
    batches=(1, 2, 4, 8, 16, 32, 64),
    prefill_starts=(0, 256, 1024, 2048),
    prefill_chunks=(16, 64, 256),
    mixed_batches=(2, 8, 32),
    max_held=4096,
    repeats=4,
)
QUICK = GridSpec(
    contexts=(32, 256),
    batches=(1, 4, 16),
    prefill_starts=(0, 256),
    prefill_chunks=(16, 64),
    mixed_batches=(4,),
    max_held=512,
    repeats=3,  # the fewest whose median ignores one disturbed run
)


def build_grid(
    spec: GridSpec, n_ctx: int, n_seq_max: int, n_batch: int, budget: int
) -> list[Point]:
    """The points of ``spec`` that fit the engine, in the order they are run."""
    # Keep a batch's worth of cells free beside the held KV, for the step's new tokens.
    room = min(spec.max_held, n_ctx - n_batch)
    points = [
        Point(Kind.PREFILL, 1, start, n)
        for start in spec.prefill_starts
        for n in spec.prefill_chunks
        if start <= room and n <= n_batch
    ]
    for c in (c for c in spec.contexts if 0 < c <= room):
        points.append(Point(Kind.STASH, 1, c))
        points += [
            Point(Kind.DECODE, b, c)
            for b in spec.batches
            if b <= min(n_seq_max, n_batch) and b * c <= room
        ]
        points += [
            Point(Kind.MIXED, b, c, budget - b)
            for b in spec.mixed_batches
            if budget - b > 1 and b < n_seq_max and b * c <= room
        ]
    return sorted(points, key=lambda p: (p.context, p.batch, _KIND_ORDER[p.kind]))


# ---- running it ----


class GridRunner:
    """Runs grid points on an executor and records every timed step as a ``Sample``."""

    def __init__(self, executor: Executor, repeats: int, seed: int = 0) -> None:
        self.ex = executor
        self.repeats = repeats
        self.rng = random.Random(seed)
        self.mirror = KvMirror.for_engine(executor.info)  # lengths before each step
        self.samples: list[Sample] = []
        self._batch = 0  # sequences 0.._batch-1 hold _context tokens; nothing else is held
        self._context = 0
        self._fills = 0

    def run(self, points: Sequence[Point], done: Callable[[Point], None] | None = None) -> None:
        for p in points:
            self.hold(p.batch, p.context)
            for i in range(1 + self.repeats):
                self.run_once(p, warmup=i == 0)
            if done is not None:
                done(p)
        self.hold(0, 0)

    def run_once(self, p: Point, warmup: bool) -> None:
        decodes = tuple(self._decode_slice(s, p.context) for s in range(p.batch))
        back = tuple(Truncate(s, p.context) for s in range(p.batch))
        match p.kind:
            case Kind.DECODE:
                self._timed(p.label, StepPlan(slices=decodes), warmup)
                self._untimed(StepPlan(kv_ops=back))
            case Kind.MIXED:
                chunk = SeqSlice(p.batch, self._tokens(p.chunk), 0)
                self._timed(p.label, StepPlan(slices=(*decodes, chunk)), warmup)
                self._untimed(StepPlan(kv_ops=(*back, Truncate(p.batch, 0))))
            case Kind.PREFILL:
                chunk = SeqSlice(0, self._tokens(p.chunk), p.context)
                self._timed(p.label, StepPlan(slices=(chunk,)), warmup)
                self._untimed(StepPlan(kv_ops=(Truncate(0, p.context),)))
            case Kind.STASH:
                key = f"calibrate#{len(self.samples)}"
                self._timed(f"stash {p.context}", StepPlan(kv_ops=(Stash(0, key),)), warmup)
                self._timed(f"restore {p.context}", StepPlan(kv_ops=(Restore(0, key),)), warmup)

    def hold(self, batch: int, context: int) -> None:
        """Make sequences ``0..batch-1`` hold ``context`` tokens, and nothing else be held."""
        if context != self._context:
            self._drop(range(self._batch))
            self._batch, self._context = 0, context
        elif batch < self._batch:
            self._drop(range(batch, self._batch))
            self._batch = batch
        if context > 0 and batch > self._batch:
            self._fill(range(self._batch, batch), context)
            self._batch = batch

    def _fill(self, seqs: range, context: int) -> None:
        """Prefill ``seqs`` to ``context`` in steps of up to n_batch tokens (timed: real steps)."""
        pending = {s: context for s in seqs}
        while pending:
            slices, room = [], self.ex.info.n_batch
            for s in list(pending):
                n = min(pending[s], room)
                if n == 0:
                    break
                slices.append(SeqSlice(s, self._tokens(n), context - pending[s]))
                room -= n
                pending[s] -= n
                if not pending[s]:
                    del pending[s]
            self._fills += 1
            self._timed(f"fill {context} #{self._fills}", StepPlan(slices=tuple(slices)), False)

    def _drop(self, seqs: range) -> None:
        held = [s for s in seqs if self.mirror.n_tokens(s)]
        owners = tuple(f"calibrate{s}" for s in seqs)
        self._untimed(StepPlan(kv_ops=tuple(Truncate(s) for s in held), release=owners))

    def _timed(self, point: str, plan: StepPlan, warmup: bool) -> None:
        features = features_of(plan, self.mirror.lengths, self.mirror.stash_lengths)
        held = sum(self.mirror.lengths.values())
        # What the virtual clock must reproduce: the step as the scheduler's caller sees it.
        t0 = time.perf_counter()
        result = self.ex.step(plan)
        seconds = time.perf_counter() - t0
        self.mirror.apply(plan)
        engine_s = result.timings.engine_s
        self.samples.append(Sample(point, features, seconds, engine_s, warmup, held))

    def _untimed(self, plan: StepPlan) -> None:
        self.ex.step(plan)
        self.mirror.apply(plan)

    def _tokens(self, n: int) -> tuple[int, ...]:
        # Distinct random tokens: no accidental repetition for the model to shortcut.
        return tuple(self.rng.randrange(100, self.ex.info.n_vocab) for _ in range(n))

    def _decode_slice(self, seq: int, pos: int) -> SeqSlice:
        # Decode slices sample, as the scheduler's do: the sampler is part of the step.
        return SeqSlice(seq, self._tokens(1), pos, sample=True, owner=f"calibrate{seq}")


# ---- where the file goes ----


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$", " ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:40] or "cpu"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def machine_slug(threads: int) -> str:
    """``<cpus>cpu-<cpu model>``, e.g. ``2cpu-amd-epyc``; ``-<n>t`` when threads != cpus.

    Not the hostname: containers and VMs rename themselves, the CPU stays.
    """
    cpus = os.cpu_count() or 1
    name = f"{cpus}cpu-{_slug(cpu_model())}"
    return name if threads == cpus else f"{name}-{threads}t"


def default_out(model_stem: str, machine: str) -> Path:
    return COST_MODELS_DIR / f"{model_stem}__{machine}.json"


# ---- measuring ----


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
        "kv_unified": info.kv_unified,
        "kv_bytes_per_token": info.kv_bytes_per_token,
        # What a simulated engine needs to stand in for this one (quanta_core.sim.run reads it).
        "n_vocab": info.n_vocab,
        "eog_tokens": list(info.eog_tokens),
        "model_desc": info.model_name,
        "token_budget": budget,
        "grid": "quick" if quick else "full",
        "repeats": repeats,
        "llama_cpp_python": package_version("llama-cpp-python"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_avg_before": list(os.getloadavg()),
    }


@contextmanager
def _progress(grid: Sequence[Point]) -> Iterator[Callable[[Point], None]]:
    """A bar over the grid that names the point being run (its fill included)."""
    columns = (TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task(grid[0].label if grid else "", total=len(grid))
        upcoming = iter(grid[1:])

        def done(p: Point) -> None:
            progress.update(task, advance=1, description=next(upcoming, p).label)

        yield done


def measure(
    settings: Settings, quick: bool, repeats: int | None
) -> tuple[list[Sample], dict[str, Any]]:
    """Start the engine, run the grid, stop the engine."""
    # The llama.cpp side is imported here only: --refit and the tests of the fit never need it.
    from app.assemble import scheduler_config
    from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor

    spec = QUICK if quick else FULL
    runs = repeats if repeats is not None else spec.repeats
    budget = scheduler_config(settings).token_budget
    load = os.getloadavg()[0]
    if load > BUSY_LOAD:
        console.print(
            f"[yellow]the machine is busy (load average {load:.2f}): other work is measured "
            "as engine time; calibrate on a quiet machine for a cost model to keep[/yellow]"
        )
    with LlamaCppExecutor.start(settings.engine_config()) as ex:
        info = ex.info
        meta = measurement_meta(settings, info, budget, quick, runs)
        grid = build_grid(spec, info.n_ctx, info.n_seq_max, info.n_batch, budget)
        runner = GridRunner(ex, runs)
        with _progress(grid) as done:
            runner.run(grid, done)
    meta["load_avg_after"] = list(os.getloadavg())
    return runner.samples, meta


# ---- showing it ----

_READING = {
    "intercept": "per step",
    "per_decode": "per decode token",
    "per_prefill": "per prefill token",
    "per_attended": "per 1,000 attended (query, key) pairs",
    "per_batch_kv": "per million (batch token, KV cell held) pairs",
    "per_kv_held": "per 1,000 KV cells held",
    "per_stash": "per stashed token",
    "per_restore": "per restored token",
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
    for group, e in fit.get("errors", {}).items():
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


def _load(path: Path) -> tuple[list[Sample], dict[str, Any]]:
    try:
        measured, meta = load_samples(path)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    return measured, {**meta, "refit_from": str(path)}


def _measure(
    settings: Settings, quick: bool, repeats: int | None
) -> tuple[list[Sample], dict[str, Any]]:
    try:
        return measure(settings, quick, repeats)
    except (ModelNotFoundError, EngineError) as exc:
        raise _fail(f"engine: {exc}", code=1) from None


def calibrate(
    model: Annotated[Path | None, typer.Option(help="GGUF file (default: SmolLM2-135M)")] = None,
    threads: Annotated[int | None, typer.Option(help="llama.cpp threads")] = None,
    n_ctx: Annotated[int | None, typer.Option(help="KV cells shared by all sequences")] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="cost model file (default: config/cost_models/<model>__<machine>.json)"),
    ] = None,
    quick: Annotated[bool, typer.Option(help="a small grid: about 20 s")] = False,
    repeats: Annotated[
        int | None, typer.Option(min=1, help="measured runs per point, after a warm-up")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="measured vs predicted PNG (default: next to --out)")
    ] = None,
    samples: Annotated[Path | None, typer.Option(help="also write the raw samples here")] = None,
    refit: Annotated[
        Path | None, typer.Option(help="fit a samples file again; no engine is started")
    ] = None,
) -> None:
    """Fit a cost model of step time from the real engine (or samples, with --refit).

    Full grid: about 4 minutes on a quiet 2-core machine with SmolLM2-135M.
    --quick: about 20 s. Calibrate on a quiet machine: other work counts as engine time.
    """
    if refit is not None:
        if any(v is not None for v in (model, threads, n_ctx, repeats)) or quick:
            raise _fail("--refit fits a samples file again: drop --model/--threads/--n-ctx/…")
        measured, meta = _load(refit)
    else:
        measured, meta = _measure(_settings(model, threads, n_ctx), quick, repeats)
        if samples is not None:
            save_samples(samples, measured, meta)
            console.print(f"samples written to {samples}")
    if out is None:
        if "model_stem" not in meta or "machine" not in meta:
            raise _fail("the samples file does not name its model and machine: give --out")
        out = default_out(meta["model_stem"], meta["machine"])
    cost_model = fit_samples(measured, meta=meta)
    cost_model.save(out)
    plot_path = plot if plot is not None else out.with_suffix(".png")
    plot_fit(cost_model, median_points(measured), plot_path)
    print_model(cost_model)
    console.print(f"cost model written to {out}; plot {plot_path}")
