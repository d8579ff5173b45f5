"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, Response, get
from litestar.di import NamedDependency
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE
from pydantic import SecretStr

from app.server.errors import InvalidApiKey
from app.server.metrics import Metrics
from app.server.state import ServerState, Status
from app.tenancy.keys import same_digest
from app.tenancy.service import bearer

# litestar adds "; charset=utf-8" to a text/* media type itself.
PROMETHEUS = "text/plain; version=0.0.4"


class Health(msgspec.Struct):
    status: str
    error: str | None = None


def _readiness(server: ServerState) -> Response[Health]:
    code = HTTP_200_OK if server.status is Status.READY else HTTP_503_SERVICE_UNAVAILABLE
    return Response(Health(server.status.value, server.error), status_code=code)


class HealthController(Controller):
    tags = ("Operations",)

    @get("/healthz", summary="Liveness: the process serves HTTP (503 if it failed to start)")
    async def healthz(self, server: NamedDependency[ServerState]) -> Response[Health]:
        code = HTTP_503_SERVICE_UNAVAILABLE if server.status is Status.FAILED else HTTP_200_OK
        return Response(Health(server.status.value, server.error), status_code=code)

    @get("/readyz", summary="Readiness: 200 only once the model is loaded and the engine is up")
    async def readyz(self, server: NamedDependency[ServerState]) -> Response[Health]:
        return _readiness(server)

    # Clients written for vLLM or llama-server (guidellm, llm-d) check this path first.
    @get("/health", summary="Readiness under vLLM's and llama-server's path (as /readyz)")
    async def health(self, server: NamedDependency[ServerState]) -> Response[Health]:
        return _readiness(server)

    @get(
        "/metrics",
        summary="Prometheus metrics (a bearer token where QUANTA_METRICS_TOKEN is set)",
        media_type=PROMETHEUS,
    )
    async def metrics(
        self,
        request: Request[Any, Any, Any],
        metrics: NamedDependency[Metrics],
        metrics_token: NamedDependency[SecretStr | None],
    ) -> Response[bytes]:
        if metrics_token is not None:
            given = bearer(request.headers.get("authorization")) or ""
            if not same_digest(given, metrics_token.get_secret_value()):
                raise InvalidApiKey("/metrics needs its bearer token", code="invalid_metrics_token")
        return Response(metrics.exposition(), media_type=PROMETHEUS)
