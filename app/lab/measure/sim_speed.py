"""Simulator speed: 10,000 requests of the Azure conversation trace on the virtual clock.

Target (issue 8): under 10 s on this machine. The workload is ``bench/workloads/azure_conv.toml``
(arrivals 20x slower, lengths a quarter, as fitted to this 2-core CPU) read from the repo's
copy of the trace, with its request limit raised to ``--requests``; the scheduler has the
server's defaults (``quanta run``); the cost model is ``config/cost_models``'s (or a stand-in
with the real engine's order of magnitude, bench/results/engine.json, when none is calibrated).
Writes ``bench/results/sim_speed.json``; ``--profile`` prints where the time goes.

This VM's speed drifts by a quarter within minutes (the same run took 7.5 s and 12 s a few
minutes apart, the machine otherwise idle): the run is repeated (``--repeat``, default 3) and
every time is kept; the figure is the best, the one least slowed by the host.

    quanta bench sim-speed [--requests N] [--policy P] [--repeat K] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import os
import pstats
import time
from pathlib import Path
from typing import Any

from app.lab.measure.common import console, environment, write_results
from app.lab.sim.command import CostModelMissing, default_cost_model_path, sim_setup
from app.server.settings import Settings
from quanta_core.metrics import summarize
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.run import SimOutcome, simulate
from quanta_core.workload import build_plan, load_workload, read_trace

ROOT = Path(__file__).resolve().parents[3]  # the checkout
WORKLOAD = ROOT / "bench/workloads/azure_conv.toml"
TRACE = ROOT / "bench/traces/azure_llm_2023_conv.csv"
OUT = ROOT / "bench/results/sim_speed.json"
# Until `quanta calibrate` has written a model: 2 threads, SmolLM2-135M (engine.json): a
# decode step of one sequence ~18 ms, ~14 ms per extra sequence, prefill ~160 tokens/s.
STAND_IN = CostModel(
    per_pass=0.006,
    per_decode=0.012,
    per_prefill=0.0063,
    per_attended=2e-5,
    meta={"model": "stand-in (bench/results/engine.json)"},
)


def cost_model() -> tuple[CostModel, str]:
    try:
        path = default_cost_model_path(ROOT / "config/cost_models")
    except CostModelMissing:
        return STAND_IN, "stand-in"
    return CostModel.load(path), str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument(
        "--rate-scale", type=float, default=1.0, help="arrivals this many times faster"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is the figure")
    parser.add_argument("--profile", action="store_true", help="cProfile the run, print the top")
    args = parser.parse_args()

    spec = load_workload(WORKLOAD)
    assert spec.trace is not None
    trace = dataclasses.replace(
        spec.trace,
        path=str(TRACE),
        limit=args.requests,
        time_scale=spec.trace.time_scale / args.rate_scale,
    )
    spec = dataclasses.replace(spec, trace=trace)
    t0 = time.perf_counter()
    plan = build_plan(spec, read_trace(str(TRACE)))
    plan_s = time.perf_counter() - t0
    model, model_name = cost_model()
    config, info = sim_setup(Settings(policy=args.policy), model)

    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    runs: list[tuple[SimOutcome, float]] = []
    for _ in range(1 if profiler is not None else max(1, args.repeat)):
        cpu = time.process_time()
        run = simulate(spec, plan, config, info, model)
        runs.append((run, time.process_time() - cpu))
    if profiler is not None:
        profiler.disable()
    outcome, cpu_s = min(runs, key=lambda r: r[0].wall_s)
    if len({(o.steps, o.virtual_s) for o, _ in runs}) != 1:
        raise SystemExit("the runs differ: a simulation must be a pure function of its inputs")
    summary = summarize(outcome.records, spec.targets, window_s=spec.window_s).overall
    tokens = sum(r.n_output for r in outcome.records)
    figures: dict[str, Any] = {
        "requests": len(outcome.records),
        "rate_scale": args.rate_scale,
        "tokens_per_step": round(tokens / max(outcome.steps, 1), 1),
        "completed": summary.completed,
        "output_tokens": tokens,
        "prompt_tokens": sum(r.prompt_tokens for r in outcome.records),
        "steps": outcome.steps,
        "virtual_s": round(outcome.virtual_s, 1),
        "engine_busy_fraction": round(outcome.busy_s / max(outcome.virtual_s, 1e-9), 3),
        "plan_s": round(plan_s, 3),
        "wall_s": round(outcome.wall_s, 3),
        "wall_s_runs": [round(o.wall_s, 3) for o, _ in runs],
        "cpu_s": round(cpu_s, 3),
        "requests_per_wall_s": round(len(outcome.records) / outcome.wall_s),
        "steps_per_wall_s": round(outcome.steps / outcome.wall_s),
        "us_per_step": round(1e6 * outcome.wall_s / max(outcome.steps, 1), 1),
        "load_avg_1min": os.getloadavg()[0],
        "target_s": 10.0,
    }
    console.print(figures)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return  # a profiled run's times are not the figure
    out = OUT if args.rate_scale == 1.0 else OUT.with_name(f"sim_speed_x{args.rate_scale:g}.json")
    write_results(
        out,
        {
            "environment": environment(
                policy=args.policy, cost_model=model_name, workload=str(WORKLOAD.name)
            ),
            "figures": figures,
        },
    )
