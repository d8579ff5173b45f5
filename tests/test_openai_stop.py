"""Stop strings: held back across chunk boundaries, never emitted (no model)."""

from __future__ import annotations

import pytest

from app.openai.choices import ChoiceText
from app.openai.stop import StopMatcher
from quanta_core.requests import TokenEvent
from tests.fakes import ByteDetokenizer, ByteTokenizer


def feed(stops: list[str], pieces: list[str]) -> tuple[list[str], str, bool]:
    m = StopMatcher(stops)
    out = [m.push(p) for p in pieces]
    return out, m.flush(), m.stopped


def test_without_stops_text_passes_straight_through() -> None:
    assert feed([], ["ab", "c"]) == (["ab", "c"], "", False)


def test_a_stop_split_over_three_chunks_is_held_then_dropped() -> None:
    out, tail, stopped = feed(["<|end|>"], ["Hi <", "|en", "d|> more"])
    assert out == ["Hi ", "", ""]
    assert (tail, stopped) == ("", True)


def test_a_false_start_is_released_when_it_stops_looking_like_a_stop() -> None:
    out, tail, stopped = feed(["STOP"], ["a ST", "OP!"[:1], "x"])
    assert out == ["a ", "", "STOx"]
    assert (tail, stopped) == ("", False)


def test_held_text_is_released_at_the_end_of_generation() -> None:
    out, tail, stopped = feed(["###"], ["done #", "#"])
    assert out == ["done ", ""]
    assert (tail, stopped) == ("##", False)


def test_the_earliest_of_several_stops_wins() -> None:
    out, _, stopped = feed(["world", "lo"], ["hello world"])
    assert out == ["hel"] and stopped


def test_a_stop_inside_one_chunk_cuts_it_and_nothing_follows() -> None:
    m = StopMatcher(["\n"])
    assert m.push("one\ntwo") == "one"
    assert m.push("three") == ""
    assert m.flush() == ""


def test_overlapping_prefixes_hold_the_longest_possible_start() -> None:
    # "aab" could start at the second 'a': holding only "a" would lose the match.
    m = StopMatcher(["aab"])
    assert m.push("xaa") == "x"
    assert m.push("b") == "" and m.stopped


@pytest.mark.parametrize("cut", range(1, 12))
def test_every_chunking_of_the_text_gives_the_same_output(cut: int) -> None:
    text = "answer: 42</s> trailing"
    m = StopMatcher(["</s>"])
    pieces = [text[i : i + cut] for i in range(0, len(text), cut)]
    assert "".join(m.push(p) for p in pieces) + m.flush() == "answer: 42"


def _choice(stops: list[str], logprobs: bool = True) -> ChoiceText:
    return ChoiceText(ByteDetokenizer(), StopMatcher(stops), ByteTokenizer(), logprobs)


def _event(ch: str) -> TokenEvent:
    return TokenEvent("r", 0, ord(ch), -0.25)


def test_logprobs_are_held_back_with_their_text_and_cut_at_the_stop() -> None:
    c = _choice(["END"])
    pieces = [c.push(_event(ch)) for ch in "ok EN"]
    assert "".join(p.text for p in pieces) == "ok "
    assert [e.token for p in pieces for e in p.logprobs] == ["o", "k", " "]
    last = c.push(_event("D"))
    assert (last.text, last.logprobs, c.stopped, c.n_tokens) == ("", (), True, 6)
    assert c.finish().text == ""


def test_a_multibyte_character_split_over_tokens_is_not_broken() -> None:
    c = _choice([], logprobs=False)
    text = "".join(c.push(TokenEvent("r", 0, b)).text for b in "é!".encode())
    assert text + c.finish().text == "é!"
