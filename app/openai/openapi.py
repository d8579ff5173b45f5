"""What the OpenAPI document says beyond what litestar infers from the handlers.

* Errors are OpenAI-shaped (``ErrorResponse``), not litestar's default body.
* ``stream=true`` turns a 200 into ``text/event-stream``: each ``data:`` line holds one chunk
  (the schema below), the last line is ``data: [DONE]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, Operation

from app.openai.schemas import ChatCompletionChunk, Completion, ErrorResponse, ResponseEvent

SSE = "text/event-stream"


def _error(description: str) -> ResponseSpec:
    return ResponseSpec(ErrorResponse, description=description, generate_examples=False)


COMPLETION_RESPONSES = {
    400: _error(
        "Invalid request: an unknown or invalid parameter (named in `param`), or "
        "`context_length_exceeded`"
    ),
    404: _error("`model_not_found`"),
    413: _error("The request body is too large"),
    503: _error("Not ready (loading or shutting down) or overloaded; see Retry-After"),
}
MODEL_RESPONSES = {404: _error("`model_not_found`"), 503: _error("Not ready")}
TOKENIZE_RESPONSES = {404: _error("`model_not_found` (when `model` is given)")}
STORED_RESPONSES = {404: _error("No response with this id stored for the key's tenant")}


def _chunk_schema(chunk: type[msgspec.Struct], path: str, description: str) -> dict[str, Any]:
    """The chunk's JSON schema, its ``$defs`` addressed where they sit in the document."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    where = f"#/paths/{pointer}/post/responses/200/content/text~1event-stream/schema/$defs"
    (ref,), defs = msgspec.json.schema_components([chunk], ref_template=where + "/{name}")
    return {**ref, "$defs": defs, "description": description}


_SSE_DESCRIPTION = (
    "With `stream: true`: server-sent events. Each `data:` line holds one chunk as described "
    "here; the last line is `data: [DONE]`. An error after the stream started is one "
    '`data: {"error": {...}}` line.'
)
_RESPONSE_EVENTS = (
    "With `stream: true`: server-sent events, each an `event: <type>` line and a `data:` "
    "line holding the event: `response.created`, `response.in_progress`, then per output "
    "item `response.output_item.added`, its deltas (`response.output_text.delta`, "
    "`response.function_call_arguments.delta`) and `response.output_item.done`, and last "
    "`response.completed` (`response.incomplete` when cut by `max_output_tokens`) with the "
    "whole response. An error after the stream started is one `error` event."
)


@dataclass
class _StreamingOperation(Operation):
    chunk: ClassVar[type[msgspec.Struct]]
    path: ClassVar[str]
    events: ClassVar[str] = _SSE_DESCRIPTION

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse):
            content = dict(ok.content or {})
            schema: Any = _chunk_schema(self.chunk, self.path, self.events)
            content[SSE] = OpenAPIMediaType(schema=schema)
            ok.content = content
            ok.description = "The completion as JSON, or with `stream: true` as events"


@dataclass
class ChatStreamingOperation(_StreamingOperation):
    chunk = ChatCompletionChunk
    path = "/v1/chat/completions"


@dataclass
class CompletionStreamingOperation(_StreamingOperation):
    chunk = Completion
    path = "/v1/completions"


@dataclass
class ResponseStreamingOperation(_StreamingOperation):
    chunk = ResponseEvent
    path = "/v1/responses"
    events = _RESPONSE_EVENTS
