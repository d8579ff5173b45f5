"""Issue 8's fidelity experiment: the same workload run for real (``quanta bench run`` against
``quanta run --policy P``) and simulated (``quanta sim`` with the calibrated cost model), for
sequential, static and fcfs at three loads; then the relative error of the simulation in
throughput, mean and p99 TTFT and mean inter-token latency (``quanta bench fidelity table``).

    quanta bench fidelity run
    quanta bench fidelity run --policies fcfs --loads light:0.5 --requests 8     # a quick try

The workload: REQUESTS requests of 64-token prompts and 64-token answers (completions, token
ids, ignore-EOS), Poisson arrivals at the load's rate. fcfs serves about 0.8 requests/s of
these on the 2-core machine, so the loads are ~0.6x, 1x and 1.5x of that; each real run takes
1-2 minutes.

Each real run: a fresh server (the lab's harness: its own database, no developer config; the
simulation is given the same), one tenant key, ``quanta bench run``, the server stopped. It
is bracketed by the reference probe (``quanta calibrate --probe-only``, the engine alone, the
same threads): right before the server starts and right after it stops. This VM's speed
drifts by ±30 % over minutes; the mean of the two speed factors (the probe's time now / at the
cost model's calibration) goes to that run's ``quanta sim --speed-factor``, and both are kept
in OUT/probe-<policy>-<load>.json. The cost model must have been calibrated with the probe.

Each real server writes a step trace (OUT/steps-<policy>-<load>.jsonl, not committed), and
``quanta step-report`` compares its engine steps with the cost model at the run's speed factor
(OUT/steps-<policy>-<load>.json). A second simulation (OUT/sim-inrun-<policy>-<load>.json) is
given the machine as that trace saw it: per 10 s, the speed factor that makes the model's time
over those steps the engine's (``quanta sim --speed-profile``), and the server's time per
cycle. ``--replay``: after each real run, its steps again on the engine alone (``quanta
step-replay``: OUT/replay-<policy>-<load>.json). ``--server-cost FILE``: the server's own time
per step for the probe-speed simulations (``quanta bench fidelity server-cost`` over an
earlier set's traces). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from app.lab.server import QUANTA, ROOT, QuantaServer

WORKLOAD = """name = "fidelity-{name}"
seed = 11
requests = {requests}
rate = {rate}
endpoint = "completions"
ignore_eos = true
[[tenants]]
name = "fid"
class = "interactive"
prompt = 64
output = 64
"""


def quanta(*args: str, quiet: bool = False, env: dict[str, str] | None = None) -> int:
    output = subprocess.DEVNULL if quiet else None
    full_env = {**os.environ, "QUANTA_CONFIG": "", **(env or {})}
    return subprocess.run([*QUANTA, *args], cwd=ROOT, stdout=output, env=full_env).returncode


class Fidelity:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.cost_flag = ["--cost-model", str(args.cost_model)] if args.cost_model else []
        self.model = str(args.model) if args.model else None

    def model_flag(self) -> list[str]:
        return ["--model", self.model] if self.model else []

    def probe(self, path: Path) -> dict[str, Any]:
        """The reference probe on the engine alone, and its speed factor."""
        flags = [*self.model_flag(), "--threads", str(self.args.threads), *self.cost_flag]
        quanta("calibrate", "--probe-only", *flags, "--out", str(path), quiet=True)
        doc: dict[str, Any] = json.loads(path.read_text())
        if doc["speed_factor"] is None:
            sys.exit(
                f"{doc['cost_model'] or 'the cost model'} has no reference probe: calibrate it "
                "again (`quanta calibrate`) before measuring fidelity"
            )
        print(f"probe: {doc['total_s']:.3f} s, speed factor {doc['speed_factor']:.3f}")
        return doc

    def speed_factor_of(self, pair_file: Path) -> float:
        """A probe pair's mean time over the cost model in use (not the one the probes were
        compared with when measured: --skip-real with another --cost-model re-judges)."""
        from app.lab.calibrate.probe import speed_factor
        from app.lab.sim.command import default_cost_model_path
        from quanta_core.sim.cost_model import CostModel

        pair = json.loads(pair_file.read_text())
        model = CostModel.load(self.args.cost_model or default_cost_model_path())
        return float(
            speed_factor((pair["before"]["total_s"] + pair["after"]["total_s"]) / 2, model)
        )

    def real(self, policy: str, load: str, workload: Path) -> None:
        run = f"{policy}-{load}"
        before = self.probe(self.out / f"probe-{run}.before.json")
        flags = ["--policy", policy, "--threads", str(self.args.threads), *self.model_flag()]
        env = {"QUANTA_STEP_TRACE": str((self.out / f"steps-{run}.jsonl").resolve())}
        print(f"=== real: {policy} at {load} ===", file=sys.stderr)
        server = QuantaServer.fresh(*flags, "--log-level", "warning", env=env, prefix="quanta-fid-")
        with server:
            key = server.tenant_key("fid")
            bench = ["bench", "run", "--url", server.url, "--workload", str(workload)]
            bench += ["--api-key", key, "--out", str(self.out / f"real-{run}.json")]
            if quanta(*bench, "--label", f"real-{run}", "--quiet", "--no-plots"):
                print(f"bench: real-{run} had failed requests (see the table above)")
        if self.args.replay:
            print(f"=== replayed on the engine alone: {policy} at {load} ===", file=sys.stderr)
            env = {"QUANTA_THREADS": str(self.args.threads)}
            if self.model:
                env["QUANTA_MODEL_PATH"] = self.model
            replay = ["step-replay", str(self.out / f"steps-{run}.jsonl")]
            replay += ["--out", str(self.out / f"alone-{run}.jsonl")]
            quanta(*replay, "--report", str(self.out / f"replay-{run}.json"), env=env)
        after = self.probe(self.out / f"probe-{run}.after.json")
        factor = (before["speed_factor"] + after["speed_factor"]) / 2
        pair = {"speed_factor": factor, "before": before, "after": after}
        (self.out / f"probe-{run}.json").write_text(json.dumps(pair, indent=1) + "\n")
        for side in ("before", "after"):
            (self.out / f"probe-{run}.{side}.json").unlink()

    def simulate(self, policy: str, load: str, workload: Path, server_flag: list[str]) -> None:
        run = f"{policy}-{load}"
        probe, steps = self.out / f"probe-{run}.json", self.out / f"steps-{run}.jsonl"
        report = self.out / f"steps-{run}.json"
        speed_flag: list[str] = []
        if probe.exists():
            speed_flag = ["--speed-factor", str(self.speed_factor_of(probe))]
            if steps.exists():  # again with --skip-real: the cost model may be new
                quanta(
                    "step-report", str(steps), *self.cost_flag, *speed_flag, "--out", str(report)
                )
        else:
            print(f"no {probe}: simulated at the calibration's speed", file=sys.stderr)
        print(f"=== simulated: {policy} at {load} {' '.join(speed_flag)} ===", file=sys.stderr)
        sim = ["sim", "--workload", str(workload), "--policy", policy, *self.cost_flag]
        out = ["--out", str(self.out / f"sim-{run}.json"), "--label", f"sim-{run}"]
        quanta(*sim, *speed_flag, *server_flag, *out, quiet=True)
        if (self.out / f"real-{run}.json").exists():
            quanta("bench", "compare", str(self.out / f"real-{run}.json"), out[1])
        if report.exists():
            cycle_ms = 1e3 * json.loads(report.read_text())["in_run"]["server_cycle_s"]
            print(f"=== simulated: {policy} at {load} as the run saw the machine ===")
            profile = ["--speed-profile", str(report), "--server-cycle-ms", str(cycle_ms)]
            out = ["--out", str(self.out / f"sim-inrun-{run}.json"), "--label", f"sim-inrun-{run}"]
            quanta(*sim, *profile, *out, quiet=True)


def server_flag(path: Path) -> list[str]:
    if not path.is_file():
        return []
    cost = json.loads(path.read_text()).get("server_cost") or {}
    cycle, token = cost.get("per_cycle_ms", 0.0), cost.get("per_token_ms", 0.0)
    print(f"server cost from {path}: {cycle} ms per cycle + {token} ms per stream")
    return ["--server-cycle-ms", str(cycle), "--server-token-ms", str(token)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="quanta bench fidelity run", description=__doc__)
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: quanta's)")
    parser.add_argument("--cost-model", type=Path, default=None, help="(default: quanta sim's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/fidelity"))
    parser.add_argument("--policies", default="sequential,static,fcfs", help="comma-separated")
    parser.add_argument(
        "--loads", default="light:0.5,medium:0.8,heavy:1.2", help="name:requests_per_s, …"
    )
    parser.add_argument("--requests", type=int, default=60, help="requests per run")
    parser.add_argument("--skip-real", action="store_true", help="only simulate (reuse real-*)")
    parser.add_argument("--replay", action="store_true", help="each run's steps, engine alone")
    parser.add_argument(
        "--server-cost", type=Path, default=Path("bench/results/fidelity/server_cost.json")
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    fidelity = Fidelity(args)
    flag = server_flag(args.server_cost)
    for load in args.loads.split(","):
        name, rate = load.split(":")
        workload = args.out / f"workload-{name}.toml"
        workload.write_text(WORKLOAD.format(name=name, requests=args.requests, rate=rate))
        for policy in args.policies.split(","):
            if not args.skip_real:
                fidelity.real(policy, name, workload)
            fidelity.simulate(policy, name, workload, flag)
    quanta("bench", "fidelity", "table", str(args.out))
