"""``/v1/responses``: the Responses API over the chat path (same plan, admission, charging).

    POST   input (+ the stored conversation of previous_response_id) → chat plan → run
           → output items (a message, function calls) → stored when ``store``
    GET    a stored response, the key's tenant's only (another tenant's id is a 404)
    DELETE the same, then it is gone

A stream is the Responses event sequence, each event ``event: <type>`` + ``data: {…}``:

    response.created · response.in_progress
    response.output_item.added (message) · response.content_part.added
        response.output_text.delta … · response.output_text.done
        response.content_part.done · response.output_item.done
    response.output_item.added (function_call) · response.function_call_arguments.delta
        response.function_call_arguments.done · response.output_item.done     (per call)
    response.completed (or response.incomplete, cut by max_output_tokens)
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Response
from litestar.response import Stream
from litestar.types import Receive
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import StoredResponse
from app.openai.choices import ToolCall
from app.openai.disconnect import unless_disconnected
from app.openai.generation import Generation, Update
from app.openai.prompt_plan import chat_plan
from app.openai.responses_input import chat_request, input_messages
from app.openai.responses_schemas import (
    DeletedResponse,
    FormatJsonObject,
    FormatJsonSchema,
    FormatOut,
    FunctionCallItem,
    FunctionChoice,
    FunctionToolOut,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputItem,
    OutputText,
    OutputTokensDetails,
    ResponseObject,
    ResponseRequest,
    ResponseUsage,
    TextOut,
)
from app.openai.schemas import ChatMessageIn, ToolCallFunctionIn, ToolCallIn, Usage
from app.openai.service import SSE_HEADERS, CompletionService
from app.server.context import RequestContext
from app.server.errors import ApiError, GenerationFailed, NotFound

log = logging.getLogger("quanta.responses")

_encoder = msgspec.json.Encoder()
_conversation = msgspec.json.Decoder(list[ChatMessageIn])


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class Output:
    """One answer's output items, built as its updates arrive; ``events`` are what a
    stream sends for each step (numbered by the caller)."""

    text: list[str] = field(default_factory=list)
    message_id: str | None = None
    message_index: int = 0  # where the message sits among the items
    calls: list[FunctionCallItem] = field(default_factory=list)
    finish: str | None = None
    _closed: bool = False

    @property
    def items(self) -> list[OutputItem]:
        items: list[OutputItem] = list(self.calls)
        if self.message_id is not None:
            items.insert(self.message_index, self._message("completed"))
        return items

    def _message(self, status: str) -> MessageItem:
        assert self.message_id is not None
        text = "".join(self.text)
        content = [OutputText(text)] if status == "completed" or text else []
        return MessageItem(self.message_id, status, content)  # type: ignore[arg-type]

    def add(self, update: Update) -> Iterator[tuple[str, dict[str, Any]]]:
        if update.piece.text:
            yield from self._text(update.piece.text)
        if update.tool_calls:
            yield from self._close_message()
            for call in update.tool_calls:
                yield from self._call(call)
        if update.finish_reason is not None:
            self.finish = update.finish_reason
            if self.message_id is None and not self.calls:
                yield from self._text("")  # an empty answer is an empty message
            yield from self._close_message()

    def _text(self, text: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if self._closed:  # text after calls: part of the one message (shown at its place)
            self.text.append(text)
            return
        if self.message_id is None:
            self.message_id, self.message_index = _id("msg"), len(self.calls)
            item = _builtins(self._message("in_progress"))
            yield "response.output_item.added", {"output_index": self.message_index, "item": item}
            part = {"type": "output_text", "text": "", "annotations": []}
            yield "response.content_part.added", self._where() | {"part": part}
        self.text.append(text)
        if text:
            yield "response.output_text.delta", self._where() | {"delta": text, "logprobs": []}

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.message_id, "output_index": self.message_index, "content_index": 0}

    def _close_message(self) -> Iterator[tuple[str, dict[str, Any]]]:
        if self.message_id is None or self._closed:
            return
        self._closed = True
        text = "".join(self.text)
        yield "response.output_text.done", self._where() | {"text": text, "logprobs": []}
        part = {"type": "output_text", "text": text, "annotations": []}
        yield "response.content_part.done", self._where() | {"part": part}
        item = _builtins(self._message("completed"))
        yield "response.output_item.done", {"output_index": self.message_index, "item": item}

    def _call(self, call: ToolCall) -> Iterator[tuple[str, dict[str, Any]]]:
        index = len(self.calls) + (self.message_id is not None)
        item = FunctionCallItem(_id("fc"), call.id, call.name, "", "in_progress")
        yield "response.output_item.added", {"output_index": index, "item": _builtins(item)}
        where = {"item_id": item.id, "output_index": index}
        yield "response.function_call_arguments.delta", where | {"delta": call.arguments}
        done = {"arguments": call.arguments, "name": call.name}
        yield "response.function_call_arguments.done", where | done
        item = FunctionCallItem(item.id, call.id, call.name, call.arguments, "completed")
        self.calls.append(item)
        yield "response.output_item.done", {"output_index": index, "item": _builtins(item)}


def _builtins(item: msgspec.Struct) -> dict[str, Any]:
    value: dict[str, Any] = msgspec.to_builtins(item)
    return value


class ResponsesService:
    def __init__(
        self, completions: CompletionService, sessions: async_sessionmaker[AsyncSession]
    ) -> None:
        self._completions = completions
        self._sessions = sessions

    async def create(
        self, request: ResponseRequest, ctx: RequestContext, receive: Receive
    ) -> Response[Any]:
        core = self._completions.core(request.model)
        history: list[ChatMessageIn] = []
        if request.previous_response_id is not None:
            history = await self._conversation(request.previous_response_id, ctx.tenant)
        new = input_messages(request.input)
        chat = chat_request(request, history, new)
        plan = chat_plan(chat, core.tokenizer, core.grammars, core.n_ctx)
        draft = _Draft(request, core.model_name, history + new)
        generation, updates = await self._completions.launch(core, plan, 1, ctx)
        if not request.stream:
            output = await unless_disconnected(receive, _collect(updates))
            body = draft.response(output, generation.usage())
            if request.store:
                await self._save(draft, body, ctx.tenant)
            response = Response(body)
            generation.mark_sent()  # charged before it is written
            return response
        return Stream(
            self._events(draft, generation, updates, ctx.tenant),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    async def _events(
        self,
        draft: _Draft,
        generation: Generation,
        updates: AsyncIterator[Update],
        tenant: str,
    ) -> AsyncIterator[bytes]:
        sequence = 0

        def event(kind: str, data: dict[str, Any]) -> bytes:
            nonlocal sequence
            payload = {"type": kind, "sequence_number": sequence, **data}
            sequence += 1
            return b"event: " + kind.encode() + b"\ndata: " + _encoder.encode(payload) + b"\n\n"

        output = Output()
        tail = b""  # the last update's events go out with the completed response
        try:
            start = _builtins(draft.response(output, None, status="in_progress"))
            yield event("response.created", {"response": start}) + event(
                "response.in_progress", {"response": start}
            )
            async for update in updates:
                events = b"".join([event(kind, data) for kind, data in output.add(update)])
                if generation.finished:
                    tail += events
                elif events:
                    generation.mark_sent()  # charged before it is written
                    yield events
            body = draft.response(output, generation.usage())
            if draft.request.store:
                await self._save(draft, body, tenant)
            kind = "response.incomplete" if body.status == "incomplete" else "response.completed"
            generation.mark_sent()
            yield tail + event(kind, {"response": _builtins(body)})
        except ApiError as exc:
            generation.mark_sent()
            yield tail + event("error", _error(exc))
        except Exception:
            log.exception("response stream failed")
            generation.mark_sent()
            yield tail + event("error", _error(GenerationFailed("internal server error")))
        finally:
            if not generation.finished:
                generation.cancel()

    async def get(self, response_id: str, tenant: str) -> Response[Any]:
        row = await self._row(response_id, tenant)
        return Response(content=row.response.encode(), media_type="application/json")

    async def delete(self, response_id: str, tenant: str) -> DeletedResponse:
        async with self._sessions() as session, session.begin():
            result = await session.execute(
                delete(StoredResponse).where(
                    StoredResponse.id == response_id, StoredResponse.tenant_id == tenant
                )
            )
        if result.rowcount == 0:  # type: ignore[attr-defined]
            raise NotFound("response", response_id)
        return DeletedResponse(response_id)

    async def _row(self, response_id: str, tenant: str) -> StoredResponse:
        async with self._sessions() as session:
            row = await session.scalar(
                select(StoredResponse).where(
                    StoredResponse.id == response_id, StoredResponse.tenant_id == tenant
                )
            )
        if row is None:
            raise NotFound("response", response_id)
        return row

    async def _conversation(self, response_id: str, tenant: str) -> list[ChatMessageIn]:
        try:
            row = await self._row(response_id, tenant)
        except NotFound as exc:
            exc.param = "previous_response_id"
            raise
        return _conversation.decode(row.conversation)

    async def _save(self, draft: _Draft, body: ResponseObject, tenant: str) -> None:
        conversation = [*draft.conversation, _assistant(body.output)]
        row = StoredResponse(
            id=body.id,
            tenant_id=tenant,
            created_at=time.time(),
            conversation=_encoder.encode(conversation).decode(),
            response=_encoder.encode(body).decode(),
        )
        async with self._sessions() as session, session.begin():
            session.add(row)


def _assistant(items: list[OutputItem]) -> ChatMessageIn:
    """The answer as the next turn's history sees it."""
    text = "".join(p.text for item in items if isinstance(item, MessageItem) for p in item.content)
    calls = [
        ToolCallIn(
            id=item.call_id, function=ToolCallFunctionIn(name=item.name, arguments=item.arguments)
        )
        for item in items
        if isinstance(item, FunctionCallItem)
    ]
    return ChatMessageIn(role="assistant", content=text, tool_calls=calls or None)


