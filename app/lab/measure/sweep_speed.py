"""Sweep speed: the default ``quanta sweep`` (5 policies × 8 rates, ``sweep_default.toml``).

Target (issue 8): a default sweep of at least 4 policies × 8 rates in under 5 minutes on this
2-core machine. Runs exactly what ``quanta sweep --cost-model …`` runs (same grid, workload,
workers, outputs) and times it: the points, then the CSV, summary and plots. The cost model is
``config/cost_models``'s, or the simulator benchmark's stand-in when none is calibrated yet.
The machine's load average is recorded before and after: other work on the 2 cores slows it.
Writes ``bench/results/sweep_speed.json`` and the sweep itself to ``--out``.

    quanta bench sweep-speed [--jobs N] [--requests N] [--cost-model F]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from app.lab.measure.common import console, environment, write_results
from app.lab.measure.sim_speed import STAND_IN
from app.lab.sim.command import CostModelMissing, sim_setup
from app.lab.sweep.command import (
    COST_MODELS,
    SweepJob,
    base_workload,
    find_cost_model,
    run_points,
    write_outputs,
)
from app.lab.sweep.grid import Grid, expand, with_requests
from app.server.settings import Settings
from quanta_core.sim.cost_model import CostModel

ROOT = Path(__file__).resolve().parents[3]  # the checkout
OUT = ROOT / "bench/results/sweep_speed.json"
TARGET_S = 300.0


def cost_model_path(given: Path | None, scratch: Path) -> tuple[Path, str]:
    try:
        path = find_cost_model(given)
        return path, str(path)
    except CostModelMissing:
        # Workers load the model from a file: write the stand-in to one.
        path = scratch / "stand_in.json"
        STAND_IN.save(path)
        return path, f"stand-in (none in {COST_MODELS})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--requests", type=int, default=None, help="default: the workload's")
    parser.add_argument("--cost-model", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "sweep_default")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        model_path, model_name = cost_model_path(args.cost_model, Path(scratch))
        spec = with_requests(base_workload(None, None, None, 1.0), args.requests)
        base, engine = sim_setup(Settings(), CostModel.load(model_path))
        grid = Grid()
        points = expand(grid, base)
        job = SweepJob(spec, base, engine, model_path)
        load_before = os.getloadavg()
        console.print(
            f"default sweep: {len(points)} points ({len(grid.policies)} policies × "
            f"{len(grid.rates)} rates), {spec.requests} requests each, {args.jobs} job(s), "
            f"cost model {model_name}; load average {load_before[0]:.2f}"
        )
        started = time.perf_counter()
        rows = run_points(job, points, args.jobs)
        ran = time.perf_counter()
        write_outputs(rows, spec, args.out, plots=True)
        finished = time.perf_counter()
    results = figures(rows, ran - started, finished - ran)
    results.update(
        points=len(points),
        policies=list(grid.policies),
        rates=list(grid.rates),
        requests_per_point=spec.requests,
        jobs=args.jobs,
        cost_model=model_name,
        load_average_before=load_before[0],
        load_average_after=os.getloadavg()[0],
        env=environment(),
    )
    print_figures(results)
    write_results(OUT, results)


def figures(rows: list[dict[str, Any]], run_s: float, outputs_s: float) -> dict[str, Any]:
    walls = [r["wall_s"] for r in rows]
    slowest = max(rows, key=lambda r: r["wall_s"])
    total = run_s + outputs_s
    return {
        "total_s": total,
        "points_s": run_s,
        "outputs_s": outputs_s,  # CSV, summary.md and the four plots
        "target_s": TARGET_S,
        "met": total < TARGET_S,
        "point_wall_s": {"sum": sum(walls), "median": statistics.median(walls), "max": max(walls)},
        "slowest_point": {k: slowest[k] for k in ("policy", "rate", "steps", "wall_s")},
        "sim_steps": sum(r["steps"] for r in rows),
    }


def print_figures(r: dict[str, Any]) -> None:
    verdict = "[green]met" if r["met"] else "[red]missed"
    w = r["point_wall_s"]
    console.print(
        f"{r['points']} points in {r['total_s']:.1f} s (points {r['points_s']:.1f} s, outputs "
        f"{r['outputs_s']:.1f} s); target < {r['target_s']:.0f} s: {verdict}\n"
        f"per point: median {w['median']:.2f} s, max {w['max']:.2f} s "
        f"({r['slowest_point']['policy']} @ {r['slowest_point']['rate']:g}), "
        f"sum {w['sum']:.1f} s over {r['jobs']} job(s); {r['sim_steps']:,} engine steps\n"
        f"load average {r['load_average_before']:.2f} before, {r['load_average_after']:.2f} after"
    )
