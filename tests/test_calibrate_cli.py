"""``quanta calibrate``: its grid, its runner and the reference probe (on the fake executor),
--refit, --probe-only, and one real run."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import msgspec
import pytest
import typer
from typer.testing import CliRunner

from app.lab.calibrate import command as cal
from app.lab.calibrate import grid as grid_module
from app.lab.calibrate import machine, probe, served
from app.lab.calibrate.command import calibrate
from app.lab.calibrate.grid import (
    FULL,
    QUICK,
    STREAMS,
    GridRunner,
    GridSpec,
    Kind,
    Point,
    build_grid,
    visit_order,
)
from quanta_core.engine import CopyPrefix, EngineInfo, Restore, Stash, StepPlan
from quanta_core.engine.fake import FakeExecutor
from quanta_core.scheduler.config import SchedulerConfig
from quanta_core.sim.cost_model import CostModel, StepFeatures
from quanta_core.sim.fit import Group, Sample, group_of, load_samples, save_samples
from quanta_core.workload import build_plan

TRUE = CostModel(
    per_pass=0.004,
    per_batched_pass=0.009,
    per_decode=0.0005,
    per_prefill=0.011,
    per_attended=0.006,
    per_batch_kv=0.00002,
    per_kv_held=0.0001,
    per_stash=0.00008,
    per_restore=0.00007,
)


def command() -> typer.Typer:
    app = typer.Typer()
    app.command()(calibrate)
    return app


def fake_samples(spec: GridSpec = QUICK) -> list[Sample]:
    """The grid run on the fake executor, timed by ``TRUE`` instead of a clock."""
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    runner = GridRunner(ex)
    runner.run(visit_order(build_grid(spec, 8192, 64, 512, 128), spec.repeats))
    return [dataclasses.replace(s, seconds=TRUE.predict(s.features)) for s in runner.samples]


class Record:
    """A ``Watcher`` that keeps what it was told."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.visited_points: list[Point] = []

    def starting(self, what: str) -> None:
        self.started.append(what)

    def visited(self, point: Point) -> None:
        self.visited_points.append(point)


# ---- the grid ----


@pytest.mark.parametrize("spec", [FULL, QUICK])
def test_grid_exercises_every_group(spec: GridSpec) -> None:
    kinds = Counter(p.kind for p in build_grid(spec, 8192, 64, 512, 128))
    assert set(kinds) == set(Kind) - {Kind.DEEP}  # one buffer: no deep mixed points


def test_the_streams_grid_reaches_long_contexts_with_1_to_8_sequences() -> None:
    # 16 streams of 4,096 cells (QUANTA_N_CTX=65536, QUANTA_N_SEQ_MAX=16), budget 128.
    grid = build_grid(STREAMS, 65536, 16, 512, 128, stream_cells=4096)
    assert set(p.kind for p in grid) == set(Kind)
    decodes = {(p.context, p.batch) for p in grid if p.kind is Kind.DECODE and not p.idle}
    assert {(1024, b) for b in (1, 2, 4, 8)} | {(3072, b) for b in (1, 2, 4)} <= decodes
    assert (3072, 8) not in decodes  # 24k cells held: over max_held, the fills' bound
    deep = {(p.batch, p.context, p.chunk) for p in grid if p.kind is Kind.DEEP}
    assert deep == {(4, 64, 125), (8, 64, 121), (4, 1024, 125), (8, 1024, 121), (4, 3072, 125)}
    prefills = {(p.context, p.chunk) for p in grid if p.kind is Kind.PREFILL}
    assert {(3072, 16), (3072, 128), (3072, 256)} <= prefills
    idle = {(p.batch, p.idle) for p in grid if p.idle}
    assert idle == {(1, 1000), (4, 1000)}
    for p in grid:  # every step's cells fit its sequence's stream
        assert p.context + max(p.chunk, 1) <= 4096
        assert p.batch * p.context <= STREAMS.max_held
    # in a stream of 2,048 cells the 3k points do not fit
    small = build_grid(STREAMS, 16 * 2048, 16, 512, 128, stream_cells=2048)
    assert max(p.context + max(p.chunk, 1) for p in small) <= 2048


# ---- the runner, on the fake executor ----


