"""Every response carries ``x-request-id``: the client's own if it sent a sane one, else ours.

The core's request id is always generated here (unique even when clients reuse theirs).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable
from typing import Any

from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
_OURS = "quanta_request_id"
_SANE = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")


def request_id_of(scope: Scope | dict[str, Any]) -> str:
    """The core's id of this request (made here if no middleware ran, e.g. an unknown path)."""
    state: dict[str, Any] = scope.setdefault("state", {})  # type: ignore[union-attr]
    return str(state.setdefault(_OURS, uuid.uuid4().hex))


def shown_request_id(scope: Scope | dict[str, Any]) -> str:
    """What ``x-request-id`` says: the client's own if it sent a sane one, else ours."""
    theirs = dict(scope["headers"]).get(HEADER.encode(), b"").decode("latin-1")
    return theirs if _SANE.match(theirs) else request_id_of(scope)


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        shown = shown_request_id(scope)

        # Not a coroutine of its own: it runs for every chunk of a stream, the header only on
        # the first.
        def send_with_id(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start":
                headers = MutableScopeHeaders.from_message(message)
                headers[HEADER] = shown
            return send(message)

        await app(scope, receive, send_with_id)

    return middleware
