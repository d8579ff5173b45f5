"""Issue 22's figures from runs already made (quanta bench horizon served writes the served ones,
quanta bench horizon sim the simulated sweeps).

    quanta bench horizon figures served bench/results/horizon
    quanta bench horizon figures sim bench/results/horizon

``served``: every ``kv-burst-<policy>-t<turn>.json`` bench result in the folder: requests,
refused, preemptions (the server's count per request), smooth requests (every gap between
two streamed tokens at most ``--gap-s``, 1 s), output tokens/s over the run (first sent to
last finished), the worst gap; then horizon over fcfs turn by turn. Writes ``served.json``.

``sim``: every ``sweep-burst<N>/sweep.csv``: per burst size and pool size, the requests that
never stalled, the preemptions and horizon's output tokens/s over fcfs's. Writes
``sim_sweep.json`` and ``sim_sweep.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from itertools import pairwise
from pathlib import Path
from typing import Any

RUN = re.compile(r"kv-burst-(?P<policy>[a-z]+)-t(?P<turn>\d+)\.json$")


def max_gap(times: list[float]) -> float:
    return max((b - a for a, b in pairwise(times)), default=0.0)


def served_figures(doc: dict[str, Any], gap_s: float) -> dict[str, Any]:
    rows = doc["requests"]
    ok = [r for r in rows if r["ok"]]
    sent = min(r["sent"] for r in rows)
    end = max(r["finished"] for r in ok) if ok else sent
    tokens = sum(r["output_tokens"] for r in ok)
    gaps = [max_gap(r["token_times"]) for r in ok]
    return {
        "requests": len(rows),
        "refused": sum(1 for r in rows if not r["ok"]),
        "preemptions": sum(r.get("server_preemptions") or 0 for r in rows),
        "smooth": sum(1 for g in gaps if g <= gap_s),
        "tokens_per_s": round(tokens / (end - sent), 2) if end > sent else 0.0,
        "wall_s": round(end - sent, 2),
        "worst_gap_s": round(max(gaps, default=0.0), 3),
    }


def served(folder: Path, gap_s: float) -> dict[str, Any]:
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    for path in sorted(folder.glob("kv-burst-*-t*.json")):
        m = RUN.search(path.name)
        if m is None:
            continue
        doc = json.loads(path.read_text())
        runs.setdefault(int(m["turn"]), {})[m["policy"]] = served_figures(doc, gap_s)
    turns = []
    for turn, by_policy in sorted(runs.items()):
        row: dict[str, Any] = {"turn": turn, **by_policy}
        f, h = by_policy.get("fcfs"), by_policy.get("horizon")
        if f and h:
            row["horizon_over_fcfs"] = {
                "smooth": round(h["smooth"] / f["smooth"], 2) if f["smooth"] else None,
                "tokens_per_s": round(h["tokens_per_s"] / f["tokens_per_s"], 3),
            }
        turns.append(row)
        print(json.dumps(row))
    out = {"gap_s": gap_s, "turns": turns}
    (folder / "served.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def sim(folder: Path) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for path in sorted(folder.glob("sweep-burst*/sweep.csv")):
        burst = int(path.parent.name.removeprefix("sweep-burst"))
        with path.open() as fh:
            for line in csv.DictReader(fh):
                points.setdefault(burst, {}).setdefault(line["policy"], []).append(line)
    table = []
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for burst, by_policy in sorted(points.items()):
        for policy, rows in sorted(by_policy.items()):
            rows.sort(key=lambda r: int(r["kv_blocks"]))
            cells = [int(r["kv_blocks"]) * int(r["block_size"]) for r in rows]
            share = [100 * int(r["never_stalled"]) / int(r["requests"]) for r in rows]
            style = "-" if policy == "horizon" else "--"
            axes[0].plot(cells, share, style, marker="o", label=f"{policy}, {burst} req")
            axes[1].plot(cells, [int(r["preemptions"]) for r in rows], style, marker="o")
        f_rows = {r["kv_blocks"]: r for r in by_policy.get("fcfs", [])}
        ratios = []
        for r in by_policy.get("horizon", []):
            f = f_rows.get(r["kv_blocks"])
            if f is None:
                continue
            ratio = float(r["output_tps"]) / float(f["output_tps"])
            ratios.append((int(r["kv_blocks"]) * int(r["block_size"]), ratio))
            table.append(
                {
                    "burst": burst,
                    "kv_cells": int(r["kv_blocks"]) * int(r["block_size"]),
                    "fcfs_never_stalled": int(f["never_stalled"]),
                    "horizon_never_stalled": int(r["never_stalled"]),
                    "fcfs_preemptions": int(f["preemptions"]),
                    "horizon_preemptions": int(r["preemptions"]),
                    "throughput_horizon_over_fcfs": round(ratio, 3),
                }
            )
        axes[2].plot(*zip(*ratios, strict=True), marker="o", label=f"{burst} req")
    axes[0].set(xlabel="KV cells", ylabel="never stalled > 1 s (%)", title="streams")
    axes[1].set(xlabel="KV cells", ylabel="preemptions", title="preemptions")
    axes[2].set(xlabel="KV cells", ylabel="horizon / fcfs", title="output tokens/s")
    axes[2].axhline(0.95, color="grey", lw=0.8)
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "sim_sweep.png", dpi=80)
    for entry in table:
        print(json.dumps(entry))
    (folder / "sim_sweep.json").write_text(json.dumps(table, indent=1) + "\n")
    return {"rows": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=["served", "sim"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--gap-s", type=float, default=1.0)
    args = parser.parse_args()
    if args.what == "served":
        served(args.folder, args.gap_s)
    else:
        sim(args.folder)
