"""``/v1``: the OpenAI-compatible endpoints. Each handler is one call into a service."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody

from app.openai.models import ModelService
from app.openai.openapi import (
    COMPLETION_RESPONSES,
    MODEL_RESPONSES,
    ChatStreamingOperation,
    CompletionStreamingOperation,
)
from app.openai.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from app.openai.service import CompletionService
from app.server.context import RequestContext, provide_context
from app.server.metrics import Metrics
from app.server.state import ServerState
from app.tenancy.gate import ApiKeyAuthentication


def provide_completions(
    server: NamedDependency[ServerState], metrics: NamedDependency[Metrics]
) -> CompletionService:
    return CompletionService(server, metrics)


def provide_models(server: NamedDependency[ServerState]) -> ModelService:
    return ModelService(server)


class CompletionsController(Controller):
    path = "/v1"
    tags = ("OpenAI",)
    middleware = [ApiKeyAuthentication]  # noqa: RUF012
    dependencies = MappingProxyType(
        {
            "ctx": Provide(provide_context),
            "completions": Provide(provide_completions, sync_to_thread=False),
        }
    )

    @post(
        "/chat/completions",
        status_code=200,
        responses=COMPLETION_RESPONSES,
        operation_class=ChatStreamingOperation,
        summary="Create a chat completion (JSON, or server-sent events with stream=true)",
    )
    async def chat(
        self,
        data: JSONBody[ChatCompletionRequest],
        completions: NamedDependency[CompletionService],
        ctx: NamedDependency[RequestContext],
        request: Request[Any, Any, Any],
    ) -> Response[ChatCompletion]:
        return await completions.chat(data, ctx, request.receive)

    @post(
        "/completions",
        status_code=200,
        responses=COMPLETION_RESPONSES,
        operation_class=CompletionStreamingOperation,
        summary="Create a completion (JSON, or server-sent events with stream=true)",
    )
    async def complete(
        self,
        data: JSONBody[CompletionRequest],
        completions: NamedDependency[CompletionService],
        ctx: NamedDependency[RequestContext],
        request: Request[Any, Any, Any],
    ) -> Response[Completion]:
        return await completions.complete(data, ctx, request.receive)


class ModelsController(Controller):
    path = "/v1/models"
    tags = ("OpenAI",)
    middleware = [ApiKeyAuthentication]  # noqa: RUF012
    dependencies = MappingProxyType({"models": Provide(provide_models, sync_to_thread=False)})

    @get("/", summary="List the served model", responses=MODEL_RESPONSES)
    async def list_models(self, models: NamedDependency[ModelService]) -> ModelList:
        return models.list()

    @get("/{model_id:str}", summary="Describe one model", responses=MODEL_RESPONSES)
    async def get_model(
        self, models: NamedDependency[ModelService], model_id: FromPath[str]
    ) -> ModelCard:
        return models.get(model_id)
