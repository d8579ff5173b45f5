"""The Azure LLM inference trace (2023): parsed and replayed, time- and length-scaled.

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

Prompt text is not part of the trace: a replay sends a prompt of ContextTokens tokens and
forces GeneratedTokens tokens out (max_tokens and ignore-EOS).
"""

from __future__ import annotations

import csv
import functools
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from quanta_core.workload.spec import TraceSpec

_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival: float  # seconds since the trace's first request
    prompt_tokens: int
    output_tokens: int


_WHOLE = re.compile(r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


@functools.cache
def _day_start(year: int, month: int, day: int) -> int:
    """Seconds from the epoch to the day's midnight, UTC."""
    return int(datetime(year, month, day, tzinfo=UTC).timestamp())


def _seconds(whole: str) -> float:
    """``whole`` (``%Y-%m-%d %H:%M:%S``, UTC) in seconds from the epoch, as ``strptime``'s
    datetime gives them: a valid time in the trace's own shape (every field its full width)
    without ``strptime``, which took most of a trace's parse; anything else through it."""
    m = _WHOLE.fullmatch(whole)
    if m is not None:
        year, month, day, hour, minute, second = map(int, m.groups())
        if hour < 24 and minute < 60 and second < 60 and 1 <= month <= 12:
            try:
                start = _day_start(year, month, day)
            except ValueError:
                pass  # not a day: strptime says why
            else:
                return float(start + hour * 3600 + minute * 60 + second)
    return datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def _timestamp(text: str) -> float:
    # Seven fractional digits: more than datetime parses, so split the fraction off.
    whole, _, fraction = text.strip().partition(".")
    return _seconds(whole) + (float("0." + fraction) if fraction else 0.0)


def parse_azure_csv(text: str) -> list[TraceRow]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        return []
    at, prompt, output = (header.index(k) for k in _COLUMNS)
    raw = [(_timestamp(r[at]), int(r[prompt]), int(r[output])) for r in reader if r]
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
