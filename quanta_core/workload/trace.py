"""The Azure LLM inference trace (2023): parsed and replayed, time- and length-scaled.

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

Prompt text is not part of the trace: a replay sends a prompt of ContextTokens tokens and
forces GeneratedTokens tokens out (max_tokens and ignore-EOS).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from quanta_core.workload.spec import TraceSpec


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival: float  # seconds since the trace's first request
    prompt_tokens: int
    output_tokens: int


def _timestamp(text: str) -> float:
    # Seven fractional digits: more than datetime parses, so split the fraction off.
    whole, _, fraction = text.strip().partition(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    return base + (float("0." + fraction) if fraction else 0.0)


def parse_azure_csv(text: str) -> list[TraceRow]:
    reader = csv.DictReader(io.StringIO(text))
    raw = [
        (_timestamp(r["TIMESTAMP"]), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
        for r in reader
    ]
    if not raw:
        return []
    t0 = min(t for t, _, _ in raw)
    return [TraceRow(t - t0, p, o) for t, p, o in sorted(raw)]


def read_trace(path: str) -> list[TraceRow]:
    with open(path, encoding="utf-8") as f:
        return parse_azure_csv(f.read())


def _scale(n: int, factor: float, cap: int | None) -> int:
    scaled = max(1, round(n * factor))
    return scaled if cap is None else min(cap, scaled)


def replay(rows: Sequence[TraceRow], spec: TraceSpec) -> Iterator[TraceRow]:
    """The rows a replay sends: skipped, scaled, clipped, with arrivals from 0."""
    kept = [r for r in rows if r.arrival >= spec.start_s]
    if not kept:
        return
    origin = kept[0].arrival
    for k, r in enumerate(kept):
        if spec.limit is not None and k >= spec.limit:
            return
        arrival = (r.arrival - origin) * spec.time_scale
        if spec.duration_s is not None and arrival >= spec.duration_s:
            return
        yield TraceRow(
            arrival,
            _scale(r.prompt_tokens, spec.prompt_scale, spec.max_prompt),
            _scale(r.output_tokens, spec.output_scale, spec.max_output),
        )
