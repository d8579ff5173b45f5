"""Prompt token ids for simulated requests: as many as the real server would see, shared
where the real prompts are shared, and cheap to make (a simulation makes tens of thousands).

    completions   [tenant prefix ...][own tokens ...]                  = prompt_tokens
    chat          [template head][tenant prefix ...][own ...][tail]    = prompt_tokens + 30

The bench sends completions prompts as token ids, which the server takes as they are (no
BOS). Chat prompts are words of one token each (``app/lab/bench/prompts.py``) wrapped in the
model's chat template: measured once with SmolLM2-135M-Instruct's tokenizer, the template adds
24 tokens before the message (its default system prompt, identical in every request, so the
prefix cache shares it) and 6 after, for every prompt length tried (1 to 256 words).

Only the shapes matter to the scheduler (lengths, and which blocks are shared), not the ids:
a request's first own tokens spell its index, so no two requests share a block by accident.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

from quanta_core.workload import Endpoint, PlannedRequest

CHAT_HEAD_TOKENS = 24
CHAT_TAIL_TOKENS = 6
TOKEN_LOW = 1000
TOKEN_HIGH = 5000


def _span(n_vocab: int) -> tuple[int, int]:
    high = min(TOKEN_HIGH, n_vocab)
    low = min(TOKEN_LOW, high // 2)
    return low, high - low


@functools.cache
def int_objects(high: int) -> np.ndarray:
    """The Python ints 0 .. ``high`` - 1, as an array of the objects: indexed by a stream's
    values, it hands out the same few thousand int objects to every prompt instead of a new
    one per token (a trace's prompts hold millions of tokens)."""
    return np.arange(high).astype(object)


def _stream(seed: int, n: int, low: int, span: int) -> list[int]:
    """``low + (seed + 7919 k + k² mod 104729) mod span`` for k < n, in numpy: a simulation
    makes millions of these (the values fit in 64 bits: seed < 2³², k < 2³¹)."""
    if n <= 0:
        return []  # most workloads have no tenant prefix: spare numpy's set-up for nothing
    k = np.arange(n, dtype=np.int64)
    values = low + (seed + 7919 * k + (k * k) % 104729) % span
    tokens: list[int] = int_objects(low + span)[values].tolist()
    return tokens


def always_in_vocabulary(n_vocab: int) -> bool:
    """Whether every id ``prompt_ids`` can make for ``n_vocab`` is in the vocabulary
    (all of them lie in the span, the chat template's head from its start)."""
    low, span = _span(n_vocab)
    return span > 0 and max(low + span, low + CHAT_HEAD_TOKENS) <= n_vocab


def prompt_ids(
    seed: int, request: PlannedRequest, endpoint: Endpoint, n_vocab: int
) -> tuple[int, ...]:
    low, span = _span(n_vocab)
    prefix = _stream(
        zlib.crc32(f"{seed}:prefix:{request.tenant}".encode()), request.prefix_tokens, low, span
    )
    own_n = request.prompt_tokens - request.prefix_tokens
    index = request.index
    own = [low + index % span, low + (index // span) % span][:own_n]
    own += _stream(zlib.crc32(f"{seed}:prompt:{index}".encode()), own_n - len(own), low, span)
    if endpoint is not Endpoint.CHAT:
        return (*prefix, *own)
    head = list(range(low, low + CHAT_HEAD_TOKENS))  # the same in every request
    tail = list(range(low + span - CHAT_TAIL_TOKENS, low + span))
    return (*head, *prefix, *own, *tail)
