"""What the prefix cache's cells cost every step: decode steps beside N cached cells vs none.

llama.cpp keeps every sequence in one KV buffer, and a step's attention spans the buffer's
cells in use, the prefix cache's holders too (masked, but not free). Two workers with the
same history (N cells prefilled in holder sequences, 128 tokens each): one frees them, the
other keeps them; then both decode B sequences from the same short prompt, step by step, in
alternating order (this VM's speed drifts by a quarter within a minute: only steps taken side
by side compare). The figure is the median ratio of paired steps (kept over freed), with its
quartiles; ``QUANTA_PREFIX_CACHE_TOKENS`` bounds N in the server. Writes
``bench/results/cached_cells.json``.

    quanta bench cached-cells [--points 1:512,1:2048,16:512,16:2048]
        [--steps 120]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from rich.table import Table

from app.lab.measure.common import console, environment, write_results
from app.server.settings import default_model_path
from quanta_core.engine import SeqSlice, StepPlan, Truncate
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor

OUT = Path("bench/results/cached_cells.json")
PROMPT = tuple(range(1000, 1017))
HOLDER_TOKENS = 128
FIRST_HOLDER = 40  # sequence ids of the holders: above the decoding ones


def holders(cells: int) -> range:
    return range(FIRST_HOLDER, FIRST_HOLDER + cells // HOLDER_TOKENS)


def prepare(executor: LlamaCppExecutor, cells: int, keep: bool, batch: int) -> None:
    for k in holders(cells):
        tokens = tuple(range(2000 + k, 2000 + k + HOLDER_TOKENS))
        executor.step(StepPlan(slices=(SeqSlice(k, tokens, 0),)))
    if not keep:
        executor.step(StepPlan(kv_ops=tuple(Truncate(k) for k in holders(cells))))
    executor.step(StepPlan(slices=tuple(SeqSlice(s, PROMPT, 0) for s in range(batch))))


def measure(config: EngineConfig, batch: int, cells: int, steps: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"freed": [], "kept": []}
    with LlamaCppExecutor.start(config) as freed, LlamaCppExecutor.start(config) as kept:
        prepare(freed, cells, False, batch)
        prepare(kept, cells, True, batch)
        order = [("freed", freed), ("kept", kept)]
        for i in range(steps):
            plan = StepPlan(
                slices=tuple(
                    SeqSlice(s, (1000 + i,), len(PROMPT) + i, True, f"s{s}") for s in range(batch)
                )
            )
            for name, executor in order if i % 2 else order[::-1]:
                times[name].append(executor.step(plan).timings.engine_s)
    ratios = [k / f for k, f in zip(times["kept"], times["freed"], strict=True)]
    return {
        "batch": batch,
        "cached_cells": cells,
        "steps": steps,
        "freed_ms": 1e3 * statistics.median(times["freed"]),
        "kept_ms": 1e3 * statistics.median(times["kept"]),
        "ratio": statistics.median(ratios),
        "ratio_quartiles": statistics.quantiles(ratios, n=4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", default="1:512,1:2048,16:512,16:2048", help="batch:cells")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = str(default_model_path())
    config = EngineConfig(model_path=model, n_ctx=8192, n_seq_max=64, threads=args.threads)
    rows = []
    for point in args.points.split(","):
        batch, cells = (int(x) for x in point.split(":"))
        rows.append(measure(config, batch, cells, args.steps))
        change = 100 * (rows[-1]["ratio"] - 1)
        console.print(f"{batch} sequences beside {cells} cached cells: {change:+.1f} %")
    table = Table(title="decode step beside the prefix cache's cells (paired steps)")
    for col in ("sequences", "cached cells", "freed ms", "kept ms", "kept / freed (quartiles)"):
        table.add_column(col, justify="right")
    for r in rows:
        q1, _, q3 = r["ratio_quartiles"]
        table.add_row(
            str(r["batch"]),
            str(r["cached_cells"]),
            f"{r['freed_ms']:.1f}",
            f"{r['kept_ms']:.1f}",
            f"{r['ratio']:.3f} ({q1:.3f}-{q3:.3f})",
        )
    console.print(table)
    write_results(
        OUT,
        {"environment": environment(model=Path(model).name, threads=args.threads), "rows": rows},
    )
