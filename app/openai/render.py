"""Updates rendered in OpenAI's two dialects: chat (``chat.completion[.chunk]``) and legacy
completions (``text_completion``), whole or as stream chunks."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from app.openai.choices import LogprobEntry, ToolCall
from app.openai.generation import Finish, Update
from app.openai.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatMessageOut,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Delta,
    FunctionCallDelta,
    FunctionCallOut,
    ServerTiming,
    TokenLogprob,
    ToolCallDelta,
    ToolCallOut,
    TopLogprobOut,
    Usage,
)


@dataclass
class Collected:
    """One choice, accumulated for a non-streaming response."""

    text: list[str] = field(default_factory=list)
    logprobs: list[LogprobEntry] = field(default_factory=list)
    finish_reason: Finish = "length"
    timing: ServerTiming | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)

    def add(self, update: Update) -> None:
        self.text.append(update.piece.text)
        self.logprobs.extend(update.piece.logprobs)
        self.tool_calls.extend(update.tool_calls)
        if update.finish_reason is not None:
            self.finish_reason = update.finish_reason
            self.timing = update.timing


_encoder = msgspec.json.Encoder()


def sse(payload: msgspec.Struct) -> bytes:
    """One server-sent event: ``data: {json}`` and a blank line."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


@dataclass(frozen=True, slots=True)
class TextEvent:
    """The stream's common event, a piece of one choice's text (no logprobs, not finished),
    as bytes around the text: cut from the encoded chunk itself, so it is byte for byte what
    ``sse(chunk)`` writes, without building and encoding the chunk for every token.

        data: {"id":…,"choices":[{"index":0,"text":  "Hello"  ,"logprobs":null,…}]…}\n\n
        └───────────────── heads[0] ────────────────┘└ text ┘└──────── tail ──────────┘
    """

    heads: tuple[bytes, ...]  # per choice index
    tail: bytes

    @classmethod
    def of(cls, chunk: Callable[[int, str], msgspec.Struct], n: int) -> TextEvent:
        marker = uuid.uuid4().hex  # cannot occur in the id or the model's name
        cuts = [sse(chunk(i, marker)).partition(f'"{marker}"'.encode()) for i in range(n)]
        return cls(tuple(head for head, _, _ in cuts), cuts[0][2])

    def render(self, index: int, text: str) -> bytes:
        return self.heads[index] + _encoder.encode(text) + self.tail


@dataclass(frozen=True, slots=True)
class Header:
    id: str
    created: int
    model: str
    n: int
    logprobs: bool


class Renderer(Protocol):
    def opening(self) -> list[msgspec.Struct]: ...

    def chunks(self, update: Update) -> list[msgspec.Struct]: ...

    def events(self, update: Update) -> bytes:
        """``update``'s chunks as server-sent events (``b""`` when there are none)."""
        ...

    def usage_chunk(self, usage: Usage) -> msgspec.Struct: ...

    def whole(self, choices: Sequence[Collected], usage: Usage) -> msgspec.Struct: ...


def _timing(timing: ServerTiming | None) -> ServerTiming | msgspec.UnsetType:
    return msgspec.UNSET if timing is None else timing


def _events(renderer: Renderer, text: TextEvent, update: Update) -> bytes:
    piece = update.piece
    if piece.text and update.finish_reason is None and not piece.logprobs and not update.tool_calls:
        return text.render(update.index, piece.text)
    return b"".join([sse(chunk) for chunk in renderer.chunks(update)])


