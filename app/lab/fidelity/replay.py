"""Fidelity with nothing from the run itself: a cost model fitted from the engine alone
replaying the other runs' steps, the run's speed from the reference probe.

``quanta bench fidelity run`` with ``REPLAY=1`` replays each real run's steps on the engine
alone right after it (``quanta step-replay``: ``alone-<policy>-<load>.jsonl`` and the served /
alone ratio in ``replay-<policy>-<load>.json``). For each run R:

    the other runs' replayed steps ─▶ engine time / that run's probe factor (each replay
        brought to the calibration's speed) ─▶ fit_cost_model ─▶ replay-model-R.json
        (the engine alone, on the shapes a server makes: batches of sequences at different
        contexts beside the prefix cache's cells, not the grid's even ones)
    speed = R's probe factor (before and after R, engine alone)
          × served / alone of the other runs of R's policy (the server's toll on the engine)
    server time per cycle = the same runs' (their step traces)
      ─▶ quanta sim ─▶ sim-replay-R.json      (quanta bench fidelity table: the fourth table)

Unlike the in-run and cross tables, R's own steps set nothing: this is the simulation one
could run before R, from a calibration and a probe.

    quanta bench fidelity replay bench/results/fidelity
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import fmean
from typing import NamedTuple

from app.lab.fidelity.cross import cross_model, simulate
from app.lab.sim.command import default_cost_model_path
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.step_trace import StepRecord, read_trace, served_steps


class Replayed(NamedTuple):
    steps: list[StepRecord]  # the engine alone's
    probe_factor: float  # the reference probe around the run (vs the calibration)
    served_over_alone: float  # the served engine's time over the replayed one's
    server_cycle_s: float  # the server's time per cycle (its step trace)


def load_replays(folder: Path) -> dict[str, Replayed]:
    runs = {}
    for trace in sorted(folder.glob("alone-*.jsonl")):
        key = trace.stem.removeprefix("alone-")
        with trace.open() as f:
            steps = served_steps(read_trace(f))
        report = folder / f"replay-{key}.json"
        probe = json.loads((folder / f"probe-{key}.json").read_text())["speed_factor"]
        served = json.loads((folder / f"steps-{key}.json").read_text())["in_run"]
        ratio = json.loads(report.read_text())["all"]["ratio"]
        runs[key] = Replayed(steps, probe, ratio, served["server_cycle_s"])
    return runs


def policy_of(key: str) -> str:
    return key.split("-", 1)[0]


def peers(key: str, runs: dict[str, Replayed]) -> list[Replayed]:
    """The other runs of ``key``'s policy (the server's toll depends on it), else all others."""
    same = [r for k, r in runs.items() if k != key and policy_of(k) == policy_of(key)]
    return same or [r for k, r in runs.items() if k != key]


def main(folder: Path) -> None:
    base = CostModel.load(default_cost_model_path())
    runs = load_replays(folder)
    if len(runs) < 2:
        sys.exit(f"{folder}: fewer than two replayed runs (quanta bench fidelity run --replay)")
    for key, run in runs.items():
        model = cross_model(key, {k: (r.steps, r.probe_factor) for k, r in runs.items()}, base)
        model_path = folder / f"replay-model-{key}.json"
        model.save(model_path)
        others = peers(key, runs)
        serving = fmean(r.served_over_alone for r in others)
        cycle_s = fmean(r.server_cycle_s for r in others)
        speed = run.probe_factor * serving
        fit = model.meta["fit"]["errors"]["all"]
        print(
            f"{key}: fitted on {model.meta['fit']['points']} replayed steps "
            f"(MAPE {fit['mape']:.1f}%), probe {run.probe_factor:.3f} x served/alone "
            f"{serving:.3f} = {speed:.3f}, server {1e3 * cycle_s:.2f} ms",
            flush=True,
        )
        simulate(folder, key, "sim-replay", model_path, speed, cycle_s)
