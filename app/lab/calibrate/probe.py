"""The reference probe: a few seconds of fixed engine work whose time says how fast the
machine is *now*, so that a cost model calibrated at one time can stand for another.

This VM's speed drifts by ±30 % over minutes (bench/results/fidelity/README.md). A
calibration measures the probe at its start, between the grid's passes and at its end, and
keeps the median in the cost model (``meta.probe``); ``quanta calibrate --probe-only``
measures it again, and the ratio now / then is the speed factor that
``quanta sim --speed-factor`` multiplies every simulated step by.

    part                                            runs           weight   ~ms (2 threads)
    one prefill chunk of 128 tokens, empty sequence 1 warm-up + 3      1        500
    1 sequence decoding at 128 tokens of context    1 warm-up + 15    32         13
    16 sequences decoding at 128 (prefix shared)    1 warm-up + 5      4        120

    the probe's time = Σ weight × the median of the part's runs   (≈ 1.4 s of work)

The weights give each part about a third of the work, so the factor weighs the one-token
path, the matrix path and prefill alike. The tokens are seeded: every measurement runs the
same steps. The 16 sequences share sequence 0's 128 tokens (``CopyPrefix``) instead of
holding their own: filling 2,048 tokens would take 13 s, and the probe is a gauge of speed,
not a grid point. Measuring it takes about 4 s. With a KV stream per sequence a prefix
cannot be copied between streams: the other 15 prefill their own 128 tokens, untimed
(about 5 s more).
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quanta_core.engine import CopyPrefix, SeqSlice, StepPlan, Truncate
from quanta_core.sim.cost_model import CostModel

PROBE_SCHEMA = "quanta.probe/1"
CONTEXT = 128
_SEED = 8


@dataclass(frozen=True, slots=True)
class ProbePart:
    name: str
    batch: int  # sequences decoding one token each; 0: the prefill chunk
    runs: int  # timed, after one warm-up
    weight: int  # how many times the probe's work holds this step


PARTS = (
    ProbePart(f"prefill {CONTEXT}", 0, runs=3, weight=1),
    ProbePart(f"decode 1 at {CONTEXT}", 1, runs=15, weight=32),
    ProbePart(f"decode 16 at {CONTEXT}", 16, runs=5, weight=4),
)
# Names the probe in files: a factor only compares two measurements of the same work.
WORK = " + ".join(f"{p.weight} x {p.name}" for p in PARTS)
SEQUENCES = max(p.batch for p in PARTS)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    parts: Mapping[str, float]  # the median seconds of each part's runs
    at_s: float = 0.0  # when, in seconds since the measurement began

    @property
    def total_s(self) -> float:
        return sum(p.weight * self.parts[p.name] for p in PARTS)

    def to_json(self) -> dict[str, Any]:
        return {"total_s": self.total_s, "parts": dict(self.parts), "at_s": self.at_s}


def measure_probe(
    step: Callable[[StepPlan], float], n_vocab: int, at_s: float = 0.0, share: bool = True
) -> ProbeResult:
    """Run the probe through ``step`` (runs a plan, returns its wall seconds) on sequences
    ``0..15``, which must be empty; they are empty again afterwards. ``share``: the others
    copy sequence 0's tokens (one KV buffer); else each prefills its own."""
    rng = random.Random(_SEED)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(100, n_vocab) for _ in range(n))

    times: dict[str, list[float]] = {p.name: [] for p in PARTS}
    owners = tuple(f"probe{s}" for s in range(SEQUENCES))
    prefill, *decodes = PARTS
    for i in range(1 + prefill.runs):  # the last run's tokens stay: the decodes' context
        if i:
            step(StepPlan(kv_ops=(Truncate(0, 0),)))
        seconds = step(StepPlan(slices=(SeqSlice(0, tokens(CONTEXT), 0),)))
        if i:
            times[prefill.name].append(seconds)
    if share:
        step(StepPlan(kv_ops=tuple(CopyPrefix(0, s, CONTEXT) for s in range(1, SEQUENCES))))
    else:
        _prefill_others(step, n_vocab)
    for part in decodes:
        back = StepPlan(kv_ops=tuple(Truncate(s, CONTEXT) for s in range(part.batch)))
        for i in range(1 + part.runs):
            slices = tuple(
                SeqSlice(s, tokens(1), CONTEXT, sample=True, owner=owners[s])
                for s in range(part.batch)
            )
            seconds = step(StepPlan(slices=slices))
            step(back)
            if i:
                times[part.name].append(seconds)
    step(StepPlan(kv_ops=tuple(Truncate(s) for s in range(SEQUENCES)), release=owners))
    return ProbeResult({name: statistics.median(ts) for name, ts in times.items()}, at_s)


