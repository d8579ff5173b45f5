"""Server-sent events as OpenAI sends them: ``data: {chunk}`` lines, then ``data: [DONE]``.

An error after the stream started cannot change the status code any more: it is sent as one
``data: {"error": {...}}`` event and the stream ends (the openai SDK raises it).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import msgspec

from app.errors import ApiError, GenerationFailed
from app.openai.generation import Generation, Update
from app.openai.render import Renderer

log = logging.getLogger("quanta.streaming")

DONE = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()


def sse(payload: msgspec.Struct) -> bytes:
    return b"data: " + _encoder.encode(payload) + b"\n\n"


async def event_stream(
    generation: Generation,
    updates: AsyncIterator[Update],
    first: Update | None,
    renderer: Renderer,
    *,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    try:
        for chunk in renderer.opening():
            yield sse(chunk)
        if first is not None:
            for chunk in renderer.chunks(first):
                yield sse(chunk)
        async for update in updates:
            for chunk in renderer.chunks(update):
                yield sse(chunk)
        if include_usage:
            yield sse(renderer.usage_chunk(generation.usage()))
        yield DONE
    except ApiError as exc:
        yield sse(exc.body())
    except Exception:
        log.exception("stream failed")
        yield sse(GenerationFailed("internal server error").body())
    finally:
        # The client left (the stream was cancelled) or something failed: free the KV now.
        if not generation.finished:
            generation.cancel()
