"""``quanta step-report``: a real server's step trace against the cost model.

    QUANTA_STEP_TRACE=steps.jsonl quanta run ...           # record (quanta_core.sim.step_trace)
    quanta step-report steps.jsonl --probe probe.json      # where does the simulation miss?

Per kind of step and batch size: the engine's measured time and the cost model's prediction
for the same plans (the model's error where the simulator would be), the process boundary,
and the server's time between steps (the median gap; what ``quanta sim --server-cycle-ms``
stands for). The speed factor is ``quanta sim``'s: ``--speed-factor`` or ``--probe``.

And the machine as the run saw it (``in_run``): the speed factor that makes the model's time
over all the run's steps equal the engine's, and the server's time per cycle. A simulation
given those is told how fast the engine really was, CPU contention from the server and the
client included; what it still misses is the scheduling, the model's shape and the timing.
And the same speed per 10 s of the run (``speed_profile``): this VM's speed drifts within a
run, and a simulation given one factor runs the fast minutes too slowly and the slow ones too
fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from app.lab.sim.command import CostModelMissing, default_cost_model_path, resolve_speed
from quanta_core.sim.cost_model import CostModel
from quanta_core.sim.step_trace import (
    TraceRow,
    compare_trace,
    in_run,
    read_trace,
    speed_profile,
)


def step_report(
    trace: Annotated[Path, typer.Argument(help="a step trace (QUANTA_STEP_TRACE of quanta run)")],
    cost_model: Annotated[
        Path | None, typer.Option(help="cost model JSON (default: config/cost_models/)")
    ] = None,
    speed_factor_: Annotated[
        float | None,
        typer.Option("--speed-factor", help="predictions x F (the machine's speed vs then)"),
    ] = None,
    probe: Annotated[
        Path | None, typer.Option(help="the speed factor from a `quanta calibrate --probe-only`")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="also write the rows as JSON here")] = None,
) -> None:
    """Compare a real server's steps with the cost model: engine, boundary, server time."""
    console = Console()
    try:
        model = CostModel.load(cost_model or default_cost_model_path())
        speed = resolve_speed(speed_factor_, probe, model)
        with trace.open() as f:
            records = read_trace(f)
        rows, overall = compare_trace(records, model.predict, speed["factor"])
        profile = speed_profile(records, model.predict)
    except (CostModelMissing, ValueError, OSError) as exc:
        console.print(f"[red]step-report: {exc}")
        raise typer.Exit(code=2) from None
    console.print(_table(rows, overall, speed["factor"]))
    machine = in_run(overall, speed["factor"])
    console.print(
        f"as the run saw the machine: quanta sim --speed-factor {machine.speed_factor:.3f} "
        f"--server-cycle-ms {machine.server_cycle_s * 1e3:.2f}"
    )
    console.print(
        f"its speed per {profile.bin_s:g} s: " + " ".join(f"{x:.2f}" for x in profile.factors)
    )
    if out is not None:
        doc = {
            "trace": str(trace),
            "speed_factor": speed,
            "rows": [_as_dict(r) for r in rows],
            "all": _as_dict(overall),
            "in_run": machine._asdict(),
            "speed_profile": msgspec.structs.asdict(profile),
        }
        out.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"written to {out}")


def _table(rows: list[TraceRow], overall: TraceRow, factor: float) -> Table:
    table = Table(title=f"engine steps vs the cost model (x {factor:.2f}), ms per step")
    for name in ("kind", "batch ≤", "steps", "engine", "model", "error", "boundary", "server"):
        table.add_column(name, justify="left" if name == "kind" else "right")
    for r in [*rows, overall]:
        table.add_row(
            r.kind,
            str(r.max_batch),
            str(r.steps),
            f"{r.engine_ms:.1f}",
            f"{r.predicted_ms:.1f}",
            f"{r.error_pct:+.0f}%",
            f"{r.boundary_ms:.2f}",
            f"{r.gap_ms:.2f}",
        )
    return table


def _as_dict(r: TraceRow) -> dict[str, object]:
    return {**msgspec.structs.asdict(r), "error_pct": r.error_pct}
