"""Tokenization in the server process: the model's vocabulary and its own chat template."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quanta_core.engine.llama_cpp.tokenizer import ChatTemplateError, Tokenizer

pytestmark = pytest.mark.model

TEXT = "Café 🐱 naïve 日本語 — done."


@pytest.fixture(scope="module")
def tok(model_path: Path) -> Iterator[Tokenizer]:
    t = Tokenizer.load(str(model_path))
    yield t
    t.close()


def test_encode_decode_round_trip(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    assert all(0 <= t < tok.n_vocab for t in ids)
    assert tok.decode(ids) == TEXT


def test_incremental_detokenizer_never_splits_a_character(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    # Some tokens of this text end inside a multi-byte character (the emoji, the kanji).
    assert any(not _is_complete_utf8(tok.token_bytes(t)) for t in ids)
    detok = tok.detokenizer()
    pieces = [detok.push(t) for t in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in p for p in pieces)


def test_an_incomplete_character_at_the_end_is_flushed_as_a_replacement(tok: Tokenizer) -> None:
    ids = tok.encode("🐱")
    detok = tok.detokenizer()
    assert "".join(detok.push(t) for t in ids[:-1]) == ""
    assert detok.flush() == "\ufffd"


def test_the_models_own_chat_template(tok: Tokenizer) -> None:
    assert tok.chat_template and "im_start" in tok.chat_template
    text = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[0] == tok.bos_token_id  # <|im_start|> parsed as one special token
    assert ids.count(tok.bos_token_id) == 3  # system, user, assistant; no extra BOS
    assert tok.is_eog(tok.eos_token_id)


def test_a_template_error_is_typed(tok: Tokenizer) -> None:
    with pytest.raises(ChatTemplateError):
        tok.apply_chat_template([{"role": "user"}])  # no content


def _is_complete_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
