"""Where the server is in its life: starting → ready → draining → stopped (or failed)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from app.server.core import Core, CoreStats
from app.server.errors import NotReady


class Status(StrEnum):
    STARTING = "starting"  # the model is loading; nothing is admitted
    READY = "ready"
    DRAINING = "draining"  # a stop was asked for: in-flight requests finish, no new ones
    STOPPED = "stopped"
    FAILED = "failed"  # the core could not be built


@dataclass
class ServerState:
    status: Status = Status.STARTING
    core: Core | None = None
    error: str | None = None

    def ready_core(self) -> Core:
        """The core, if it takes new requests; else 503."""
        if self.status is Status.READY and self.core is not None:
            return self.core
        reason = {
            Status.STARTING: "the model is still loading",
            Status.DRAINING: "the server is shutting down",
            Status.STOPPED: "the server has stopped",
        }.get(self.status, f"the server failed to start: {self.error}")
        raise NotReady(reason)

    def stats(self) -> CoreStats | None:
        return self.core.stats() if self.core is not None else None
