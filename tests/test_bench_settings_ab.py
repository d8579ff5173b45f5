"""The settings A/B's reading of step traces: which steps count, and the step cycle."""

from __future__ import annotations

import argparse

import pytest

from quanta_core.engine.types import SeqSlice, StepPlan, Truncate
from quanta_core.sim.step_trace import StepRecord
from scripts.bench_settings_ab import decode_batch, settings_arg, step_figures


def decode(streams: int, pos: int = 10) -> StepPlan:
    return StepPlan(slices=tuple(SeqSlice(s, (5,), pos, True, f"o{s}") for s in range(streams)))


def record(plan: StepPlan | None, gap: float | None, engine: float, total: float) -> StepRecord:
    return StepRecord(start=0.0, gap=gap, engine=engine, total=total, kv_ops=0, f=(), plan=plan)


def test_only_steps_that_decode_one_token_per_stream_count() -> None:
    assert decode_batch(record(decode(3), 0.001, 0.01, 0.011)) == 3
    prefill = StepPlan(slices=(SeqSlice(0, (1, 2, 3), 0, True, "p"),))
    assert decode_batch(record(prefill, 0.001, 0.01, 0.011)) is None
    mixed = StepPlan(slices=(*decode(1).slices, SeqSlice(1, (1, 2), 0, True, "p")))
    assert decode_batch(record(mixed, 0.001, 0.01, 0.011)) is None
    freed = StepPlan(kv_ops=(Truncate(0),), slices=decode(1).slices)
    assert decode_batch(record(freed, 0.001, 0.01, 0.011)) is None
    assert decode_batch(record(None, 0.001, 0.01, 0.011)) is None
    assert decode_batch(record(StepPlan(), 0.001, 0.01, 0.011)) is None


def test_figures_are_medians_per_batch_and_a_cycle_is_a_step_and_the_gap_after_it() -> None:
    ms = 1e-3
    records = [
        record(decode(1), None, 10 * ms, 10.2 * ms),  # the first step: no gap, not counted
        record(decode(1), 0.3 * ms, 10 * ms, 10.2 * ms),
        record(decode(1), 0.5 * ms, 12 * ms, 12.4 * ms),
        record(decode(1), 0.4 * ms, 11 * ms, 11.3 * ms),
        record(decode(2), 5.0 * ms, 20 * ms, 21.0 * ms),  # another batch: ends the cycles of 1
        record(StepPlan(kv_ops=(Truncate(0),)), 0.1 * ms, 1 * ms, 1.1 * ms),
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
