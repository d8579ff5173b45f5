"""Tokenization, detokenization and the model's own chat template, in the caller's process.

The model is loaded vocabulary-only (no weights, a few MB), so the server tokenizes a prompt
and turns sampled tokens back into text without a round trip to the engine worker.
"""

from __future__ import annotations

import codecs
import ctypes
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import llama_cpp
from jinja2.sandbox import ImmutableSandboxedEnvironment

from quanta_core.engine.errors import EngineStartError
from quanta_core.engine.llama_cpp.logs import quiet_llama_logs

CHAT_TEMPLATE_KEY = b"tokenizer.chat_template"


class ChatTemplateError(ValueError):
    """The messages cannot be rendered by the model's template (it raised, or there is none)."""


class IncrementalDetokenizer:
    """Turns tokens into text one at a time, never splitting a UTF-8 character.

    A token may end inside a multi-byte character (byte-fallback tokens, emoji); those bytes
    are held back until the character is complete.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._tokenizer.token_bytes(token))

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)


class Tokenizer:
    """A vocabulary-only llama.cpp model: ``Tokenizer.load(path)``."""

    def __init__(self, model: Any, model_path: str) -> None:
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.model_path = model_path
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.bos_token_id: int = llama_cpp.llama_vocab_bos(self._vocab)
        self.eos_token_id: int = llama_cpp.llama_vocab_eos(self._vocab)
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.eog_tokens: tuple[int, ...] = tuple(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t)
        )
        self.chat_template: str | None = self._metadata(CHAT_TEMPLATE_KEY)
        self._template: jinja2.Template | None = None
        self._token_bytes = lru_cache(maxsize=None)(self._piece)

    @classmethod
    def load(cls, model_path: str) -> Tokenizer:
        quiet_llama_logs()
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
        if not model:
            raise EngineStartError(f"cannot load the vocabulary of {model_path}")
        return cls(model, model_path)

    def close(self) -> None:
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    # ---- text <-> tokens ----

    def encode(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS where the model wants one."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(
            self._vocab, data, len(data), buf, capacity, add_special, parse_special
        )
        if n < 0:  # cannot happen with one token per byte plus specials, but be exact
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buf, capacity, add_special, parse_special
            )
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (control tokens render as nothing)."""
        return self._token_bytes(token)

    def decode(self, tokens: Iterable[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # ---- chat ----

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text the model's own template (GGUF metadata) makes of ``messages``
        (and ``tools``, for templates that know them; ``extra``: more template variables,
        vLLM's ``chat_template_kwargs``)."""
        template = self._compiled_template()
        variables = {
            **(extra or {}),
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.decode([self.bos_token_id]) if self.bos_token_id >= 0 else "",
            "eos_token": self.decode([self.eos_token_id]) if self.eos_token_id >= 0 else "",
        }
        if tools:
            variables["tools"] = list(tools)
        try:
            return template.render(**variables)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ChatTemplateError(str(exc) or type(exc).__name__) from exc

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        continue_final_message: bool = False,
        add_generation_prompt: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of the rendered chat prompt; special tokens in it are parsed as such.

        ``continue_final_message``: the prompt ends inside the last (assistant) message, as
        vLLM's option does: rendered without a generation prompt, cut after its content."""
        text = self.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            tools=tools,
            extra=extra,
        )
        if continue_final_message and messages:
            last = str(messages[-1].get("content") or "")
            cut = text.rfind(last) if last else -1
            if cut < 0:
                raise ChatTemplateError("the final message's content is not in the prompt")
            text = text[: cut + len(last)]
        starts_with_bos = self.bos_token_id >= 0 and text.startswith(
            self.decode([self.bos_token_id]) or "\0"
        )
        return self.encode(text, add_special=not starts_with_bos, parse_special=True)

    def _compiled_template(self) -> jinja2.Template:
        if self._template is None:
            if not self.chat_template:
                raise ChatTemplateError(f"{self.model_path} has no chat template")
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
            )
            env.globals["raise_exception"] = _raise_template_error
            env.globals["strftime_now"] = _strftime_now
            env.filters["tojson"] = _tojson
            self._template = env.from_string(self.chat_template)
        return self._template

    def _piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def _metadata(self, key: bytes) -> str | None:
        size = llama_cpp.llama_model_meta_val_str(self._model, key, None, 0)
        if size < 0:
            return None
        buf = ctypes.create_string_buffer(size + 1)
        llama_cpp.llama_model_meta_val_str(self._model, key, buf, size + 1)
        return buf.value.decode("utf-8")


def _raise_template_error(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False
) -> str:
    """As the templates' authors (Hugging Face's renderer) expect: plain JSON, not jinja2's
    HTML-escaped kind (which turns ``<`` into ``\\u003c`` inside tool schemas)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)