def _error(exc: ApiError) -> dict[str, Any]:
    return {"code": exc.code, "message": exc.message, "param": exc.param}


async def _collect(updates: AsyncIterator[Update]) -> Output:
    output = Output()
    async for update in updates:
        for _ in output.add(update):
            pass
    return output


@dataclass
class _Draft:
    """What the response says besides its output: the request's settings, echoed."""

    request: ResponseRequest
    model: str
    conversation: list[ChatMessageIn]
    id: str = field(default_factory=lambda: _id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(
        self, output: Output, usage: Usage | None, status: str | None = None
    ) -> ResponseObject:
        r = self.request
        incomplete = output.finish == "length"
        if status is None:
            status = "incomplete" if incomplete else "completed"
        choice: Any = r.tool_choice or "auto"
        if isinstance(choice, FunctionChoice):
            choice = {"type": "function", "name": choice.name}
        return ResponseObject(
            id=self.id,
            created_at=self.created_at,
            status=status,  # type: ignore[arg-type]
            model=self.model,
            output=output.items if status != "in_progress" else [],
            usage=None if usage is None else _usage(usage),
            incomplete_details=IncompleteDetails("max_output_tokens") if incomplete else None,
            instructions=r.instructions,
            max_output_tokens=r.max_output_tokens,
            temperature=1.0 if r.temperature is None else r.temperature,
            top_p=1.0 if r.top_p is None else r.top_p,
            tools=[
                FunctionToolOut(t.name, t.parameters, t.strict, t.description)
                for t in r.tools or []
            ],
            tool_choice=choice,
            parallel_tool_calls=r.parallel_tool_calls is not False,
            previous_response_id=r.previous_response_id,
            store=r.store,
            text=TextOut(_format(r)),
            metadata=r.metadata or {},
            user=r.user,
        )


def _format(request: ResponseRequest) -> FormatOut:
    fmt = request.text.format if request.text is not None else None
    if isinstance(fmt, FormatJsonSchema):
        return FormatOut("json_schema", fmt.name, fmt.schema_, fmt.strict)
    if isinstance(fmt, FormatJsonObject):
        return FormatOut("json_object")
    return FormatOut("text")


def _usage(usage: Usage) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(usage.prompt_tokens_details.cached_tokens),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(),
        total_tokens=usage.total_tokens,
    )
