"""``quanta step-replay``: a served run's recorded plans run again on another executor."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from app.cli import cli
from app.lab.fidelity.replay import load_replays, peers
from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import SeqSlice, StepPlan, StepResult, Truncate
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.executor import SimExecutor
from quanta_core.sim.replay import compare_replay, replay
from quanta_core.sim.step_trace import StepRecord, StepTracer, read_trace

MODEL = CostModel(per_pass=0.01, per_decode=0.002, per_prefill=0.003)
PLANS = [
    StepPlan(slices=(SeqSlice(0, (5, 6, 7, 8), 0, sample=True, owner="a"),)),
    StepPlan(slices=(SeqSlice(0, (9,), 4, sample=True, owner="a"),)),
    StepPlan(
        slices=(
            SeqSlice(0, (10,), 5, sample=True, owner="a"),
            SeqSlice(1, (1, 2, 3), 0, sample=True, owner="b"),
        )
    ),
    StepPlan(kv_ops=(Truncate(0),)),
]


class TickClock:
    """Each reading 1 ms after the previous: the gaps and step times of a scripted run."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        self.t += 0.001
        return self.t


def _trace(executor: SimExecutor | FakeExecutor, plans: list[StepPlan]) -> list[StepRecord]:
    sink = io.StringIO()
    tracer = StepTracer(executor, TickClock(), sink)
    for plan in plans:
        tracer.step(plan)
    return read_trace(io.StringIO(sink.getvalue()))


