"""``create_app()``: the whole server, wired in one place."""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from app.admin.routes import ADMIN_CONTROLLERS
from app.admin.ui.plugin import LiveViewPlugin
from app.openai.responses import ResponsesService
from app.openai.routes import (
    CompletionsController,
    ModelsController,
    ResponsesController,
    TokenizeController,
)
from app.openai.service import CompletionService
from app.server.allow import allow_middleware
from app.server.api_doc import FinishedJsonPlugin, docs_assets, swagger_plugin
from app.server.core import Core, CoreFactory
from app.server.errors import EXCEPTION_HANDLERS
from app.server.health import HealthController
from app.server.lifecycle import Lifecycle
from app.server.metrics import Metrics
from app.server.request_id import request_id_middleware
from app.server.request_log import request_log
from app.server.settings import Settings
from app.server.state import ServerState
from app.tenancy.gate import tenancy_middleware
from app.tenancy.routes import OwnKeyController
from app.tenancy.service import Tenancy

VERSION = "0.1.0"


def build_real_core(settings: Settings) -> Core:
    from app.server.assemble import build_core  # imports llama.cpp: only when a real core is wanted

    return build_core(settings)


def create_app(
    settings: Settings | None = None, core_factory: CoreFactory | None = None
) -> Litestar:
    settings = settings or Settings()
    state = ServerState()
    tenancy = Tenancy(settings)

    def tenant_name(tenant_id: str) -> str:
        tenant = tenancy.directory.tenants.get(tenant_id)
        return tenant.name if tenant is not None else tenant_id

    def model_name() -> str:
        return state.core.model_name if state.core is not None else ""

    metrics = Metrics(state.stats, tenant_name, model_name)
    completions = CompletionService(state, metrics)
    lifecycle = Lifecycle(state, settings, core_factory or build_real_core)

    def provide(value: Any) -> Provide:
        return Provide(lambda: value, use_cache=True, sync_to_thread=False)

    app = Litestar(
        route_handlers=[
            CompletionsController,
            ModelsController,
            ResponsesController,
            TokenizeController,
            OwnKeyController,
            HealthController,
            *ADMIN_CONTROLLERS,
            docs_assets(),
        ],
        dependencies={
            "server": provide(state),
            "metrics": provide(metrics),
            "metrics_token": provide(settings.metrics_token),
        },
        exception_handlers=EXCEPTION_HANDLERS,
        plugins=[LiveViewPlugin()],
        middleware=[request_id_middleware, tenancy_middleware, allow_middleware],
        # Exited in reverse: in-flight requests drain first, then the ledger is flushed.
        lifespan=[tenancy.lifespan, lifecycle.lifespan],
        request_max_body_size=settings.max_body_bytes,
        cors_config=(
            CORSConfig(
                allow_origins=list(settings.cors_allow_origins),
                allow_headers=["authorization", "content-type", "x-request-id"],
                expose_headers=["x-request-id", "retry-after", "x-ratelimit-remaining-requests"],
            )
            if settings.cors_allow_origins
            else None
        ),
        logging_config=None,  # the process's one format (app/server/logs.py), not litestar's
        openapi_config=OpenAPIConfig(
            title="Quanta",
            version=VERSION,
            description="An OpenAI-compatible LLM inference server with a scheduler core.",
            path="/docs",
            render_plugins=[swagger_plugin(), FinishedJsonPlugin()],
        ),
        state=State(
            {
                "lifecycle": lifecycle,
                "tenancy": tenancy,
                "completions": completions,
                "responses": ResponsesService(completions, tenancy.sessions),
            }
        ),
    )
    # Around everything, the exception handlers too: the request log sees every response.
    app.asgi_handler = request_log(app.asgi_handler, metrics)
    return app
