"""Server-sent events as OpenAI sends them: ``data: {chunk}`` lines, then ``data: [DONE]``.

An error after the stream started cannot change the status code any more: it is sent as one
``data: {"error": {...}}`` event and the stream ends (the openai SDK raises it).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

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
) -> AsyncIterator[bytes]:
    # One write per update; the last choice's end goes out with the usage and [DONE].
    tail = b""
    try:
        opening = b"".join([sse(chunk) for chunk in renderer.opening()])
        if opening:
            yield opening
        async for update in updates:
            events = renderer.events(update)
            if generation.finished:
                tail += events
            elif events:
                yield events
        if include_usage:
            tail += sse(renderer.usage_chunk(generation.usage()))
        yield tail + DONE
    except ApiError as exc:
        yield tail + sse(exc.body())
    except Exception:
        log.exception("stream failed")
        yield tail + sse(GenerationFailed("internal server error").body())
    finally:
        # The client left (the stream was cancelled) or something failed: free the KV now.
        if not generation.finished:
            generation.cancel()
