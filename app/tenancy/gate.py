"""Where a request meets its tenant and quotas: authentication, the per-request gate and the
headers middleware.

ApiKeyAuthentication   litestar's auth middleware on the tenant routes: 401/403, or the
                       Principal as ``request.user`` (x-ratelimit-* noted for the response)
RequestGate.reserve    after planning (prompt, max_tokens and the likely output known): 429
                       or a Reservation
RequestGate.allows     for each output token: may the request go on (False: the quotas have
                       nothing left; the request ends with finish_reason "length")
tenancy_middleware     adds x-ratelimit-* to whatever response goes out, tells the
                       reservation whether each write it was charged for reached the client,
                       and closes the reservation when the ASGI call ends — finished, failed
                       or the client gone — so a concurrency slot is always given back
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
from app.tenancy.quotas import Ask
from app.tenancy.service import Principal, Reservation, Served, Tenancy

# What the handler leaves for ``tenancy_middleware`` in the scope's state: the response's
# x-ratelimit-* headers and the reservation to close when the call ends.
RATE_HEADERS = "quanta_rate_headers"
RESERVATION = "quanta_reservation"


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
        self._reservation: Reservation | None = None

    async def reserve(self, ask: Ask) -> None:
        """Reserve what ``ask`` will likely use, or raise the 429."""
        self._reservation = await self._tenancy.reserve(self._principal, self._request_id, ask)
        self._state[RESERVATION] = self._reservation
        self._state[RATE_HEADERS] = self._tenancy.headers(self._principal)

    def allows(self, output_tokens: int) -> bool:
        """May the request have produced ``output_tokens`` (all choices) in all?"""
        return self._reservation is None or self._reservation.more(output_tokens)

    def bind(self, served: Served) -> None:
        if self._reservation is not None:
            self._reservation.bind(served)

    def sent(self) -> None:
        """The client is about to be written what the outcome now counts."""
        if self._reservation is not None:
            self._reservation.sent()


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
            reservation: Reservation | None = state.get(RESERVATION)
            if reservation is not None and reservation.writing:
                return _charged_write(send, message, reservation, closing)
            return send(message)

        try:
            await app(scope, receive, send_with_limits)
        finally:
            reservation: Reservation | None = state.pop(RESERVATION, None)
            if reservation is not None:
                reservation.close()

    return middleware


async def _charged_write(
    send: Send, message: Message, reservation: Reservation, closing: Callable[[], bool]
) -> None:
    """Send a write its tokens were charged for ahead, and tell the reservation whether it
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
        reservation.written(reached)
