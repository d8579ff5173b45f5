"""``/v1``: the OpenAI-compatible endpoints. Each handler is one call into a service."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody

from app.openai.models import ModelService
from app.openai.openapi import (
    COMPLETION_RESPONSES,
    MODEL_RESPONSES,
    STORED_RESPONSES,
    TOKENIZE_RESPONSES,
    ChatStreamingOperation,
    CompletionStreamingOperation,
    ResponseStreamingOperation,
)
from app.openai.responses import ResponsesService
from app.openai.responses_schemas import DeletedResponse, ResponseObject, ResponseRequest
from app.openai.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from app.openai.service import CompletionService
from app.openai.tokenize import TokenizeService
from app.server.context import request_context
from app.server.state import ServerState
from app.tenancy.gate import ApiKeyAuthentication
from app.tenancy.service import Principal


def completions_of(request: Request[Any, Any, Any]) -> CompletionService:
    """The app's one ``CompletionService`` (made by ``create_app``).

    A handler here has this one dependency, and makes its ``RequestContext`` itself: litestar
    resolves the dependencies of one level concurrently, in an anyio task group of a task
    each, which cost a refused request more than its refusal (under overload, refusals are
    most of the requests)."""
    service: CompletionService = request.app.state["completions"]
    return service


def provide_models(server: NamedDependency[ServerState]) -> ModelService:
    return ModelService(server)


def responses_of(request: Request[Any, Any, Any]) -> ResponsesService:
    """The app's one ``ResponsesService`` (made by ``create_app``)."""
    service: ResponsesService = request.app.state["responses"]
    return service


def provide_tokenizer(server: NamedDependency[ServerState]) -> TokenizeService:
    return TokenizeService(server)


class CompletionsController(Controller):
    path = "/v1"
    tags = ("OpenAI",)
    middleware = [ApiKeyAuthentication]  # noqa: RUF012
    dependencies = MappingProxyType({"completions": Provide(completions_of, sync_to_thread=False)})

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
        request: Request[Principal, str, Any],
    ) -> Response[ChatCompletion]:
        return await completions.chat(data, request_context(request), request.receive)

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
        request: Request[Principal, str, Any],
    ) -> Response[Completion]:
        return await completions.complete(data, request_context(request), request.receive)


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


class ResponsesController(Controller):
    path = "/v1/responses"
    tags = ("OpenAI",)
    middleware = [ApiKeyAuthentication]  # noqa: RUF012
    dependencies = MappingProxyType({"responses": Provide(responses_of, sync_to_thread=False)})

    @post(
        "/",
        status_code=200,
        responses=COMPLETION_RESPONSES,
        operation_class=ResponseStreamingOperation,
        summary="Create a response (JSON, or server-sent events with stream=true)",
    )
    async def create(
        self,
        data: JSONBody[ResponseRequest],
        responses: NamedDependency[ResponsesService],
        request: Request[Principal, str, Any],
    ) -> Response[ResponseObject]:
        return await responses.create(data, request_context(request), request.receive)

    @get("/{response_id:str}", summary="A stored response", responses=STORED_RESPONSES)
    async def retrieve(
        self,
        responses: NamedDependency[ResponsesService],
        response_id: FromPath[str],
        request: Request[Principal, str, Any],
    ) -> Response[ResponseObject]:
        return await responses.get(response_id, request.user.tenant.id)

    @delete(
        "/{response_id:str}",
        status_code=200,
        summary="Delete a stored response",
        responses=STORED_RESPONSES,
    )
    async def remove(
        self,
        responses: NamedDependency[ResponsesService],
        response_id: FromPath[str],
        request: Request[Principal, str, Any],
    ) -> DeletedResponse:
        return await responses.delete(response_id, request.user.tenant.id)


class TokenizeController(Controller):
    """vLLM's and llama-server's tokenizer endpoints (at the root, where they serve them)."""

    path = "/"
    tags = ("OpenAI",)
    middleware = [ApiKeyAuthentication]  # noqa: RUF012
    dependencies = MappingProxyType({"tokenizer": Provide(provide_tokenizer, sync_to_thread=False)})

    @post(
        "/tokenize",
        status_code=200,
        summary="Token ids of a text or a chat",
        responses=TOKENIZE_RESPONSES,
    )
    async def tokenize(
        self, data: JSONBody[TokenizeRequest], tokenizer: NamedDependency[TokenizeService]
    ) -> TokenizeResponse:
        return tokenizer.tokenize(data)

    @post(
        "/detokenize",
        status_code=200,
        summary="The text of token ids",
        responses=TOKENIZE_RESPONSES,
    )
    async def detokenize(
        self, data: JSONBody[DetokenizeRequest], tokenizer: NamedDependency[TokenizeService]
    ) -> DetokenizeResponse:
        return tokenizer.detokenize(data)
