"""Fitting a ``CostModel`` from measured steps, and saying how well it fits.

    samples ──(drop warm-ups, median of each point's repeats)──▶ points (features, seconds)
            ──(served steps: the mean of each bin's steps)──────▶ points
    points  ──(non-negative least squares on relative error)──▶ coefficients
    model   ──(relative error per sample group)──▶ meta["fit"]

Choices, and why:
  - The median of a point's repeats, not every sample: on a shared machine interference only
    ever makes a step slower, so the noise is one-sided with a heavy tail; least squares over
    every sample would be pulled up by a few bursts, the median ignores them.
  - A served step (the calibration's served phase: the scheduler's own steps, each shape once)
    has no repeats; its bin (policy, kind of step, batch size) is one point: the mean of its
    steps' features and the mean of their times. The model is linear, so the mean step's
    price is the mean of its steps' prices; and the mean keeps the step-time tail, which
    a server pays: back to back, 5 % of the steps of one sequence took over 1.6x the median
    here, and 1 % over 4x (a median of repeats drops them).
  - Relative error is minimised (each row divided by its measured time): step times span
    three orders of magnitude (a 1 ms restore, a 3 s prefill), and the simulator's fidelity
    is judged in relative terms. Plain least squares would fit the long steps and let the
    18 ms decode steps, the bulk of a real run, be off by half.
  - Coefficients are non-negative (Lawson–Hanson active set): no feature makes a step
    faster, and a negative coefficient would be a fit of noise.
  - A coefficient the grid cannot identify is 0, never garbage: a column that is always 0
    (no stash was measured) is left out, and so is a column that is a linear combination of
    the ones before it in ``COEFFICIENTS`` order (in decode-only batches at one context,
    attended pairs are proportional to decode tokens: the cost goes to ``per_decode``, the
    readable one).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from quanta_core.sim.cost_model import COEFFICIENTS, CostModel, StepFeatures

SAMPLES_SCHEMA = "quanta.cost_samples/1"
Array = npt.NDArray[np.float64]


class Group(StrEnum):
    """What kind of step a sample is; the fit's error is reported per group."""

    DECODE = "decode"  # decode tokens only
    PREFILL = "prefill"  # prefill chunks only
    MIXED = "mixed"  # decode tokens and prefill chunks in one batch
    STASH = "stash"  # a stash or a restore (with or without a batch)
    EMPTY = "empty"


