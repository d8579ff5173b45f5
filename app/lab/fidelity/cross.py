"""Fidelity with a cost model fitted from served steps, each run held out of its own fit.

The calibration grid measures the engine alone, step after step; a served step also competes
with the HTTP server and the client for the two cores, and the grid's shapes are not the
served ones. The step traces of the real fidelity runs (``steps-<policy>-<load>.jsonl``) hold
thousands of served steps with their engine times. For each run R:

    the other runs' steps ─▶ engine time / that run's in-run speed factor (the machine's
        drift taken out: every trace brought to the calibration's speed)
      ─▶ fit_cost_model (as `quanta calibrate` fits; what the traces do not exercise, such
        as stash and restore in runs without preemption, kept from the calibrated model)
      ─▶ cross-model-R.json
    R's steps against that model ─▶ R's in-run speed factor and server time per cycle
      ─▶ quanta sim ─▶ sim-cross-R.json        (quanta bench fidelity table: the third table)

R's own steps set only its speed (one number, as in the in-run table), never the model's
shape: the shape comes from the other eight runs.

    quanta bench fidelity cross bench/results/fidelity
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from app.lab.sim.command import default_cost_model_path
from quanta_core.sim.cost_model import CostModel, StepFeatures
from quanta_core.sim.fit import fit_cost_model
from quanta_core.sim.step_trace import StepRecord, compare_trace, in_run, read_trace, served_steps


def load_runs(folder: Path) -> dict[str, tuple[list[StepRecord], float]]:
    """Each traced run's served steps and its in-run speed factor (vs the calibrated model)."""
    runs = {}
    for report in sorted(folder.glob("steps-*.json")):
        key = report.stem.removeprefix("steps-")
        trace = folder / f"steps-{key}.jsonl"
        if not trace.exists():
            continue
        with trace.open() as f:
            records = served_steps(read_trace(f))
        runs[key] = (records, json.loads(report.read_text())["in_run"]["speed_factor"])
    return runs


def cross_model(
    held_out: str, runs: dict[str, tuple[list[StepRecord], float]], base: CostModel
) -> CostModel:
    points: list[tuple[StepFeatures, float]] = [
        (r.features, r.engine / factor)
        for key, (records, factor) in runs.items()
        if key != held_out
        for r in records
    ]
    meta = {**base.meta, "fitted_from": f"served steps of every fidelity run but {held_out}"}
    fitted = fit_cost_model(points, meta=meta)
    kept = {name: getattr(base, name) for name in fitted.meta["fit"]["unexercised"]}
    coefficients = {**fitted.coefficients(), **kept}
    return CostModel(**coefficients, meta=fitted.meta)


def main(folder: Path) -> None:
    base = CostModel.load(default_cost_model_path())
    runs = load_runs(folder)
    if len(runs) < 2:
        sys.exit(f"{folder}: fewer than two traced runs (steps-*.jsonl with their reports)")
    for key, (records, _) in runs.items():
        model = cross_model(key, runs, base)
        model_path = folder / f"cross-model-{key}.json"
        model.save(model_path)
        machine = in_run(compare_trace(records, model.predict)[1], 1.0)
        fit = model.meta["fit"]["errors"]["all"]
        print(
            f"{key}: fitted on {model.meta['fit']['points']} steps (MAPE {fit['mape']:.1f}%), "
            f"in-run speed {machine.speed_factor:.3f}, "
            f"server {1e3 * machine.server_cycle_s:.2f} ms",
            flush=True,
        )
        simulate(folder, key, "sim-cross", model_path, machine.speed_factor, machine.server_cycle_s)


def simulate(
    folder: Path, key: str, prefix: str, model_path: Path, speed: float, server_cycle_s: float
) -> None:
    """``quanta sim`` of the run ``key`` (``<policy>-<load>``) with that cost model, speed and
    server time per cycle, into ``<prefix>-<key>.json``."""
    policy, load = key.split("-", 1)
    command = [
        str(Path(sys.executable).with_name("quanta")),
        "sim",
        "--workload", str(folder / f"workload-{load}.toml"),
        "--policy", policy,
        "--cost-model", str(model_path),
        "--speed-factor", str(speed),
        "--server-cycle-ms", str(1e3 * server_cycle_s),
        "--out", str(folder / f"{prefix}-{key}.json"),
        "--label", f"{prefix}-{key}",
    ]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
