"""``OPTIONS`` answers with every method of the path.

litestar builds a path's ``OPTIONS`` handler from the first handler registered there, so a
path whose handlers come in one by one (a controller's ``GET``, then its ``PATCH`` and
``DELETE``) answers ``Allow: GET, OPTIONS``. The methods are taken from the app's route map
instead, once per path.
"""

from __future__ import annotations

from typing import Any

from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send


def allow_middleware(app: ASGIApp) -> ASGIApp:
    cache: dict[str, str] = {}

    def allowed(scope: Scope) -> str | None:
        handler: Any = scope.get("route_handler")
        paths = getattr(handler, "paths", None)
        if not paths:
            return None
        path = next(iter(paths))
        if path not in cache:
            methods = scope["litestar_app"].route_handler_method_map.get(path, {})  # type: ignore[typeddict-item]
            cache[path] = ", ".join(sorted(methods))
        return cache[path] or None

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope["method"] != "OPTIONS":
            await app(scope, receive, send)
            return

        async def send_with_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and (value := allowed(scope)):
                MutableScopeHeaders.from_message(message)["allow"] = value
            await send(message)

        await app(scope, receive, send_with_allow)

    return middleware
