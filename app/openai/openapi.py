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

from app.openai.schemas import ChatCompletionChunk, Completion, ErrorResponse

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


def _chunk_schema(chunk: type[msgspec.Struct], path: str) -> dict[str, Any]:
    """The chunk's JSON schema, its ``$defs`` addressed where they sit in the document."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    where = f"#/paths/{pointer}/post/responses/200/content/text~1event-stream/schema/$defs"
    (ref,), defs = msgspec.json.schema_components([chunk], ref_template=where + "/{name}")
    return {**ref, "$defs": defs, "description": _SSE_DESCRIPTION}


_SSE_DESCRIPTION = (
    "With `stream: true`: server-sent events. Each `data:` line holds one chunk as described "
    "here; the last line is `data: [DONE]`. An error after the stream started is one "
    '`data: {"error": {...}}` line.'
)


@dataclass
class _StreamingOperation(Operation):
    chunk: ClassVar[type[msgspec.Struct]]
    path: ClassVar[str]

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse):
            content = dict(ok.content or {})
            content[SSE] = OpenAPIMediaType(schema=_chunk_schema(self.chunk, self.path))  # type: ignore[arg-type]
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
