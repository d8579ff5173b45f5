"""The twenty-people scenario, in the core: 20 people ask at once for a 128-token answer.

For each policy, the scheduler core drives the real engine (no HTTP): when the 1st, 10th and
20th person sees a first token, the whole run's time and its tokens/s. Prints a table and
writes ``bench/results/twenty_at_once_core.json``.

    quanta bench twenty-core [--policies sequential,static,fcfs] [--threads N]

llama.cpp's own llama-server on this machine (20 slots) prefills all 20 prompts before any
decode: every person waits ≈ 3.2 s for a first token; one slot at a time, the 20th waits 23.6 s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from app.lab.measure.common import console, environment, write_results
from app.server.settings import default_model_path
from quanta_core.clock import WallClock
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor
from quanta_core.engine.llama_cpp.tokenizer import Tokenizer
from quanta_core.engine.types import SamplingParams
from quanta_core.requests import GenerationRequest, TokenEvent
from quanta_core.scheduler import Driver, Scheduler, SchedulerConfig

PEOPLE = 20
ANSWER_TOKENS = 128
QUESTIONS = [
    "What is the tallest mountain on Earth?",
    "How do bees make honey?",
    "Why is the sky blue?",
    "What is a prime number?",
    "How does a rainbow form?",
    "Who wrote Romeo and Juliet?",
    "What do plants need to grow?",
    "How far is the Moon?",
    "What is photosynthesis?",
    "Why do cats purr?",
    "How do airplanes fly?",
    "What causes the seasons?",
    "What is the speed of light?",
    "How do volcanoes erupt?",
    "What is a black hole?",
    "Why do leaves change colour?",
    "How does the heart work?",
    "What is gravity?",
    "How are clouds formed?",
    "What is the largest ocean?",
]


async def one_run(
    executor: LlamaCppExecutor, prompts: list[tuple[int, ...]], config: SchedulerConfig
) -> dict[str, Any]:
    clock = WallClock()
    driver = Driver(Scheduler(config, executor.info, clock), executor, clock)
    await driver.start()
    # Exactly ANSWER_TOKENS tokens each, as the scenario says: the end token is masked.
    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    started = clock.now()
    handles = [
        driver.submit(GenerationRequest(f"p{i}", p, ANSWER_TOKENS, sampling))
        for i, p in enumerate(prompts)
    ]

    async def watch(handle: Any) -> list[float]:
        times = []
        async for event in handle:
            if isinstance(event, TokenEvent):
                times.append(clock.now() - started)
        return times

    token_times = await asyncio.gather(*(watch(h) for h in handles))
    total = clock.now() - started
    await driver.stop(grace_s=1)
    first = sorted(t[0] for t in token_times)
    gaps = [b - a for t in token_times for a, b in itertools.pairwise(t)]
    n_tokens = sum(len(t) for t in token_times)
    return {
        "ttft_1st_s": first[0],
        "ttft_10th_s": first[9],
        "ttft_20th_s": first[-1],
        "ttft_mean_s": statistics.fmean(first),
        "total_s": total,
        "tokens": n_tokens,
        "tokens_per_s": n_tokens / total,
        "itl_mean_ms": 1e3 * statistics.fmean(gaps),
        "itl_p99_ms": 1e3 * statistics.quantiles(gaps, n=100)[98],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", default="sequential,static,fcfs")
    parser.add_argument("--token-budgets", default="512,128", help="fcfs runs once for each")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/twenty_at_once_core.json"))
    args = parser.parse_args()
    model = str(default_model_path())
    tokenizer = Tokenizer.load(model)
    prompts = [tuple(tokenizer.encode_chat([{"role": "user", "content": q}])) for q in QUESTIONS]
    engine = EngineConfig(model_path=model, n_ctx=8192, n_seq_max=32, threads=args.threads)
    runs: list[dict[str, Any]] = []
    for policy in args.policies.split(","):
        budgets = [int(b) for b in args.token_budgets.split(",")] if policy == "fcfs" else [512]
        for budget in budgets:
            config = SchedulerConfig(policy=policy, max_running=PEOPLE, token_budget=budget)  # type: ignore[arg-type]
            with LlamaCppExecutor.start(engine) as executor:
                console.print(f"{policy} (token budget {budget}) …")
                t0 = time.perf_counter()
                row = asyncio.run(one_run(executor, prompts, config))
                console.print(f"  done in {time.perf_counter() - t0:.1f} s")
            runs.append({"policy": policy, "token_budget": budget, **row})
    table = Table(title=f"{PEOPLE} people ask at once for {ANSWER_TOKENS} tokens (core, no HTTP)")
    for col in (
        "policy",
        "budget",
        "1st TTFT",
        "10th",
        "20th",
        "20th/1st",
        "total",
        "tok/s",
        "ITL mean",
        "ITL p99",
    ):
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(
            r["policy"],
            str(r["token_budget"]),
            f"{r['ttft_1st_s']:.2f} s",
            f"{r['ttft_10th_s']:.2f} s",
            f"{r['ttft_20th_s']:.2f} s",
            f"{r['ttft_20th_s'] / r['ttft_1st_s']:.1f}×",
            f"{r['total_s']:.1f} s",
            f"{r['tokens_per_s']:.0f}",
            f"{r['itl_mean_ms']:.0f} ms",
            f"{r['itl_p99_ms']:.0f} ms",
        )
    console.print(table)
    write_results(
        args.out,
        {
            "scenario": {
                "people": PEOPLE,
                "answer_tokens": ANSWER_TOKENS,
                "prompt_tokens": [len(p) for p in prompts],
            },
            "environment": environment(model=Path(model).name, threads=args.threads),
            "runs": runs,
        },
    )
