"""How far one real run is from another of the same workload: the machine's own noise floor.

    quanta bench fidelity repeat \
        bench/results/fidelity bench/results/fidelity/repeats/*

The fidelity targets (issue 8: 10 % on throughput and means, 20 % on p99) compare a simulation
with one real run. This asks how close two real runs of the same workload come to each other,
judged by the same figures and targets (``app.lab.fidelity.table.compare``): for every
``real-<policy>-<load>.json`` found in two or more of the folders, every pair of its runs, the
later against the earlier. A run's workload (``config.workload``) must be the same in every
folder; a pair whose workloads differ is refused, not compared.

Each row also shows the two runs' reference probes (``probe-<policy>-<load>.json``: the speed
factor right before and after each run), where their folders have them: how fast the machine
said it was then. Writes ``repeat.json`` and ``repeat.md`` into the first folder.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

from app.lab.fidelity.table import FIGURES, compare


class Run:
    """One real run: its results file, and the probe pair beside it if there is one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.key = path.stem.removeprefix("real-")
        self.doc: dict[str, Any] = json.loads(path.read_text())
        self.when: str = self.doc.get("environment", {}).get("time_utc", "")
        probe = path.with_name(f"probe-{self.key}.json")
        self.probe: float | None = (
            json.loads(probe.read_text())["speed_factor"] if probe.exists() else None
        )

    @property
    def workload(self) -> dict[str, Any]:
        return dict(self.doc.get("config", {}).get("workload") or {})

    @property
    def label(self) -> str:
        return self.when[:16].replace("T", " ") or str(self.path.parent)


def runs_by_key(folders: list[Path]) -> dict[str, list[Run]]:
    """The runs of each ``<policy>-<load>`` found in two or more folders, oldest first."""
    by_key: dict[str, list[Run]] = {}
    for folder in folders:
        for path in sorted(folder.glob("real-*.json")):
            run = Run(path)
            by_key.setdefault(run.key, []).append(run)
    return {k: sorted(v, key=lambda r: r.when) for k, v in sorted(by_key.items()) if len(v) > 1}


def compare_pair(first: Run, second: Run) -> dict[str, Any]:
    if first.workload != second.workload:
        raise ValueError(f"{first.path} and {second.path} ran different workloads")
    figures = {  # compare()'s names are a simulation's against its run: here, two runs
        name: {
            "first": f["real"],
            "second": f["sim"],
            "diff": f["error"],
            "target": f["target"],
            "within": f["within"],
        }
        for name, f in compare(first.doc, second.doc).items()
    }
    return {
        "first": {"run": str(first.path), "at": first.when, "probe": first.probe},
        "second": {"run": str(second.path), "at": second.when, "probe": second.probe},
        "figures": figures,
    }


def _probe(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def table(pairs: dict[str, list[dict[str, Any]]]) -> str:
    head = "| policy | load | runs (probe) | " + " | ".join(
        f"{n} (first / second / diff)" for n, _, _ in FIGURES
    )
    lines = [head + " |", "|" + "---|" * (3 + len(FIGURES))]
    for key, rows in pairs.items():
        policy, load = key.split("-", 1)
        for row in rows:
            a, b = row["first"], row["second"]
            runs = (
                f"{a['at'][11:16]} ({_probe(a['probe'])}) → {b['at'][11:16]} ({_probe(b['probe'])})"
            )
            cells = []
            for name, _, _ in FIGURES:
                f = row["figures"][name]
                mark = "" if f["within"] else " ✗"
                cells.append(
                    f"{f['first']:.1f} / {f['second']:.1f} / {100 * f['diff']:+.0f}%{mark}"
                )
            lines.append(f"| {policy} | {load} | {runs} | " + " | ".join(cells) + " |")
    targets = ", ".join(f"{n} ±{100 * t:.0f}%" for n, _, t in FIGURES)
    return "\n".join(
        [*lines, "", f"✗: the two real runs differ by more than the target ({targets})."]
    )


def within_count(pairs: dict[str, list[dict[str, Any]]]) -> tuple[int, int]:
    verdicts = [
        f["within"] for rows in pairs.values() for row in rows for f in row["figures"].values()
    ]
    return sum(1 for v in verdicts if v), sum(1 for v in verdicts if v is not None)


def main(folders: list[Path]) -> None:
    pairs = {
        key: [compare_pair(a, b) for a, b in itertools.combinations(runs, 2)]
        for key, runs in runs_by_key(folders).items()
    }
    if not pairs:
        sys.exit("no run is in two of the folders: nothing to compare")
    within, total = within_count(pairs)
    summary = f"{within} of {total} figures within the target, real run against real run"
    text = "\n".join([table(pairs), "", summary + ".", ""])
    out = folders[0]
    (out / "repeat.json").write_text(
        json.dumps({"within": within, "figures": total, "pairs": pairs}, indent=1) + "\n"
    )
    (out / "repeat.md").write_text(text)
    print(text)
