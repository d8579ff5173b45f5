"""The server's own overhead: decode throughput through HTTP streaming vs the engine alone.

For each batch size B: B streaming completions at once through a real ``quanta run``
(``ignore_eos``, fixed answer length), counting tokens/s in the window where all B are
decoding; and the engine alone (a worker of its own, no server, no scheduler) decoding B
sequences from the same prompt for as many steps, tokens/s over the whole run (a mean, as the
HTTP figure is); both first decode one sequence alone for as long (the HTTP side's warm-up
request). Target: HTTP at least 90% of the engine alone. Writes
``bench/results/http_overhead.json``, with the server's own time per step fitted from the
differences (``server_cost``: per cycle + per stream, for ``quanta sim``).

Two servers answer: one that keeps no prefix cache beyond its running requests
(``QUANTA_PREFIX_CACHE_TOKENS=0``), whose engine does the same work as the engine alone, so
the difference is the server's own (HTTP, scheduler, process boundary; the target and
``server_cost`` are read from it); and one as configured by default, whose finished
requests' cells stay in the engine's buffer for later prefix hits. Those cells cost every
step (llama.cpp attends over its whole buffer in use: ``quanta bench cached-cells``), and
nothing here hits them: the default's row shows the price of the cache when it does not pay.
The three sides alternate, ROUNDS times each, the order reversed every other round (this
machine slows down over minutes of load: no side always runs last), and medians are compared.

The client runs on the same 2 cores as the server. Its own CPU time (reading SSE) is not the
server's overhead, so it runs at the lowest priority (nice 19): it reads what the server sent
when the engine's threads leave a core free, as a remote client would cost nothing here.
``--client-nice 0`` measures instead what a client on this machine costs as well, as
``quanta bench`` runs (its ``server_cost`` is the one for simulating such runs).

    quanta bench http-overhead [--batches 1,8,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from app.lab.measure.common import console, environment, write_results
from app.lab.server import QuantaServer
from app.server.settings import default_model_path
from quanta_core.engine import SeqSlice, StepPlan, Truncate
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor
from quanta_core.engine.llama_cpp.tokenizer import Tokenizer
from quanta_core.sim.server_cost import fit_server_cost

PROMPT = "Write a long story about a lighthouse keeper and the sea."
ANSWER_TOKENS = 160
ROUNDS = 3
PATH = "no_cache"  # the server whose engine does the engine alone's work
DEFAULT = "default_cache"


async def stream_one(client: httpx.AsyncClient, model: str, index: int) -> tuple[list[float], int]:
    """Chunk arrival times and the server's count of completion tokens."""
    body = {
        "model": model,
        "prompt": f"{PROMPT} ({index})",
        "max_tokens": ANSWER_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    times: list[float] = []
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0].get("text"):
                times.append(time.perf_counter())
    return times, tokens


def steady_rate(streams: list[tuple[list[float], int]]) -> float:
    """Tokens/s while every stream is decoding: from the last first chunk to the first last."""
    start = max(t[0] for t, _ in streams)
    end = min(t[-1] for t, _ in streams)
    chunks = sum(sum(1 for x in t if start < x <= end) for t, _ in streams)
    tokens_per_chunk = sum(n for _, n in streams) / sum(len(t) for t, _ in streams)
    return chunks * tokens_per_chunk / (end - start)


