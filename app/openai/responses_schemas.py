"""The Responses API's bodies (``POST /v1/responses``) as msgspec structs.

The request is strict at its top level (an unknown parameter is a 400 naming it); ``input``
items are read by ``responses_input.py``, which names the item at fault. Parameters the
SDKs send by default that Quanta cannot act on are accepted and ignored: ``include``,
``reasoning`` (not a reasoning model), ``service_tier``, ``truncation`` (a conversation
longer than the context is a 400, as with ``disabled``), ``prompt_cache_key`` (prefixes are
cached anyway), ``safety_identifier``, ``user``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from app.openai.schemas import (
    FunctionName,
    PositiveInt,
    Temperature,
    TopP,
    _Request,
)


class FunctionTool(_Request, kw_only=True, tag_field="type", tag="function"):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(_Request, kw_only=True):
    type: Literal["function"]
    name: str


class FormatText(_Request, kw_only=True, tag_field="type", tag="text"):
    pass


class FormatJsonObject(_Request, kw_only=True, tag_field="type", tag="json_object"):
    pass


class FormatJsonSchema(_Request, kw_only=True, tag_field="type", tag="json_schema"):
    name: str
    schema_: dict[str, Any] = msgspec.field(name="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = FormatText | FormatJsonObject | FormatJsonSchema


class TextOptions(_Request, kw_only=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningOptions(_Request, kw_only=True):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponseRequest(_Request, kw_only=True):
    model: str
    # Text, or a list of items: messages, function_call and function_call_output items.
    input: str | Annotated[list[dict[str, Any]], Meta(min_length=1, max_length=4096)]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    stream: bool = False
    store: bool = True  # kept for GET and previous_response_id, for the key's tenant only
    previous_response_id: Annotated[str, Meta(min_length=1, max_length=64)] | None = None
    metadata: Annotated[dict[str, str], Meta(max_length=16)] | None = None
    # accepted and ignored (see the module's docstring)
    include: list[str] | None = None
    reasoning: ReasoningOptions | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    user: str | None = None


# ---- the response ----


class OutputText(msgspec.Struct, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


class MessageItem(msgspec.Struct, tag_field="type", tag="message"):
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]
    role: Literal["assistant"] = "assistant"


class FunctionCallItem(msgspec.Struct, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = MessageItem | FunctionCallItem


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct):
    reason: Literal["max_output_tokens"]


class FunctionToolOut(msgspec.Struct, tag_field="type", tag="function"):
    name: str
    parameters: dict[str, Any] | None
    strict: bool | None
    description: str | None = None


class FormatOut(msgspec.Struct):
    type: Literal["text", "json_object", "json_schema"]
    name: str | UnsetType = UNSET
    schema_: dict[str, Any] | UnsetType = msgspec.field(default=UNSET, name="schema")
    strict: bool | UnsetType | None = UNSET


class TextOut(msgspec.Struct):
    format: FormatOut


class ReasoningOut(msgspec.Struct):
    effort: str | None = None
    summary: str | None = None


class ResponseObject(msgspec.Struct):
    id: str
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tools: list[FunctionToolOut]
    tool_choice: Literal["none", "auto", "required"] | dict[str, str]
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    text: TextOut
    metadata: dict[str, str]
    object: Literal["response"] = "response"
    error: None = None
    truncation: Literal["disabled"] = "disabled"
    reasoning: ReasoningOut = msgspec.field(default_factory=ReasoningOut)
    service_tier: Literal["default"] = "default"
    background: bool = False
    user: str | None = None


class DeletedResponse(msgspec.Struct):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True
