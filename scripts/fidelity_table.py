"""The simulator's error against the real engine, from pairs of bench results files.

For every ``real-<policy>-<load>.json`` in the directory with a ``sim-<policy>-<load>.json``
beside it: throughput (output tokens/s), mean and p99 TTFT, mean inter-token latency, real vs
simulated, and the relative error (sim - real) / real. Targets (issue 8): 10 % on means and
throughput, 20 % on p99. Writes ``fidelity.json`` and ``fidelity.md`` (README-ready markdown).

    .venv/bin/python -m scripts.fidelity_table bench/results/fidelity
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# (name, path in the overall summary, target relative error)
FIGURES: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("throughput tok/s", ("output_tokens_per_s",), 0.10),
    ("TTFT mean ms", ("ttft", "mean_ms"), 0.10),
    ("TTFT p99 ms", ("ttft", "p99_ms"), 0.20),
    ("ITL mean ms", ("itl", "mean_ms"), 0.10),
)


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return None if value is None else float(value)


def compare(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, path, target in FIGURES:
        a = _get(real["summary"]["overall"], path)
        b = _get(sim["summary"]["overall"], path)
        error = None if a is None or b is None or a == 0 else (b - a) / a
        ok = None if error is None else abs(error) <= target
        out[name] = {"real": a, "sim": b, "error": error, "target": target, "within": ok}
    return out


def table(rows: dict[str, dict[str, Any]]) -> str:
    head = "| policy | load | " + " | ".join(f"{n} (real / sim / err)" for n, _, _ in FIGURES)
    lines = [head + " |", "|" + "---|" * (2 + len(FIGURES))]
    for key, figures in rows.items():
        policy, load = key.split("-", 1)
        cells = []
        for name, _, _ in FIGURES:
            f = figures[name]
            if f["error"] is None:
                cells.append("–")
                continue
            mark = "" if f["within"] else " ✗"
            cells.append(f"{f['real']:.1f} / {f['sim']:.1f} / {100 * f['error']:+.0f}%{mark}")
        lines.append(f"| {policy} | {load} | " + " | ".join(cells) + " |")
    targets = ", ".join(f"{n} ±{100 * t:.0f}%" for n, _, t in FIGURES)
    return "\n".join([*lines, "", f"✗: outside the target ({targets})."])


def main(folder: Path) -> None:
    rows: dict[str, dict[str, Any]] = {}
    for real_path in sorted(folder.glob("real-*.json")):
        key = real_path.stem.removeprefix("real-")
        sim_path = folder / f"sim-{key}.json"
        if not sim_path.exists():
            continue
        rows[key] = compare(json.loads(real_path.read_text()), json.loads(sim_path.read_text()))
    (folder / "fidelity.json").write_text(json.dumps(rows, indent=1) + "\n")
    text = table(rows)
    (folder / "fidelity.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/fidelity"))