async def http_rate(url: str, model: str, batch: int, api_key: str) -> float:
    headers = {"authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=url, timeout=600, headers=headers) as client:
        await stream_one(client, model, -1)  # warm up
        streams = await asyncio.gather(*(stream_one(client, model, i) for i in range(batch)))
    return steady_rate(list(streams))


def engine_rate(executor: LlamaCppExecutor, prompt: list[int], batch: int) -> float:
    """Tokens/s of B sequences decoding ANSWER_TOKENS tokens each, after the prompt; first
    one sequence alone for as long, as the HTTP side warms up with one request."""
    decode(executor, prompt, 1)
    return decode(executor, prompt, batch)


def decode(executor: LlamaCppExecutor, prompt: list[int], batch: int) -> float:
    n = len(prompt)
    executor.step(StepPlan(slices=tuple(SeqSlice(s, tuple(prompt), 0) for s in range(batch))))
    start = time.perf_counter()
    for i in range(ANSWER_TOKENS - 1):  # the prompt's step gave the first token
        plan = StepPlan(
            slices=tuple(SeqSlice(s, (1000 + i,), n + i, True, f"e{s}") for s in range(batch))
        )
        executor.step(plan)
    elapsed = time.perf_counter() - start
    executor.step(
        StepPlan(
            kv_ops=tuple(Truncate(s) for s in range(batch)),
            release=tuple(f"e{s}" for s in range(batch)),
        )
    )
    return batch * (ANSWER_TOKENS - 1) / elapsed


def measure(
    servers: dict[str, tuple[QuantaServer, str]],
    name: str,
    executor: LlamaCppExecutor,
    prompt: list[int],
    batch: int,
    rounds: int,
) -> dict[str, Any]:
    """Rounds of the engine alone and of each server, in an order reversed every round."""
    runs: dict[str, list[float]] = {"engine": [], **{side: [] for side in servers}}
    for i in range(rounds):
        for side in list(runs)[:: 1 if i % 2 == 0 else -1]:
            if side == "engine":
                runs[side].append(engine_rate(executor, prompt, batch))
            else:
                server, key = servers[side]
                rate = asyncio.run(http_rate(server.url, name, batch, key))
                runs[side].append(rate)
    engine = statistics.median(runs["engine"])
    row: dict[str, Any] = {
        "batch": batch,
        "engine_tokens_per_s": engine,
        "engine_rounds": runs["engine"],
    }
    for side in servers:
        prefix = "http" if side == PATH else f"http_{side}"
        row[f"{prefix}_tokens_per_s"] = statistics.median(runs[side])
        row[f"{prefix}_ratio_pct"] = 100 * statistics.median(runs[side]) / engine
        row[f"{prefix}_rounds"] = runs[side]
    return row


def server_cost(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The server's own time per step, from each batch's step time through HTTP minus the
    engine's alone: ``gap = per_cycle + per_token * batch`` by least squares, both >= 0
    (what ``quanta sim --server-cycle-ms/--server-token-ms`` take)."""
    batches = [float(r["batch"]) for r in rows]
    gaps = [
        max(0.0, r["batch"] / r["http_tokens_per_s"] - r["batch"] / r["engine_tokens_per_s"])
        for r in rows
    ]
    cost = fit_server_cost(list(zip(batches, gaps, strict=True)))
    return {
        "per_cycle_ms": 1e3 * cost.per_cycle_s,
        "per_token_ms": 1e3 * cost.per_token_s,
        "gap_ms": {int(b): 1e3 * g for b, g in zip(batches, gaps, strict=True)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument(
        "--client-nice",
        type=int,
        default=19,
        help="the client's niceness (0: it competes with the server as `quanta bench` does)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/http_overhead.json"))
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    model = str(default_model_path())
    prompt = Tokenizer.load(model).encode(f"{PROMPT} (0)")
    os.environ["QUANTA_MAX_RUNNING"] = str(max(batches))  # the servers inherit it
    os.environ.pop("QUANTA_PREFIX_CACHE_TOKENS", None)
    threads = ("--threads", str(args.threads))
    servers = {
        PATH: QuantaServer.fresh(*threads, env={"QUANTA_PREFIX_CACHE_TOKENS": "0"}),
        DEFAULT: QuantaServer.fresh(*threads),
    }
    config = EngineConfig(model_path=model, n_ctx=8192, n_seq_max=64, threads=args.threads)
    try:
        keyed = {}
        for side, server in servers.items():
            server.start()
            keyed[side] = (server, server.tenant_key("bench"))
        path, key = keyed[PATH]
        auth = {"authorization": f"Bearer {key}"}
        name = httpx.get(f"{path.url}/v1/models", headers=auth).json()["data"][0]["id"]
        with LlamaCppExecutor.start(config) as executor:
            os.nice(args.client_nice)  # the client only (see above); the servers started before
            rows = [measure(keyed, name, executor, prompt, b, args.rounds) for b in batches]
    finally:
        for server in servers.values():
            server.stop()
            server.remove()
    table = Table(title="decode throughput: HTTP streaming vs the engine alone")
    columns = (
        "batch",
        "engine tok/s",
        "HTTP tok/s",
        "HTTP / engine (target ≥ 90%)",
        "HTTP, default cache",
        "/ engine",
    )
    for col in columns:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["batch"]),
            f"{r['engine_tokens_per_s']:.0f}",
            f"{r['http_tokens_per_s']:.0f}",
            f"{r['http_ratio_pct']:.0f}%",
            f"{r[f'http_{DEFAULT}_tokens_per_s']:.0f}",
            f"{r[f'http_{DEFAULT}_ratio_pct']:.0f}%",
        )
    console.print(table)
    cost = server_cost(rows)
    console.print(
        f"the server's own time per step: {cost['per_cycle_ms']:.2f} ms per cycle + "
        f"{cost['per_token_ms']:.3f} ms per stream (for quanta sim --server-cycle-ms/-token-ms)"
    )
    write_results(
        args.out,
        {
            "environment": environment(model=Path(model).name, threads=args.threads),
            "answer_tokens": ANSWER_TOKENS,
            "rounds": args.rounds,
            "client_nice": args.client_nice,
            "rows": rows,
            "server_cost": cost,
        },
    )
