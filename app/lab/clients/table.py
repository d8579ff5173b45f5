"""The table of quanta bench clients run: each client's own figures, side by side.

    quanta bench clients table bench/results/clients    # prints it, writes summary.json

Each tool's figures are read from its own results file: completed requests, errors, output
tokens/s as the tool reports it (guidellm and aiperf: completed requests' tokens only),
streamed tokens/s (every token received, unfinished requests' too, over the run: the one
figure that means the same for the three), time to first token (median, p95). With them,
each tool's CPU use (user + system seconds over wall seconds, from /usr/bin/time).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SERVERS = ("quanta", "llama-server")
TOOLS = ("guidellm", "aiperf", "quanta-bench")


def guidellm(d: dict[str, Any]) -> dict[str, float]:
    m = d["benchmarks"][0]["metrics"]
    ttft = m["time_to_first_token_ms"]["successful"]
    totals = m["request_totals"]
    return {
        "completed": totals["successful"],
        "errors": totals["errored"],
        "output_tokens_per_s": m["output_tokens_per_second"]["successful"]["mean"],
        "streamed_tokens_per_s": m["output_token_count"]["total"]["total_sum"]
        / d["benchmarks"][0]["duration"],
        "ttft_p50_ms": ttft["median"],
        "ttft_p95_ms": ttft["percentiles"]["p95"],
    }


def aiperf(d: dict[str, Any]) -> dict[str, float]:
    ttft = d["time_to_first_token"]
    errors = d.get("error_request_count") or {}
    return {
        "completed": d["request_count"]["avg"],
        "errors": errors.get("avg", 0) if isinstance(errors, dict) else errors,
        "output_tokens_per_s": d["output_token_throughput"]["avg"],
        "streamed_tokens_per_s": d["total_output_tokens"]["avg"] / d["benchmark_duration"]["avg"],
        "ttft_p50_ms": ttft["p50"],
        "ttft_p95_ms": ttft["p95"],
    }


def quanta_bench(d: dict[str, Any]) -> dict[str, float]:
    o = d["summary"]["overall"]
    return {
        "completed": o["completed"],
        "errors": o["failed"] + o["rejected"],
        "output_tokens_per_s": o["output_tokens_per_s"],
        "streamed_tokens_per_s": o["output_tokens_per_s"],  # every request runs to its end
        "ttft_p50_ms": o["ttft"]["p50_ms"],
        "ttft_p95_ms": o["ttft"]["p90_ms"],  # quanta bench gives p90 and p99; p90 shown
    }


READERS = {"guidellm": guidellm, "aiperf": aiperf, "quanta-bench": quanta_bench}


def row(out: Path, server: str, tool: str) -> dict[str, Any] | None:
    results, timing = out / f"{server}-{tool}.json", out / f"{server}-{tool}.time"
    if not results.is_file() or not timing.is_file():
        return None
    figures: dict[str, Any] = READERS[tool](json.loads(results.read_text()))
    user, system, wall = (float(x) for x in timing.read_text().split()[-3:])
    figures |= {
        "client_cpu_s": user + system,
        "wall_s": wall,
        "client_cores": (user + system) / wall,
    }
    return {"server": server, "tool": tool, **figures}


# Measurement drift of this machine between runs minutes apart (bench/README.md): the band
# the check allows beyond what the tool's own CPU explains.
DRIFT = 0.10


def agreement(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each tool's streamed tokens/s and median TTFT against ``quanta bench``'s on the same
    server, and whether they agree within what the tool's CPU allows.

    A tool that keeps ``c`` of a core busy takes it from llama.cpp's threads, which meet at a
    barrier every layer: at worst a whole step waits for the thread that lost the time, so
    the engine runs at ``1 - c`` of its speed (tokens/s ratio ≥ 1 - c, TTFT ratio ≤ 1 / (1 -
    c)); at best the cost is spread and nothing is lost. Beyond that, ``DRIFT`` either way.
    """
    out = []
    for server in SERVERS:
        ref = next((r for r in rows if r["server"] == server and r["tool"] == "quanta-bench"), None)
        for r in rows:
            if ref is None or r["server"] != server or r["tool"] == "quanta-bench":
                continue
            c = r["client_cores"]
            tps = r["streamed_tokens_per_s"] / ref["streamed_tokens_per_s"]
            ttft = r["ttft_p50_ms"] / ref["ttft_p50_ms"] if r["ttft_p50_ms"] else float("nan")
            tps_band = (1 - c - DRIFT, 1 + DRIFT)
            ttft_band = (1 - DRIFT, 1 / (1 - c) + DRIFT)
            out.append(
                {
                    "server": server,
                    "tool": r["tool"],
                    "client_cores": c,
                    "tokens_per_s_ratio": tps,
                    "tokens_per_s_band": tps_band,
                    "ttft_p50_ratio": ttft,
                    "ttft_p50_band": ttft_band,
                    "agrees": tps_band[0] <= tps <= tps_band[1]
                    and ttft_band[0] <= ttft <= ttft_band[1],
                }
            )
    return out


def main(out: Path) -> None:
    rows = [r for s in SERVERS for t in TOOLS if (r := row(out, s, t)) is not None]
    head = f"{'server':13} {'client':13} {'done':>5} {'err':>4} {'tok/s own':>10} "
    print(head + f"{'streamed':>9} {'TTFT p50':>9} {'p95*':>8} {'client CPU':>11}")
    for r in rows:
        print(
            f"{r['server']:13} {r['tool']:13} {r['completed']:5.0f} {r['errors']:4.0f} "
            f"{r['output_tokens_per_s']:10.1f} {r['streamed_tokens_per_s']:9.1f} "
            f"{r['ttft_p50_ms']:7.0f}ms {r['ttft_p95_ms']:6.0f}ms "
            f"{r['client_cores']:6.2f} core"
        )
    print("* quanta bench's column is its p90")
    checks = agreement(rows)
    print(
        f"\n{'server':13} {'client':9} {'tok/s ratio':>12} {'allowed':>12} "
        f"{'TTFT ratio':>11} {'allowed':>12}  agrees"
    )
    for a in checks:
        lo, hi = a["tokens_per_s_band"]
        tlo, thi = a["ttft_p50_band"]
        print(
            f"{a['server']:13} {a['tool']:9} {a['tokens_per_s_ratio']:12.2f} {lo:5.2f}-{hi:<6.2f}"
            f"{a['ttft_p50_ratio']:11.2f} {tlo:5.2f}-{thi:<6.2f}  {'yes' if a['agrees'] else 'NO'}"
        )
    summary = {"rows": rows, "agreement": checks}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
