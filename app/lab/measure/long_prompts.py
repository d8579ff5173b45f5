"""The default policy at real prompt lengths, served: four workloads against ``quanta run``.

    burst-1k     8 x (1,000-token prompt + 128) at once, interactive
    burst-3k     4 x (3,000 + 128) at once, interactive
    coding       24 requests of a coding-style stream (prompts 36-2,236 tokens, median ~480;
                 answers 6-94), Poisson, interactive: 0.12/s on the reference machine (about
                 3/4 of what it serves, by the simulator), scaled by this machine's speed
                 now (the reference probe's time, measured before each round)
    weights-run  two interactive tenants, weights 1 : 2, 12 closed-loop users each (64 + 48
                 tokens), 60 s: every stream fits the running set at once (on a GPU; on the
                 2-core CPU 24 streams outgrow it and the users, who resend at once when
                 refused, never wait their retry-after)
    weights-8    the same with 4 users each: all streams run at once on the 2-core CPU

Each is run against a fresh server per ``--code`` tree (the checkout whose ``app.cli`` is
started: compare a branch with its base in turns on the same machine). The long-prompt
workloads run with one KV stream per slot (``QUANTA_KV_UNIFIED=false``,
``QUANTA_N_SEQ_MAX=16``) and ``n_ctx`` 65,536 unless the environment says otherwise; the
weights workloads on the server's defaults (nothing set: the split is a claim about what a
user gets). Prints one line per run and writes the cells to ``--out``.

    quanta bench long-prompts --only burst-1k,coding --code /work/base --code .
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from app.lab.bench.scenarios import TARGETS, Scenario
from app.lab.bench.servers import RealServers
from app.lab.bench.suite import run_one
from app.server.settings import default_model_path
from quanta_core.workload import TenantSpec, WorkloadSpec, fixed
from quanta_core.workload.lengths import DistKind, LengthDist

N_CTX = 65_536
_ENV = {"QUANTA_KV_UNIFIED": "false", "QUANTA_N_SEQ_MAX": "16"}


def burst(name: str, n: int, prompt: int, output: int) -> Scenario:
    people = TenantSpec("people", prompt=fixed(prompt), output=fixed(output), requests=n)
    spec = WorkloadSpec(name, (people,), requests=None, rate=math.inf, targets=TARGETS)
    return Scenario(name, spec, n_ctx=N_CTX)


CODING_RATE = 0.12  # requests/s on the reference machine: about 3/4 of its capacity


def coding(rate: float = CODING_RATE) -> Scenario:
    prompt = LengthDist(DistKind.LOGNORMAL, mean=600.0, std=750.0, min=33, max=3718)
    output = LengthDist(DistKind.UNIFORM, min=6, max=94)
    dev = TenantSpec("dev", prompt=prompt, output=output, requests=24)
    spec = WorkloadSpec("coding", (dev,), seed=38, requests=None, rate=rate, targets=TARGETS)
    return Scenario("coding", spec, n_ctx=N_CTX)


def weights_running(users: int = 12) -> Scenario:
    tenants = tuple(
        TenantSpec(name, weight=w, prompt=fixed(64), output=fixed(48), users=users)
        for name, w in (("one", 1.0), ("two", 2.0))
    )
    spec = WorkloadSpec(
        "weights",  # the suite's key figures for two weighted tenants
        tenants,
        seed=11,
        requests=4000,
        users=2 * users,
        duration_s=60.0,
        targets=TARGETS,
        window_s=10.0,
    )
    return Scenario("weights", spec, n_ctx=None)  # the server's defaults


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "burst-1k": lambda: burst("burst-1k", 8, 1000, 128),
    "burst-3k": lambda: burst("burst-3k", 4, 3000, 128),
    "burst-7k": lambda: burst("burst-7k", 2, 7600, 64),
    "coding": coding,
    "weights-run": weights_running,
    "weights-8": lambda: weights_running(4),  # 4 + 4 users: all fit this CPU's running set
}


@contextmanager
def _layout_env(scenario: Scenario) -> Iterator[None]:
    """The stream layout's settings (``_ENV``, where the environment does not set them) for
    a scenario that sets its context; none for one that runs on the defaults."""
    added = {k: v for k, v in _ENV.items() if k not in os.environ}
    if scenario.n_ctx is not None:
        os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _line(tag: str, cell: dict[str, object]) -> str:
    keep = ("served", "refused", "ttft_p50_s", "ttft_p99_s", "itl_p99_s", "tokens_per_s")
    parts = [f"{k}={cell[k]:.3g}" if isinstance(cell[k], float) else f"{k}={cell[k]}" for k in keep]
    est = cell.get("estimate")
    if isinstance(est, dict):
        parts.append(f"est/actual={est['estimate_over_actual_median']:.3g}")
    key = cell.get("key")
    if isinstance(key, dict) and "tokens_ratio" in key:
        parts.append(f"tokens 2:1={key['tokens_ratio']}")
    return f"{tag}: " + " ".join(parts)


def _speed_factor() -> float:
    """How many times the reference machine's time this one takes for the reference probe
    now (``quanta calibrate --probe-only``)."""
    from app.lab.calibrate.command import measure_probe_alone
    from app.lab.calibrate.probe import speed_factor
    from app.lab.sim.command import default_cost_model_path
    from app.server.settings import Settings
    from quanta_core.sim.cost_model import CostModel

    reference = CostModel.load(default_cost_model_path())
    # the probe copies sequences: the calibration's layout, one KV buffer
    settings = Settings(
        model_path=default_model_path(), threads=os.cpu_count() or 2, kv_unified=True
    )
    return float(speed_factor(measure_probe_alone(settings).total_s, reference))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--code", action="append", default=[], help="checkout to serve from")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("bench/results/long_prompts"))
    args = ap.parse_args()
    codes = [Path(c).resolve() for c in args.code] or [Path.cwd()]
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    launcher = RealServers(default_model_path(), threads=os.cpu_count() or 2)
    cells: list[dict[str, object]] = []
    for rnd in range(args.rounds):
        for name in args.only.split(","):
            factor = _speed_factor() if name == "coding" else 1.0
            for code in codes:
                os.chdir(code)  # ``python -m app.cli`` serves this checkout's code
                scenario = coding(CODING_RATE / factor) if name == "coding" else SCENARIOS[name]()
                load = os.getloadavg()
                with _layout_env(scenario):
                    cell = run_one(scenario, "quanta", launcher, args.out / code.name / str(rnd))
                cell.pop("records")
                cell.update(code=str(code), round=rnd, name=name, speed_factor=factor)
                cells.append(cell)
                tag = f"{name} {code.name} #{rnd} x{factor:.2f}"
                print(f"load {load[0]:.2f} " + _line(tag, cell), flush=True)
                with open(args.out / "cells.jsonl", "a") as f:
                    f.write(json.dumps(cell) + "\n")
