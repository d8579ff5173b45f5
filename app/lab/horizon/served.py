"""Issue 22's served figure: the KV-bound burst (``bench/workloads/kv_burst.toml``: 24
requests at once) against ``quanta run --policy P`` with a small KV pool, the policies in turns
on fresh servers (the lab's harness), every other setting at its default; then ``quanta bench
horizon figures served`` reads the runs.

    quanta bench horizon served                       # 2 turns: fcfs, horizon, fcfs, horizon
    quanta bench horizon served --turns 1 --policies horizon

Writes ``<label>-<policy>-t<turn>.json`` (``quanta bench run``'s results) and the server's
``/metrics`` after the run beside it (``.metrics.txt``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import httpx

from app.lab.server import QUANTA, ROOT, QuantaServer


def run_one(args: argparse.Namespace, policy: str, turn: int) -> None:
    label = f"{args.label}-{policy}-t{turn}"
    print(f"=== {label} ===", file=sys.stderr)
    flags = ("--policy", policy, "--threads", str(args.threads), "--log-level", "warning")
    env = {"QUANTA_N_CTX": str(args.n_ctx)}
    with QuantaServer.fresh(*flags, env=env, prefix="quanta-horizon-") as server:
        key = server.tenant_key("burst")
        bench = [*QUANTA, "bench", "run", "--url", server.url, "--workload", str(args.workload)]
        bench += ["--api-key", key, "--out", str(args.out / f"{label}.json"), "--label", label]
        if subprocess.run([*bench, "--quiet", "--no-plots"], cwd=ROOT).returncode:
            print(f"bench: {label} had failed requests", file=sys.stderr)
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        (args.out / f"{label}.metrics.txt").write_text(metrics)


def main() -> None:
    parser = argparse.ArgumentParser(prog="quanta bench horizon served", description=__doc__)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--policies", default="fcfs,horizon", help="comma-separated")
    parser.add_argument("--n-ctx", type=int, default=2048, help="the server's KV pool")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workload", type=Path, default=Path("bench/workloads/kv_burst.toml"))
    parser.add_argument("--label", default="kv-burst", help="the results' name")
    parser.add_argument("--out", type=Path, default=Path("bench/results/horizon"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for turn in range(1, args.turns + 1):
        for policy in args.policies.split(","):
            run_one(args, policy, turn)
    if args.label == "kv-burst":
        figures = [*QUANTA, "bench", "horizon", "figures", "served", str(args.out)]
        subprocess.run(figures, check=True, cwd=ROOT)
