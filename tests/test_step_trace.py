"""The step trace: what a real server's steps were and took, against the cost model."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli
from app.lab.fidelity.cross import cross_model
from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import SeqSlice, Stash, StepPlan
from quanta_core.sim.cost_model import CostModel, StepFeatures, features_of
from quanta_core.sim.executor import SimExecutor
from quanta_core.sim.server_cost import fit_server_cost
from quanta_core.sim.step_trace import (
    StepRecord,
    StepTracer,
    compare_trace,
    in_run,
    read_trace,
    server_cost_of,
    speed_profile,
)

MODEL = CostModel(per_pass=0.01, per_decode=0.002, per_prefill=0.003)


class ScriptedClock:
    def __init__(self, *times: float) -> None:
        self._times = list(times)

    def now(self) -> float:
        return self._times.pop(0)


class KeptOpen(io.StringIO):
    def close(self) -> None:  # the test reads it after the tracer closed it
        self.closed_by_tracer = True


PREFILL = StepPlan(slices=(SeqSlice(0, (5, 6, 7, 8), 0, sample=True, owner="a"),))
DECODE = StepPlan(
    slices=(SeqSlice(0, (9,), 4, sample=True, owner="a"), SeqSlice(1, (3,), 0, owner="b"))
)


def test_every_step_is_recorded_with_its_features_times_and_the_gap_before_it() -> None:
    sink = KeptOpen()
    # (start, end) of three steps: 0.0-0.1, 0.25-0.3, 0.3-0.35
    tracer = StepTracer(
        SimExecutor(FakeExecutor().info, MODEL), ScriptedClock(0.0, 0.1, 0.25, 0.3, 0.3, 0.35), sink
    )
    tracer.step(PREFILL)
    tracer.step(DECODE)
    tracer.step(StepPlan(kv_ops=(Stash(1, "k"),)))
    tracer.close()
    assert sink.closed_by_tracer
    records = read_trace(io.StringIO(sink.getvalue()))
    assert [r.start for r in records] == [0.0, 0.25, 0.3]
    assert [r.gap for r in records] == [None, pytest.approx(0.15), pytest.approx(0.0)]
    assert [r.total for r in records] == [
        pytest.approx(0.1),
        pytest.approx(0.05),
        pytest.approx(0.05),
    ]
    assert records[0].features == features_of(PREFILL, {}, {})
    assert records[1].features.decode_tokens == 2
    assert records[0].engine == pytest.approx(MODEL.predict(records[0].features))
    assert [r.kv_ops for r in records] == [0, 0, 1]
    assert records[2].features.stash_tokens == 1  # the tracer knows what sequence 1 held
    assert [r.plan for r in records] == [PREFILL, DECODE, StepPlan(kv_ops=(Stash(1, "k"),))]


def test_a_trace_written_before_plans_were_recorded_still_reads() -> None:
    line = '{"start":1.0,"gap":null,"engine":0.01,"total":0.011,"kv_ops":0,"f":[1,1,0]}\n'
    (record,) = read_trace(io.StringIO(line))
    assert record.plan is None
    assert record.features.decode_tokens == 1


def _record(f: tuple[float, ...], engine: float, gap: float | None, kv_ops: int = 0) -> StepRecord:
    return StepRecord(start=0.0, gap=gap, engine=engine, total=engine + 0.001, kv_ops=kv_ops, f=f)


def test_steps_are_grouped_by_kind_and_batch_and_compared_with_the_prediction() -> None:
    decode1 = (1, 1, 0, 0.1, 0.0, 0.1)
    decode3 = (3, 3, 0, 0.3, 0.0, 0.3)
    mixed = (2, 1, 16, 0.5, 0.0, 0.5)
    records = [
        _record(decode1, 0.012, None),
        _record(decode1, 0.012, 0.004),
        _record(decode1, 0.012, 0.005),
        _record(decode1, 0.012, 30.0),  # the server was idle: the median does not see it
        _record(decode3, 0.020, 0.002),  # the model says 16 ms: 20% under
        _record(mixed, 0.100, 0.006),
        _record((0, 0, 0, 0, 0, 0), 0.001, 0.001, kv_ops=1),  # only freed a sequence: left out
    ]
    rows, overall = compare_trace(records, MODEL.predict)
    assert [(r.kind, r.max_batch, r.steps) for r in rows] == [
        ("decode", 1, 4),
        ("decode", 4, 1),
        ("mixed", 2, 1),
    ]
    one, three, mix = rows
    assert one.engine_ms == pytest.approx(12.0)
    assert one.predicted_ms == pytest.approx(12.0) and one.error_pct == pytest.approx(0.0)
    assert one.gap_ms == pytest.approx(5.0)
    assert one.boundary_ms == pytest.approx(1.0)
    assert three.predicted_ms == pytest.approx(16.0) and three.error_pct == pytest.approx(-20.0)
    assert mix.predicted_ms == pytest.approx(10 + 2 + 48)
    assert overall.steps == 6 and overall.max_batch == 4
    assert overall.engine_ms == pytest.approx((48 + 20 + 100) / 6)
    slower = compare_trace(records, MODEL.predict, speed_factor=1.5)[1]
    assert slower.predicted_ms == pytest.approx(1.5 * overall.predicted_ms)
    # The machine as the run saw it: the same whichever factor the rows were predicted at.
    machine = in_run(slower, 1.5)
    assert machine == in_run(overall, 1.0)
    assert machine.speed_factor == pytest.approx(overall.engine_ms / overall.predicted_ms)
    assert machine.server_cycle_s == pytest.approx((overall.gap_ms + 1.0) / 1e3)
    with pytest.raises(ValueError, match="no step"):
        compare_trace(records[-1:], MODEL.predict)


def test_the_speed_profile_is_the_engines_time_over_the_models_per_bin_of_the_run() -> None:
    decode, prefill = (1, 1, 0, 0.1, 0.0, 0.1), (1, 0, 16, 0.136, 0.0, 0.016)

    def step(t: float, f: tuple[float, ...], speed: float) -> StepRecord:
        engine = speed * MODEL.predict(StepFeatures(*f))  # type: ignore[arg-type]
        return StepRecord(start=100.0 + t, gap=0.001, engine=engine, total=engine, kv_ops=0, f=f)

    # 10 s at 0.8 (a prefill among the decodes), 10 s at 1.2, 10 s idle, 5 s at 1.5
    records = [step(t, decode, 0.8) for t in range(10)] + [step(4.5, prefill, 0.8)]
    records += [step(t, decode, 1.2) for t in range(10, 20)]
    records.append(StepRecord(start=125.0, gap=5.0, engine=1.0, total=1.0, kv_ops=1, f=()))
    records += [step(t, decode, 1.5) for t in range(30, 35)]
    profile = speed_profile(records, MODEL.predict, bin_s=10.0)
    run = (0.8 * (10 * 0.012 + 0.058) + 1.2 * 10 * 0.012 + 1.5 * 5 * 0.012) / (25 * 0.012 + 0.058)
    assert profile.factors == pytest.approx((0.8, 1.2, run, 1.5))  # idle: the run's factor
    assert [profile.at(t) for t in (-1.0, 9.99, 10.0, 34.0, 99.0)] == pytest.approx(
        [0.8, 0.8, 1.2, 1.5, 1.5]
    )
    with pytest.raises(ValueError, match="no step"):
        speed_profile(records[21:22], MODEL.predict)  # only freed a sequence


def test_step_report_prints_and_writes_the_comparison(tmp_path: Path) -> None:
    model_path = tmp_path / "tiny__machine.json"
    MODEL.save(model_path)
    trace = tmp_path / "steps.jsonl"
    tracer = StepTracer(
        SimExecutor(FakeExecutor().info, MODEL), ScriptedClock(0.0, 0.1, 0.2, 0.3), trace.open("w")
    )
    tracer.step(PREFILL)
    tracer.step(DECODE)
    tracer.close()
    out = tmp_path / "report.json"
    args = ["step-report", str(trace), "--cost-model", str(model_path), "--speed-factor", "2"]
    result = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "engine steps vs the cost model" in result.output
    doc = json.loads(out.read_text())
    assert [(r["kind"], r["steps"]) for r in doc["rows"]] == [("decode", 1), ("prefill", 1)]
    assert doc["all"]["error_pct"] == pytest.approx(100.0)  # the same model, twice as slow
    assert doc["in_run"]["speed_factor"] == pytest.approx(1.0)  # the engine was the model
    assert doc["speed_profile"]["factors"] == [pytest.approx(1.0)]
    missing = CliRunner().invoke(
        cli, ["step-report", str(tmp_path / "none.jsonl"), "--cost-model", str(model_path)]
    )
    assert missing.exit_code == 2 and "step-report" in missing.output


def test_a_cross_model_learns_the_shape_of_the_other_runs_steps_at_the_calibrations_speed() -> None:
    served = CostModel(per_pass=0.01, per_batched_pass=0.02, per_decode=0.003, per_prefill=0.004)
    calibrated = CostModel(per_pass=0.02, per_decode=0.001, per_stash=1e-5, per_restore=2e-5)

    def run(speed: float) -> list[StepRecord]:
        shapes = [StepFeatures(n, n, 0) for n in (1, 2, 4, 8, 16)]
        shapes += [StepFeatures(1, 0, p) for p in (16, 64, 256)]
        shapes += [StepFeatures(3, 2, 32), StepFeatures(9, 8, 128)]
        return [_record(tuple(f), speed * served.predict(f), 0.001) for f in shapes]

    # Each run's steps as fast as its machine was (its in-run factor): the held-out run's
    # steps, however odd, take no part.
    runs = {
        "a": (run(1.3), 1.3),
        "b": (run(0.8), 0.8),
        "held": ([_record((1, 1, 0), 9.0, 0.001)], 1.0),
    }
    model = cross_model("held", runs, calibrated)
    for name in ("per_pass", "per_batched_pass", "per_decode", "per_prefill"):
        assert getattr(model, name) == pytest.approx(getattr(served, name), rel=1e-6)
    assert (model.per_stash, model.per_restore) == (1e-5, 2e-5)  # not in a trace: kept
    assert model.meta["fit"]["points"] == 20


def test_the_server_cost_is_read_from_the_gaps_and_boundaries_per_streamed_token_count() -> None:
    def decode(streams: int, gap: float, boundary: float) -> StepRecord:
        plan = StepPlan(
            slices=tuple(SeqSlice(s, (9,), 4, sample=True, owner=f"o{s}") for s in range(streams))
        )
        f = features_of(plan, dict.fromkeys(range(streams), 4), {})
        return StepRecord(0.0, gap, 0.010, 0.010 + boundary, 0, tuple(f), plan)

    # 1 ms per cycle + 0.2 ms per streamed token, the boundary 0.3 ms of it; one long gap
    # per count (the server waited for an arrival) that the median ignores.
    records = [
        decode(n, 0.0007 + 0.0002 * n + (5.0 if i == 0 else 0.0), 0.0003)
        for n in (1, 4, 8)
        for i in range(7)
    ]
    records.append(decode(16, 0.0, 0.0))  # too rare a count to take a median of
    cost = server_cost_of(records)
    assert cost.per_cycle_s == pytest.approx(0.001)
    assert cost.per_token_s == pytest.approx(0.0002)
    with pytest.raises(ValueError, match="too few steps"):
        server_cost_of(records[:3])


@pytest.mark.parametrize(
    ("points", "cycle", "token"),
    [
        ([(1, 0.002), (2, 0.003), (4, 0.005)], 0.001, 0.001),
        ([(1, 0.003), (8, 0.002)], 0.0025, 0.0),  # falling: no per-token cost, the mean
        ([(1, 0.001), (2, 0.003)], 0.0, 0.0014),  # through the origin, not below it
        ([(3, 0.004)], 0.004, 0.0),
    ],
)
def test_fit_server_cost_keeps_both_terms_non_negative(
    points: list[tuple[int, float]], cycle: float, token: float
) -> None:
    cost = fit_server_cost(points)
    assert cost.per_cycle_s == pytest.approx(cycle)
    assert cost.per_token_s == pytest.approx(token)