def test_visits_are_repeat_major_each_pass_shuffled_and_seeded() -> None:
    grid = build_grid(FULL, 8192, 64, 512, 128)
    visits = visit_order(grid, 3)
    passes = [visits[i * len(grid) : (i + 1) * len(grid)] for i in range(3)]
    for one in passes:
        assert sorted(one, key=grid.index) == grid  # every point once per pass
    assert len({tuple(one) for one in passes}) == 3  # each pass in its own order
    assert passes[0] != grid
    assert visit_order(grid, 3) == visits
    assert visit_order(grid, 3, seed=1) != visits


def test_runner_runs_the_full_grid_with_identical_repeats_and_leaves_the_engine_empty() -> None:
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    grid = build_grid(FULL, 8192, 64, 512, 128)
    visits = visit_order(grid, 2)
    runner = GridRunner(ex)
    watcher = Record()
    runner.run(visits, watcher)
    assert watcher.visited_points == visits
    assert ex.memory_stats().sequences == ()
    assert ex.memory_stats().n_stashes == 0
    by_point: dict[str, list[Sample]] = {}
    for s in runner.samples:
        by_point.setdefault(s.point, []).append(s)
    for point, runs in by_point.items():
        if point.startswith("fill"):
            assert len(runs) == 1
            assert group_of(runs[0].features) is Group.PREFILL
            continue
        # Each visit: a warm-up, then the measured run.
        assert [r.warmup for r in runs] == [True, False, True, False], point
        assert len({r.features for r in runs}) == 1, point  # each run is undone
        assert len({r.kv_held for r in runs}) == 1, point  # and restored the same
    assert {group_of(s.features) for s in runner.samples} == set(Group) - {Group.EMPTY}
    # The fills come first, one per context, then the passes: a point's measured runs are
    # far apart in time, the rest of a pass between them.
    fills = [i for i, s in enumerate(runner.samples) if s.point.startswith("fill")]
    assert fills == list(range(len(fills)))
    times = [s.t for s in runner.samples]
    assert times == sorted(times)
    per_visit = {p.label: 4 if p.kind is Kind.STASH else 2 for p in grid}
    second_pass = len(fills) + sum(per_visit.values())  # the first sample of the second pass
    for point, runs in by_point.items():
        if not point.startswith("fill"):
            first, second = (runner.samples.index(r) for r in runs if not r.warmup)
            assert first < second_pass <= second, point


def test_only_the_points_own_sequences_hold_kv_while_it_runs() -> None:
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    runner = GridRunner(ex)
    points = [
        Point(Kind.DECODE, 4, 64),
        Point(Kind.DECODE, 2, 64, idle=300),  # and the idle sequence, beside the batch
        Point(Kind.PREFILL, 1, 256, 16),
        Point(Kind.DECODE, 2, 64),
    ]
    runner.run(points)
    timed = [s for s in runner.samples if not s.point.startswith("fill")]
    assert [(s.point, s.kv_held, s.features.idle_k) for s in timed] == [
        *[("decode 4 at 64", 256, 0.0)] * 2,
        *[("decode 2 at 64 beside 300", 428, 0.3)] * 2,
        *[("prefill 16 at 256", 256, 0.0)] * 2,
        *[("decode 2 at 64", 128, 0.0)] * 2,
    ]
    assert ex.memory_stats().n_stashes == 0


def test_kv_copies_go_in_plans_under_the_wires_frame_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 16 sequences of 64 tokens at the fake's 1 KiB a token: 64 KiB each, so with the bound at
    # 200 KiB a plan copies at most 3 of them (the fill's 16 stashes in 6 plans).
    monkeypatch.setattr(grid_module, "KV_COPY_BYTES", 200 * 1024)
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    runner = GridRunner(ex)
    runner.run([Point(Kind.DECODE, 16, 64)])
    copies = [sum(isinstance(op, Stash | Restore) for op in plan.kv_ops) for plan in ex.steps]
    assert max(copies) == 3
    assert sum(copies) == 16 + 16 + 16  # stashed after the fill, restored, stashed back
    assert ex.memory_stats().n_stashes == 0


# ---- the reference probe ----


