"""Issue 22's simulator figure: one whole ``quanta sim`` process replaying 10,000 requests of
the Azure conversation trace at its recorded lengths and rate (target: under 10 s).

    python -m scripts.bench_sim_process [--requests N] [--repeat K]

Times the process from the outside (start-up, the trace, the simulation, the figures and the
results file all count): wall seconds and the CPU seconds it used (on a machine others load,
the CPU time is the steadier figure). Writes ``bench/results/sim/trace_full.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchlib import environment, write_results

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "bench/traces/azure_llm_2023_conv.csv"
OUT = ROOT / "bench/results/sim/trace_full.json"


def one_run(requests: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "app.cli", "sim", "--trace", str(TRACE)]
        cmd += ["--requests", str(requests), "--out", f"{tmp}/sim.json"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    runs = [one_run(args.requests) for _ in range(args.repeat)]
    figures = {
        "requests": args.requests,
        "wall_s_runs": [round(w, 2) for w, _ in runs],
        "cpu_s_runs": [round(c, 2) for _, c in runs],
        "wall_s": round(min(w for w, _ in runs), 2),
        "cpu_s": round(min(c for _, c in runs), 2),
        "load_avg_1min": os.getloadavg()[0],
        "target_s": 10.0,
    }
    print(figures)
    write_results(OUT, {"environment": environment(workload=TRACE.name), "figures": figures})


if __name__ == "__main__":
    main()
