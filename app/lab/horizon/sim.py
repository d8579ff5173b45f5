"""Issue 22 on the simulator: ``bench/sweeps/kv_burst.toml`` (fcfs vs horizon over KV pool
sizes) for bursts of 12, 24 and 48 requests, then the plots (``quanta bench horizon figures
sim``).

    quanta bench horizon sim [--bursts 12,24,48] [--out bench/results/horizon]
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from app.lab.server import QUANTA, ROOT


def main() -> None:
    parser = argparse.ArgumentParser(prog="quanta bench horizon sim", description=__doc__)
    parser.add_argument("--bursts", default="12,24,48", help="burst sizes, comma-separated")
    parser.add_argument("--grid", type=Path, default=Path("bench/sweeps/kv_burst.toml"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/horizon"))
    args = parser.parse_args()
    for n in args.bursts.split(","):
        command = [*QUANTA, "sweep", "--grid", str(args.grid), "--requests", n, "--jobs", "1"]
        command += ["--no-plots", "--quiet", "--out", str(args.out / f"sweep-burst{n}")]
        subprocess.run(command, check=True, cwd=ROOT)
    subprocess.run([*QUANTA, "bench", "horizon", "figures", "sim", str(args.out)], check=True)
