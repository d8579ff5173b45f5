"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import msgspec
from litestar import Controller, Response, get
from litestar.di import NamedDependency
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE

from app.server.metrics import Metrics
from app.server.state import ServerState, Status

PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


class Health(msgspec.Struct):
    status: str
    error: str | None = None


class HealthController(Controller):
    tags = ("Operations",)

    @get("/healthz", summary="Liveness: the process serves HTTP (503 if it failed to start)")
    async def healthz(self, server: NamedDependency[ServerState]) -> Response[Health]:
        code = HTTP_503_SERVICE_UNAVAILABLE if server.status is Status.FAILED else HTTP_200_OK
        return Response(Health(server.status.value, server.error), status_code=code)

    @get("/readyz", summary="Readiness: 200 only once the model is loaded and the engine is up")
    async def readyz(self, server: NamedDependency[ServerState]) -> Response[Health]:
        code = HTTP_200_OK if server.status is Status.READY else HTTP_503_SERVICE_UNAVAILABLE
        return Response(Health(server.status.value, server.error), status_code=code)

    @get("/metrics", summary="Prometheus metrics", media_type=PROMETHEUS)
    async def metrics(self, metrics: NamedDependency[Metrics]) -> Response[bytes]:
        return Response(metrics.exposition(), media_type=PROMETHEUS)