def group_of(f: StepFeatures) -> Group:
    if f.stash_tokens or f.restore_tokens:
        return Group.STASH
    if f.decode_tokens and f.prefill_tokens:
        return Group.MIXED
    if f.prefill_tokens:
        return Group.PREFILL
    if f.decode_tokens:
        return Group.DECODE
    return Group.EMPTY


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured step. Repeats of one grid point share ``point`` and ``features``."""

    point: str
    features: StepFeatures
    seconds: float  # wall time around ``executor.step`` in the caller: what the clock sees
    engine_s: float = 0.0  # the worker's own measure of the same step
    warmup: bool = False  # measured, but not fitted
    kv_held: int = 0  # tokens all sequences held before the step (unified KV: attended)
    t: float = 0.0  # when, in seconds since the measurement began: drift shows against it
    served: bool = False  # a step the scheduler made: fitted as its bin's (``point``) mean

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["features"] = self.features._asdict()
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Sample:
        return cls(
            point=str(doc["point"]),
            features=StepFeatures(**doc["features"]),
            seconds=float(doc["seconds"]),
            engine_s=float(doc.get("engine_s", 0.0)),
            warmup=bool(doc.get("warmup", False)),
            kv_held=int(doc.get("kv_held", 0)),
            t=float(doc.get("t", 0.0)),
            served=bool(doc.get("served", False)),
        )


def save_samples(path: Path, samples: Sequence[Sample], meta: Mapping[str, Any]) -> None:
    doc = {
        "schema": SAMPLES_SCHEMA,
        "meta": dict(meta),
        "samples": [s.to_json() for s in samples],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def load_samples(path: Path) -> tuple[list[Sample], dict[str, Any]]:
    """The samples and the measurement's meta; ``ValueError`` says what is wrong."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read samples file {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SAMPLES_SCHEMA:
        schema = doc.get("schema") if isinstance(doc, dict) else None
        raise ValueError(f"{path}: not a samples file (schema {schema!r}, want {SAMPLES_SCHEMA})")
    try:
        samples = [Sample.from_json(s) for s in doc["samples"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: bad sample: {exc!r}") from exc
    return samples, dict(doc.get("meta") or {})


def fit_points(samples: Iterable[Sample]) -> list[tuple[StepFeatures, float]]:
    """The points to fit: one (features, median seconds) per grid point, warm-ups dropped,
    in first-seen order; then one (mean features, mean seconds) per bin of served steps."""
    grid: dict[tuple[str, StepFeatures], list[float]] = {}
    served: dict[str, list[Sample]] = {}
    for s in samples:
        if s.warmup:
            continue
        if s.served:
            served.setdefault(s.point, []).append(s)
        else:
            grid.setdefault((s.point, s.features), []).append(s.seconds)
    points = [(f, statistics.median(times)) for (_, f), times in grid.items()]
    return points + [_mean_point(steps) for steps in served.values()]


def _mean_point(steps: Sequence[Sample]) -> tuple[StepFeatures, float]:
    columns = zip(*(s.features for s in steps), strict=True)
    means = StepFeatures._make(statistics.fmean(c) for c in columns)
    return means, statistics.fmean(s.seconds for s in steps)


# ---- the fit ----


def nnls(a: Array, b: Array, max_iter: int | None = None) -> Array:
    """``argmin ||a x - b||`` subject to ``x >= 0`` (Lawson and Hanson's active-set method).

    Columns move one at a time from the active set (held at 0) to the passive set (solved by
    unconstrained least squares); a passive coefficient that would go negative is walked back
    to the boundary and returned to the active set.
    """
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * max(m, n) * float(np.abs(a).sum(axis=0).max(initial=0.0))
    for _ in range(max_iter or 3 * n + 10):
        gradient = a.T @ (b - a @ x)
        if passive.all() or gradient[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, gradient))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            blocking = passive & (z <= 0)
            step = float(np.min(x[blocking] / (x[blocking] - z[blocking])))
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


@dataclass(frozen=True, slots=True)
class Design:
    """Which coefficients the points can determine, and the fit over those alone."""

    fitted: tuple[str, ...]
    unexercised: tuple[str, ...]  # their feature is 0 in every point
    unidentified: tuple[str, ...]  # their feature is a combination of fitted ones


def identifiable(x: Array) -> Design:
    """Split ``COEFFICIENTS`` by whether the columns of ``x`` (in that order) determine them."""
    norms = np.linalg.norm(x, axis=0)
    scaled = x / np.where(norms > 0, norms, 1.0)  # scale-free rank: ms and thousands alike
    kept: list[str] = []
    unexercised: list[str] = []
    unidentified: list[str] = []
    for j, name in enumerate(COEFFICIENTS):  # a dependent column goes to the earlier one
        if norms[j] == 0:
            unexercised.append(name)
            continue
        trial = [COEFFICIENTS.index(k) for k in (*kept, name)]
        if np.linalg.matrix_rank(scaled[:, trial], tol=1e-9) == len(trial):
            kept.append(name)
        else:
            unidentified.append(name)
    return Design(
        fitted=tuple(kept),
        unexercised=tuple(unexercised),
        unidentified=tuple(unidentified),
    )


def fit_cost_model(
    points: Sequence[tuple[StepFeatures, float]],
    *,
    relative: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> CostModel:
    """The non-negative least-squares cost model of ``points`` (features, seconds).

    ``relative`` minimises squared relative error (see the module's docstring); otherwise
    squared seconds. ``meta["fit"]`` gets the design and the error figures per group.
    """
    if not points:
        raise ValueError("no samples to fit")
    y = np.array([seconds for _, seconds in points], dtype=float)
    if (y <= 0).any():
        raise ValueError("every measured time must be above 0 (relative errors divide by it)")
    x = np.array([f.as_row() for f, _ in points], dtype=float)
    design = identifiable(x)
    cols = [COEFFICIENTS.index(n) for n in design.fitted]
    weight = 1.0 / y if relative else np.ones_like(y)
    a = x[:, cols] * weight[:, None]
    scale = np.linalg.norm(a, axis=0)  # unit columns: the active set's tolerances are fair
    solution = nnls(a / scale, y * weight) / scale
    coefficients: dict[str, Any] = dict.fromkeys(COEFFICIENTS, 0.0)
    coefficients.update({n: float(v) for n, v in zip(design.fitted, solution, strict=True)})
    model = CostModel(**coefficients)
    fit_meta = {
        "method": "non-negative least squares, "
        + ("relative error" if relative else "absolute error"),
        "points": len(points),
        "unexercised": list(design.unexercised),
        "unidentified": list(design.unidentified),
        "errors": {g: e.to_json() for g, e in fit_errors(model, points).items()},
    }
    return CostModel(**coefficients, meta={**(meta or {}), "fit": fit_meta})


def fit_samples(
    samples: Sequence[Sample], *, relative: bool = True, meta: Mapping[str, Any] | None = None
) -> CostModel:
    """Fit the medians of each grid point's repeats (warm-ups dropped) and the means of the
    served steps' bins; ``meta["fit"]["served"]``: the error over those bins alone."""
    measured = [s for s in samples if not s.warmup]
    overhead = [s.seconds - s.engine_s for s in measured if s.engine_s > 0]
    extra = {
        "samples": len(measured),
        "aggregate": "median of each grid point's repeats, warm-up runs dropped; "
        "mean of each bin of served steps",
        # The caller's share (socket, msgspec, stash bytes) that the worker's clock misses.
        "caller_overhead_ms_p50": 1e3 * statistics.median(overhead) if overhead else None,
    }
    model = fit_cost_model(fit_points(measured), relative=relative, meta={**(meta or {}), **extra})
    served = fit_points(s for s in measured if s.served)
    if served:
        fit_meta = {**model.meta["fit"], "served": fit_errors(model, served)["all"].to_json()}
        model = replace(model, meta={**model.meta, "fit": fit_meta})
    return model


# ---- how good the fit is ----


@dataclass(frozen=True, slots=True)
class ErrorFigures:
    """Relative error ``|predicted - measured| / measured`` over a group of points."""

    n: int
    r2: float | None  # of seconds; None where the measured times do not vary
    mape: float  # mean absolute percentage error, in percent
    p50: float  # relative errors, in percent
    p90: float
    max: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def error_figures(predicted: Array, measured: Array) -> ErrorFigures:
    rel = 100.0 * np.abs(predicted - measured) / measured
    total = float(((measured - measured.mean()) ** 2).sum())
    residual = float(((measured - predicted) ** 2).sum())
    return ErrorFigures(
        n=len(measured),
        r2=1.0 - residual / total if total > 0 else None,
        mape=float(rel.mean()),
        p50=float(np.percentile(rel, 50)),
        p90=float(np.percentile(rel, 90)),
        max=float(rel.max()),
    )


def fit_errors(
    model: CostModel, points: Sequence[tuple[StepFeatures, float]]
) -> dict[str, ErrorFigures]:
    """Error figures for all points ("all") and for each group that has any."""
    groups: dict[str, list[tuple[float, float]]] = {"all": []}
    for f, seconds in points:
        pair = (model.predict(f), seconds)
        groups["all"].append(pair)
        groups.setdefault(group_of(f).value, []).append(pair)
    out = {}
    for name, pairs in groups.items():
        if pairs:
            pred, meas = np.array(pairs, dtype=float).T
            out[name] = error_figures(pred, meas)
    return out
