"""Stream events: the byte template of a text chunk is exactly the encoded chunk (no model)."""

from __future__ import annotations

import pytest

from app.openai.choices import LogprobEntry, Piece
from app.openai.generation import Update
from app.openai.render import ChatRenderer, CompletionRenderer, Header, sse
from app.openai.schemas import ServerTiming

TEXTS = ["Hello", " wörld", 'a "quoted" \\ path', "tab\tnew\nline\x00\x1f", "😀 €", "</script>"]


@pytest.mark.parametrize("renderer", [ChatRenderer, CompletionRenderer])
@pytest.mark.parametrize("logprobs", [False, True])
def test_events_are_the_chunks_encoded(
    renderer: type[ChatRenderer] | type[CompletionRenderer], logprobs: bool
) -> None:
    r = renderer(Header('cmpl-"id"', 1_700_000_000, "model/ä", 3, logprobs))
    entry = LogprobEntry("x", b"x", -0.5, (), 0)
    timing = ServerTiming(0.1, 0.2, 0.3, 0, 0)
    updates = [Update(i, Piece(t, (entry,) if logprobs else ())) for i in range(3) for t in TEXTS]
    updates += [Update(2, Piece("end", ()), "stop", timing), Update(0, Piece("", ()), "length")]
    for update in updates:
        assert r.events(update) == b"".join(sse(c) for c in r.chunks(update))
