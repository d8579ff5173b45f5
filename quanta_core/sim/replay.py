"""A served run's steps again, on the engine alone: does the server slow the engine down?

    QUANTA_STEP_TRACE=served.jsonl quanta run ...      # the steps, plans included
    quanta step-replay served.jsonl --out alone.jsonl  # the same plans, nothing else running

A step trace says what each served step took, and ``quanta step-report`` compares that with
the cost model, but a gap there has two causes that call for different mends: the model's
shape (the engine alone would take as long: calibrate better) or the serving (the HTTP
server, the streams and the client take CPU from the engine's threads: model the server).
Replaying the very plans on an engine with nothing beside it separates the two: per kind of
step, the served engine's time over the replayed one's.

The replay keeps the run's pace: before each step it waits the gap the server left (idle
periods included: the first step after an idle second runs colder), unless told not to.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from statistics import fmean, median

import msgspec

from quanta_core.engine.errors import EngineDied, EngineInputError
from quanta_core.engine.protocol import Executor
from quanta_core.sim.fit import group_of
from quanta_core.sim.step_trace import StepRecord, batch_bucket


def replayable(records: Sequence[StepRecord]) -> list[StepRecord]:
    """The records to replay; a trace must carry its plans (``QUANTA_STEP_TRACE`` records them)."""
    if not records:
        raise ValueError("the trace has no step")
    missing = sum(1 for r in records if r.plan is None)
    if missing:
        raise ValueError(
            f"{missing} of {len(records)} steps have no plan: the trace was written before "
            "plans were recorded; record the run again"
        )
    return list(records)


class ReplayStopped(Exception):
    """The engine refused or lost a step: a trace across a worker restart, or one recorded
    with another model or context, cannot be replayed past it."""

    def __init__(self, step: int, total: int, cause: Exception) -> None:
        super().__init__(f"step {step} of {total}: {cause}")
        self.step = step


def replay(
    records: Sequence[StepRecord],
    executor: Executor,
    keep_gaps: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    on_step: Callable[[int], None] | None = None,
) -> None:
    """Run every record's plan on ``executor`` in order (wrap it in a ``StepTracer`` to time
    them), waiting each record's gap first when ``keep_gaps``; ``ReplayStopped`` says where
    the engine refused."""
    records = replayable(records)
    for i, record in enumerate(records):
        if keep_gaps and record.gap:
            sleep(record.gap)
        assert record.plan is not None  # replayable() checked
        try:
            executor.step(record.plan)
        except (EngineInputError, EngineDied) as exc:
            raise ReplayStopped(i + 1, len(records), exc) from exc
        if on_step is not None:
            on_step(i + 1)


class ReplayRow(msgspec.Struct, frozen=True):
    """Steps of one kind and batch-size bucket, served and replayed, in ms per step."""

    kind: str
    max_batch: int
    steps: int
    served_ms: float  # the served engine's mean
    alone_ms: float  # the replayed engine's mean
    ratio_median: float  # the median of served / alone, step by step

    @property
    def ratio(self) -> float:
        """The served engine's time over the engine alone's, for these steps together."""
        return self.served_ms / self.alone_ms if self.alone_ms else 0.0


def compare_replay(
    served: Sequence[StepRecord], alone: Sequence[StepRecord]
) -> tuple[list[ReplayRow], ReplayRow]:
    """Rows per (kind, batch bucket) and one over every step that ran a batch; the two traces
    pair step by step (the replay of ``served``)."""
    if len(served) != len(alone):
        raise ValueError(f"the replay has {len(alone)} steps, the served trace {len(served)}")
    groups: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for s, a in zip(served, alone, strict=True):
        f = s.features
        if f.decode_tokens + f.prefill_tokens and a.engine > 0:
            groups[(group_of(f).value, batch_bucket(f.seqs))].append((s.engine, a.engine))
    if not groups:
        raise ValueError("the traces have no step that ran a batch")

    def row(kind: str, max_batch: int, pairs: list[tuple[float, float]]) -> ReplayRow:
        return ReplayRow(
            kind=kind,
            max_batch=max_batch,
            steps=len(pairs),
            served_ms=1e3 * fmean(s for s, _ in pairs),
            alone_ms=1e3 * fmean(a for _, a in pairs),
            ratio_median=median(s / a for s, a in pairs),
        )

    rows = [row(kind, b, groups[(kind, b)]) for kind, b in sorted(groups)]
    every = [p for pairs in groups.values() for p in pairs]
    return rows, row("all", max(b for _, b in groups), every)
