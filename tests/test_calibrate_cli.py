"""``quanta calibrate``: its grid, its runner (on the fake executor), --refit, and one real run."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from app import calibrate as cal
from app.calibrate import FULL, QUICK, GridRunner, Kind, build_grid, calibrate
from quanta_core.engine.fake import FakeExecutor
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.fit import Group, Sample, group_of, load_samples, save_samples

TRUE = CostModel(0.004, 0.0005, 0.011, 0.006, 0.00002, 0.0001, 0.00008)


def command() -> typer.Typer:
    app = typer.Typer()
    app.command()(calibrate)
    return app


def fake_samples(spec: cal.GridSpec = QUICK) -> list[Sample]:
    """The grid run on the fake executor, timed by ``TRUE`` instead of a clock."""
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    runner = GridRunner(ex, spec.repeats)
    runner.run(build_grid(spec, 8192, 64, 512, 128))
    return [dataclasses.replace(s, seconds=TRUE.predict(s.features)) for s in runner.samples]


# ---- the grid ----


@pytest.mark.parametrize("spec", [FULL, QUICK])
def test_grid_exercises_every_group(spec: cal.GridSpec) -> None:
    kinds = Counter(p.kind for p in build_grid(spec, 8192, 64, 512, 128))
    assert set(kinds) == set(Kind)


def test_grid_fits_a_small_engine_and_runs_context_by_context() -> None:
    n_ctx, n_seq_max, n_batch, budget = 2048, 8, 128, 64
    grid = build_grid(FULL, n_ctx, n_seq_max, n_batch, budget)
    room = n_ctx - n_batch
    assert grid
    for p in grid:
        assert p.batch * p.context <= room
        assert p.batch <= n_seq_max
        assert p.chunk <= n_batch
        if p.kind is Kind.MIXED:
            assert p.batch < n_seq_max  # one more sequence for the chunk
            assert p.batch + p.chunk == budget
    keys = [(p.context, p.batch) for p in grid]
    assert keys == sorted(keys)


# ---- the runner, on the fake executor ----


def test_runner_runs_the_full_grid_with_identical_repeats_and_leaves_the_engine_empty() -> None:
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    grid = build_grid(FULL, 8192, 64, 512, 128)
    runner = GridRunner(ex, repeats=2)
    seen = []
    runner.run(grid, seen.append)
    assert seen == grid
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
        assert [r.warmup for r in runs] == [True, False, False], point
        assert len({r.features for r in runs}) == 1, point  # each run is undone
    assert {group_of(s.features) for s in runner.samples} == set(Group) - {Group.EMPTY}


def test_only_the_points_own_sequences_hold_kv_while_it_runs() -> None:
    ex = FakeExecutor(n_ctx=8192, n_seq_max=64, n_batch=512)
    runner = GridRunner(ex, repeats=1)
    runner.run([cal.Point(Kind.DECODE, 4, 64), cal.Point(Kind.DECODE, 2, 64)])
    decodes = [s for s in runner.samples if s.point.startswith("decode")]
    assert [(s.features.decode_tokens, s.kv_held) for s in decodes] == [(4, 256)] * 2 + [
        (2, 128)
    ] * 2


# ---- where the file goes ----


def test_machine_slug_is_cpus_and_cpu_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cal, "cpu_model", lambda: "Intel(R) Core(TM) i7-8550U CPU @ 1.80GHz")
    monkeypatch.setattr(cal.os, "cpu_count", lambda: 8)
    assert cal.machine_slug(8) == "8cpu-intel-core-i7-8550u"
    assert cal.machine_slug(2) == "8cpu-intel-core-i7-8550u-2t"
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
    assert model.meta["refit_from"] == str(samples_file)
    assert set(model.meta["fit"]["errors"]) == {"all", "decode", "prefill", "mixed", "stash"}
    assert out.with_suffix(".png").stat().st_size > 0
    assert "per decode token" in result.output
    assert "MAPE" in result.output


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
