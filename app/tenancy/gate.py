"""Where a request meets its tenant and quotas: authentication, the per-request gate and the
headers middleware.

ApiKeyAuthentication   litestar's auth middleware on the tenant routes: 401/403, or the
                       Principal as ``request.user`` (x-ratelimit-* noted for the response)
RequestGate.reserve    after planning (prompt, max_tokens and the likely output known): 429
                       or the request's ``Meter`` (app/tenancy/meter.py), which the OpenAI
                       layer then only reports to: what ran, what it is sending
tenancy_middleware     adds x-ratelimit-* to whatever response goes out, tells the meter
                       whether each write it was charged for reached the client, and
                       closes the meter when the ASGI call ends — finished, failed or the
                       client gone — so a concurrency slot is always given back
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from litestar.connection import ASGIConnection
from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.handlers import BaseRouteHandler
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.server.http_protocol import connection_closing
from app.tenancy.meter import Meter
from app.tenancy.quotas import Ask
from app.tenancy.service import Principal, Tenancy

# What the gate leaves for ``tenancy_middleware`` (this module's) in the scope's state: the
# response's x-ratelimit-* headers and the meter to follow the writes of and to close.
RATE_HEADERS = "quanta_rate_headers"
METER = "quanta_meter"


def tenancy_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Tenancy:
    tenancy: Tenancy = connection.app.state["tenancy"]
    return tenancy


def _state(scope: Scope | dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = scope.setdefault("state", {})  # type: ignore[union-attr]
    return state


class ApiKeyAuthentication(AbstractAuthenticationMiddleware):
    """The tenant routes' authentication: ``request.user`` is the key's ``Principal``,
    ``request.auth`` the key's id."""

    async def authenticate_request(
        self, connection: ASGIConnection[Any, Any, Any, Any]
    ) -> AuthenticationResult:
        tenancy = tenancy_of(connection)
        client = connection.client.host if connection.client is not None else ""
        principal = await tenancy.authenticate(connection.headers.get("authorization"), client)
        _state(connection.scope)[RATE_HEADERS] = tenancy.headers(principal)
        return AuthenticationResult(user=principal, auth=principal.key.id)


async def require_admin(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    tenancy_of(connection).check_admin(connection.headers.get("authorization"))


class RequestGate:
    """One request's way through its quotas (made by ``request_context``)."""

    def __init__(
        self, tenancy: Tenancy, principal: Principal, scope: Scope, request_id: str
    ) -> None:
        self._tenancy = tenancy
        self._principal = principal
        self._state = _state(scope)
        self._request_id = request_id

    async def reserve(self, ask: Ask) -> Meter:
        """Reserve what ``ask`` will likely use and return the request's meter, or raise the
        429. The middleware settles the meter when the call ends."""
        meter = await self._tenancy.reserve(self._principal, self._request_id, ask)
        self._state[METER] = meter
        self._state[RATE_HEADERS] = self._tenancy.headers(self._principal)
        return meter


def tenancy_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        state = _state(scope)
        closing = connection_closing(scope)

        # Not a coroutine of its own: it runs for every chunk of a stream, the headers only on
        # the first; only a write that was charged ahead is followed to its end.
        def send_with_limits(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start":
                if extra := state.get(RATE_HEADERS):
                    headers = MutableScopeHeaders.from_message(message)
                    for name, value in extra.items():
                        headers[name] = value
                return send(message)
            meter: Meter | None = state.get(METER)
            if meter is not None and meter.writing:
                return _charged_write(send, message, meter, closing)
            return send(message)

        try:
            await app(scope, receive, send_with_limits)
        finally:
            meter: Meter | None = state.pop(METER, None)
            if meter is not None:
                meter.close()

    return middleware


async def _charged_write(
    send: Send, message: Message, meter: Meter, closing: Callable[[], bool]
) -> None:
    """Send a write its tokens were charged for ahead, and tell the meter whether it
    reached the client. It did not if its send failed or was cancelled (the client stopped
    reading and left), if the connection was already closing when it was sent (uvicorn
    drops such a write without a word), or if the write itself broke the connection (the
    peer had reset it). A final write may close the connection itself (``connection:
    close``): after it only a failure counts."""
    reached = False
    try:
        gone = closing()
        await send(message)
        reached = not gone and not (message.get("more_body", False) and closing())
    finally:
        meter.written(reached)
