"""A Responses request in chat terms: its ``input`` items as chat messages, and the whole
request as the ``ChatCompletionRequest`` that the chat path plans and runs.

    input item                                   chat message
    "text"                                       user: text
    {role, content: text | [input_text…]}        that role: the texts joined
    {type: function_call, call_id, name, …}      assistant: tool_calls (consecutive calls,
                                                 and a message just before them, merge)
    {type: function_call_output, call_id, …}     tool: output
    {type: reasoning}                            (dropped: this model does not reason aloud)

Fields an item carries besides these (``id``, ``status``, ``annotations``) are read past:
they are the SDKs echoing a previous response's output back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.openai.responses_schemas import (
    FormatJsonObject,
    FormatJsonSchema,
    FunctionChoice,
    ResponseRequest,
)
from app.openai.schemas import (
    ChatCompletionRequest,
    ChatMessageIn,
    FunctionDef,
    JsonSchemaSpec,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    ToolCallFunctionIn,
    ToolCallIn,
    ToolChoice,
    ToolDef,
)
from app.server.errors import InvalidParameter, UnsupportedParameter

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")


def input_messages(items: str | Sequence[dict[str, Any]]) -> list[ChatMessageIn]:
    if isinstance(items, str):
        return [ChatMessageIn(role="user", content=items)]
    out: list[ChatMessageIn] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise InvalidParameter(f"{where}.role", f"role must be one of {', '.join(ROLES)}")
            out.append(ChatMessageIn(role=role, content=_text(item.get("content"), where)))
        elif kind == "function_call":
            call = ToolCallIn(
                id=_string(item, "call_id", where),
                function=ToolCallFunctionIn(
                    name=_string(item, "name", where), arguments=_string(item, "arguments", where)
                ),
            )
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(ChatMessageIn(role="assistant", content=None, tool_calls=[call]))
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            call_id = _string(item, "call_id", where)
            out.append(ChatMessageIn(role="tool", content=text, tool_call_id=call_id))
        elif kind == "reasoning":
            continue
        else:
            raise UnsupportedParameter(f"{where}.type", f"input items of type {kind!r}")
    if not out:
        raise InvalidParameter("input", "the input has no message")
    return out


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidParameter(f"{where}.{key}", f"'{key}' must be a string")
    return value


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidParameter(f"{where}.content", "content must be text or a list of parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise UnsupportedParameter(
                f"{where}.content[{j}]", "only text parts (input_text, output_text)"
            )
        texts.append(part["text"])
    return "".join(texts)


def chat_request(
    request: ResponseRequest, history: Sequence[ChatMessageIn], new: Sequence[ChatMessageIn]
) -> ChatCompletionRequest:
    """The chat request that answers ``request`` after ``history`` (a stored conversation)."""
    messages = list(history) + list(new)
    if request.instructions:
        messages.insert(0, ChatMessageIn(role="system", content=request.instructions))
    tools = None
    if request.tools:
        tools = [
            ToolDef(
                type="function",
                function=FunctionDef(
                    name=t.name, description=t.description, parameters=t.parameters, strict=t.strict
                ),
            )
            for t in request.tools
        ]
    choice: ToolChoice | None
    if isinstance(request.tool_choice, FunctionChoice):
        choice = NamedToolChoice(
            type="function", function=NamedFunction(name=request.tool_choice.name)
        )
    else:
        choice = request.tool_choice
    return ChatCompletionRequest(
        model=request.model,
        messages=messages,
        max_completion_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=request.parallel_tool_calls,
        response_format=_response_format(request),
    )


def _response_format(request: ResponseRequest) -> ResponseFormat | None:
    fmt = request.text.format if request.text is not None else None
    if isinstance(fmt, FormatJsonObject):
        return ResponseFormat(type="json_object")
    if isinstance(fmt, FormatJsonSchema):
        spec = JsonSchemaSpec(
            name=fmt.name, schema_=fmt.schema_, description=fmt.description, strict=fmt.strict
        )
        return ResponseFormat(type="json_schema", json_schema=spec)
    return None
