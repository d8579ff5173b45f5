"""``quanta step-replay``: a served run's steps again, on the engine alone.

    QUANTA_STEP_TRACE=served.jsonl quanta run ...           # record, plans included
    quanta step-replay served.jsonl --out alone.jsonl       # replay; print served / alone

The engine is started as ``quanta run`` would start it (the same ``QUANTA_*`` settings; give
the served run's), runs every recorded plan in order, and writes its own step trace, which
``quanta step-report`` reads like any other. The table: per kind of step and batch size, the
served engine's time over the replayed one's (``quanta_core.sim.replay``). Run it on a quiet
machine; this VM's speed drifts by up to 30 % within minutes, so replay right after the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import msgspec
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from app.server.settings import Settings
from quanta_core.clock import WallClock
from quanta_core.sim.replay import (
    ReplayRow,
    ReplayStopped,
    compare_replay,
    replay,
    replayable,
)
from quanta_core.sim.step_trace import StepTracer, read_trace


def step_replay(
    trace: Annotated[Path, typer.Argument(help="a step trace (QUANTA_STEP_TRACE of quanta run)")],
    out: Annotated[Path, typer.Option(help="the replay's own step trace (JSON lines)")],
    report: Annotated[
        Path | None, typer.Option(help="also write the served / alone rows as JSON here")
    ] = None,
    keep_gaps: Annotated[
        bool, typer.Option(help="wait the server's gap before each step, as the run did")
    ] = True,
) -> None:
    """Replay a served run's steps on the engine alone: how much did serving slow it down?"""
    console = Console()
    try:
        with trace.open() as f:
            served = replayable(read_trace(f))
        settings = Settings()
        sink = out.open("w")
    except (ValueError, OSError) as exc:  # a bad setting too (pydantic's is a ValueError)
        console.print(f"[red]step-replay: {exc}")
        raise typer.Exit(code=2) from None
    from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor  # the engine, here only

    tracer = StepTracer(LlamaCppExecutor.start(settings.engine_config()), WallClock(), sink)
    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("replay", total=len(served))
            replay(
                served,
                tracer,
                keep_gaps=keep_gaps,
                on_step=lambda n: progress.update(task, completed=n),
            )
    except ReplayStopped as exc:
        console.print(f"[red]step-replay: {exc}")
        raise typer.Exit(code=1) from None
    finally:
        tracer.close()
    with out.open() as f:
        rows, overall = compare_replay(served, read_trace(f))
    console.print(_table(rows, overall))
    console.print(f"the replay's step trace: {out} (quanta step-report reads it)")
    if report is not None:
        doc = {
            "served": str(trace),
            "alone": str(out),
            "keep_gaps": keep_gaps,
            "rows": [_as_dict(r) for r in rows],
            "all": _as_dict(overall),
        }
        report.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"written to {report}")


def _table(rows: list[ReplayRow], overall: ReplayRow) -> Table:
    table = Table(title="the served engine against the same steps alone, ms per step")
    for name in ("kind", "batch ≤", "steps", "served", "alone", "served / alone", "median"):
        table.add_column(name, justify="left" if name == "kind" else "right")
    for r in [*rows, overall]:
        table.add_row(
            r.kind,
            str(r.max_batch),
            str(r.steps),
            f"{r.served_ms:.1f}",
            f"{r.alone_ms:.1f}",
            f"{r.ratio:.2f}",
            f"{r.ratio_median:.2f}",
        )
    return table


def _as_dict(r: ReplayRow) -> dict[str, object]:
    return {**msgspec.structs.asdict(r), "ratio": r.ratio}
