"""``llama-batched-bench`` figures as cost-model points: a layout's terms fitted where the
engine cannot be calibrated here.

llama-batched-bench runs N sequences' prompts of P tokens, then G decode steps of all N at
once, and reports tokens/s of each phase. Its steps are known exactly, so each phase is one
fit point: the mean features of its steps (built as plans, counted by ``features_of`` for
the layout) and its mean step time (phase tokens / tokens/s / steps). The model is linear,
so the mean step's price is the mean of the steps' prices.

    prefill   the prompts fill batches of n_batch tokens in sequence order (a prompt's last
              token samples); each batch is one llama_decode
    decode    G steps of one token for each of the N sequences, ids 0..N-1 in order

Quanta's engine pays more per step than llama-batched-bench (its worker's round trip, the
plan, the samplers): the difference on one sequence's decode, where the base model (fitted
from Quanta's own engine) and the bench measure the same step, is added to every bench
step. The base keeps what the real engine measured at short contexts (a pass, a decode
token, a prefill token); the bench's long contexts fit the terms that price the KV span.

    quanta bench batched-bench     # writes both H200 models
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from quanta_core.engine.types import SeqSlice, StepPlan
from quanta_core.sim.cost_model import (
    COEFFICIENTS,
    CostModel,
    KvLayout,
    StepFeatures,
    features_of,
)
from quanta_core.sim.fit import fit_errors, nnls


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One line of llama-batched-bench: N sequences of ``prompt`` + ``generated`` tokens."""

    sequences: int
    prompt: int
    generated: int
    prefill_tok_s: float
    decode_tok_s: float


# Issue 38, the H200 (8B-shaped model, flash attention, -b 2048 -ub 512), 2,048 + 128.
H200_UNIFIED = (
    BenchRow(1, 2048, 128, 10476, 323),
    BenchRow(16, 2048, 128, 8833, 1466),
    BenchRow(64, 2048, 128, 4867, 1123),
)
H200_STREAMS = (
    BenchRow(1, 2048, 128, 10387, 316),
    BenchRow(16, 2048, 128, 11822, 1821),
    BenchRow(64, 2048, 128, 11826, 3374),
)


def _mean(features: Sequence[StepFeatures]) -> StepFeatures:
    return StepFeatures._make(statistics.fmean(c) for c in zip(*features, strict=True))


def prefill_point(row: BenchRow, layout: KvLayout, n_batch: int) -> tuple[StepFeatures, float]:
    lengths: dict[int, int] = {}
    steps: list[StepFeatures] = []
    slices: list[SeqSlice] = []
    room = n_batch

    def run() -> None:
        nonlocal slices, room
        plan = StepPlan(slices=tuple(slices))
        steps.append(features_of(plan, lengths, {}, layout))
        for s in slices:
            lengths[s.seq] = s.start_pos + len(s.tokens)
        slices, room = [], n_batch

    for seq in range(row.sequences):
        done = 0
        while done < row.prompt:
            n = min(room, row.prompt - done)
            last = done + n == row.prompt
            slices.append(SeqSlice(seq, (1,) * n, done, sample=last, owner=f"s{seq}"))
            done += n
            room -= n
            if room == 0:
                run()
    if slices:
        run()
    seconds = row.sequences * row.prompt / row.prefill_tok_s / len(steps)
    return _mean(steps), seconds


def decode_point(row: BenchRow, layout: KvLayout) -> tuple[StepFeatures, float]:
    steps = []
    for k in range(row.generated):
        plan = StepPlan(
            slices=tuple(
                SeqSlice(s, (1,), row.prompt + k, sample=True, owner=f"s{s}")
                for s in range(row.sequences)
            )
        )
        lengths = dict.fromkeys(range(row.sequences), row.prompt + k)
        steps.append(features_of(plan, lengths, {}, layout))
    return _mean(steps), row.sequences / row.decode_tok_s


def bench_points(
    rows: Sequence[BenchRow], layout: KvLayout, n_batch: int
) -> list[tuple[StepFeatures, float]]:
    out = []
    for row in rows:
        out += [prefill_point(row, layout, n_batch), decode_point(row, layout)]
    return out


# A stream per sequence spans no cell of another sequence: the terms that price the shared
# buffer's spans have no feature in this layout, and the one that prices the cells a
# step holds (its views and mask) is what the stream term now measures.
UNIFIED_ONLY = ("per_batch_kv", "per_kv_held", "per_idle_kv", "per_batch_idle")


def step_overhead(base: CostModel, row: BenchRow, layout: KvLayout) -> float:
    """Seconds a step of Quanta's engine takes beyond the bench's: one sequence's decode."""
    features, seconds = decode_point(replace(row, sequences=1), layout)
    return base.predict(features) - seconds