def test_the_probe_runs_the_same_fixed_work_every_time_and_leaves_the_engine_empty() -> None:
    ex = FakeExecutor(n_ctx=4096, n_seq_max=16, n_batch=512)

    def step(plan: StepPlan) -> float:
        ex.step(plan)
        return 0.001 * plan.num_tokens + 0.002 * bool(plan.slices)

    first = probe.measure_probe(step, ex.info.n_vocab)
    plans = list(ex.steps)
    second = probe.measure_probe(step, ex.info.n_vocab, at_s=5.0)
    assert ex.steps[len(plans) :] == plans
    assert ex.memory_stats().sequences == ()
    runs = sum(1 + p.runs for p in probe.PARTS)
    assert sum(1 for p in plans if p.slices) == runs
    assert first.parts == second.parts
    assert first.parts == pytest.approx(
        {"prefill 128": 0.130, "decode 1 at 128": 0.003, "decode 16 at 128": 0.018}
    )
    assert first.total_s == pytest.approx(0.130 + 32 * 0.003 + 4 * 0.018)
    assert second.to_json()["at_s"] == 5.0


def test_the_runner_probes_at_the_start_after_the_fills_every_n_visits_and_at_the_end() -> None:
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    grid = build_grid(QUICK, 8192, 64, 512, 128)
    visits = visit_order(grid, 2)
    runner = GridRunner(ex, probe_every=10)
    watcher = Record()
    runner.run(visits, watcher)
    expected = 1 + len(range(0, len(visits), 10)) + 1
    assert len(runner.probes) == expected
    assert watcher.started.count("reference probe") == expected
    assert watcher.started[0] == "reference probe"
    assert watcher.started[-1] == "reference probe"
    assert [r.at_s for r in runner.probes] == sorted(r.at_s for r in runner.probes)
    assert ex.memory_stats().sequences == ()
    assert ex.memory_stats().n_stashes == 0
    # A probe between visits leaves the next point's sequences as they should be.
    for s in runner.samples:
        if s.point.startswith("decode"):
            f = s.features
            cells = (f.kv_held_k + f.idle_k) * 1000 - f.decode_tokens
            assert s.kv_held == pytest.approx(cells), s.point
    summary = probe.summarise(runner.probes)
    assert summary["work"] == probe.WORK
    assert len(summary["measurements"]) == expected
    assert summary["spread"] >= 1.0
    assert set(summary["parts"]) == {p.name for p in probe.PARTS}


@pytest.mark.parametrize("probe_every", [5, 0])
def test_the_interlude_runs_after_the_fills_and_each_probe_between_visits_on_an_empty_engine(
    probe_every: int,
) -> None:
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    visits = visit_order(build_grid(QUICK, 8192, 64, 512, 128), 2)
    runner = GridRunner(ex, probe_every=probe_every)
    held: list[tuple[object, ...]] = []
    runner.interlude = lambda: held.append(ex.memory_stats().sequences)
    watcher = Record()
    runner.run(visits, watcher)
    calls = len(range(0, len(visits), probe_every)) if probe_every else 1
    assert calls > 1 or not probe_every
    assert held == [()] * calls
    said = watcher.started
    assert said.count("served requests") == calls
    last_fill = max(i for i, what in enumerate(said) if what.startswith("fill"))
    assert said.index("served requests") == last_fill + 1 + (1 if probe_every else 0)


def test_the_served_phase_serves_each_policy_and_leaves_the_engine_as_it_found_it() -> None:
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    spec = dataclasses.replace(served.QUICK_SERVED, policies=("sequential", "fcfs"))
    runner = GridRunner(ex)
    runner.fill([Point(Kind.DECODE, 2, 64)])
    runner.hold(0, 0)  # the grid's sequences wait in host RAM, as between visits
    stashes = ex.memory_stats().n_stashes
    serving = served.ServedRunner(ex, SchedulerConfig(prefix_cache_tokens=64), spec, runner.t0)
    serving.segment()
    serving.segment()
    assert ex.memory_stats().sequences == ()  # the prefix cache's holders were freed
    assert ex.memory_stats().n_stashes == stashes
    assert serving.segments == 2
    points = Counter(s.point.split()[1] for s in serving.samples)
    assert set(points) == {"sequential", "fcfs"}
    assert all(s.served and s.point.startswith("served ") for s in serving.samples)
    # Every request's prompt was prefilled and its answer decoded, in each segment.
    prefilled = sum(s.features.prefill_tokens for s in serving.samples)
    plans = [build_plan(serving.workload(p, k)) for p in spec.policies for k in (0, 1)]
    assert prefilled == sum(r.prompt_tokens for plan in plans for r in plan)
    assert serving.describe()["steps"] == len(serving.samples)


