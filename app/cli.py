"""``quanta``: the command line. ``quanta run`` serves the OpenAI-compatible API."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
import uvicorn
from pydantic import ValidationError

from app.bench.cli import bench_cli
from app.calibrate import calibrate
from app.lifecycle import Lifecycle
from app.server import create_app
from app.settings import Settings
from app.sim_cli import sim
from app.state import Status
from app.step_report import step_report
from app.sweep import sweep
from app.tenancy.cli import migrate, prepare_run, tenants_cli

cli = typer.Typer(help="Quanta: a multi-tenant LLM inference server.", no_args_is_help=True)
cli.add_typer(bench_cli, name="bench")
cli.command()(migrate)
cli.add_typer(tenants_cli, name="tenants")
cli.command()(calibrate)
cli.command()(sim)
cli.command()(sweep)
cli.command(name="step-report")(step_report)


class _Server(uvicorn.Server):
    """uvicorn, told first: on SIGINT/SIGTERM the server drains before uvicorn closes."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle) -> None:
        super().__init__(config)
        self._lifecycle = lifecycle
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is not None and sig in _STOP_SIGNALS:
            self._loop.call_soon_threadsafe(self._lifecycle.begin_drain)
        super().handle_exit(sig, frame)

    def fail(self) -> None:
        self.should_exit = True


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _already_handled(sig: int, frame: FrameType | None) -> None:
    pass


def freeze_startup_heap() -> None:
    """What start-up built (the app, the ORM, the tokenizer, the scheduler) lives as long as
    the process: out of the collector's way, a full collection no longer walks it. One took
    ~160 ms of the event loop, stalling every stream, with the engine's threads short of a core.
    (The process's business, not the app's: tests build many apps in one process.)
    """
    gc.collect()
    gc.freeze()


@cli.command()
def run(
    host: Annotated[str | None, typer.Option(help="address to listen on")] = None,
    port: Annotated[int | None, typer.Option(help="port (0: any free port)")] = None,
    model: Annotated[Path | None, typer.Option(help="GGUF file (default: SmolLM2-135M)")] = None,
    model_name: Annotated[str | None, typer.Option(help="the model id clients send")] = None,
    policy: Annotated[str | None, typer.Option(help="scheduling policy")] = None,
    n_ctx: Annotated[int | None, typer.Option(help="KV cells shared by all sequences")] = None,
    n_seq_max: Annotated[int | None, typer.Option(help="engine sequence slots")] = None,
    threads: Annotated[int | None, typer.Option(help="llama.cpp threads")] = None,
    grace: Annotated[float | None, typer.Option(help="seconds in-flight requests get")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning…")] = None,
) -> None:
    """Serve the model: /v1/chat/completions, /v1/completions, /v1/models, /metrics."""
    flags: dict[str, Any] = {
        "host": host,
        "port": port,
        "model_path": model,
        "model_name": model_name,
        "policy": policy,
        "n_ctx": n_ctx,
        "n_seq_max": n_seq_max,
        "threads": threads,
        "grace_s": grace,
        "log_level": log_level,
    }
    try:
        settings = Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        typer.echo(f"invalid settings: {exc}", err=True)
        raise typer.Exit(code=2) from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    prepare_run(settings)  # refuses a schema not at head; generates an admin key if none
    app = create_app(settings)
    lifecycle: Lifecycle = app.state["lifecycle"]
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        # In-flight requests end within grace_s (the driver fails what is left), so uvicorn
        # needs only a little longer before it gives up on their connections.
        timeout_graceful_shutdown=int(settings.grace_s) + 5,
    )
    server = _Server(config, lifecycle)
    lifecycle.on_failure = server.fail
    lifecycle.on_ready = freeze_startup_heap
    # uvicorn re-raises the stop signal after its graceful shutdown, to the handler that was
    # there before it: make that a no-op, so a drained server exits 0 instead of dying of it.
    previous = {sig: signal.signal(sig, _already_handled) for sig in _STOP_SIGNALS}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if lifecycle.state.status is Status.FAILED:
        raise typer.Exit(code=1)


@cli.command()
def version() -> None:
    """Print the version."""
    from app.server import VERSION

    typer.echo(VERSION)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