def _prefill_others(step: Callable[[StepPlan], float], n_vocab: int) -> None:
    """Sequences ``1..15`` prefill ``CONTEXT`` tokens each, four to a step (their own rng:
    the timed parts' tokens stay those of a shared probe)."""
    rng = random.Random(f"{_SEED} others")
    seqs = list(range(1, SEQUENCES))
    for i in range(0, len(seqs), 4):
        step(
            StepPlan(
                slices=tuple(
                    SeqSlice(s, tuple(rng.randrange(100, n_vocab) for _ in range(CONTEXT)), 0)
                    for s in seqs[i : i + 4]
                )
            )
        )


def summarise(probes: Sequence[ProbeResult]) -> dict[str, Any]:
    """What a cost model keeps (``meta.probe``): each part's median over the measurements,
    the probe's time from those, and every measurement (its drift during the calibration)."""
    parts = {p.name: statistics.median(r.parts[p.name] for r in probes) for p in PARTS}
    totals = [r.total_s for r in probes]
    return {
        "work": WORK,
        "total_s": ProbeResult(parts).total_s,
        "parts": parts,
        "spread": max(totals) / min(totals),  # slowest / fastest measurement
        "measurements": [r.to_json() for r in probes],
    }


def merge_summaries(summaries: Sequence[Any]) -> dict[str, Any] | None:
    """One ``meta.probe`` from several calibrations' (fitted together): every measurement of
    each, summarised as one calibration's; None unless each measured this probe."""
    if not all(isinstance(s, Mapping) and s.get("work") == WORK for s in summaries):
        return None
    return summarise(
        [
            ProbeResult(m["parts"], m.get("at_s", 0.0))
            for summary in summaries
            for m in summary["measurements"]
        ]
    )


# ---- the speed factor ----


def calibrated_probe_s(model: CostModel) -> float | None:
    """The probe's time during ``model``'s calibration; None if it was not measured."""
    probe = model.meta.get("probe")
    if not isinstance(probe, Mapping) or probe.get("work") != WORK:
        return None
    total = probe.get("total_s")
    return float(total) if isinstance(total, int | float) and total > 0 else None


def probe_report(
    result: ProbeResult,
    reference: CostModel | None,
    reference_path: Path | None,
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """The probe file: this measurement, how it was made (``meta``), and the speed factor
    against ``reference`` if that cost model has a probe."""
    then = None if reference is None else calibrated_probe_s(reference)
    return {
        "schema": PROBE_SCHEMA,
        "work": WORK,
        "total_s": result.total_s,
        "parts": dict(result.parts),
        "cost_model": None if reference_path is None else str(reference_path),
        "calibrated_total_s": then,
        "speed_factor": None if then is None else result.total_s / then,
        **meta,
    }


def load_probe_total(path: Path) -> float:
    """The probe's time in a probe file (``quanta calibrate --probe-only --out``)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read probe file {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != PROBE_SCHEMA:
        raise ValueError(f"{path}: not a probe file (want schema {PROBE_SCHEMA})")
    if doc.get("work") != WORK:
        raise ValueError(f"{path}: measured another probe ({doc.get('work')!r})")
    return float(doc["total_s"])


def speed_factor(probe_total_s: float, model: CostModel) -> float:
    """How many times slower the machine runs the probe now than at ``model``'s calibration."""
    then = calibrated_probe_s(model)
    if then is None:
        raise ValueError(
            "the cost model has no reference probe (calibrated before probes existed, or with "
            "another probe): calibrate again with `quanta calibrate`"
        )
    return probe_total_s / then
