"""``quanta sweep``: the grid, the rate knob, a tiny sweep end to end, and its errors.

The tiny sweeps use a hand-written cost model and a few short requests: what is tested is the
plumbing (rows, columns, files, determinism across --jobs), not any figure's value.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from app.lab.sweep.command import sweep
from app.lab.sweep.grid import (
    Grid,
    GridError,
    expand,
    linspace,
    load_grid_file,
    merge,
    parse_list,
    with_rate,
    with_requests,
)
from app.lab.sweep.plots import curves, knee
from quanta_core.scheduler import SchedulerConfig
from quanta_core.workload import TenantSpec, TraceSpec, WorkloadError, WorkloadSpec, fixed

BASE = SchedulerConfig()
WALL_COLUMNS = {"wall_s", "sim_wall_s"}  # the only columns that measure this machine
PLOTS = ("throughput_ttft.png", "itl_batch.png", "goodput_rate.png", "service_rate.png")

# ---- the grid ----


def test_expand_counts_and_order() -> None:
    grid = Grid(policies=("fcfs", "vtc"), rates=(0.5, 1.0, 2.0), max_running=(8, 16))
    points = expand(grid, BASE)
    assert len(points) == 2 * 3 * 2
    assert [p.index for p in points] == list(range(12))
    # policies outermost, then the knobs, rates innermost: one curve is a run of rows
    assert [(p.policy, p.max_running, p.rate) for p in points[:4]] == [
        ("fcfs", 8, 0.5),
        ("fcfs", 8, 1.0),
        ("fcfs", 8, 2.0),
        ("fcfs", 16, 0.5),
    ]
    assert points[-1].policy == "vtc"
    assert expand(grid, BASE) == points  # the same grid, the same points


def test_unset_knobs_keep_the_base_config() -> None:
    base = SchedulerConfig(max_running=5, token_budget=64, block_size=32, num_kv_blocks=100)
    (point,) = expand(Grid(policies=("fcfs",), rates=(1.0,)), base)
    assert (point.max_running, point.token_budget, point.block_size, point.kv_blocks) == (
        5,
        64,
        32,
        100,
    )
    config = dataclasses.replace(point, policy="vtc", kv_blocks=7).config(base)
    assert (config.policy, config.num_kv_blocks, config.max_running) == ("vtc", 7, 5)


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        (Grid(policies=("fcfs", "lottery")), "unknown policy 'lottery'"),
        (Grid(policies=()), "empty grid"),
        (Grid(rates=()), "empty grid"),
        (Grid(rates=(0.0,)), "positive"),
        (Grid(max_running=(0,)), "max_running"),
    ],
)
def test_bad_grids(grid: Grid, message: str) -> None:
    with pytest.raises(GridError, match=message):
        expand(grid, BASE)


def test_linspace_and_lists() -> None:
    assert linspace(0.1, 0.8, 8) == (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    assert linspace(2.0, 2.0, 1) == (2.0,)
    assert parse_list("8, 16,32", int, "--max-running") == (8, 16, 32)
    with pytest.raises(GridError, match="--max-running"):
        parse_list("8,lots", int, "--max-running")
    with pytest.raises(GridError):
        linspace(0.0, 1.0, 4)


def test_grid_file_and_flags_layer(tmp_path: Path) -> None:
    path = tmp_path / "grid.toml"
    path.write_text(
        'workload = "w.toml"\nrequests = 30\n[grid]\npolicies = ["fcfs", "slo"]\n'
        "rates = { from = 0.5, to = 1.5, n = 3 }\nmax_running = [4, 8]\n"
    )
    axes, settings = load_grid_file(path)
    assert axes == {"policies": ("fcfs", "slo"), "rates": (0.5, 1.0, 1.5), "max_running": (4, 8)}
    assert settings == {"workload": tmp_path / "w.toml", "requests": 30}
    grid = merge(dataclasses.asdict(Grid()), axes, {"policies": ("vtc",)})  # flags win
    assert (grid.policies, grid.rates, grid.max_running) == (("vtc",), (0.5, 1.0, 1.5), (4, 8))
    path.write_text("[grid]\npolicy = ['fcfs']\n")
    with pytest.raises(GridError, match=r"grid\.policy"):
        load_grid_file(path)


# ---- the rate knob ----


def _spec(**kw: Any) -> WorkloadSpec:
    tenants = (TenantSpec("a", prompt=fixed(8), output=fixed(4)), TenantSpec("b", share=3))
    return dataclasses.replace(WorkloadSpec(name="w", tenants=tenants, rate=1.0), **kw)


def test_rate_sets_the_total_rate() -> None:
    assert with_rate(_spec(), 2.5).rate == 2.5


def test_rate_scales_tenants_with_their_own_rates_in_proportion() -> None:
    spec = _spec(tenants=(TenantSpec("a", rate=0.8), TenantSpec("b", rate=1.6)))
    scaled = with_rate(spec, 1.2)
    assert [t.rate for t in scaled.tenants] == pytest.approx([0.4, 0.8])


def test_rate_of_a_trace_is_a_multiple_of_its_arrival_rate() -> None:
    spec = _spec(trace=TraceSpec("t.csv", time_scale=20.0))
    scaled = with_rate(spec, 2.0)
    assert scaled.trace is not None and scaled.trace.time_scale == 10.0
    limited = with_requests(spec, 50)
    assert limited.trace is not None and limited.trace.limit == 50


def test_closed_loop_has_no_rate() -> None:
    with pytest.raises(WorkloadError, match="closed-loop"):
        with_rate(_spec(users=4), 1.0)


def test_request_count_replaces_a_duration() -> None:
    spec = with_requests(_spec(duration_s=30.0, requests=None), 40)
    assert (spec.requests, spec.duration_s) == (40, None)


# ---- a tiny sweep, end to end ----


@pytest.fixture
def cost_model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.json"
    doc = {
        "schema": "quanta.cost_model/2",
        "coefficients": {"per_pass": 0.01, "per_decode": 0.002, "per_prefill": 0.001},
        "meta": {"note": "hand-written for tests"},
    }
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "two.toml"
    path.write_text(
        'name = "two"\nseed = 3\nrate = 1.0\nwindow_s = 2.0\n'
        '[[tenants]]\nname = "a"\nshare = 2\nprompt = 24\noutput = 6\n'
        '[[tenants]]\nname = "b"\nprompt = 40\noutput = 6\n'
    )
    return path


def _invoke(*args: str) -> tuple[int, str]:
    app = typer.Typer()
    app.command()(sweep)
    result = CliRunner().invoke(app, [*args, "--quiet"])
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines


def _tiny(cost_model: Path, workload: Path, out: Path, *more: str) -> tuple[int, str]:
    return _invoke(
        "--cost-model",
        str(cost_model),
        "--workload",
        str(workload),
        "--policies",
        "fcfs,vtc",
        "--rates",
        "2,8",
        "--requests",
        "12",
        "--out",
        str(out),
        *more,
    )


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_tiny_sweep_writes_rows_plots_and_summary(
    cost_model: Path, workload: Path, tmp_path: Path
) -> None:
    code, output = _tiny(cost_model, workload, tmp_path / "out", "--jobs", "1")
    assert code == 0, output
    rows = _rows(tmp_path / "out" / "sweep.csv")
    assert [(r["policy"], r["rate"]) for r in rows] == [
        ("fcfs", "2"),
        ("fcfs", "8"),
        ("vtc", "2"),
        ("vtc", "8"),
    ]
    for column in (
        "max_running",
        "token_budget",
        "block_size",
        "kv_blocks",
        "throughput_rps",
        "output_tps",
        "ttft_mean_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "itl_mean_s",
        "itl_p99_s",
        "goodput_rps",
        "goodput_fraction",
        "service_diff_max",
        "jain_mean",
        "rejected",
        "preemptions",
        "never_stalled",
        "virtual_s",
        "wall_s",
    ):
        assert column in rows[0]
    assert all(r["requests"] == "12" and r["completed"] == "12" for r in rows)
    assert all(float(r["throughput_rps"]) > 0 and float(r["virtual_s"]) > 0 for r in rows)
    for name in PLOTS:
        assert (tmp_path / "out" / name).stat().st_size > 0
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| fcfs |" in summary and "| vtc |" in summary


def test_jobs_do_not_change_the_results(cost_model: Path, workload: Path, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    assert _tiny(cost_model, workload, one, "--jobs", "1", "--no-plots")[0] == 0
    assert _tiny(cost_model, workload, two, "--jobs", "2", "--no-plots")[0] == 0

    def measured(path: Path) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if k not in WALL_COLUMNS} for r in _rows(path)]

    assert measured(one / "sweep.csv") == measured(two / "sweep.csv")
    assert (one / "summary.md").read_text() == (two / "summary.md").read_text()


def test_a_cost_model_that_measured_its_server_sweeps_with_it(
    cost_model: Path, workload: Path, tmp_path: Path
) -> None:
    doc = json.loads(cost_model.read_text())
    doc["meta"]["server_cost_ms"] = {"per_cycle": 5.0, "per_token": 1.0, "per_request": 0.0}
    served = tmp_path / "served.json"
    served.write_text(json.dumps(doc))
    assert _tiny(cost_model, workload, tmp_path / "engine", "--jobs", "1", "--no-plots")[0] == 0
    assert _tiny(served, workload, tmp_path / "served", "--jobs", "1", "--no-plots")[0] == 0
    engine, server = (_rows(tmp_path / d / "sweep.csv") for d in ("engine", "served"))
    # every inter-token gap is at least the server's 5 ms per cycle longer
    for e, s in zip(engine, server, strict=True):
        assert float(s["itl_mean_s"]) > float(e["itl_mean_s"]) + 0.005


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--policies", "fcfs,lottery"), "unknown policy 'lottery'"),
        (("--policies", ","), "empty grid"),
        (("--rates", "0.5", "--rates-n", "3"), "--rates-from"),
        (("--max-running", "many"), "--max-running"),
        (("--preset", "twenty-at-once", "--workload", "x.toml"), "not both"),
    ],
)
def test_bad_flags_are_refused_clearly(
    cost_model: Path, flags: tuple[str, ...], message: str
) -> None:
    code, output = _invoke("--cost-model", str(cost_model), *flags)
    assert code == 2
    assert message in output


def test_missing_cost_model_says_to_calibrate(tmp_path: Path) -> None:
    code, output = _invoke("--cost-model", str(tmp_path / "none.json"))
    assert code == 2
    assert "quanta calibrate" in output


# ---- the facts of summary.md ----


def _row(policy: str, rate: float, ttft: float, itl: float, **kw: Any) -> dict[str, Any]:
    knobs = {"max_running": 16, "token_budget": 128, "block_size": 16, "kv_blocks": 512}
    figures = {"interactive_ttft_p99_s": ttft, "interactive_itl_p99_s": itl}
    return {"policy": policy, "rate": rate, **knobs, **figures, **kw}


def test_knee_is_the_last_rate_before_a_target_first_breaks() -> None:
    group = [
        _row("fcfs", 0.2, 1.0, 0.1),
        _row("fcfs", 0.4, 1.5, 0.2),
        _row("fcfs", 0.6, 3.0, 0.2),  # TTFT breaks here
        _row("fcfs", 0.8, 1.9, 0.2),  # holding again past the knee does not count
    ]
    knee_row = knee(group, 2.0, 0.25)
    assert knee_row is not None and knee_row["rate"] == 0.4
    assert knee(group, 0.5, 0.25) is None
    last = knee(group, None, 0.25)  # no TTFT target: the ITL alone
    assert last is not None and last["rate"] == 0.8


def test_curves_are_labelled_by_the_knobs_that_vary() -> None:
    rows = [
        _row("vtc", 0.4, 1, 0.1, max_running=8),
        _row("vtc", 0.2, 1, 0.1, max_running=8),
        _row("vtc", 0.2, 1, 0.1, max_running=16),
    ]
    grouped = curves(rows)
    assert list(grouped) == ["vtc mr=8", "vtc mr=16"]
    assert [r["rate"] for r in grouped["vtc mr=8"]] == [0.2, 0.4]


def test_shipped_grid_files_load() -> None:
    found = sorted((Path(__file__).parents[1] / "bench/sweeps").glob("*.toml"))
    assert found
    for path in found:
        axes, settings = load_grid_file(path)
        expand(merge(dataclasses.asdict(Grid()), axes), BASE)
        assert "workload" not in settings or settings["workload"].is_file()


def test_a_failing_point_is_named(
    cost_model: Path, workload: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr("app.lab.sweep.command.simulate", broken)
    code, output = _tiny(cost_model, workload, tmp_path / "out", "--jobs", "1")
    assert code == 1
    assert "point 0" in output and "policy='fcfs'" in output and "scheduler bug" in output
