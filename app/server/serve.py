"""``quanta run``'s body: the app on uvicorn, with a drain on SIGINT/SIGTERM.

Apart from ``app.cli`` so that the other commands (``quanta sim``, ``bench``, ``migrate``…)
do not import the web stack they never use (a second of start-up).
"""

from __future__ import annotations

import asyncio
import gc
import signal
from types import FrameType
from typing import Any

import uvicorn

from app.server.app import create_app
from app.server.core import CoreFactory
from app.server.http_protocol import guarded_protocol
from app.server.lifecycle import Lifecycle
from app.server.logs import configure_logging
from app.server.settings import Settings
from app.server.state import Status
from app.tenancy.cli import prepare_run


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


def serve(settings: Settings, core_factory: CoreFactory | None = None) -> int:
    """Run the server until it is stopped; the exit code (1: it failed). (``core_factory``:
    another core than the model's, for tests.)"""
    prepare_run(settings)  # refuses a schema not at head or a stranger secret; an admin key
    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings, core_factory)
    lifecycle: Lifecycle = app.state["lifecycle"]
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # configure_logging's one format, for uvicorn's lines too
        access_log=False,  # one line per request, when it ends (app/server/request_log.py)
        lifespan="on",
        # In-flight requests end within grace_s (the driver fails what is left), so uvicorn
        # needs only a little longer before it gives up on their connections.
        timeout_graceful_shutdown=int(settings.grace_s) + 5,
        http=guarded_protocol(settings),
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
        return 1
    return 0
