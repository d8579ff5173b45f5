"""A step trace: every engine step's cost-model features and what it really took.

    executor = StepTracer(LlamaCppExecutor.start(config), clock, open("steps.jsonl", "w"))

One JSON line per step: ``{"start": s, "gap": s, "engine": s, "total": s, "kv_ops": n,
"f": [StepFeatures...], "plan": StepPlan, "decode": s, "sample": s}``. The plan (its KV
operations and slices, token ids and sampling included) lets ``quanta step-replay`` run the
very same steps on the engine alone; a trace written before it was recorded has none.

    ┌─ gap ─┐┌────────── total ──────────┐┌─ gap ─┐
    ────────┤│ plan ─▶ worker ─▶ result   │├───────
     server  │   └──── engine ───┘        │ server
     (scheduler, HTTP, client; all that is not the step)

``engine`` is the worker's own time, ``total`` the step call as the driver sees it (the
process boundary included), ``gap`` the time since the previous step returned (the server's
own work between steps, or idleness: an idle server has long gaps). Comparing ``engine`` with
the cost model's prediction for ``f`` tells whether a simulation misses the engine or the
rest; ``quanta step-report`` does that, and reads the engine's speed over the run from it
(``speed_profile``). The tracer keeps its own ``KvMirror`` (what each sequence and stash
holds), so a stash's or restore's size is in ``f`` as the simulator counts it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from statistics import fmean, median
from typing import NamedTuple, TextIO

import msgspec

from quanta_core.clock import Clock
from quanta_core.engine.errors import EngineDied
from quanta_core.engine.kv_mirror import KvMirror
from quanta_core.engine.protocol import Executor, SteppedFromLoop
from quanta_core.engine.types import EngineInfo, MemoryStats, StepPlan, StepResult
from quanta_core.sim.cost_model import KvLayout, StepFeatures, features_of
from quanta_core.sim.fit import group_of
from quanta_core.sim.server_cost import ServerCost, fit_server_cost, streamed_tokens


class StepRecord(msgspec.Struct, frozen=True):
    start: float
    gap: float | None  # None for the first step
    engine: float
    total: float
    kv_ops: int
    f: tuple[float, ...]
    plan: StepPlan | None = None
    # The worker's own split of ``engine``: llama_decode, and the sampling after it (None in a
    # trace written before they were recorded).
    decode: float | None = None
    sample: float | None = None

    @property
    def features(self) -> StepFeatures:
        return StepFeatures(*self.f)  # type: ignore[arg-type]


class StepTracer:
    """An ``Executor`` that passes every call on to ``inner`` and writes one record per step.

    Stepped from a loop, a step's record is written once the next step is sent (or at
    ``restart`` / ``close``): its features and line then cost the engine nothing, where
    written on the reply they would delay the next plan."""

    def __init__(self, inner: Executor, clock: Clock, sink: TextIO) -> None:
        self.inner = inner
        self._clock = clock
        self._sink = sink
        self._encoder = msgspec.json.Encoder()
        self._last_end: float | None = None
        self._mirror = KvMirror.for_engine(inner.info)
        self._layout = KvLayout.of(inner.info)  # llama.cpp's default micro-batch (512)
        self._from_loop = inner if isinstance(inner, SteppedFromLoop) else None
        self._pending: list[tuple[StepPlan, float, float, StepResult]] = []  # in step order

    @property
    def info(self) -> EngineInfo:
        return self.inner.info

    def step(self, plan: StepPlan) -> StepResult:
        start = self._clock.now()
        try:
            result = self.inner.step(plan)  # an error is not a step: nothing is written
        except EngineDied:
            self._forget_engine()
            raise
        self._pending.append((plan, start, self._clock.now(), result))
        self._write_pending()
        return result

    def start_step(self, plan: StepPlan) -> asyncio.Future[StepResult]:
        """As ``step``, for a driver on an event loop (see ``SteppedFromLoop``)."""
        start = self._clock.now()
        if self._from_loop is not None:
            step = self._from_loop.start_step(plan)
        else:
            step = asyncio.get_running_loop().run_in_executor(None, self.inner.step, plan)
        step.add_done_callback(lambda done: self._on_done(plan, start, done))
        self._write_pending()  # the steps before this one, now that it is sent
        return step

    def _on_done(self, plan: StepPlan, start: float, step: asyncio.Future[StepResult]) -> None:
        if step.cancelled():
            return
        if step.exception() is None:
            self._pending.append((plan, start, self._clock.now(), step.result()))
        elif isinstance(step.exception(), EngineDied):
            self._forget_engine()

    def _forget_engine(self) -> None:
        self._write_pending()
        self._mirror.forget_engine()

    def _write_pending(self) -> None:
        mirror = self._mirror
        for plan, start, end, result in self._pending:
            features = features_of(plan, mirror.lengths, mirror.stash_lengths, self._layout)
            mirror.adopt(mirror.after(plan))  # the engine ran it: it was valid
            gap = None if self._last_end is None else start - self._last_end
            self._last_end = end
            record = StepRecord(
                start=start,
                gap=gap,
                engine=result.timings.engine_s,
                total=end - start,
                kv_ops=len(plan.kv_ops),
                f=tuple(features),
                plan=plan,
                decode=result.timings.decode_s,
                sample=result.timings.sample_s,
            )
            self._sink.write(self._encoder.encode(record).decode())
            self._sink.write("\n")
        self._pending.clear()

    def memory_stats(self) -> MemoryStats:
        return self.inner.memory_stats()

    def restart(self) -> None:
        self._forget_engine()
        self._last_end = None
        self.inner.restart()

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self._write_pending()
            self._sink.close()


def read_trace(sink: TextIO) -> list[StepRecord]:
    decoder = msgspec.json.Decoder(StepRecord)
    return [decoder.decode(line) for line in sink if line.strip()]


# ---- the trace against a cost model ----

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 256)  # a row per (kind, batch of at most this)


class TraceRow(msgspec.Struct, frozen=True):
    """Steps of one kind and batch-size bucket, in milliseconds per step (means)."""

    kind: str  # "decode" (all slices single tokens), "mixed", "prefill" (no decode token)
    max_batch: int  # slices per step: at most this, more than the previous bucket
    steps: int
    engine_ms: float  # measured in the worker
    predicted_ms: float  # the cost model's, times the speed factor
    boundary_ms: float  # the step call minus the worker's time: the process boundary
    gap_ms: float  # the server's time before the step: the median gap (an idle one is long)

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_ms / self.engine_ms - 1.0) if self.engine_ms else 0.0


def batch_bucket(seqs: int) -> int:
    return next((b for b in BATCH_BUCKETS if seqs <= b), seqs)


def served_steps(records: list[StepRecord]) -> list[StepRecord]:
    """The steps that did any work the cost model prices (not only frees of sequences)."""
    return [r for r in records if any(r.features)]


def compare_trace(
    records: list[StepRecord], predict: Callable[[StepFeatures], float], speed_factor: float = 1.0
) -> tuple[list[TraceRow], TraceRow]:
    """Rows per (kind, batch bucket) and one over every step that did priced work."""
    groups: dict[tuple[str, int], list[StepRecord]] = defaultdict(list)
    for r in served_steps(records):
        f = r.features
        groups[(group_of(f).value, batch_bucket(f.seqs))].append(r)

    def row(kind: str, max_batch: int, rs: list[StepRecord]) -> TraceRow:
        gaps = [r.gap for r in rs if r.gap is not None]
        return TraceRow(
            kind=kind,
            max_batch=max_batch,
            steps=len(rs),
            engine_ms=1e3 * fmean(r.engine for r in rs),
            predicted_ms=1e3 * speed_factor * fmean(predict(r.features) for r in rs),
            boundary_ms=1e3 * fmean(r.total - r.engine for r in rs),
            gap_ms=1e3 * median(gaps) if gaps else 0.0,
        )

    if not groups:
        raise ValueError("the trace has no step that did any work")
    rows = [row(kind, b, groups[(kind, b)]) for kind, b in sorted(groups)]
    every = [r for rs in groups.values() for r in rs]
    return rows, row("all", max(b for _, b in groups), every)


class InRun(NamedTuple):
    """The machine as a run's own steps saw it, for ``quanta sim``: every step's cost-model
    time x ``speed_factor`` (the engine's time over the model's, summed over the steps) plus
    ``server_cycle_s`` (a typical gap between steps and the step call's boundary)."""

    speed_factor: float
    server_cycle_s: float


def in_run(overall: TraceRow, speed_factor: float) -> InRun:
    """From ``compare_trace``'s row over every step, predicted at ``speed_factor``."""
    predicted_at_one = overall.predicted_ms / speed_factor
    return InRun(
        speed_factor=overall.engine_ms / predicted_at_one,
        server_cycle_s=(overall.gap_ms + overall.boundary_ms) / 1e3,
    )


# ---- the server's own time ----

# A token count's median needs a few steps; rarer counts (fcfs's largest batches) are left out.
SERVER_COST_MIN_STEPS = 5


def server_cost_of(records: list[StepRecord], priced_s: float = 0.0) -> ServerCost:
    """The server's time around each step as the traces saw it: for each count of tokens the
    step handed to streams (its sampled slices), the median of the gap before the step plus
    its boundary (the step call beyond the worker's time); then ``per_cycle + per_token x
    tokens`` fitted through those medians. The median ignores the gaps in which the server
    only waited for a request to arrive. ``priced_s``: the part of each boundary the cost
    model already prices (its calibration timed the step call, ``caller_overhead_ms_p50``)."""
    by_tokens: dict[int, list[float]] = defaultdict(list)
    for r in served_steps(records):
        if r.gap is not None and r.plan is not None:
            by_tokens[streamed_tokens(r.plan)].append(r.gap + r.total - r.engine - priced_s)
    points = [(n, median(v)) for n, v in by_tokens.items() if len(v) >= SERVER_COST_MIN_STEPS]
    if not points:
        raise ValueError("the traces have too few steps with plans to read the server's time")
    return fit_server_cost(points)


# ---- the machine's speed over the run ----

# Short against the drift (a minute or more), long enough to hold 15-60 steps at the heaviest
# load, so that one step kind's shape error does not make a bin's factor; 3-30 s fared alike.
PROFILE_BIN_S = 10.0


class SpeedProfile(msgspec.Struct, frozen=True):
    """The engine's speed over a run, bin by bin: ``factors[i]`` is the engine's time over the
    cost model's for the steps that started ``i * bin_s`` to ``(i + 1) * bin_s`` seconds after
    the run's first step; a bin with no step has the run's own factor (``in_run``).

    This VM's speed drifts by up to 30 % within a minute, and one factor per run cannot say
    when: fcfs at 1.2 requests/s ran its first 20 s at 0.73-0.86 and the rest at 0.9-1.26
    (1.00 over the run), so a simulation at 1.00 ran the start too slowly, queued more and
    missed the mean TTFT by 31 %. A simulation times each step by the factor of the bin its
    virtual start falls in (its clock's 0 is the first arrival, the real run's first step)."""

    bin_s: float
    factors: tuple[float, ...]

    def at(self, t: float) -> float:
        """The factor at ``t`` seconds from the start; past either end, the nearest bin's."""
        i = int(t // self.bin_s)
        return self.factors[min(max(i, 0), len(self.factors) - 1)]


def speed_profile(
    records: list[StepRecord],
    predict: Callable[[StepFeatures], float],
    bin_s: float = PROFILE_BIN_S,
) -> SpeedProfile:
    """The engine's time over ``predict``'s, per ``bin_s`` of the run's served steps."""
    steps = served_steps(records)
    if not steps:
        raise ValueError("the trace has no step that did any work")
    origin = steps[0].start
    bins = int((steps[-1].start - origin) // bin_s) + 1
    engine, model = [0.0] * bins, [0.0] * bins
    for r in steps:
        i = int((r.start - origin) // bin_s)
        engine[i] += r.engine
        model[i] += predict(r.features)
    run = sum(engine) / sum(model)
    factors = tuple(e / m if m > 0 else run for e, m in zip(engine, model, strict=True))
    return SpeedProfile(bin_s=bin_s, factors=factors)
