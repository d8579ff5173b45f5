"""``quanta sim`` end to end: a results file that ``quanta bench compare`` takes, real or not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli import cli
from app.lab.bench.report import SCHEMA, load_result
from app.lab.calibrate.probe import PROBE_SCHEMA, WORK
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.server_cost import ServerCost

ROOT = Path(__file__).resolve().parent.parent
REAL_RUN = ROOT / "tests/data/twenty-at-once-quanta-fcfs.json"  # a served run, whole

runner = CliRunner()


@pytest.fixture
def cost_model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny__machine.json"
    reference = {"probe": {"work": WORK, "total_s": 2.0}}
    model = CostModel(
        per_pass=0.012, per_decode=0.003, per_prefill=0.006, meta={"model": "tiny", **reference}
    )
    model.save(path)
    return path


def test_sim_writes_a_bench_results_file_that_compare_accepts(
    tmp_path: Path, cost_model: Path
) -> None:
    out = tmp_path / "sim.json"
    args = ["sim", "--preset", "twenty-at-once", "--policy", "fcfs", "--cost-model"]
    result = runner.invoke(cli, [*args, str(cost_model), "--out", str(out), "--max-running", "8"])
    assert result.exit_code == 0, result.output
    assert "simulated 20 requests" in result.output
    doc = load_result(out)
    assert doc["schema"] == SCHEMA
    assert doc["environment"]["simulated"] is True
    assert doc["environment"]["cost_model"]["path"] == str(cost_model)
    assert doc["config"]["flags"]["scheduler"]["max_running"] == 8
    # The server's default token budget (settings: 128), not the dataclass's (512).
    assert doc["config"]["flags"]["scheduler"]["token_budget"] == 128
    assert len(doc["requests"]) == 20 and doc["summary"]["overall"]["completed"] == 20
    compared = runner.invoke(cli, ["bench", "compare", str(REAL_RUN), str(out)])
    assert compared.exit_code == 0, compared.output
    assert "TTFT p99" in compared.output


def test_sim_replays_a_trace_scaled(tmp_path: Path, cost_model: Path) -> None:
    csv = tmp_path / "trace.csv"
    rows = [f"2023-11-16 18:15:{40 + k:02d}.0000000,{100 + k},{40 + k}" for k in range(10)]
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "trace.json"
    result = runner.invoke(
        cli,
        [
            "sim",
            "--trace",
            str(csv),
            "--requests",
            "6",
            "--rate-scale",
            "2",
            "--length-scale",
            "0.5",
            "--cost-model",
            str(cost_model),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows_out = json.loads(out.read_text())["requests"]
    assert [r["scheduled"] for r in rows_out] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert [r["prompt_tokens"] for r in rows_out] == [50, 50, 51, 52, 52, 52]
    assert [r["max_tokens"] for r in rows_out] == [20, 20, 21, 22, 22, 22]


def test_a_missing_cost_model_says_to_calibrate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no config/cost_models here
    result = runner.invoke(cli, ["sim", "--preset", "twenty-at-once"])
    assert result.exit_code == 2
    assert "quanta calibrate" in result.output


def _sim(cost_model: Path, out: Path, *extra: str) -> dict:
    args = ["sim", "--preset", "twenty-at-once", "--policy", "fcfs", "--cost-model"]
    result = runner.invoke(cli, [*args, str(cost_model), "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return load_result(out)


def test_speed_factor_multiplies_every_step_and_is_recorded(
    tmp_path: Path, cost_model: Path
) -> None:
    base = _sim(cost_model, tmp_path / "base.json")
    slow = _sim(cost_model, tmp_path / "slow.json", "--speed-factor", "1.5")
    # Twenty requests at t = 0: every time the run measures is 1.5x as long.
    for figure in ("ttft", "e2e"):
        got, want = slow["summary"]["overall"][figure], base["summary"]["overall"][figure]
        assert got["mean_ms"] == pytest.approx(1.5 * want["mean_ms"]), figure
    assert slow["config"]["flags"]["speed_factor"] == 1.5
    assert slow["environment"]["speed_factor"] == {"factor": 1.5, "from": "--speed-factor"}
    assert base["environment"]["speed_factor"]["factor"] == 1.0
    # The coefficients as calibrated, the factor beside them.
    assert slow["environment"]["cost_model"]["coefficients"]["per_pass"] == 0.012


def test_server_cost_lengthens_every_gap_and_is_recorded(tmp_path: Path, cost_model: Path) -> None:
    base = _sim(cost_model, tmp_path / "base.json")
    flags = ("--server-cycle-ms", "3", "--server-token-ms", "0.5")
    served = _sim(cost_model, tmp_path / "served.json", *flags)
    got, want = (r["summary"]["overall"]["itl"]["mean_ms"] for r in (served, base))
    assert got > want + 3  # every gap: 3 ms per cycle and 0.5 ms per stream in the step
    assert served["config"]["flags"]["server_cost_ms"] == {
        "per_cycle": 3.0,
        "per_token": 0.5,
        "per_request": 0.0,
    }
    refused = runner.invoke(cli, ["sim", "--preset", "twenty-at-once", "--server-cycle-ms", "-1"])
    assert refused.exit_code == 2


def test_a_cost_model_that_measured_its_server_simulates_it_by_default(
    tmp_path: Path, cost_model: Path
) -> None:
    base = _sim(cost_model, tmp_path / "base.json")
    model = CostModel.load(cost_model)
    measured = ServerCost(0.003, 0.0005, 0.05).in_meta("a served run")
    served_model = tmp_path / "served__machine.json"
    dataclasses.replace(model, meta={**model.meta, "server_cost_ms": measured}).save(served_model)
    served = _sim(served_model, tmp_path / "served.json")
    assert served["config"]["flags"]["server_cost_ms"] == pytest.approx(
        {"per_cycle": 3.0, "per_token": 0.5, "per_request": 50.0}
    )
    # the same run as with the three flags given
    flagged = _sim(
        cost_model,
        tmp_path / "flagged.json",
        *("--server-cycle-ms", "3", "--server-token-ms", "0.5", "--server-request-ms", "50"),
    )
    assert served["summary"] == flagged["summary"] != base["summary"]
    # a flag overrides the model's figure, the others stay
    one = _sim(served_model, tmp_path / "one.json", "--server-request-ms", "0")
    assert one["config"]["flags"]["server_cost_ms"] == pytest.approx(
        {"per_cycle": 3.0, "per_token": 0.5, "per_request": 0.0}
    )


def test_the_servers_intake_delays_a_bursts_first_tokens(tmp_path: Path, cost_model: Path) -> None:
    base = _sim(cost_model, tmp_path / "base.json")
    taken = _sim(cost_model, tmp_path / "taken.json", "--server-request-ms", "50")
    assert taken["config"]["flags"]["server_cost_ms"]["per_request"] == 50.0

    def before_the_scheduler(doc: dict[str, Any]) -> list[float]:  # sent to submitted, each
        return sorted(
            r["token_times"][0] - r["sent"] - r["server_queue_s"] - r["server_prefill_s"]
            for r in doc["requests"]
        )

    # Twenty at once, taken in one at a time: submitted 50, 100, ... 1,000 ms after sent.
    assert before_the_scheduler(taken) == pytest.approx([0.05 * k for k in range(1, 21)])
    assert before_the_scheduler(base) == pytest.approx([0.0] * 20, abs=1e-9)
    refused = runner.invoke(cli, ["sim", "--preset", "twenty-at-once", "--server-request-ms", "-1"])
    assert refused.exit_code == 2


def test_probe_file_gives_the_speed_factor(tmp_path: Path, cost_model: Path) -> None:
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"schema": PROBE_SCHEMA, "work": WORK, "total_s": 2.5}))
    doc = _sim(cost_model, tmp_path / "sim.json", "--probe", str(probe))
    speed = doc["environment"]["speed_factor"]
    assert speed == {"factor": pytest.approx(1.25), "from": str(probe), "probe_s": 2.5}


def test_a_speed_profile_times_every_step_by_the_runs_speed_then(
    tmp_path: Path, cost_model: Path
) -> None:
    report = tmp_path / "steps.json"  # as `quanta step-report --out` writes it
    report.write_text(json.dumps({"speed_profile": {"bin_s": 1000.0, "factors": [1.5]}}))
    base = _sim(cost_model, tmp_path / "base.json")
    slow = _sim(cost_model, tmp_path / "slow.json", "--speed-profile", str(report))
    got, want = (r["summary"]["overall"]["e2e"]["mean_ms"] for r in (slow, base))
    assert got == pytest.approx(1.5 * want)  # the whole run in the first bin
    speed = slow["environment"]["speed_factor"]
    assert speed == {"factor": 1.0, "from": str(report), "bin_s": 1000.0, "profile": [1.5]}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--speed-factor", "0"], "above 0"),
        (["--speed-factor", "2", "--probe", "p.json"], "not both"),
        (["--probe", "absent.json"], "cannot read probe file"),
        (["--speed-factor", "2", "--speed-profile", "s.json"], "not both"),
        (["--speed-profile", "absent.json"], "no speed profile"),
    ],
)
def test_bad_speed_factors_say_why(cost_model: Path, extra: list[str], message: str) -> None:
    args = ["sim", "--preset", "twenty-at-once", "--cost-model", str(cost_model), *extra]
    result = runner.invoke(cli, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_probe_against_a_cost_model_without_one_says_to_calibrate(tmp_path: Path) -> None:
    model = tmp_path / "old.json"
    CostModel(per_pass=0.01).save(model)
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"schema": PROBE_SCHEMA, "work": WORK, "total_s": 2.5}))
    args = ["sim", "--preset", "twenty-at-once", "--cost-model", str(model)]
    result = runner.invoke(cli, [*args, "--probe", str(probe)])
    assert result.exit_code == 2
    assert "no reference probe" in " ".join(result.output.split())


def test_retries_send_a_refused_request_again_and_count_it_once(
    tmp_path: Path, cost_model: Path
) -> None:
    args = ["sim", "--preset", "twenty-at-once", "--policy", "quanta", "--cost-model"]
    load = ["--requests", "200", "--rate", "40", "--retries", "1"]
    out = tmp_path / "retries.json"
    result = runner.invoke(cli, [*args, str(cost_model), "--out", str(out), *load])
    assert result.exit_code == 0, result.output
    doc = load_result(out)
    rows = doc["requests"]
    assert any(r["attempt"] == 1 for r in rows)  # refused, then sent again
    assert doc["summary"]["overall"]["requests"] == 200 == len({r["request_id"] for r in rows})
    assert doc["config"]["flags"]["retries"] == 1
