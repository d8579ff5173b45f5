"""Engine benchmark: what one llama.cpp pass costs on this machine, through the worker.

Prints a table and writes ``bench/results/engine.json``:
  - decode step time vs batch size (1…64) and context length,
  - prefill throughput by chunk size,
  - the socket round trip of an empty step, and the process boundary's share of a
    single-sequence decode step (target: under 2%),
  - stash / restore time per 1,000 tokens.

    quanta bench engine [--quick] [--threads N] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from rich.progress import Progress
from rich.table import Table

from app.lab.measure.common import console, environment, write_results
from app.server.settings import default_model_path
from quanta_core.engine import Restore, SeqSlice, Stash, StepPlan, StepTimings, Truncate
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor

BOUNDARY_BLOCK = 200  # one-sequence decode steps per block of the boundary's figure


def random_tokens(rng: random.Random, n: int, n_vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(100, n_vocab) for _ in range(n))


def fill(ex: LlamaCppExecutor, seqs: range, context: int, rng: random.Random) -> None:
    """Give each sequence ``context`` distinct tokens, prefilled in n_batch-sized steps."""
    n_batch = ex.info.n_batch
    pending = {s: random_tokens(rng, context, ex.info.n_vocab) for s in seqs}
    pos = dict.fromkeys(seqs, 0)
    while pending:
        slices, room = [], n_batch
        for s in list(pending):
            if room == 0:
                break
            piece = pending[s][:room]
            slices.append(SeqSlice(s, piece, pos[s]))
            pos[s] += len(piece)
            room -= len(piece)
            pending[s] = pending[s][len(piece) :]
            if not pending[s]:
                del pending[s]
        ex.step(StepPlan(slices=tuple(slices)))


def clear(ex: LlamaCppExecutor) -> None:
    held = [m.seq for m in ex.memory_stats().sequences]
    ex.step(StepPlan(kv_ops=tuple(Truncate(s) for s in held)))


def decode_step_times(
    ex: LlamaCppExecutor, batch: int, context: int, steps: int, rng: random.Random
) -> list[float]:
    fill(ex, range(batch), context, rng)
    owners = [f"d{s}" for s in range(batch)]
    times = []
    for i in range(steps):
        plan = StepPlan(
            slices=tuple(
                SeqSlice(s, (rng.randrange(100, ex.info.n_vocab),), context + i, True, owners[s])
                for s in range(batch)
            )
        )
        times.append(ex.step(plan).timings.total_s)
    ex.step(StepPlan(release=tuple(owners)))
    clear(ex)
    return times


def bench_decode(ex: LlamaCppExecutor, quick: bool, progress: Progress) -> list[dict[str, Any]]:
    rng = random.Random(0)
    grid = [(b, 128) for b in (1, 2, 4, 8, 16, 32, 64)]
    grid += [(b, c) for c in (512, 1024) for b in (1, 4, 16)]
    if quick:
        grid = [(1, 128), (16, 128), (64, 128), (1, 1024), (16, 512)]
    rows = []
    task = progress.add_task("decode steps", total=len(grid))
    for batch, context in grid:
        times = decode_step_times(ex, batch, context, 4 if quick else 8, rng)
        step = statistics.median(times)
        rows.append(
            {
                "batch": batch,
                "context": context,
                "step_ms": step * 1e3,
                "tokens_per_s": batch / step,
            }
        )
        progress.advance(task)
    return rows


def bench_prefill(ex: LlamaCppExecutor, quick: bool, progress: Progress) -> list[dict[str, Any]]:
    rng = random.Random(1)
    rows = []
    chunks = (64, 256, 512) if not quick else (128, 512)
    task = progress.add_task("prefill", total=len(chunks))
    for chunk in chunks:
        chunk = min(chunk, ex.info.n_batch)
        tokens = random_tokens(rng, 1024 if not quick else 512, ex.info.n_vocab)
        started = time.perf_counter()
        for pos in range(0, len(tokens), chunk):
            ex.step(StepPlan(slices=(SeqSlice(0, tokens[pos : pos + chunk], pos),)))
        elapsed = time.perf_counter() - started
        clear(ex)
        rows.append({"chunk": chunk, "tokens": len(tokens), "tokens_per_s": len(tokens) / elapsed})
        progress.advance(task)
    return rows


def bench_round_trip(ex: LlamaCppExecutor, quick: bool) -> dict[str, Any]:
    """The empty step's round trip, and the process boundary on one-sequence decode steps:
    each step's time as the caller sees it minus the worker's own (``total_s - engine_s``),
    medians over all the steps and, to show how this machine drifts, over blocks of them."""
    n = 300 if quick else 2000
    empty = [ex.step(StepPlan()).timings for _ in range(n)]
    rtt = statistics.median(t.total_s for t in empty)
    fill(ex, range(1), 128, random.Random(2))
    blocks = []
    for _ in range(1 if quick else 5):  # each block decodes the same positions, 128 onwards
        block = [
            ex.step(StepPlan(slices=(SeqSlice(0, (500,), 128 + i, True, "rt"),))).timings
            for i in range(BOUNDARY_BLOCK)
        ]
        blocks.append(block)
        ex.step(StepPlan(kv_ops=(Truncate(0, 128),)))
    ex.step(StepPlan(release=("rt",)))
    clear(ex)
    decode = [t for block in blocks for t in block]
    step, boundary = step_and_boundary(decode)
    return {
        "empty_step_round_trip_us": rtt * 1e6,
        "decode_steps": len(decode),
        "decode_step_1seq_ms": step * 1e3,
        "boundary_per_decode_step_us": boundary * 1e6,
        "boundary_share_of_decode_step_pct": 100 * boundary / step,
        "boundary_share_by_block_pct": [100 * b / s for s, b in map(step_and_boundary, blocks)],
    }


def step_and_boundary(steps: list[StepTimings]) -> tuple[float, float]:
    """The median step and the median boundary of ``steps``."""
    step = statistics.median(t.total_s for t in steps)
    return step, statistics.median(t.total_s - t.engine_s for t in steps)


def bench_stash(ex: LlamaCppExecutor, quick: bool) -> dict[str, float]:
    fill(ex, range(1), 1000, random.Random(3))
    stash, restore, n_bytes = [], [], 0
    for i in range(3 if quick else 10):
        res = ex.step(StepPlan(kv_ops=(Stash(0, f"s{i}"),)))
        stash.append(res.timings.total_s)
        n_bytes = res.stashed[0].n_bytes
        res = ex.step(StepPlan(kv_ops=(Restore(0, f"s{i}"),)))
        restore.append(res.timings.total_s)
    clear(ex)
    return {
        "tokens": 1000,
        "bytes": n_bytes,
        "stash_ms": statistics.median(stash) * 1e3,
        "restore_ms": statistics.median(restore) * 1e3,
    }


def engine_environment(config: EngineConfig, ex: LlamaCppExecutor) -> dict[str, Any]:
    return environment(
        model=Path(config.model_path).name,
        threads=config.threads,
        n_ctx=config.n_ctx,
        kv_unified=config.kv_unified,
        kv_bytes_per_token=ex.info.kv_bytes_per_token,
    )


def report(results: dict[str, Any]) -> None:
    t = Table(title="decode step vs batch and context")
    for col in ("batch", "context", "step ms", "tokens/s"):
        t.add_column(col, justify="right")
    for r in results["decode"]:
        t.add_row(
            str(r["batch"]), str(r["context"]), f"{r['step_ms']:.1f}", f"{r['tokens_per_s']:.0f}"
        )
    console.print(t)
    t = Table(title="prefill")
    for col in ("chunk", "tokens", "tokens/s"):
        t.add_column(col, justify="right")
    for r in results["prefill"]:
        t.add_row(str(r["chunk"]), str(r["tokens"]), f"{r['tokens_per_s']:.0f}")
    console.print(t)
    rt, st = results["round_trip"], results["stash"]
    console.print(
        f"empty step round trip {rt['empty_step_round_trip_us']:.0f} µs; process boundary "
        f"{rt['boundary_per_decode_step_us']:.0f} µs = "
        f"{rt['boundary_share_of_decode_step_pct']:.2f}% of a 1-sequence decode step "
        f"({rt['decode_step_1seq_ms']:.1f} ms, median of {rt['decode_steps']} steps; "
        "target < 2%); by blocks of "
        f"{BOUNDARY_BLOCK}: " + ", ".join(f"{b:.2f}%" for b in rt["boundary_share_by_block_pct"])
    )
    console.print(
        f"stash {st['tokens']} tokens ({st['bytes'] / 2**20:.1f} MiB): {st['stash_ms']:.2f} ms; "
        f"restore {st['restore_ms']:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller grid (about a minute)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/engine.json"))
    args = parser.parse_args()
    config = EngineConfig(
        model_path=args.model or str(default_model_path()),
        n_ctx=20480,
        n_seq_max=64,
        n_batch=512,
        threads=args.threads,
    )
    with (
        LlamaCppExecutor.start(config) as ex,
        Progress(console=console, transient=True) as progress,
    ):
        results: dict[str, Any] = {"environment": engine_environment(config, ex)}
        results["round_trip"] = bench_round_trip(ex, args.quick)
        results["stash"] = bench_stash(ex, args.quick)
        results["prefill"] = bench_prefill(ex, args.quick, progress)
        results["decode"] = bench_decode(ex, args.quick, progress)
    report(results)
    write_results(args.out, results)