def fit_terms(
    base: CostModel,
    points: Sequence[tuple[StepFeatures, float]],
    names: Sequence[str],
    drop: Sequence[str] = UNIFIED_ONLY,
) -> CostModel:
    """``base`` with ``drop`` at 0 and ``names`` fitted to ``points`` (non-negative least
    squares of relative error on what the other coefficients leave unexplained)."""
    start = _with(base, dict.fromkeys((*drop, *names), 0.0))
    rest = np.array([s - start.predict(f) for f, s in points])
    y = np.array([s for _, s in points])
    cols = np.array([[_value(f, n) for n in names] for f, _ in points], dtype=float) / y[:, None]
    scale = np.linalg.norm(cols, axis=0)
    scale[scale == 0] = 1.0
    solution = nnls(cols / scale, rest / y) / scale
    fitted = {n: float(v) for n, v in zip(names, solution, strict=True)}
    return _with(start, fitted)


def _with(model: CostModel, coefficients: dict[str, float]) -> CostModel:
    values: dict[str, Any] = {**model.coefficients(), **coefficients}
    return CostModel(**values, meta=dict(model.meta))


def _value(f: StepFeatures, name: str) -> float:
    return f.as_row()[COEFFICIENTS.index(name)]


# What each layout's bench points fit (the rest from the base): one buffer's spans (batch x
# the batch's cells, batch x the others'), a stream's cells read, and its extra passes.
UNIFIED_TERMS = ("per_batch_kv", "per_batch_idle", "per_kv_held")
STREAM_TERMS = ("per_stream_read", "per_stream_kv", "per_extra_pass")


def extend(
    base: CostModel,
    rows: Sequence[BenchRow],
    layout: KvLayout,
    overhead: float,
    source: str,
) -> CostModel:
    """``base`` with its layout's terms fitted to ``rows`` (+ ``overhead`` a step)."""
    n_batch = int(base.meta.get("n_batch", 2048))
    points = [(f, s + overhead) for f, s in bench_points(rows, layout, n_batch)]
    if layout.unified:
        model = fit_terms(base, points, UNIFIED_TERMS, drop=())
    else:
        model = fit_terms(base, points, STREAM_TERMS)
    fit = {
        "method": "llama-batched-bench points: the base model's coefficients, these fitted "
        "(non-negative least squares, relative error)",
        "fitted": list(UNIFIED_TERMS if layout.unified else STREAM_TERMS),
        "zeroed": [] if layout.unified else list(UNIFIED_ONLY),
        "source": source,
        "rows": [dataclasses.asdict(r) for r in rows],
        "step_overhead_ms": 1e3 * overhead,
        "errors": {g: e.to_json() for g, e in fit_errors(model, points).items()},
    }
    meta = {**base.meta, "kv_unified": layout.unified, "n_ubatch": layout.n_ubatch, "fit": fit}
    return replace(model, meta=meta)


def calibrated(model: CostModel) -> CostModel:
    """The model as its calibration fitted it: an extended one keeps that in its meta (so
    running this again starts from the same base)."""
    kept = model.meta.get("calibrated")
    if not kept:
        return model
    meta = {k: v for k, v in model.meta.items() if k != "calibrated"}
    return CostModel(**kept["coefficients"], meta={**meta, "fit": kept["fit"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    folder = Path("config/cost_models")
    parser.add_argument(
        "--base",
        type=Path,
        default=folder / "synthetic-llama3-8b.Q4_0__16cpu-intel-xeon-processor.json",
    )
    args = parser.parse_args()
    base = calibrated(CostModel.load(args.base))
    n_ubatch = int(base.meta.get("n_ubatch", 512))
    unified = KvLayout(True, 0, n_ubatch)
    streams = KvLayout(False, 0, n_ubatch)  # the bench's streams hold every prompt whole
    overhead = step_overhead(base, H200_UNIFIED[0], unified)
    source = "issue 38: llama-batched-bench on the H200, -kvu / -no-kvu, 2,048 + 128"
    stem = args.base.with_suffix("")
    for layout, rows, path in (
        (unified, H200_UNIFIED, args.base),
        (streams, H200_STREAMS, stem.with_name(stem.name + "__streams.json")),
    ):
        model = extend(base, rows, layout, overhead, source)
        calibration = {"coefficients": base.coefficients(), "fit": base.meta.get("fit")}
        model = replace(model, meta={**model.meta, "calibrated": calibration})
        model.save(path)
        errs = model.meta["fit"]["errors"]
        print(
            f"{path}: "
            + ", ".join(
                f"{n} {1e3 * getattr(model, n):.4g} ms"
                for n in (UNIFIED_TERMS if layout.unified else STREAM_TERMS)
            )
            + f"; MAPE {errs['all']['mape']:.1f} % over {errs['all']['n']} points"
        )


if __name__ == "__main__":
    main()
