"""One choice's text as the client sees it: detokenized, cut at stop strings, with logprobs.

A token is released together with the last character of its text (its logprob entry with
it), so text held back at a possible stop string holds back its tokens too; tokens past a
stop string are never shown. ``released`` counts the tokens released: what the client can
have been sent of a choice that has not ended.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from app.openai.stop import StopMatcher
from app.server.core import Detokenizer, Tokenizer
from quanta_core.requests import TokenEvent


@dataclass(frozen=True, slots=True)
class TokenAlternative:
    token: str
    bytes: bytes
    logprob: float


@dataclass(frozen=True, slots=True)
class LogprobEntry:
    token: str
    bytes: bytes
    logprob: float
    top: tuple[TokenAlternative, ...]
    offset: int  # where its text starts in the choice's output


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    logprobs: tuple[LogprobEntry, ...]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One whole call read from a choice's text; ``index``: its place in the choice's calls."""

    index: int
    id: str
    name: str
    arguments: str  # JSON


@dataclass
class ChoiceText:
    detokenizer: Detokenizer
    stop: StopMatcher
    vocab: Tokenizer
    want_logprobs: bool = False
    stop_ids: frozenset[int] = frozenset()  # vLLM's stop_token_ids: end the choice, unshown
    n_tokens: int = 0  # tokens consumed (up to and including the one completing a stop)
    released: int = 0  # tokens whose text has been released
    _produced: int = 0  # characters decoded so far, held back or not
    _released: int = 0
    # (start, end) of each token's text not yet released, and its logprob entry if asked
    _pending: deque[tuple[int, int, LogprobEntry | None]] = field(default_factory=deque)

    @property
    def stopped(self) -> bool:
        return self.stop.stopped

    def push(self, event: TokenEvent) -> Piece:
        if self.stopped:
            return Piece("", ())
        self.n_tokens += 1
        if event.token in self.stop_ids:
            held = self.detokenizer.flush()
            self._produced += len(held)
            text = self.stop.push(held)
            if not self.stopped:
                text += self.stop.flush()
                self.stop.stopped = True
            return self._release(text, everything=True)
        text = self.detokenizer.push(event.token)
        start, self._produced = self._produced, self._produced + len(text)
        entry = self._entry(event, start) if self.want_logprobs else None
        self._pending.append((start, self._produced, entry))
        return self._release(self.stop.push(text))

    def finish(self) -> Piece:
        """The end of generation: whatever was held back (unless a stop string matched)."""
        if self.stopped:
            return Piece("", ())
        tail = self.detokenizer.flush()
        self._produced += len(tail)
        text = self.stop.push(tail)
        return self._release(text + self.stop.flush(), everything=not self.stopped)

    def _release(self, text: str, *, everything: bool = False) -> Piece:
        self._released += len(text)
        out: list[LogprobEntry] = []
        while self._pending:
            start, end, entry = self._pending[0]
            shown = end <= self._released or everything
            if self.stopped:  # a token is shown if any of its text was
                shown = shown or start < self._released
            if not shown:
                break
            if entry is not None:
                out.append(entry)
            self.released += 1
            self._pending.popleft()
        if self.stopped:
            self._pending.clear()
        return Piece(text, tuple(out))

    def _entry(self, event: TokenEvent, offset: int) -> LogprobEntry:
        raw = self.vocab.token_bytes(event.token)
        top = tuple(
            TokenAlternative(_text(b := self.vocab.token_bytes(t.token)), b, t.logprob)
            for t in event.top_logprobs
        )
        logprob = event.logprob if event.logprob is not None else 0.0
        return LogprobEntry(_text(raw), raw, logprob, top, offset)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")
