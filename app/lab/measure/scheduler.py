"""Scheduler overhead per cycle: ``schedule()`` + ``update()`` at 1, 16 and 64 running; and
a burst's admission: N interactive requests at once under the default policy.

The engine is the fake one (its own time is not counted); the figure is compared with the
real engine's decode step at the same batch, read from ``bench/results/engine.json`` (run
``quanta bench engine`` first). Target: under 2% of the step. The burst runs with a
GPU's slots (256 running, 2,048-token steps), where a crowd of 200 comes in at once: every
``submit`` is on the server's event loop before the request is queued, so its cost adds up
across the burst. Writes ``bench/results/scheduler_overhead.json``.

    quanta bench scheduler [--cycles N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from app.lab.measure.common import console, environment, write_results
from quanta_core.clock import VirtualClock
from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import SamplingParams
from quanta_core.requests import GenerationRequest
from quanta_core.scheduler import Scheduler, SchedulerConfig

CONTEXT = 128  # prompt tokens per sequence, as in the engine benchmark's batch sweep


def cycle_times(running: int, cycles: int) -> list[float]:
    executor = FakeExecutor(n_ctx=65536, n_seq_max=64, n_batch=8192, n_vocab=100_000)
    clock = VirtualClock()
    config = SchedulerConfig(max_running=running, token_budget=8192)
    scheduler = Scheduler(config, executor.info, clock)
    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    for i in range(running):
        prompt = tuple(range(1000 * i + 1, 1000 * i + 1 + CONTEXT))
        scheduler.submit(GenerationRequest(f"r{i}", prompt, 10 * cycles, sampling))
    for _ in range(3):  # prefill everyone; from here on every cycle is a decode of all
        plan = scheduler.schedule()
        scheduler.update(plan, executor.step(plan))
        clock.advance(0.01)
    times = []
    for _ in range(cycles):
        t0 = time.perf_counter()
        plan = scheduler.schedule()
        t1 = time.perf_counter()
        result = executor.step(plan)  # not counted
        t2 = time.perf_counter()
        scheduler.update(plan, result)
        scheduler.drain_events()
        t3 = time.perf_counter()
        assert len(plan.slices) == running
        times.append((t1 - t0) + (t3 - t2))
        clock.advance(0.01)
    return times


def burst_times(n: int) -> tuple[list[float], float]:
    """``submit`` seconds of each of ``n`` interactive requests (32-token prompts, 256 tokens)
    arriving 0.5 ms apart, and the seconds of the ``schedule`` that starts the first of them."""
    from app.server.scheduling import scheduler_config
    from app.server.settings import Settings

    settings = Settings(n_gpu_layers=-1, n_seq_max=256, max_running=256, n_ctx=77824, n_batch=2048)
    executor = FakeExecutor(n_ctx=77824, n_seq_max=256, n_batch=2048, n_vocab=100_000)
    clock = VirtualClock()
    scheduler = Scheduler(scheduler_config(settings), executor.info, clock)
    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    submits = []
    for i in range(n):
        clock.advance(0.0005)
        prompt = tuple(range(300 * i + 1, 300 * i + 33))
        t0 = time.perf_counter()
        scheduler.submit(GenerationRequest(f"b{i}", prompt, 256, sampling))
        submits.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    plan = scheduler.schedule()
    first = time.perf_counter() - t0
    assert plan.slices, "the burst's first cycle started nothing"
    return submits, first


def engine_step_ms(batch: int) -> float | None:
    path = Path("bench/results/engine.json")
    if not path.exists():
        return None
    rows = json.loads(path.read_text())["decode"]
    match = [r["step_ms"] for r in rows if r["batch"] == batch and r["context"] == CONTEXT]
    return match[0] if match else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("bench/results/scheduler_overhead.json"))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for running in (1, 16, 64):
        times = cycle_times(running, args.cycles)
        overhead_ms = statistics.median(times) * 1e3
        step_ms = engine_step_ms(running)
        rows.append(
            {
                "running": running,
                "cycle_overhead_ms": overhead_ms,
                "cycle_overhead_p99_ms": statistics.quantiles(times, n=100)[98] * 1e3,
                "engine_step_ms": step_ms,
                "share_pct": None if step_ms is None else 100 * overhead_ms / step_ms,
            }
        )
    bursts: list[dict[str, Any]] = []
    for n in (64, 200):
        submits, first = burst_times(n)
        bursts.append(
            {
                "requests": n,
                "submit_mean_us": statistics.fmean(submits) * 1e6,
                "submit_last_us": submits[-1] * 1e6,
                "submit_total_ms": sum(submits) * 1e3,
                "first_schedule_ms": first * 1e3,
            }
        )
    table = Table(title="scheduler overhead per cycle (schedule + update)")
    for col in ("running", "median", "p99", "engine step", "share (target < 2%)"):
        table.add_column(col, justify="right")
    for r in rows:
        step = "—" if r["engine_step_ms"] is None else f"{r['engine_step_ms']:.1f} ms"
        share = "—" if r["share_pct"] is None else f"{r['share_pct']:.2f}%"
        table.add_row(
            str(r["running"]),
            f"{r['cycle_overhead_ms']:.3f} ms",
            f"{r['cycle_overhead_p99_ms']:.3f} ms",
            step,
            share,
        )
    console.print(table)
    burst = Table(title="a burst at once (default policy, 256 slots): submits, first schedule")
    for col in ("requests", "submit mean", "last submit", "all submits", "first schedule"):
        burst.add_column(col, justify="right")
    for b in bursts:
        burst.add_row(
            str(b["requests"]),
            f"{b['submit_mean_us']:.0f} µs",
            f"{b['submit_last_us']:.0f} µs",
            f"{b['submit_total_ms']:.1f} ms",
            f"{b['first_schedule_ms']:.1f} ms",
        )
    console.print(burst)
    write_results(
        args.out,
        {"environment": environment(), "context": CONTEXT, "rows": rows, "bursts": bursts},
    )
