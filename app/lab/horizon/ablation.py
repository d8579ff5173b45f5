"""Issue 22's ablation on the simulator: what admission projects with, and how many streams
stay smooth (every gap between two tokens at most 1 s).

Two tenants share one KV pool (2,048 cells): ``terse`` answers 20-60 tokens, ``wordy``
200-300, both with ``max_tokens`` 320 and ending at end-of-generation (the simulated engine
samples it at the planned length), so ``max_tokens`` does not tell the length. A warm-up of
64 requests at 0.5/s teaches the predictor; then a burst of 48 (half each) arrives at once.
The ``horizon`` policy runs with its admission projecting remaining lengths by

    predictor      the p90 of the tenant's learnt lengths (the default)
    max_tokens     every request runs to its cap (safe, and pessimistic)
    global mean    the mean of every length seen (one number for all)

and ``fcfs`` for reference. Reported for the burst: streams that never stalled over 1 s,
preemptions, output tokens/s, mean time to first token, median end-to-end, the most
sequences one step ran (the warm-up's included). Writes ``bench/results/horizon/ablation.json``.

    quanta bench horizon ablation
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

from app.lab.sim.command import default_cost_model_path, sim_setup
from app.server.settings import Settings
from quanta_core.clock import VirtualClock
from quanta_core.engine.types import EngineInfo, SamplingParams
from quanta_core.requests import ChoiceResult, GenerationRequest
from quanta_core.scheduler import Scheduler
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.config import PolicyName, SchedulerConfig
from quanta_core.scheduler.policies.horizon import HorizonPolicy
from quanta_core.scheduler.policies.memory import max_tokens_remaining
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.executor import SimExecutor
from quanta_core.sim.loop import SimLoop

ROOT = Path(__file__).resolve().parents[3]  # the checkout
OUT = ROOT / "bench/results/horizon/ablation.json"
KV_BLOCKS = 128  # x 16 = 2,048 cells
MAX_TOKENS = 320
GAP_S = 1.0


class EndsAtLength(SimExecutor):
    """The simulated engine, sampling end-of-generation as a choice's planned last token."""

    def __init__(self, info: EngineInfo, cost_model: CostModel, lengths: dict[str, int]) -> None:
        super().__init__(info, cost_model)
        self.lengths = lengths
        self.eos = info.eog_tokens[0]

    def sample(self, owner: str, replayed: int) -> int:
        token = super().sample(owner, replayed)
        if self._samplers[owner][1] >= self.lengths[owner]:
            return self.eos
        return token


def requests(seed: int = 22) -> list[tuple[float, GenerationRequest, int, bool]]:
    """(arrival, request, length, in the burst)."""
    rng = random.Random(seed)
    out = []
    warm = [(i / 0.5, i % 2 == 0) for i in range(64)]
    burst_at = warm[-1][0] + 200.0
    burst = [(burst_at, i % 2 == 0) for i in range(48)]
    for k, (t, terse) in enumerate(warm + burst):
        tenant = "terse" if terse else "wordy"
        length = rng.randint(20, 60) if terse else rng.randint(200, 300)
        prompt = tuple(rng.randrange(1, 20_000) for _ in range(rng.randint(50, 100)))
        req = GenerationRequest(
            f"r{k}", prompt, MAX_TOKENS, sampling=SamplingParams(), tenant=tenant
        )
        out.append((t, req, length, k >= len(warm)))
    return out


def global_mean(policy: HorizonPolicy) -> Callable[[Choice], int]:
    def remaining(r: Choice) -> int:
        bound = max(r.max_tokens - r.num_output, 1)
        mean = policy.predictor.global_mean() or r.max_tokens
        return min(max(round(mean) - r.num_output, 1), bound)

    return remaining


def run(
    variant: str, config: SchedulerConfig, info: EngineInfo, model: CostModel
) -> dict[str, Any]:
    policy = PolicyName.FCFS if variant == "fcfs" else PolicyName.HORIZON
    config = SchedulerConfig(
        **{**{f: getattr(config, f) for f in config.__slots__}, "policy": policy}
    )
    clock = VirtualClock()
    sched = Scheduler(config, info, clock, token_events=False)
    if isinstance(sched.policy, HorizonPolicy):
        if variant == "max_tokens":
            sched.policy.gate.remaining = max_tokens_remaining
        elif variant == "global mean":
            sched.policy.gate.remaining = global_mean(sched.policy)
    plan = requests()
    lengths = {f"{req.request_id}/0": n for _, req, n, _ in plan}
    results: dict[str, ChoiceResult] = {}
    loop = SimLoop(
        sched,
        EndsAtLength(info, model, lengths),
        clock,
        lambda r: results.__setitem__(r.request_id, r),
    )
    for t, req, _, _ in plan:
        loop.arrive(t, req)
    most_running = 0

    def observe(plan: Any, result: Any) -> None:
        nonlocal most_running
        most_running = max(most_running, len(plan.slices))

    sched.policy.on_step = _chain(sched.policy.on_step, observe)  # type: ignore[method-assign]
    loop.run()
    burst = [results[req.request_id] for _, req, _, b in plan if b]
    t0 = min(r.timings.arrival for r in burst)
    end = max(r.timings.finished or t0 for r in burst)
    smooth = sum(1 for r in burst if all(b - a <= GAP_S for a, b in pairwise(r.token_times)))
    ttfts = sorted((r.timings.first_token or end) - r.timings.arrival for r in burst)
    e2es = sorted((r.timings.finished or end) - r.timings.arrival for r in burst)
    return {
        "variant": variant,
        "mean_ttft_s": round(sum(ttfts) / len(ttfts), 1),
        "median_e2e_s": round(e2es[len(e2es) // 2], 1),
        "most_running": most_running,
        "burst": len(burst),
        "never_stalled": smooth,
        "preemptions": sum(r.preemptions for r in burst),
        "output_tokens_per_s": round(sum(r.completion_tokens for r in burst) / (end - t0), 2),
        "burst_s": round(end - t0, 1),
    }


def _chain(first: Callable[[Any, Any], None], then: Callable[[Any, Any], None]) -> Any:
    def both(plan: Any, result: Any) -> None:
        first(plan, result)
        then(plan, result)

    return both


def main() -> None:
    parser = argparse.ArgumentParser(prog="quanta bench horizon ablation", description=__doc__)
    parser.parse_args()
    model_path = default_cost_model_path(ROOT / "config/cost_models")
    model = CostModel.load(model_path)
    config, info = sim_setup(Settings(), model, kv_blocks=KV_BLOCKS)
    rows = [run(v, config, info, model) for v in ("predictor", "max_tokens", "global mean", "fcfs")]
    for row in rows:
        print(json.dumps(row))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {"cost_model": model_path.name, "kv_cells": KV_BLOCKS * 16, "rows": rows}, indent=1
        )
        + "\n"
    )
