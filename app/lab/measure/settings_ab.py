"""Two servers alike but for some settings, used in turn: which one serves streams faster.

    quanta bench settings-ab --a QUANTA_CALL_SPIN_S=0 \\
        --b QUANTA_CALL_SPIN_S=0.002 [--batches 1,16] [--rounds 6] [--out FILE]

Both servers run at once (an idle one costs nearly nothing) and write step traces. Every
round, each in turn serves B streaming completions of a fixed length at once (the first
server first in even rounds, last in odd ones: this machine drifts by tens of percent over
minutes, and only a comparison made in turn is worth reading). Per batch size, over all the
rounds' decode steps of that many streams, from the traces: the engine's own time, the
boundary (the step call beyond the worker's time), the server's gap before the step, and the
step cycle (a step and the gap after it: what one token of every stream costs), as medians;
and each round's streaming tokens/s. Writes ``bench/results/ab/<a>-vs-<b>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from app.lab.measure.common import console, environment, write_results
from app.lab.measure.http_overhead import http_rate
from app.lab.server import QuantaServer
from quanta_core.sim.fit import Group, group_of
from quanta_core.sim.step_trace import StepRecord, read_trace

SIDES = ("a", "b")


def settings_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.startswith("QUANTA_"):
        raise argparse.ArgumentTypeError(f"expected QUANTA_NAME=VALUE, got {text!r}")
    return key, value


def short(settings: dict[str, str]) -> str:
    """``QUANTA_CALL_SPIN_S=0`` as ``call_spin_s=0``, for labels and file names."""
    return ",".join(
        f"{key.removeprefix('QUANTA_').lower()}={value}" for key, value in settings.items()
    )


def decode_batch(record: StepRecord) -> int | None:
    """The number of streams a step decoded one token each for, as ``quanta step-report``
    counts a decode step; None for any other step."""
    f = record.features
    return f.decode_tokens if group_of(f) is Group.DECODE else None


def step_figures(records: list[StepRecord]) -> dict[int, dict[str, float]]:
    """Per count of decoding streams: medians of the engine's time, the boundary and the gap
    before each step (ms), and of the cycle, a step plus the gap after it when the next step
    decodes as many streams."""
    steps: dict[int, list[StepRecord]] = defaultdict(list)
    cycles: dict[int, list[float]] = defaultdict(list)
    for this, after in zip(records, [*records[1:], None], strict=True):
        batch = decode_batch(this)
        if batch is None or this.gap is None:
            continue
        steps[batch].append(this)
        if after is not None and after.gap is not None and decode_batch(after) == batch:
            cycles[batch].append(this.total + after.gap)
    return {
        batch: {
            "steps": len(rs),
            "engine_ms": 1e3 * statistics.median(r.engine for r in rs),
            "boundary_ms": 1e3 * statistics.median(r.total - r.engine for r in rs),
            "gap_ms": 1e3 * statistics.median(r.gap for r in rs if r.gap is not None),
            "cycle_ms": 1e3 * statistics.median(cycles[batch]) if cycles[batch] else 0.0,
        }
        for batch, rs in sorted(steps.items())
    }


def serve_in_turn(
    servers: dict[str, tuple[QuantaServer, str]], batches: list[int], rounds: int
) -> dict[str, dict[int, list[float]]]:
    """Each round, each server serves each batch; tokens/s while all its streams decode.
    ``servers``: each side's server and an API key of it."""
    first, first_key = servers[SIDES[0]]
    auth = {"authorization": f"Bearer {first_key}"}
    model = httpx.get(f"{first.url}/v1/models", headers=auth).json()["data"][0]["id"]
    rates: dict[str, dict[int, list[float]]] = {side: defaultdict(list) for side in servers}
    for i in range(rounds):
        for side in SIDES[:: 1 if i % 2 == 0 else -1]:
            server, key = servers[side]
            for batch in batches:
                rate = asyncio.run(http_rate(server.url, model, batch, key))
                rates[side][batch].append(rate)
                console.print(f"round {i + 1}/{rounds}: {side}, {batch} streams: {rate:.1f} tok/s")
    return rates


def report(results: dict[str, Any], batches: list[int]) -> None:
    table = Table(title="two servers' decode steps, in turn (medians)")
    for col in ("streams", "side", "tok/s", "engine ms", "boundary ms", "gap ms", "cycle ms"):
        table.add_column(col, justify="right")
    for batch in batches:
        for side in SIDES:
            r = results[side]
            f = r["steps"].get(batch, {})
            table.add_row(
                str(batch),
                side,
                f"{statistics.median(r['tokens_per_s'][batch]):.1f}",
                *(
                    f"{f.get(k, 0.0):.3f}"
                    for k in ("engine_ms", "boundary_ms", "gap_ms", "cycle_ms")
                ),
            )
    for side in SIDES:
        console.print(f"{side}: {short(results[side]['settings'])}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", type=settings_arg, action="append", required=True)
    parser.add_argument("--b", type=settings_arg, action="append", required=True)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--client-nice",
        type=int,
        default=19,
        help="the client's niceness: it reads streams when the servers leave a core free",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    chosen = {"a": dict(args.a), "b": dict(args.b)}
    out = (
        args.out or Path("bench/results/ab") / f"{short(chosen['a'])}-vs-{short(chosen['b'])}.json"
    )
    with tempfile.TemporaryDirectory(prefix="quanta-ab-") as tmp:
        traces = {side: Path(tmp) / f"{side}.jsonl" for side in SIDES}
        common = {"QUANTA_PREFIX_CACHE_TOKENS": "0", "QUANTA_MAX_RUNNING": str(max(batches))}
        servers = {
            side: QuantaServer.fresh(
                "--threads",
                str(args.threads),
                env={**common, **chosen[side], "QUANTA_STEP_TRACE": str(traces[side])},
            )
            for side in SIDES
        }
        try:
            keyed = {}
            for side, server in servers.items():
                server.start()
                keyed[side] = (server, server.tenant_key("bench"))
            os.nice(args.client_nice)  # the client only: the servers started before
            rates = serve_in_turn(keyed, batches, args.rounds)
        finally:
            for server in servers.values():
                server.stop()
                server.remove()
        results: dict[str, Any] = {
            "environment": environment(threads=args.threads),
            "rounds": args.rounds,
            "client_nice": args.client_nice,
        }
        for side in SIDES:
            with traces[side].open() as sink:
                figures = step_figures(read_trace(sink))
            results[side] = {
                "settings": chosen[side],
                "tokens_per_s": dict(rates[side]),
                "steps": figures,
            }
    report(results, batches)
    write_results(out, results)