@dataclass(frozen=True, slots=True)
class ChatRenderer:
    head: Header
    _text: TextEvent | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text = None
        if not self.head.logprobs:  # with logprobs, every text chunk carries them
            text = TextEvent.of(
                lambda i, t: self._chunk([ChatChunkChoice(i, Delta(content=t), None, None)]),
                self.head.n,
            )
        object.__setattr__(self, "_text", text)

    def events(self, update: Update) -> bytes:
        if self._text is None:
            return b"".join([sse(chunk) for chunk in self.chunks(update)])
        return _events(self, self._text, update)

    def _chunk(self, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
        h = self.head
        return ChatCompletionChunk(id=h.id, created=h.created, model=h.model, choices=choices)

    def _logprobs(self, entries: Sequence[LogprobEntry]) -> ChatLogprobs | None:
        return chat_logprobs(entries) if self.head.logprobs else None

    def opening(self) -> list[msgspec.Struct]:
        return [
            self._chunk([ChatChunkChoice(i, Delta(role="assistant", content=""), None, None)])
            for i in range(self.head.n)
        ]

    def chunks(self, update: Update) -> list[msgspec.Struct]:
        out: list[msgspec.Struct] = []
        piece = update.piece
        if piece.text or piece.logprobs:
            delta = Delta(content=piece.text)
            out.append(
                self._chunk(
                    [ChatChunkChoice(update.index, delta, self._logprobs(piece.logprobs), None)]
                )
            )
        for call in update.tool_calls:
            deltas = _call_deltas(call)
            out.extend(self._chunk([ChatChunkChoice(update.index, d, None, None)]) for d in deltas)
        if update.finish_reason is not None:
            done = ChatChunkChoice(
                update.index, Delta(), None, update.finish_reason, _timing(update.timing)
            )
            out.append(self._chunk([done]))
        return out

    def usage_chunk(self, usage: Usage) -> msgspec.Struct:
        chunk = self._chunk([])
        chunk.usage = usage
        return chunk

    def whole(self, choices: Sequence[Collected], usage: Usage) -> msgspec.Struct:
        h = self.head
        return ChatCompletion(
            id=h.id,
            created=h.created,
            model=h.model,
            usage=usage,
            choices=[
                ChatChoice(
                    index=i,
                    message=_message(c),
                    logprobs=self._logprobs(c.logprobs),
                    finish_reason=c.finish_reason,
                    quanta=_timing(c.timing),
                )
                for i, c in enumerate(choices)
            ],
        )


def _message(choice: Collected) -> ChatMessageOut:
    text = "".join(choice.text)
    if not choice.tool_calls:
        return ChatMessageOut(role="assistant", content=text)
    calls = [
        ToolCallOut(call.id, FunctionCallOut(call.name, call.arguments))
        for call in choice.tool_calls
    ]
    return ChatMessageOut(role="assistant", content=text or None, tool_calls=calls)


def _call_deltas(call: ToolCall) -> list[Delta]:
    """A call as OpenAI streams it: its id and name first, then its arguments."""
    return [
        Delta(
            tool_calls=[
                ToolCallDelta(
                    call.index, call.id, "function", FunctionCallDelta(call.name, arguments="")
                )
            ]
        ),
        Delta(
            tool_calls=[
                ToolCallDelta(call.index, function=FunctionCallDelta(arguments=call.arguments))
            ]
        ),
    ]


@dataclass(frozen=True, slots=True)
class CompletionRenderer:
    head: Header
    _text: TextEvent | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text = None
        if not self.head.logprobs:  # with logprobs, every text chunk carries them
            text = TextEvent.of(
                lambda i, t: self._chunk([CompletionChoice(i, t, None, None)]), self.head.n
            )
        object.__setattr__(self, "_text", text)

    def events(self, update: Update) -> bytes:
        if self._text is None:
            return b"".join([sse(chunk) for chunk in self.chunks(update)])
        return _events(self, self._text, update)

    def _chunk(self, choices: list[CompletionChoice]) -> Completion:
        h = self.head
        return Completion(id=h.id, created=h.created, model=h.model, choices=choices)

    def _logprobs(self, entries: Sequence[LogprobEntry]) -> CompletionLogprobs | None:
        return completion_logprobs(entries) if self.head.logprobs else None

    def opening(self) -> list[msgspec.Struct]:
        return []

    def chunks(self, update: Update) -> list[msgspec.Struct]:
        piece = update.piece
        choice = CompletionChoice(
            update.index,
            piece.text,
            self._logprobs(piece.logprobs),
            update.finish_reason,
            _timing(update.timing),
        )
        return [self._chunk([choice])]

    def usage_chunk(self, usage: Usage) -> msgspec.Struct:
        chunk = self._chunk([])
        chunk.usage = usage
        return chunk

    def whole(self, choices: Sequence[Collected], usage: Usage) -> msgspec.Struct:
        chunk = self._chunk(
            [
                CompletionChoice(
                    i,
                    "".join(c.text),
                    self._logprobs(c.logprobs),
                    c.finish_reason,
                    _timing(c.timing),
                )
                for i, c in enumerate(choices)
            ]
        )
        chunk.usage = usage
        return chunk


def chat_logprobs(entries: Sequence[LogprobEntry]) -> ChatLogprobs:
    return ChatLogprobs(
        content=[
            TokenLogprob(
                token=e.token,
                logprob=e.logprob,
                bytes=list(e.bytes),
                top_logprobs=[TopLogprobOut(t.token, t.logprob, list(t.bytes)) for t in e.top],
            )
            for e in entries
        ]
    )


def completion_logprobs(entries: Sequence[LogprobEntry]) -> CompletionLogprobs:
    return CompletionLogprobs(
        tokens=[e.token for e in entries],
        token_logprobs=[e.logprob for e in entries],
        top_logprobs=[{t.token: t.logprob for t in e.top} for e in entries],
        text_offset=[e.offset for e in entries],
    )
