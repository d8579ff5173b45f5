"""The completions service: validate, plan, run, render. Handlers call only this."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Response
from litestar.response import Stream
from litestar.types import Receive

from app.openai.disconnect import unless_disconnected
from app.openai.generation import Generation, Update, core_request
from app.openai.prompt_plan import PromptPlan, chat_plan, completion_plan
from app.openai.render import ChatRenderer, Collected, CompletionRenderer, Header, Renderer
from app.openai.schemas import ChatCompletionRequest, CompletionRequest
from app.openai.streaming import event_stream
from app.openai.tool_parser import with_tool_calls
from app.server.context import RequestContext
from app.server.core import Core
from app.server.errors import ModelNotFound
from app.server.metrics import Metrics
from app.server.state import ServerState
from app.tenancy.quotas import Ask

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class CompletionService:
    def __init__(self, state: ServerState, metrics: Metrics) -> None:
        self._state = state
        self._metrics = metrics

    def core(self, model: str) -> Core:
        core = self._state.ready_core()
        if model not in core.names:
            raise ModelNotFound(model)
        return core

    async def chat(
        self, request: ChatCompletionRequest, ctx: RequestContext, receive: Receive
    ) -> Response[Any]:
        core = self.core(request.model)
        plan = chat_plan(request, core.tokenizer, core.grammars, core.n_ctx)
        head = _header("chatcmpl", ctx, core, request.n, request.logprobs)
        return await self._run(core, plan, request, ChatRenderer(head), ctx, receive)

    async def complete(
        self, request: CompletionRequest, ctx: RequestContext, receive: Receive
    ) -> Response[Any]:
        core = self.core(request.model)
        plan = completion_plan(request, core.tokenizer, core.grammars, core.n_ctx)
        head = _header("cmpl", ctx, core, request.n, request.logprobs is not None)
        return await self._run(core, plan, request, CompletionRenderer(head), ctx, receive)

    async def _run(
        self,
        core: Core,
        plan: PromptPlan,
        request: ChatCompletionRequest | CompletionRequest,
        renderer: Renderer,
        ctx: RequestContext,
        receive: Receive,
    ) -> Response[Any]:
        generation, updates = await self.launch(core, plan, request.n, ctx)
        if not request.stream:
            choices = await unless_disconnected(receive, _collect(updates, request.n))
            response = Response(renderer.whole(choices, generation.usage()))
            generation.mark_sent()  # charged before it is written; a failure is sent nothing
            return response
        options = request.stream_options
        include_usage = options is not None and options.include_usage
        # As vLLM: continuous usage only together with include_usage.
        continuous = include_usage and options is not None and options.continuous_usage_stats
        stream = event_stream(
            generation, updates, renderer, include_usage=include_usage, continuous_usage=continuous
        )
        return Stream(stream, media_type="text/event-stream", headers=SSE_HEADERS)

    async def launch(
        self, core: Core, plan: PromptPlan, n: int, ctx: RequestContext
    ) -> tuple[Generation, AsyncIterator[Update]]:
        """Admit and start ``plan`` (quotas, then the core: a refusal raises here, before
        any body); its updates, with tool calls read out when it has tools."""
        request = core_request(core, plan, n, ctx)
        meter = None
        if ctx.gate is not None:  # 429 here, before anything reaches the core
            likely = core.likely_output(request) if core.likely_output else None
            meter = await ctx.gate.reserve(Ask(len(plan.prompt_tokens), plan.max_tokens, n, likely))
            if ctx.record is not None:
                ctx.record.meter = meter
        logprobs = plan.sampling.logprobs is not None
        generation = Generation(core, plan, request, ctx, self._metrics, meter, logprobs=logprobs)
        generation.start()
        updates = generation.updates()
        if plan.tools is not None:
            updates = with_tool_calls(updates, plan.tools, n, plan.answer_prefix)
        return generation, updates


def _header(prefix: str, ctx: RequestContext, core: Core, n: int, logprobs: bool) -> Header:
    return Header(f"{prefix}-{ctx.request_id}", int(time.time()), core.model_name, n, logprobs)


async def _collect(updates: AsyncIterator[Update], n: int) -> list[Collected]:
    choices = [Collected() for _ in range(n)]
    async for update in updates:
        choices[update.index].add(update)
    return choices
