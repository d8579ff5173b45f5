"""A clean start and a clean stop.

start:  HTTP up (healthz 200, readyz 503) ─ load tokenizer, worker, scheduler ─▶ ready
stop:   SIGINT/SIGTERM ─▶ draining (readyz 503, new requests 503)
        ─ in-flight requests finish within grace_s, then fail ─▶ worker stopped
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from litestar import Litestar

from app.server.core import Core, CoreFactory
from app.server.settings import Settings
from app.server.state import ServerState, Status
from quanta_core.engine.fit import FitError

log = logging.getLogger("quanta.lifecycle")


class Lifecycle:
    def __init__(self, state: ServerState, settings: Settings, factory: CoreFactory) -> None:
        self.state = state
        self._settings = settings
        self._factory = factory
        self._loading: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None
        self.on_failure: Callable[[], None] | None = None  # the CLI exits the process
        self.on_ready: Callable[[], None] | None = None  # the core is built and started

    @asynccontextmanager
    async def lifespan(self, _: Litestar) -> AsyncIterator[None]:
        self._loading = asyncio.create_task(self._load())
        try:
            yield
        finally:
            await self.shutdown()

    async def _load(self) -> None:
        try:
            core = await asyncio.to_thread(self._factory, self._settings)
            await core.driver.start()
        except Exception as exc:
            if isinstance(exc, FitError):  # the settings ask more than the machine has
                log.error("the engine cannot start: %s", exc)
            else:
                log.exception("the core failed to start")
            self.state.status, self.state.error = Status.FAILED, f"{type(exc).__name__}: {exc}"
            if self.on_failure is not None:
                self.on_failure()
            return
        self.state.core = core
        if self.on_ready is not None:
            self.on_ready()
        if self.state.status is Status.STARTING:
            self.state.status = Status.READY
            log.info("ready: serving %s (n_ctx %d)", core.model_name, core.n_ctx)

    def begin_drain(self) -> None:
        """Admit nothing new; give in-flight requests ``grace_s`` to finish. Idempotent."""
        if self.state.status in (Status.STARTING, Status.READY):
            log.info("draining: in-flight requests have %.1f s", self._settings.grace_s)
            self.state.status = Status.DRAINING
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._stop_core())

    async def _stop_core(self) -> None:
        if self._loading is not None:
            await asyncio.shield(self._loading)
        if self.state.core is not None:
            await self.state.core.driver.stop(self._settings.grace_s)

    async def shutdown(self) -> None:
        self.begin_drain()
        assert self._stopping is not None
        try:
            await self._stopping
        finally:
            core: Core | None = self.state.core
            if core is not None:
                await asyncio.to_thread(core.close)
            if self.state.status is not Status.FAILED:
                self.state.status = Status.STOPPED
            log.info("stopped")
