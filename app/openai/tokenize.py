"""``/tokenize`` and ``/detokenize``: the served model's tokenizer, as vLLM and llama-server
offer it (clients count a prompt's tokens before sending it). Nothing runs on the engine,
so nothing is charged."""

from __future__ import annotations

from app.openai.schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from app.openai.tools import chat_messages
from app.server.core import Core
from app.server.errors import InvalidParameter, ModelNotFound
from app.server.state import ServerState


class TokenizeService:
    def __init__(self, state: ServerState) -> None:
        self._state = state

    def _core(self, model: str | None) -> Core:
        core = self._state.ready_core()
        if model is not None and model not in core.names:
            raise ModelNotFound(model)
        return core

    def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        core = self._core(request.model)
        given = [x for x in (request.prompt, request.content, request.messages) if x is not None]
        if len(given) != 1:
            raise InvalidParameter(
                "prompt", "give exactly one of 'prompt', 'content' or 'messages'"
            )
        if request.messages is not None:
            try:
                tokens = core.tokenizer.encode_chat(
                    chat_messages(request.messages, None),
                    add_generation_prompt=request.add_generation_prompt,
                )
            except ValueError as exc:
                raise InvalidParameter("messages", f"the chat template failed: {exc}") from exc
        else:
            text = request.prompt if request.prompt is not None else request.content
            special = request.add_special
            if special is None:
                special = request.add_special_tokens
            tokens = core.tokenizer.encode(text or "", add_special=special)
        return TokenizeResponse(tokens, len(tokens), core.n_ctx)

    def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        core = self._core(request.model)
        n_vocab = core.tokenizer.n_vocab
        if any(t >= n_vocab for t in request.tokens):
            raise InvalidParameter("tokens", f"token ids must be below {n_vocab}")
        raw = b"".join(core.tokenizer.token_bytes(t) for t in request.tokens)
        text = raw.decode("utf-8", errors="replace")
        return DetokenizeResponse(text, text)