def test_served_steps_are_binned_by_policy_kind_and_batch_size() -> None:
    assert served.bin_label("fcfs", Group.DECODE, 1) == "served fcfs decode ≤1"
    assert served.bin_label("fcfs", Group.DECODE, 3) == "served fcfs decode ≤4"
    assert served.bin_label("static", Group.MIXED, 64) == "served static mixed ≤64"
    assert served.bin_label("static", Group.MIXED, 65) == "served static mixed ≤256"


def test_speed_factor_is_now_over_the_calibrations_probe(tmp_path: Path) -> None:
    parts = {p.name: 0.01 for p in probe.PARTS}
    then = probe.ProbeResult(parts)
    model = CostModel(per_pass=0.01, meta={"probe": probe.summarise([then])})
    assert probe.calibrated_probe_s(model) == pytest.approx(then.total_s)
    now = probe.ProbeResult({name: 0.0125 for name in parts})
    assert probe.speed_factor(now.total_s, model) == pytest.approx(1.25)
    report = probe.probe_report(now, model, tmp_path / "m.json", {"threads": 2})
    assert report["speed_factor"] == pytest.approx(1.25)
    assert report["threads"] == 2
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(report))
    assert probe.load_probe_total(path) == pytest.approx(now.total_s)
    with pytest.raises(ValueError, match="no reference probe"):
        probe.speed_factor(1.0, CostModel())
    other = CostModel(meta={"probe": {**probe.summarise([then]), "work": "something else"}})
    assert probe.calibrated_probe_s(other) is None
    path.write_text(json.dumps({**report, "work": "something else"}))
    with pytest.raises(ValueError, match="another probe"):
        probe.load_probe_total(path)


def test_probe_only_prints_and_writes_the_speed_factor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calibrated = probe.ProbeResult({p.name: 0.01 for p in probe.PARTS})
    model_file = tmp_path / "m.json"
    CostModel(per_pass=0.01, meta={"probe": probe.summarise([calibrated])}).save(model_file)
    now = probe.ProbeResult({p.name: 0.012 for p in probe.PARTS})
    monkeypatch.setattr(cal, "measure_probe_alone", lambda settings: now)
    out = tmp_path / "probe.json"
    args = ["--probe-only", "--cost-model", str(model_file), "--out", str(out)]
    result = CliRunner().invoke(command(), args)
    assert result.exit_code == 0, result.output
    assert "this machine now runs the probe in" in result.output
    assert "speed factor" in result.output and "1.200" in result.output
    doc = json.loads(out.read_text())
    assert doc["speed_factor"] == pytest.approx(1.2)
    assert doc["cost_model"] == str(model_file)
    # A cost model from before probes: the time, and no factor.
    CostModel(per_pass=0.01).save(model_file)
    result = CliRunner().invoke(command(), args)
    assert result.exit_code == 0, result.output
    assert "no speed factor" in " ".join(result.output.split())
    assert json.loads(out.read_text())["speed_factor"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--probe-only", "--quick"], "--probe-only measures the probe alone"),
        (["--probe-only", "--refit", "s.json"], "--probe-only measures the probe alone"),
        (["--cost-model", "m.json"], "--cost-model goes with --probe-only"),
    ],
)
def test_probe_only_refuses_other_flags(args: list[str], message: str) -> None:
    result = CliRunner().invoke(command(), args)
    assert result.exit_code == 2
    assert message in result.output


# ---- where the file goes ----


def test_machine_slug_is_cpus_and_cpu_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_model", lambda: "Intel(R) Core(TM) i7-8550U CPU @ 1.80GHz")
    monkeypatch.setattr(cal.os, "cpu_count", lambda: 8)
    assert machine.machine_slug(8) == "8cpu-intel-core-i7-8550u"
    assert machine.machine_slug(2) == "8cpu-intel-core-i7-8550u-2t"
    assert cal.default_out("SmolLM2", "8cpu-x") == Path("config/cost_models/SmolLM2__8cpu-x.json")


# ---- (e) --refit: a samples file fitted again, no engine ----


