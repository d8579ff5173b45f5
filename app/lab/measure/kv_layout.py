"""What the KV layout and flash attention cost a many-sequence decode step, in turns.

Three engines over the same model, each in its own worker: Quanta's default (one KV buffer
for all sequences, flash attention as llama.cpp picks it), the same without flash
attention, and one KV stream per sequence (``kv_unified=False``, llama-server's default
layout). Each round runs every engine's decode steps of ``--batch`` sequences at
``--context`` tokens one after the other, so that the machine's drift falls on all three.
Prints each engine's median step per round and writes ``bench/results/kv_layout.json``.

    quanta bench kv-layout [--batch 20] [--context 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from app.lab.measure.common import console, environment, write_results
from app.lab.measure.engine import decode_step_times
from app.server.settings import default_model_path
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor

STEPS = 12  # decode steps per engine and round; the first two are left out (warm-up)


def engines(model: str, threads: int, batch: int, context: int) -> dict[str, EngineConfig]:
    # One stream per sequence, each of the cells a sequence needs (rounded up to 256).
    per_seq = -(-(context + STEPS) // 256) * 256
    return {
        "unified": EngineConfig(model, threads=threads),
        "unified, flash attention off": EngineConfig(model, threads=threads, flash_attn="off"),
        "a stream per sequence": EngineConfig(
            model, threads=threads, kv_unified=False, n_seq_max=batch, n_ctx=batch * per_seq
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/kv_layout.json"))
    args = parser.parse_args()

    configs = engines(str(default_model_path()), args.threads, args.batch, args.context)
    started = {name: LlamaCppExecutor.start(c) for name, c in configs.items()}
    steps_ms: dict[str, list[float]] = {name: [] for name in configs}
    try:
        for rnd in range(args.rounds):
            for name, ex in started.items():
                times = decode_step_times(ex, args.batch, args.context, STEPS, random.Random(rnd))
                steps_ms[name].append(statistics.median(times[2:]) * 1e3)
    finally:
        for ex in started.values():
            ex.close()

    base = statistics.median(steps_ms["unified"])
    rows = []
    for name, ms in steps_ms.items():
        ratio = statistics.median(ms) / base
        rows.append({"engine": name, "step_ms": ms, "over_unified": ratio})
        console.print(f"{name:30} {' '.join(f'{x:6.1f}' for x in ms)} ms   x{ratio:.2f}")
    write_results(
        args.out,
        {
            "environment": environment(threads=args.threads),
            "batch": args.batch,
            "context": args.context,
            "rows": rows,
        },
    )
