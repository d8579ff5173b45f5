"""The settings A/B's reading of step traces: which steps count, and the step cycle."""

from __future__ import annotations

import argparse

import pytest

from app.lab.measure.settings_ab import decode_batch, settings_arg, step_figures
from quanta_core.sim.cost_model import StepFeatures
from quanta_core.sim.step_trace import StepRecord


def decode(streams: int) -> StepFeatures:
    return StepFeatures(seqs=streams, decode_tokens=streams)


def record(f: StepFeatures, gap: float | None, engine: float, total: float) -> StepRecord:
    return StepRecord(start=0.0, gap=gap, engine=engine, total=total, kv_ops=0, f=tuple(f))


def test_only_steps_that_decode_one_token_per_stream_count() -> None:
    assert decode_batch(record(decode(3), 0.001, 0.01, 0.011)) == 3
    prefill = StepFeatures(seqs=1, prefill_tokens=3)
    assert decode_batch(record(prefill, 0.001, 0.01, 0.011)) is None
    mixed = StepFeatures(seqs=2, decode_tokens=1, prefill_tokens=2)
    assert decode_batch(record(mixed, 0.001, 0.01, 0.011)) is None
    stash = StepFeatures(seqs=1, decode_tokens=1, stash_tokens=100)
    assert decode_batch(record(stash, 0.001, 0.01, 0.011)) is None
    assert decode_batch(record(StepFeatures(), 0.001, 0.01, 0.011)) is None


def test_figures_are_medians_per_batch_and_a_cycle_is_a_step_and_the_gap_after_it() -> None:
    ms = 1e-3
    records = [
        record(decode(1), None, 10 * ms, 10.2 * ms),  # the first step: no gap, not counted
        record(decode(1), 0.3 * ms, 10 * ms, 10.2 * ms),
        record(decode(1), 0.5 * ms, 12 * ms, 12.4 * ms),
        record(decode(1), 0.4 * ms, 11 * ms, 11.3 * ms),
        record(decode(2), 5.0 * ms, 20 * ms, 21.0 * ms),  # another batch: ends the cycles of 1
        record(StepFeatures(), 0.1 * ms, 1 * ms, 1.1 * ms),  # only frees sequences
    ]
    figures = step_figures(records)
    assert set(figures) == {1, 2}
    one = figures[1]
    assert one["steps"] == 3
    assert one["engine_ms"] == pytest.approx(11.0)
    assert one["boundary_ms"] == pytest.approx(0.3)
    assert one["gap_ms"] == pytest.approx(0.4)
    # cycles of the counted steps: 10.2 + 0.5 and 12.4 + 0.4; the last step of one stream is
    # followed by a step of two, so it has none
    assert one["cycle_ms"] == pytest.approx((10.7 + 12.8) / 2)
    assert figures[2]["steps"] == 1
    assert figures[2]["cycle_ms"] == 0.0  # the next step does not decode


def test_settings_are_quanta_names_with_values() -> None:
    assert settings_arg("QUANTA_CALL_SPIN_S=0") == ("QUANTA_CALL_SPIN_S", "0")
    assert settings_arg("QUANTA_POLICY=fcfs=x") == ("QUANTA_POLICY", "fcfs=x")
    for bad in ("CALL_SPIN_S=0", "QUANTA_CALL_SPIN_S"):
        with pytest.raises(argparse.ArgumentTypeError):
            settings_arg(bad)
