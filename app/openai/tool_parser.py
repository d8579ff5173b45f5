"""Tool calls read out of a choice's text as it streams, in the format its template speaks.

hermes / generic: text is released until a call may be opening (a tail that is a prefix of
``<tool_call>`` is held back, as stop strings are); a call is held until ``</tool_call>``
closes it, then released whole, parsed:

    Let me check.<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>
    └── content ─┘└────────────────── one ToolCall(name="f", arguments='{"x": 1}') ──┘

llama3 / mistral: an answer that opens with ``{`` (``[``) is held to its end and parsed as
calls; if it does not parse, it is released as text (no grammar holds these under ``auto``).

A call cut short by ``max_tokens`` is dropped, never passed on as text; a call that does not
parse in the hermes format (only possible without the grammar) is dropped too.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.openai.choices import Piece, ToolCall
from app.openai.generation import Update
from app.openai.tools import ToolFormat, ToolSetup

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str


def parse_calls(text: str, names: frozenset[str], args_keys: Sequence[str]) -> list[ParsedCall]:
    """The calls in ``text``: one JSON object, a JSON list of them, or objects separated by
    ``;``. Raises ``ValueError`` if it is not that, or names a function not offered."""
    text = text.strip()
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = [json.loads(part) for part in text.split(";") if part.strip()]
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            raise ValueError("not a call of an offered function")
        key = next((k for k in args_keys if k in item), None)
        arguments = {} if key is None else item[key]
        if isinstance(arguments, str):
            arguments = json.loads(arguments)  # a JSON string of the arguments
        if not isinstance(arguments, dict):
            raise ValueError("arguments are not a JSON object")
        calls.append(ParsedCall(item["name"], json.dumps(arguments, ensure_ascii=False)))
    return calls


@dataclass
class CallExtractor:
    """One choice's text split into content and calls, piece by piece."""

    setup: ToolSetup
    calls: int = 0  # calls released so far
    cut: bool = False  # a call was open when the text ended
    _held: str = ""
    _inside: bool = False
    _after_call: bool = False
    _whole: bool | None = None  # llama3/mistral: the answer is held whole (decided once)

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.setup.format in (ToolFormat.HERMES, ToolFormat.GENERIC):
            return self._push_tagged(text)
        return self._push_whole(text)

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self.setup.format in (ToolFormat.HERMES, ToolFormat.GENERIC):
            if self._inside:
                self.cut = True
                self._held = ""
                return "", []
            held, self._held = self._held, ""
            return self._content(held), []
        held, self._held = self._held, ""
        if not self._whole:
            return held, []
        keys = ("parameters", "arguments") if self.setup.format is ToolFormat.LLAMA3 else ()
        try:
            body = held.strip().removeprefix("[TOOL_CALLS]")
            return "", self._released(parse_calls(body, self.setup.names, keys or ("arguments",)))
        except ValueError:
            return held, []

    # ---- hermes / generic ----

    def _push_tagged(self, text: str) -> tuple[str, list[ToolCall]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        while text:
            buffer, self._held = self._held + text, ""
            text = ""
            if not self._inside:
                start = buffer.find(OPEN)
                if start < 0:
                    keep = _opening_tail(buffer)
                    content.append(self._content(buffer[: len(buffer) - keep]))
                    self._held = buffer[len(buffer) - keep :]
                    break
                content.append(self._content(buffer[:start]))
                self._inside, text = True, buffer[start + len(OPEN) :]
                continue
            end = buffer.find(CLOSE)
            if end < 0:
                self._held = buffer
                break
            body, text = buffer[:end], buffer[end + len(CLOSE) :]
            self._inside, self._after_call = False, True
            # malformed (only possible without the grammar): dropped, not shown as text
            with contextlib.suppress(ValueError):
                calls.extend(self._released(parse_calls(body, self.setup.names, ("arguments",))))
        return "".join(content), calls

    def _content(self, text: str) -> str:
        """Whitespace right after a call (between calls, before the end) is not content."""
        if self._after_call:
            text = text.lstrip()
            if text:
                self._after_call = False
        return text

    # ---- llama3 / mistral ----

    def _push_whole(self, text: str) -> tuple[str, list[ToolCall]]:
        if self._whole is None:
            self._held += text
            start = self._held.lstrip()
            if not start:
                return "", []
            self._whole = start[0] in "{["
            if not self._whole:
                text, self._held = self._held, ""
                return text, []
            return "", []
        if self._whole:
            self._held += text
            return "", []
        return text, []

    def _released(self, parsed: list[ParsedCall]) -> list[ToolCall]:
        out = []
        for call in parsed:
            out.append(ToolCall(self.calls, call_id(), call.name, call.arguments))
            self.calls += 1
        return out


def _opening_tail(text: str) -> int:
    """The length of the longest end of ``text`` that may be the start of ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:n]):
            return n
    return 0


async def with_tool_calls(
    updates: AsyncIterator[Update], setup: ToolSetup, n: int, prefix: str = ""
) -> AsyncIterator[Update]:
    """``updates`` with each choice's calls read out of its text (which starts with
    ``prefix``, put in the prompt); a choice that made calls and stopped finishes with
    ``tool_calls``."""
    extractors = [CallExtractor(setup) for _ in range(n)]
    for extractor in extractors:
        extractor.push(prefix)  # the start of a call: nothing to release yet
    async for update in updates:
        extractor = extractors[update.index]
        text, calls = extractor.push(update.piece.text)
        reason = update.finish_reason
        if reason is not None:
            more_text, more_calls = extractor.finish()
            text, calls = text + more_text, calls + more_calls
            if reason == "stop" and extractor.calls:
                reason = "tool_calls"
        yield replace(
            update,
            piece=Piece(text, update.piece.logprobs),
            tool_calls=tuple(calls),
            finish_reason=reason,
        )