class Recording(FakeExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.plans: list[StepPlan] = []

    def step(self, plan: StepPlan) -> StepResult:
        self.plans.append(plan)
        return super().step(plan)


def test_the_recorded_plans_run_again_in_order_after_their_gaps() -> None:
    served = _trace(SimExecutor(FakeExecutor().info, MODEL), PLANS)
    engine = Recording()
    waits: list[float] = []
    done: list[int] = []
    replay(served, engine, sleep=waits.append, on_step=done.append)
    assert engine.plans == PLANS
    assert waits == [pytest.approx(0.001)] * 3  # the first step has no gap before it
    assert done == [1, 2, 3, 4]
    engine = Recording()
    replay(served, engine, keep_gaps=False, sleep=waits.append)
    assert engine.plans == PLANS and len(waits) == 3


def test_a_trace_without_plans_is_refused_before_any_step_runs() -> None:
    served = _trace(SimExecutor(FakeExecutor().info, MODEL), PLANS)
    old = [StepRecord(r.start, r.gap, r.engine, r.total, r.kv_ops, r.f) for r in served]
    engine = Recording()
    with pytest.raises(ValueError, match="no plan"):
        replay(old, engine)
    assert engine.plans == []
    with pytest.raises(ValueError, match="no step"):
        replay([], engine)


def test_served_and_replayed_steps_pair_up_by_kind_and_batch() -> None:
    served = _trace(SimExecutor(FakeExecutor().info, MODEL), PLANS)
    alone = _trace(SimExecutor(FakeExecutor().info, MODEL.scaled(0.5)), PLANS)
    rows, overall = compare_replay(served, alone)
    # The truncate ran no batch: not a row.
    assert [(r.kind, r.max_batch, r.steps) for r in rows] == [
        ("decode", 1, 1),
        ("mixed", 2, 1),
        ("prefill", 1, 1),
    ]
    assert all(r.ratio == pytest.approx(2.0) for r in [*rows, overall])
    assert all(r.ratio_median == pytest.approx(2.0) for r in [*rows, overall])
    decode = rows[0]
    assert decode.served_ms == pytest.approx(1e3 * MODEL.predict(served[1].features))
    assert overall.steps == 3
    with pytest.raises(ValueError, match="3 steps"):
        compare_replay(served, alone[:3])


# ---- the command, on the real engine ----


@pytest.fixture
def small_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``quanta step-replay``'s engine: the default model, a small context, no config file."""
    monkeypatch.setenv("QUANTA_CONFIG", "")
    monkeypatch.setenv("QUANTA_N_CTX", "512")
    monkeypatch.setenv("QUANTA_N_SEQ_MAX", "4")


@pytest.mark.usefixtures("small_engine")
def test_step_replay_runs_a_trace_on_the_real_engine_and_reports_served_over_alone(
    tmp_path: Path,
) -> None:
    served = tmp_path / "served.jsonl"
    slow = CostModel(per_pass=5.0)  # "served" steps of 5 s: the real engine is far faster
    tracer = StepTracer(SimExecutor(FakeExecutor().info, slow), TickClock(), served.open("w"))
    for plan in PLANS:
        tracer.step(plan)
    tracer.close()
    alone, report = tmp_path / "alone.jsonl", tmp_path / "replay.json"
    args = ["step-replay", str(served), "--out", str(alone), "--report", str(report)]
    result = CliRunner().invoke(cli, [*args, "--no-keep-gaps"])
    assert result.exit_code == 0, result.output
    assert "the served engine against the same steps alone" in result.output
    with alone.open() as f:
        replayed = read_trace(f)
    assert [r.plan for r in replayed] == PLANS
    assert all(0 < r.engine < 1.0 for r in replayed[:3])
    doc = json.loads(report.read_text())
    assert [(r["kind"], r["max_batch"], r["steps"]) for r in doc["rows"]] == [
        ("decode", 1, 1),
        ("mixed", 2, 1),
        ("prefill", 1, 1),
    ]
    assert doc["all"]["ratio"] > 5.0


def test_step_replay_refuses_a_trace_without_plans(tmp_path: Path) -> None:
    old = tmp_path / "old.jsonl"
    old.write_text('{"start":1.0,"gap":null,"engine":0.01,"total":0.011,"kv_ops":0,"f":[1,1]}\n')
    result = CliRunner().invoke(cli, ["step-replay", str(old), "--out", str(tmp_path / "a")])
    assert result.exit_code == 2
    assert "no plan" in result.output and "record the run again" in " ".join(result.output.split())
    assert not (tmp_path / "a").exists()


# ---- quanta bench fidelity replay: what it reads of the fidelity runs ----


def test_fidelity_replay_reads_each_replayed_run_and_takes_the_toll_from_its_policys_peers(
    tmp_path: Path,
) -> None:
    served = _trace(SimExecutor(FakeExecutor().info, MODEL), PLANS)
    for key, probe, ratio, cycle in (
        ("fcfs-light", 1.1, 1.02, 0.001),
        ("fcfs-heavy", 0.9, 1.06, 0.003),
        ("sequential-light", 1.0, 1.12, 0.002),
    ):
        with (tmp_path / f"alone-{key}.jsonl").open("w") as f:
            f.writelines(line + "\n" for line in _lines(served))
        (tmp_path / f"probe-{key}.json").write_text(json.dumps({"speed_factor": probe}))
        steps_report = {"in_run": {"server_cycle_s": cycle, "speed_factor": 1.0}}
        (tmp_path / f"steps-{key}.json").write_text(json.dumps(steps_report))
        (tmp_path / f"replay-{key}.json").write_text(json.dumps({"all": {"ratio": ratio}}))
    CostModel().save(tmp_path / "replay-model-fcfs-light.json")  # a previous pass's output
    runs = load_replays(tmp_path)
    assert sorted(runs) == ["fcfs-heavy", "fcfs-light", "sequential-light"]
    light = runs["fcfs-light"]
    assert len(light.steps) == 3  # the truncate-only step is not a served step
    assert (light.probe_factor, light.served_over_alone, light.server_cycle_s) == (
        1.1,
        1.02,
        0.001,
    )
    assert peers("fcfs-light", runs) == [runs["fcfs-heavy"]]  # the same policy only
    assert peers("sequential-light", runs) == [runs["fcfs-heavy"], runs["fcfs-light"]]


def _lines(records: list[StepRecord]) -> list[str]:
    return [msgspec.json.encode(r).decode() for r in records]


@pytest.mark.usefixtures("small_engine")
def test_step_replay_stops_with_a_clear_error_at_a_step_the_engine_refuses(
    tmp_path: Path,
) -> None:
    # A trace recorded across a worker restart: its second step continues a sequence from
    # where the lost worker had it, which the engine replaying it does not hold.
    served = tmp_path / "served.jsonl"
    first, second = _trace(SimExecutor(FakeExecutor().info, MODEL), PLANS[:2])
    lost = StepPlan(slices=(SeqSlice(0, (9,), 8, sample=True, owner="a"),))
    served.write_text("\n".join(_lines([first, msgspec.structs.replace(second, plan=lost)])))
    alone = tmp_path / "alone.jsonl"
    result = CliRunner().invoke(cli, ["step-replay", str(served), "--out", str(alone)])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "step 2 of 2" in text and "starts at position 8" in text
    with alone.open() as f:
        assert [r.plan for r in read_trace(f)] == [PLANS[0]]  # the first step ran
    nowhere = CliRunner().invoke(
        cli, ["step-replay", str(served), "--out", str(tmp_path / "no" / "dir.jsonl")]
    )
    assert nowhere.exit_code == 2 and "step-replay" in nowhere.output
