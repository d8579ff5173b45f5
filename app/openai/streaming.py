"""Server-sent events as OpenAI sends them: ``data: {chunk}`` lines, then ``data: [DONE]``.

With ``continuous_usage`` (vLLM's ``stream_options.continuous_usage_stats``) every chunk
carries the usage so far, as vLLM sends it; the final usage chunk goes out as with
``include_usage``.

An error after the stream started cannot change the status code any more: it is sent as one
``data: {"error": {...}}`` event and the stream ends (the openai SDK raises it).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import msgspec

from app.openai.generation import Generation, Update
from app.openai.render import Renderer, sse
from app.server.errors import ApiError, GenerationFailed

log = logging.getLogger("quanta.streaming")

DONE = b"data: [DONE]\n\n"


async def event_stream(
    generation: Generation,
    updates: AsyncIterator[Update],
    renderer: Renderer,
    *,
    include_usage: bool,
    continuous_usage: bool = False,
) -> AsyncIterator[bytes]:
    # One write per update; the last choice's end goes out with the usage and [DONE].
    tail = b""

    def with_usage(chunks: list[msgspec.Struct]) -> bytes:
        usage = generation.usage()
        for chunk in chunks:
            chunk.usage = usage  # type: ignore[attr-defined]  # both chunk types have it
        return b"".join([sse(chunk) for chunk in chunks])

    def render(update: Update) -> bytes:
        if continuous_usage:
            return with_usage(renderer.chunks(update))
        return renderer.events(update)

    try:
        opening_chunks = renderer.opening()
        if continuous_usage:
            opening = with_usage(opening_chunks)
        else:
            opening = b"".join([sse(chunk) for chunk in opening_chunks])
        if opening:
            yield opening
        async for update in updates:
            events = render(update)
            if generation.finished:
                tail += events
            elif events:
                generation.mark_sent()  # charged before it is written
                yield events
        if include_usage:
            tail += sse(renderer.usage_chunk(generation.usage()))
        generation.mark_sent()
        yield tail + DONE
    except ApiError as exc:
        generation.mark_sent()
        yield tail + sse(exc.body())
    except Exception:
        log.exception("stream failed")
        generation.mark_sent()
        yield tail + sse(GenerationFailed("internal server error").body())
    finally:
        # The client left (the stream was cancelled) or something failed: free the KV now.
        if not generation.finished:
            generation.cancel()