def test_refit_from_a_samples_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    samples_file = tmp_path / "samples.json"
    save_samples(samples_file, fake_samples(), {"model_stem": "tiny", "machine": "2cpu-test"})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(command(), ["--refit", str(samples_file)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "config/cost_models/tiny__2cpu-test.json"
    model = CostModel.load(out)
    for name, value in TRUE.coefficients().items():
        assert getattr(model, name) == pytest.approx(value, rel=1e-6), name
    assert model.meta["refit_from"] == [str(samples_file)]
    assert set(model.meta["fit"]["errors"]) == {"all", "decode", "prefill", "mixed", "stash"}
    assert out.with_suffix(".png").stat().st_size > 0
    assert "per decode token" in result.output
    assert "MAPE" in result.output


def probe_summary(*totals: float) -> dict[str, object]:
    """A calibration's ``meta.probe`` whose measurements take ``totals`` seconds."""
    unit = probe.ProbeResult({p.name: 1.0 for p in probe.PARTS}).total_s
    return probe.summarise(
        [
            probe.ProbeResult({p.name: t / unit for p in probe.PARTS}, i)
            for i, t in enumerate(totals)
        ]
    )


def test_refit_of_two_calibrations_fits_their_samples_and_probes_together(tmp_path: Path) -> None:
    grid = [s for s in fake_samples() if not s.warmup]
    meta = {"model": "tiny.gguf", "machine": "2cpu-test", "threads": 2, "n_ctx": 8192}
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    # The same grid twice, the second calibration 20 % slower throughout.
    save_samples(first, grid, {**meta, "date": "10:00", "probe": probe_summary(1.0, 1.0)})
    slower = [dataclasses.replace(s, seconds=1.2 * s.seconds) for s in grid]
    save_samples(second, slower, {**meta, "date": "11:00", "probe": probe_summary(1.2, 1.2, 1.2)})
    out = tmp_path / "m.json"
    args = ["--refit", str(first), "--refit", str(second), "--out", str(out)]
    result = CliRunner().invoke(command(), args)
    assert result.exit_code == 0, result.output
    model = CostModel.load(out)
    assert model.meta["samples"] == 2 * len(grid)
    assert model.meta["refit_from"] == [str(first), str(second)]
    assert model.meta["calibrations"] == ["10:00", "11:00"]
    assert model.meta["served"] == [None, None]  # neither served (their grids alone)
    assert len(model.meta["probe"]["measurements"]) == 5
    assert probe.calibrated_probe_s(model) == pytest.approx(1.2)  # the median of the five
    # Each grid point's median over both calibrations' repeats, half of them 1.2x: 1.1x.
    assert model.per_decode == pytest.approx(1.1 * TRUE.per_decode, rel=1e-6)
    other = tmp_path / "other.json"
    save_samples(other, grid, {**meta, "machine": "8cpu-other"})
    result = CliRunner().invoke(command(), ["--refit", str(first), "--refit", str(other)])
    assert result.exit_code == 2
    assert "differ in machine" in result.output


def test_refit_with_out_and_plot(tmp_path: Path) -> None:
    samples_file = tmp_path / "samples.json"
    save_samples(samples_file, fake_samples(), {})  # no model or machine named
    out, plot = tmp_path / "m.json", tmp_path / "p.png"
    args = ["--refit", str(samples_file), "--out", str(out), "--plot", str(plot)]
    result = CliRunner().invoke(command(), args)
    assert result.exit_code == 0, result.output
    assert CostModel.load(out).per_decode == pytest.approx(TRUE.per_decode)
    assert plot.is_file()
    result = CliRunner().invoke(command(), ["--refit", str(samples_file)])
    assert result.exit_code == 2
    assert "give --out" in result.output


def test_refit_no_served_fits_the_grids_samples_alone(tmp_path: Path) -> None:
    grid = fake_samples()
    decodes = [StepFeatures(1, 1, 0, c / 1000, c / 1e6, c / 1000) for c in range(64, 96)]
    slow = [  # served decodes 50 % slower than the grid's model says
        Sample("served fcfs decode ≤1", f, 1.5 * TRUE.predict(f), served=True) for f in decodes
    ]
    samples_file = tmp_path / "samples.json"
    save_samples(samples_file, grid + slow, {})
    measured = sum(not s.warmup for s in grid)
    fitted, output = {}, {}
    for flag in ("--served", "--no-served"):
        out = tmp_path / f"{flag}.json"
        args = ["--refit", str(samples_file), "--out", str(out), flag]
        result = CliRunner().invoke(command(), args)
        assert result.exit_code == 0, result.output
        fitted[flag], output[flag] = CostModel.load(out), result.output
    assert fitted["--served"].meta["samples"] == measured + len(slow)
    assert fitted["--served"].meta["fit"]["served"]["n"] == 1  # one bin
    assert "served bins" in output["--served"]
    assert fitted["--no-served"].meta["samples"] == measured
    assert "served" not in fitted["--no-served"].meta["fit"]
    assert "served bins" not in output["--no-served"]
    for name, value in TRUE.coefficients().items():
        assert getattr(fitted["--no-served"], name) == pytest.approx(value, rel=1e-6), name
    # The served fit prices such decodes higher: pulled up by the slow bin.
    assert fitted["--served"].predict(decodes[0]) > 1.05 * TRUE.predict(decodes[0])


@pytest.mark.parametrize("extra", [["--quick"], ["--threads", "1"], ["--repeats", "3"]])
def test_refit_refuses_measurement_flags(tmp_path: Path, extra: list[str]) -> None:
    result = CliRunner().invoke(command(), ["--refit", str(tmp_path / "s.json"), *extra])
    assert result.exit_code == 2
    assert "--refit" in result.output


def test_refit_of_a_bad_file_says_why(tmp_path: Path) -> None:
    bad = tmp_path / "s.json"
    bad.write_text('{"schema": "quanta.cost_model/1"}')
    result = CliRunner().invoke(command(), ["--refit", str(bad)])
    assert result.exit_code == 2
    assert "not a samples file" in result.output


def test_calibrate_is_a_quanta_command() -> None:
    from app.cli import cli

    result = CliRunner().invoke(cli, ["calibrate", "--help"])
    assert result.exit_code == 0
    assert "--refit" in result.output


# ---- (d) the real engine, the quick grid ----


@pytest.mark.model
def test_quick_calibration_of_the_real_engine(model_path: Path, tmp_path: Path) -> None:
    out, samples_file = tmp_path / "m.json", tmp_path / "s.json"
    # One thread: with two, llama.cpp's threads wait for each other at every barrier, and
    # on a shared 2-core machine this test then took minutes instead of seconds.
    args = ["--quick", "--threads", "1", "--model", str(model_path), "--out", str(out)]
    result = CliRunner().invoke(command(), [*args, "--samples", str(samples_file)])
    assert result.exit_code == 0, result.output
    model = CostModel.load(out)
    assert all(v >= 0 for v in model.coefficients().values())
    # Exercised by the quick grid.
    assert model.per_decode > 0
    assert model.per_prefill > 0
    assert model.per_stash > 0
    assert model.per_restore > 0
    assert model.meta["grid"] == "quick"
    assert model.meta["model"] == model_path.name
    assert model.meta["threads"] == 1
    assert out.with_suffix(".png").stat().st_size > 0
    samples, meta = load_samples(samples_file)
    assert {group_of(s.features) for s in samples} == set(Group) - {Group.EMPTY}
    assert all(s.engine_s > 0 for s in samples)
    assert meta["kv_unified"] == model.meta["kv_unified"]
    assert len(model.meta["probe"]["measurements"]) == 2  # at the start and at the end
    assert probe.calibrated_probe_s(model) is not None
    assert all(s.t > 0 for s in samples)
    # The served phase ran once (no probes between visits in the quick grid): fcfs's steps.
    assert model.meta["served"]["segments"] == 1
    assert {s.point.split()[1] for s in samples if s.served} == {"fcfs"}
    assert model.meta["fit"]["served"]["n"] == model.meta["served"]["bins"] > 0
    # The probe alone, against the model just calibrated: a speed factor near 1.
    probe_file = tmp_path / "probe.json"
    args = ["--probe-only", "--threads", "1", "--model", str(model_path)]
    result = CliRunner().invoke(
        command(), [*args, "--cost-model", str(out), "--out", str(probe_file)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(probe_file.read_text())["speed_factor"] > 0


def test_a_burst_point_starts_new_sequences_that_all_sample_and_undoes_them() -> None:
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    runner = GridRunner(ex)
    points = build_grid(dataclasses.replace(QUICK, burst_prompts=(16, 100)), 8192, 64, 512, 128)
    bursts = [p for p in points if p.kind is Kind.BURST]
    # As many prompts as the token budget holds: 128 // 16 and 128 // 100
    assert [(p.batch, p.chunk) for p in bursts] == [(1, 100), (8, 16)]
    runner.run(bursts)
    measured = [s for s in runner.samples if s.point.startswith("burst") and not s.warmup]
    assert [s.point for s in measured] == ["burst 1 x 100", "burst 8 x 16"]
    for s, p in zip(measured, bursts, strict=True):
        assert s.features.seqs == s.features.sampled_chunks == p.batch
        assert s.features.prefill_tokens == p.batch * p.chunk
        assert s.kv_held == 0  # nothing held beside it
    assert ex.memory_stats().sequences == ()


def test_mixed_points_also_take_the_shorter_chunks_the_spec_names() -> None:
    spec = dataclasses.replace(QUICK, mixed_batches=(4,), mixed_chunks=(16, 64))
    mixed = [p for p in build_grid(spec, 8192, 256, 512, 64) if p.kind is Kind.MIXED]
    # beside 4 decodes, a budget of 64: its rest (60) and the named chunk shorter than that
    assert {(p.batch, p.chunk) for p in mixed if p.context == 32} == {(4, 16), (4, 60)}
    assert "mixed 4 at 32 + 16" in {p.label for p in mixed}


# ---- a KV stream per sequence ----


class StreamsFake(FakeExecutor):
    """The fake engine, reporting a KV stream per sequence (``kv_unified=False``)."""

    @property
    def info(self) -> EngineInfo:
        return msgspec.structs.replace(super().info, kv_unified=False)


def test_a_deep_mixed_point_appends_a_chunk_to_the_last_sequence_beside_the_decodes() -> None:
    ex = StreamsFake(n_ctx=16 * 1024, n_seq_max=16, n_batch=512)
    runner = GridRunner(ex)
    point = Point(Kind.DEEP, 4, 300, 125)
    assert point.label == "mixed 3 at 300 + 125 at 300"
    runner.run([point])
    timed = [s for s in runner.samples if s.point == point.label]
    assert len(timed) == 2 and [s.warmup for s in timed] == [True, False]
    plan = next(p for p in ex.steps if p.slices and len(p.slices) == 4)
    assert [(s.seq, s.start_pos, len(s.tokens)) for s in plan.slices] == [
        (0, 300, 1),
        (1, 300, 1),
        (2, 300, 1),
        (3, 300, 125),
    ]
    f = timed[1].features
    assert (f.decode_tokens, f.prefill_tokens) == (3, 125)
    # a token of each of 0..3 over n_kv 512 (301 cells), then seq 3's other 124 over 512
    assert f.extra_passes == 1
    assert f.stream_read_k == pytest.approx((4 * 512 + 512) / 1000)
    assert f.stream_kv_m == pytest.approx((4 * 512 + 124 * 512) / 1e6)
    assert f.batch_kv_m == 0.0
    assert ex.memory_stats().sequences == ()


def test_the_probe_with_streams_prefills_the_others_and_times_the_same_work() -> None:
    shared, own = FakeExecutor(n_ctx=4096, n_seq_max=16), StreamsFake(n_ctx=4096, n_seq_max=16)

    def stepper(ex: FakeExecutor):  # type: ignore[no-untyped-def]
        def step(plan: StepPlan) -> float:
            ex.step(plan)
            return 0.001 * plan.num_tokens + 0.002 * bool(plan.slices)

        return step

    a = probe.measure_probe(stepper(shared), shared.info.n_vocab)
    b = probe.measure_probe(stepper(own), own.info.n_vocab, share=False)
    assert not any(isinstance(op, CopyPrefix) for p in own.steps for op in p.kv_ops)
    fills = [p for p in own.steps if p.slices and all(s.start_pos == 0 for s in p.slices)]
    others = [[s.seq for s in p.slices] for p in fills if p.slices[0].seq != 0]
    assert others == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15]]
    # the timed steps are the shared probe's, token for token
    timed = [p for p in own.steps if p.slices and not (p in fills and p.slices[0].seq != 0)]
    assert timed == [p for p in shared.steps if p.slices]
    assert a.parts == b.parts
    assert own.memory_stats().sequences == ()


def test_a_stream_layouts_cost_model_is_named_apart() -> None:
    assert cal.default_out("m", "2cpu-x").name == "m__2cpu-x.json"
    assert cal.default_out("m", "2cpu-x", kv_unified=False).name == "m__2cpu-x__streams.json"
