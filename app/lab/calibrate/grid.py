"""The calibration grid and the runner that measures it on an executor.

    fills     each context's sequences are filled once (in context order; the fill steps are
              real multi-sequence prefill steps, kept as single-run samples) and stashed
    probe     the reference probe (app/calibration_probe.py): at the start, after the fills,
              every ``probe_every`` visits, and at the end
    interlude the served phase's segments (app/calibration_served.py): after the fills and
              after each probe between visits, the engine empty
    passes    ``repeats`` passes over the grid, each in its own shuffled (seeded) order;
              a visit restores the point's sequences, runs the step once as a warm-up and
              once measured, and undoes it (Truncate back to the context)

    burst       new sequences, each one prompt of P tokens, all sampled, in one step of the
                token budget (what a burst of arrivals makes the first steps)
    context C   sequence 0 holds C:   prefill chunks appended at C, stash + restore of C
                sequences 0..B-1 hold C:   decode of all B,
                                           mixed = B decodes + one chunk of (budget - B) tokens,
                                           and of each shorter chunk the spec names
                ... and the last sequence id holds I idle cells beside them: decode of all B
                (what a prefix cache's holders cost the steps they are not in)
                deep mixed = B - 1 decodes + a chunk of (budget - B + 1) appended to the
                             B-th at C (a long prompt's later chunks beside long decodes)

With a KV stream per sequence (``kv_unified=False``: ``STREAMS``) the contexts reach what a
stream holds (each sequence's own context is what its attention costs there), and a point's
held cells are bounded by ``max_held`` (the fills' time), not by a shared buffer.

Repeat-major and shuffled because this machine's speed drifts by ±30 % over minutes: run
back to back, a point's repeats all see the same minute and the drift lines up with the
grid's axes (the small contexts fast, the large ones slow); spread over the whole
calibration, each point's median sees its average. Restoring a point's sequences from host
RAM costs ~0.1 ms a token (0.4 s for 4,096), filling them again ~6 ms a token.

Only the point's own sequences hold KV while it runs (with ``kv_unified`` the fill steps
measured slower beside other sequences' cells, so bystanders are stashed away), and the idle
sequence where the point has one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from app.lab.calibrate.probe import SEQUENCES, ProbeResult, measure_probe
from quanta_core.engine import DropStash, Executor, Restore, SeqSlice, Stash, StepPlan, Truncate
from quanta_core.engine.kv_mirror import KvMirror
from quanta_core.sim.cost_model import KvLayout, features_of
from quanta_core.sim.fit import Sample


class Kind(StrEnum):
    PREFILL = "prefill"
    STASH = "stash"
    DECODE = "decode"
    MIXED = "mixed"
    BURST = "burst"
    DEEP = "deep mixed"


_KIND_ORDER = {
    Kind.PREFILL: 0,
    Kind.STASH: 1,
    Kind.DECODE: 2,
    Kind.MIXED: 3,
    Kind.DEEP: 4,
    Kind.BURST: 5,
}


@dataclass(frozen=True, slots=True)
class Point:
    """One grid point: sequences ``0..batch-1`` hold ``context`` tokens while it runs."""

    kind: Kind
    batch: int
    context: int
    # new prefill tokens: appended to sequence 0 (PREFILL), a new one (MIXED), or each of
    # ``batch`` new ones (BURST)
    chunk: int = 0
    idle: int = 0  # tokens a sequence outside the batch (the last id) holds meanwhile

    @property
    def label(self) -> str:
        match self.kind:
            case Kind.PREFILL:
                return f"prefill {self.chunk} at {self.context}"
            case Kind.STASH:
                return f"stash/restore {self.context}"
            case Kind.DECODE if self.idle:
                return f"decode {self.batch} at {self.context} beside {self.idle}"
            case Kind.DECODE:
                return f"decode {self.batch} at {self.context}"
            case Kind.MIXED:
                return f"mixed {self.batch} at {self.context} + {self.chunk}"
            case Kind.BURST:
                return f"burst {self.batch} x {self.chunk}"
            case Kind.DEEP:
                return f"mixed {self.batch - 1} at {self.context} + {self.chunk} at {self.context}"


@dataclass(frozen=True, slots=True)
class GridSpec:
    contexts: tuple[int, ...]  # tokens each decode sequence holds
    batches: tuple[int, ...]  # decode batch sizes
    prefill_starts: tuple[int, ...]
    prefill_chunks: tuple[int, ...]
    mixed_batches: tuple[int, ...]  # decodes beside one chunk of (token budget - batch)
    idle_batches: tuple[int, ...]  # decodes at the smallest context beside idle cells ...
    idle_cells: tuple[int, ...]  # ... of this many (a fill of its own each)
    max_held: int  # KV tokens a context's fill may reach: bounds the time spent filling
    repeats: int  # passes over the grid: each point's measured runs
    probe_every: int  # visits between reference probes; 0: at the start and the end only
    burst_prompts: tuple[int, ...] = ()  # prompt lengths of a burst's new sequences
    # Chunks, beside each of ``mixed_batches``' decodes, shorter than the budget's rest: a
    # prompt joining a running set that does not fill the step (a steady day's steps)
    mixed_chunks: tuple[int, ...] = ()
    # Batches B of the deep mixed points: B - 1 decodes and a chunk appended to the B-th,
    # all at the point's context.
    deep_mixed_batches: tuple[int, ...] = ()


# Time on this 2-core machine: filling 4 contexts x 4096 tokens at ~155 tokens/s, then the
# passes (~45 s each: a warm-up and a measured run per point, the restores).
FULL = GridSpec(
    contexts=(64, 256, 1024, 2048),
    batches=(1, 2, 4, 8, 16, 32, 64),
    prefill_starts=(0, 256, 1024, 2048),
    prefill_chunks=(16, 64, 256),
    mixed_batches=(2, 8, 32),
    idle_batches=(1, 4, 16),
    idle_cells=(512, 2048),
    max_held=4096,
    repeats=4,
    probe_every=40,  # about twice a pass: ~4 s every ~25 s
    burst_prompts=(32,),  # twenty people at once, say (a few seconds more)
)
# A GPU engine (n_gpu_layers != 0) runs up to 256 sequences a step: batches and held cells
# reach what it serves; its steps take milliseconds, so the larger grid costs minutes.
GPU = GridSpec(
    contexts=(64, 256, 1024, 2048),
    batches=(1, 4, 16, 32, 64, 128, 256),
    prefill_starts=(0, 256, 1024, 2048),
    prefill_chunks=(16, 64, 256, 512),
    mixed_batches=(2, 8, 32, 128),
    idle_batches=(1, 16, 64),
    idle_cells=(512, 2048, 8192),
    max_held=16384,
    repeats=4,
    # A burst of short prompts fills the budget with many sampled rows: a step shape the
    # other points do not have, and the one that sets a burst's first tokens.
    burst_prompts=(16, 32, 128, 512),
    # On a steady day a prompt of a few hundred tokens joins a few dozen decodes: priced
    # from the budget-filling mixed points alone, such steps came out at 0.81 of their
    # measured time (bench/results/gpu/README.md).
    mixed_chunks=(256,),
    probe_every=40,
)
# A KV stream per sequence (kv_unified=False) on this 2-core machine: a step's attention is
# each sequence's own context, so the contexts reach 3k (1-8 sequences at 1k, up to 4 at
# 3k: issue 38's 8 x 1,000 and 4 x 3,000), prompt chunks are appended deep into a stream
# beside decodes there, and the fills (21k tokens) stay within a few minutes.
STREAMS = GridSpec(
    contexts=(64, 1024, 3072),
    batches=(1, 2, 4, 8),
    prefill_starts=(0, 1024, 3072),
    prefill_chunks=(16, 128, 256),
    mixed_batches=(2, 8),
    idle_batches=(1, 4),
    idle_cells=(1000,),  # not a context: the idle sequence (the last id) is in the batches too
    max_held=12288,
    repeats=3,
    probe_every=60,
    burst_prompts=(32,),
    deep_mixed_batches=(4, 8),
)
QUICK = GridSpec(
    contexts=(32, 256),
    batches=(1, 4, 16),
    prefill_starts=(0, 256),
    prefill_chunks=(16, 64),
    mixed_batches=(4,),
    idle_batches=(4,),
    idle_cells=(256,),
    max_held=512,
    repeats=3,  # the fewest whose median ignores one disturbed run
    probe_every=0,
    burst_prompts=(16,),
)


def build_grid(
    spec: GridSpec,
    n_ctx: int,
    n_seq_max: int,
    n_batch: int,
    budget: int,
    stream_cells: int = 0,
) -> list[Point]:
    """The points of ``spec`` that fit the engine, sorted by context and batch.
    ``stream_cells``: the cells of each sequence's own stream (0: one buffer for all)."""
    # Keep a batch's worth of cells free beside the held KV, for the step's new tokens.
    room = min(spec.max_held, n_ctx - n_batch)
    # A sequence's cells, and a step's new tokens on top, must fit its stream.
    own = stream_cells or n_ctx
    points = [
        Point(Kind.PREFILL, 1, start, n)
        for start in spec.prefill_starts
        for n in spec.prefill_chunks
        if start <= room and n <= n_batch and start + n <= own
    ]
    contexts = [c for c in spec.contexts if 0 < c <= room and c + budget <= own]
    for c in contexts:
        points.append(Point(Kind.STASH, 1, c))
        points += [
            Point(Kind.DECODE, b, c)
            for b in spec.batches
            if b <= min(n_seq_max, n_batch) and b * c <= room
        ]
        points += [
            Point(Kind.MIXED, b, c, chunk)
            for b in spec.mixed_batches
            for chunk in sorted({budget - b, *(n for n in spec.mixed_chunks if n < budget - b)})
            if chunk > 1 and b < n_seq_max and b * c <= room
        ]
        points += [
            Point(Kind.DEEP, b, c, budget - b + 1)
            for b in spec.deep_mixed_batches
            if 1 < b <= n_seq_max and b <= budget and b * c <= room
        ]
    for n in spec.burst_prompts:
        batch = min(budget // n, n_seq_max - 1, n_batch // n)
        if batch >= 1 and batch * n <= room:
            points.append(Point(Kind.BURST, batch, 0, n))
    if contexts:
        c = min(contexts)
        points += [
            Point(Kind.DECODE, b, c, idle=i)
            for i in spec.idle_cells
            for b in spec.idle_batches
            if b < n_seq_max and b * c + i <= room
        ]
    return sorted(points, key=lambda p: (p.context, p.batch, _KIND_ORDER[p.kind], p.idle))


def visit_order(points: Sequence[Point], repeats: int, seed: int = 0) -> list[Point]:
    """Repeat-major: every point once per pass, each pass in its own shuffled order."""
    rng = random.Random(f"grid order {seed}")
    visits: list[Point] = []
    for _ in range(repeats):
        shuffled = list(points)
        rng.shuffle(shuffled)
        visits += shuffled
    return visits


# ---- running it ----


class Watcher(Protocol):
    """Told what the runner does: a progress bar, or a test's record."""

    def starting(self, what: str) -> None: ...  # a fill, a probe or a visit begins

    def visited(self, point: Point) -> None: ...  # a visit ended


# A stash's KV comes back in its step's reply and a restore's goes out in its call, each one
# frame of the worker's wire (under its 2 GiB MAX_FRAME): the GPU grid's fill of 256 x 64
# tokens of an 8B model (128 KiB a token) is 2 GiB, so copies go in plans of at most this.
KV_COPY_BYTES = 1 << 29


class GridRunner:
    """Runs grid points on an executor and records every timed step as a ``Sample``."""

    def __init__(
        self,
        executor: Executor,
        seed: int = 0,
        probe_every: int | None = None,
        interlude: Callable[[], None] | None = None,
        n_ubatch: int = 512,
    ) -> None:
        self.ex = executor
        self.layout = KvLayout.of(executor.info, n_ubatch)  # what the features count
        self.rng = random.Random(seed)  # the tokens
        self.probe_every = probe_every  # None: no probes; 0: at the start and the end only
        # Work between visits (the served phase's segments): after the fills and each probe.
        self.interlude = interlude
        if probe_every is not None and executor.info.n_seq_max < SEQUENCES:
            raise ValueError(f"the reference probe needs {SEQUENCES} sequences")
        self.mirror = KvMirror.for_engine(executor.info)  # lengths before each step
        self.samples: list[Sample] = []
        self.probes: list[ProbeResult] = []
        self._filled: dict[int, int] = {}  # context -> sequences 0..n-1 stashed at it
        self._idle_seq = executor.info.n_seq_max - 1  # holds a point's idle cells
        self._idle_filled: set[int] = set()  # idle sizes stashed from the idle sequence
        self._held: dict[int, int] = {}  # sequence -> the context it holds (restored)
        self._fills = 0
        self.t0 = time.perf_counter()

    def run(self, visits: Sequence[Point], watcher: Watcher | None = None) -> None:
        """Fill, then visit each point of ``visits`` in order; leave the engine empty."""
        self._probe(watcher)
        self.fill(visits, watcher)
        every = self.probe_every or 0  # 0: no probes between visits
        for i, p in enumerate(visits):
            between = every > 0 and i % every == 0  # i = 0: after the fills
            if between:
                self._probe(watcher)
            if i == 0 or between:
                self._interlude(watcher)
            if watcher is not None:
                watcher.starting(p.label)
            self.hold(p.batch, p.context, p.idle)
            self.run_once(p, warmup=True)
            self.run_once(p, warmup=False)
            if watcher is not None:
                watcher.visited(p)
        self._probe(watcher)
        self.release()

    def fill(self, points: Sequence[Point], watcher: Watcher | None = None) -> None:
        """Fill, once, the sequences each context of ``points`` needs, and stash them."""
        need: dict[int, int] = {}
        for p in points:
            if p.context and p.batch > self._filled.get(p.context, 0):
                need[p.context] = max(need.get(p.context, 0), p.batch)
        self.hold(0, 0)
        for idle in sorted({p.idle for p in points if p.idle} - self._idle_filled):
            if watcher is not None:
                watcher.starting(f"fill idle {idle}")
            self._fill(range(self._idle_seq, self._idle_seq + 1), idle)
            self._copy_kv([(Stash(self._idle_seq, _key(idle, self._idle_seq)), idle)])
            self._idle_filled.add(idle)
        for context, n in sorted(need.items()):
            if watcher is not None:
                watcher.starting(f"fill {n} x {context}")
            seqs = range(self._filled.get(context, 0), n)
            self._fill(seqs, context)
            self._copy_kv([(Stash(s, _key(context, s)), context) for s in seqs])
            self._filled[context] = n

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
            case Kind.DEEP:
                last = p.batch - 1
                chunk = SeqSlice(last, self._tokens(p.chunk), p.context)
                self._timed(p.label, StepPlan(slices=(*decodes[:last], chunk)), warmup)
                self._untimed(StepPlan(kv_ops=back))
            case Kind.BURST:
                prompts = tuple(
                    SeqSlice(s, self._tokens(p.chunk), 0, sample=True, owner=f"calibrate{s}")
                    for s in range(p.batch)
                )
                self._timed(p.label, StepPlan(slices=prompts), warmup)
                self._untimed(StepPlan(kv_ops=tuple(Truncate(s, 0) for s in range(p.batch))))
            case Kind.STASH:
                key = f"calibrate#{len(self.samples)}"
                self._timed(f"stash {p.context}", StepPlan(kv_ops=(Stash(0, key),)), warmup)
                self._timed(f"restore {p.context}", StepPlan(kv_ops=(Restore(0, key),)), warmup)

    def hold(self, batch: int, context: int, idle: int = 0) -> None:
        """Make sequences ``0..batch-1`` hold ``context`` tokens and the idle sequence ``idle``
        (restored from their fill's stash), and nothing else be held (stashed back)."""
        want = dict.fromkeys(range(batch), context) if context else {}
        if context and batch > self._filled.get(context, 0):
            raise ValueError(f"{batch} sequences at {context} were not filled")
        if idle:
            if idle not in self._idle_filled:
                raise ValueError(f"no idle sequence of {idle} tokens was filled")
            want[self._idle_seq] = idle
        away = [s for s, c in self._held.items() if want.get(s) != c]
        back = [s for s in want if self._held.get(s) != want[s]]
        self._copy_kv([(Stash(s, _key(self._held[s], s)), self._held[s]) for s in away])
        self._copy_kv([(Restore(s, _key(want[s], s)), want[s]) for s in back])
        self._held = want

    def _copy_kv(self, ops: Sequence[tuple[Stash | Restore, int]]) -> None:
        """Run stashes or restores (each with its tokens), untimed, in as few plans as keep
        each plan's KV within ``KV_COPY_BYTES``."""
        per_token = max(self.ex.info.kv_bytes_per_token, 1)
        part: list[Stash | Restore] = []
        size = 0
        for op, tokens in ops:
            if part and size + tokens * per_token > KV_COPY_BYTES:
                self._untimed(StepPlan(kv_ops=tuple(part)))
                part, size = [], 0
            part.append(op)
            size += tokens * per_token
        if part:
            self._untimed(StepPlan(kv_ops=tuple(part)))

    def release(self) -> None:
        """Drop every held sequence, stash and sampler: the engine as it was found."""
        self.hold(0, 0)
        drops = tuple(DropStash(_key(c, s)) for c, n in self._filled.items() for s in range(n))
        drops += tuple(DropStash(_key(i, self._idle_seq)) for i in self._idle_filled)
        owners = tuple(f"calibrate{s}" for s in range(self.ex.info.n_seq_max))
        self._untimed(StepPlan(kv_ops=drops, release=owners))
        self._filled = {}
        self._idle_filled = set()

    def _interlude(self, watcher: Watcher | None) -> None:
        if self.interlude is None:
            return
        if watcher is not None:
            watcher.starting("served requests")
        self.hold(0, 0)  # the interlude finds the engine empty, and leaves it so
        self.interlude()

    def _probe(self, watcher: Watcher | None) -> None:
        if self.probe_every is None:
            return
        if watcher is not None:
            watcher.starting("reference probe")
        self.hold(0, 0)  # the probe's sequences must be empty
        at = time.perf_counter() - self.t0
        info = self.ex.info
        self.probes.append(measure_probe(self._time, info.n_vocab, at, share=info.kv_unified))

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

    def _timed(self, point: str, plan: StepPlan, warmup: bool) -> None:
        features = features_of(plan, self.mirror.lengths, self.mirror.stash_lengths, self.layout)
        held = sum(self.mirror.lengths.values())
        t = time.perf_counter() - self.t0
        seconds, engine_s = self._step(plan)
        self.samples.append(Sample(point, features, seconds, engine_s, warmup, held, t))

    def _time(self, plan: StepPlan) -> float:
        return self._step(plan)[0]

    def _step(self, plan: StepPlan) -> tuple[float, float]:
        """Run ``plan``: its wall seconds (what the virtual clock must reproduce: the step as
        the scheduler's caller sees it) and the worker's own measure of it."""
        t0 = time.perf_counter()
        result = self.ex.step(plan)
        seconds = time.perf_counter() - t0
        self.mirror.apply(plan)
        return seconds, result.timings.engine_s

    def _untimed(self, plan: StepPlan) -> None:
        self.ex.step(plan)
        self.mirror.apply(plan)

    def _tokens(self, n: int) -> tuple[int, ...]:
        # Distinct random tokens: no accidental repetition for the model to shortcut.
        return tuple(self.rng.randrange(100, self.ex.info.n_vocab) for _ in range(n))

    def _decode_slice(self, seq: int, pos: int) -> SeqSlice:
        # Decode slices sample, as the scheduler's do: the sampler is part of the step.
        return SeqSlice(seq, self._tokens(1), pos, sample=True, owner=f"calibrate{seq}")


def _key(context: int, seq: int) -> str:
    return f"calibrate hold {context}/{seq}"
