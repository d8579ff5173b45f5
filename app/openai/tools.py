"""Tools as the model sees them: which call format its template speaks, the chat history
rendered for it, and the grammar its answer is held to.

    template says          format    a call looks like
    <tool_call>            hermes    <tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>
    [TOOL_CALLS]           mistral   [TOOL_CALLS][{"name": …, "arguments": {…}}, …]
    <|python_tag|> ipython llama3    {"name": …, "parameters": {…}}
    no tools at all        generic   as hermes; the tools are described in the system message
                                     and tool results come back as user turns

A template that knows tools gets them (and the history's calls and results) as its own
variables, as transformers and llama-server hand them over. The grammar:

    tool_choice   hermes / generic                          llama3 / mistral
    none          text that never opens a call              none
    auto          text, then optionally whole, valid calls  none (a call that does not
                                                            parse is returned as text)
    required      one call (more with parallel_tool_calls)  the same
    named         exactly one call of that function         the same
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from app.openai.schemas import (
    ChatMessageIn,
    NamedToolChoice,
    ToolChoice,
    ToolDef,
)
from app.server.errors import InvalidParameter
from quanta_core.engine.tool_grammar import ToolCallGrammar


class ToolFormat(StrEnum):
    HERMES = "hermes"
    MISTRAL = "mistral"
    LLAMA3 = "llama3"
    GENERIC = "generic"


@lru_cache(maxsize=8)
def tool_format(template: str | None) -> ToolFormat:
    """The call format the model's template speaks (``generic`` when it knows no tools)."""
    if not template or "tools" not in template:
        return ToolFormat.GENERIC
    if "<tool_call>" in template:
        return ToolFormat.HERMES
    if "[TOOL_CALLS]" in template:
        return ToolFormat.MISTRAL
    if "<|python_tag|>" in template or "ipython" in template:
        return ToolFormat.LLAMA3
    return ToolFormat.GENERIC


@dataclass(frozen=True, slots=True)
class ToolSetup:
    """What a request's tools mean for its answer."""

    format: ToolFormat
    choice: str  # none | auto | required | the named function
    functions: tuple[tuple[str, str], ...]  # (name, parameters as JSON) that may be called
    parallel: bool
    descriptions: tuple[tuple[str, str], ...] = ()  # (name, description)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.functions)

    @property
    def parses(self) -> bool:
        """Whether answers are read for calls (not with ``none``)."""
        return self.choice != "none"

    def grammar(self, answer_schema: str | None = None) -> ToolCallGrammar | None:
        """The grammar's spec, or None where the format's answers are parsed unconstrained
        (``answer_schema``: ``response_format``'s schema, the alternative to calls)."""
        named = self.choice not in ("none", "auto", "required")
        free = self.choice in ("none", "auto")
        if free and self.format in (ToolFormat.LLAMA3, ToolFormat.MISTRAL):
            return None
        functions = tuple(f for f in self.functions if not named or f[0] == self.choice)
        one = named or not self.parallel
        shape = _SHAPES[self.format]
        return ToolCallGrammar(
            functions=functions if self.choice != "none" else (),
            min_calls=0 if free else 1,
            max_calls=0 if self.choice == "none" else (1 if one else None),
            text=free and answer_schema is None,
            answer=answer_schema if free else None,
            **shape,
        )


_HERMES = {"open": "<tool_call>\n", "close": "\n</tool_call>", "separator": "\n"}
_SHAPES: dict[ToolFormat, dict[str, Any]] = {
    ToolFormat.HERMES: _HERMES,
    ToolFormat.GENERIC: _HERMES,
    ToolFormat.LLAMA3: {"open": "", "close": "", "separator": "; ", "args_key": "parameters"},
    ToolFormat.MISTRAL: {
        "before": "[TOOL_CALLS][",
        "open": "",
        "close": "",
        "separator": ", ",
        "after": "]",
    },
}


