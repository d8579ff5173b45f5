"""Prompts of a given token length, the same on every run with the same seed.

Completions get token ids, so the prompt is exactly ``prompt_tokens`` long on any server
running any model with a vocabulary of more than ``TOKEN_HIGH`` ids. Chat gets text made of
common one-token words (about one token per word; the chat template adds a few). Each request
draws its own tokens, so prompts do not share a prefix by accident — only a tenant's declared
``prefix_tokens`` are shared, on purpose.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from quanta_core.workload import Endpoint, PlannedRequest

TOKEN_LOW = 1000
TOKEN_HIGH = 5000

_COMMON_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no what up out who them some could time more into only other new like then these"
)
_WORDS = _COMMON_WORDS.split()


def prompt_token_ids(seed: int, request: PlannedRequest) -> list[int]:
    prefix_rng = random.Random(f"{seed}:prefix:{request.tenant}")
    own_rng = random.Random(f"{seed}:prompt:{request.index}")
    prefix = [prefix_rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(request.prefix_tokens)]
    own = request.prompt_tokens - request.prefix_tokens
    return prefix + [own_rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(own)]


def prompt_text(seed: int, request: PlannedRequest) -> str:
    ids = prompt_token_ids(seed, request)
    return " ".join(_WORDS[i % len(_WORDS)] for i in ids)


def request_body(
    request: PlannedRequest,
    *,
    model: str,
    endpoint: Endpoint,
    seed: int,
    ignore_eos: bool,
    temperature: float,
    prompt_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """A streaming request that both Quanta and llama-server accept (Quanta rejects unknown
    fields, so only fields it knows are sent). ``prompt_ids``: this prompt instead of the
    seeded one (completions only)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
        "temperature": temperature,
    }
    if endpoint is Endpoint.CHAT:
        body["messages"] = [{"role": "user", "content": prompt_text(seed, request)}]
    elif prompt_ids is not None:
        body["prompt"] = list(prompt_ids)
    else:
        body["prompt"] = prompt_token_ids(seed, request)
    return body


def path(endpoint: Endpoint) -> str:
    return "/v1/chat/completions" if endpoint is Endpoint.CHAT else "/v1/completions"