def tool_setup(
    tools: Sequence[ToolDef] | None,
    choice: ToolChoice | None,
    parallel: bool | None,
    template: str | None,
) -> ToolSetup | None:
    """The request's tools checked (a 400 names what is wrong); None without tools."""
    if not tools:
        if choice not in (None, "none"):
            raise InvalidParameter("tool_choice", "tool_choice needs 'tools'")
        return None
    functions = []
    for tool in tools:
        parameters = tool.function.parameters
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        functions.append((tool.function.name, json.dumps(parameters)))
    names = [name for name, _ in functions]
    if len(set(names)) != len(names):
        raise InvalidParameter("tools", "two tools have the same name")
    descriptions = tuple(
        (t.function.name, t.function.description) for t in tools if t.function.description
    )
    mode: str
    if isinstance(choice, NamedToolChoice):
        mode = choice.function.name
        if mode not in names:
            raise InvalidParameter(
                "tool_choice", f"tool_choice names '{mode}', which is not in tools"
            )
    else:
        mode = choice or "auto"
    return ToolSetup(
        tool_format(template), mode, tuple(functions), parallel is not False, descriptions
    )


def template_tools(setup: ToolSetup) -> list[dict[str, Any]] | None:
    """The tools handed to a template that knows them (none with ``tool_choice: none``)."""
    if setup.format is ToolFormat.GENERIC or setup.choice == "none":
        return None
    return [
        {"type": "function", "function": _function(setup, name, params)}
        for name, params in setup.functions
    ]


def _function(setup: ToolSetup, name: str, params: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if description := dict(setup.descriptions).get(name):
        function["description"] = description
    function["parameters"] = json.loads(params)
    return function


def chat_messages(
    messages: Sequence[ChatMessageIn], setup: ToolSetup | None
) -> list[dict[str, Any]]:
    """The history as the template takes it: developer → system, calls and results in the
    template's own terms (native formats) or as text (generic)."""
    generic = setup is None or setup.format is ToolFormat.GENERIC
    called: dict[str, str] = {}  # call id → function name
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        text = m.text()
        if m.role == "tool":
            if m.tool_call_id is None:
                raise InvalidParameter(
                    f"messages[{i}].tool_call_id", "a tool message needs 'tool_call_id'"
                )
            name = called.get(m.tool_call_id, m.name or "")
            if generic:
                block = f"<tool_response>\n{text}\n</tool_response>"
                if out and out[-1].get("quanta_tool_results"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "quanta_tool_results": True})
            else:
                out.append(
                    {"role": "tool", "content": text, "tool_call_id": m.tool_call_id, "name": name}
                )
            continue
        entry: dict[str, Any] = {"role": role, "content": text}
        if m.tool_calls:
            if m.role != "assistant":
                raise InvalidParameter(
                    f"messages[{i}].tool_calls", "only assistant messages carry tool_calls"
                )
            calls = []
            for call in m.tool_calls:
                called[call.id] = call.function.name
                calls.append((call.id, call.function.name, _arguments(call.function.arguments)))
            if generic:
                blocks = [
                    "<tool_call>\n"
                    + json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
                    + "\n</tool_call>"
                    for _, name, args in calls
                ]
                entry["content"] = "\n".join([text, *blocks] if text else blocks)
            else:
                entry["tool_calls"] = [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": args},
                    }
                    for call_id, name, args in calls
                ]
        out.append(entry)
    for entry in out:
        entry.pop("quanta_tool_results", None)
    if setup is not None and generic and setup.choice != "none":
        _describe_tools(out, setup)
    return out


def _arguments(arguments: str) -> Any:
    """A call's arguments as an object for the template (as it was sent, if not JSON)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


GENERIC_PROMPT = """You can call functions. They are, as JSON schemas:
<tools>
{tools}
</tools>
To call a function, answer with one block per call, each exactly:
<tool_call>
{{"name": <the function's name>, "arguments": <its arguments as a JSON object>}}
</tool_call>
A function's result comes back inside <tool_response></tool_response>."""


def _describe_tools(messages: list[dict[str, Any]], setup: ToolSetup) -> None:
    """The generic format: the tools are described in the (first) system message."""
    lines = [
        json.dumps({"type": "function", "function": _function(setup, name, params)})
        for name, params in setup.functions
    ]
    prompt = GENERIC_PROMPT.format(tools="\n".join(lines))
    if setup.choice == "required":
        prompt += "\nAnswer with a function call."
    elif setup.choice != "auto":
        prompt += f"\nAnswer with a call of {setup.choice}."
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{prompt}".lstrip()
    else:
        messages.insert(0, {"role": "system", "content": prompt})
