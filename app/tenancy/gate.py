"""Where a request meets its quotas: guards, the per-request gate and the headers middleware.

guard require_api_key   401/403; puts the Principal and x-ratelimit-* in scope state
RequestGate.admit       after planning (prompt and max_tokens known): 429 or a charge
tenancy_middleware      adds x-ratelimit-* to whatever response goes out, and closes the
                        admission when the ASGI call ends — finished, failed or the
                        client gone — so a concurrency slot is always given back
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from litestar.connection import ASGIConnection
from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.handlers import BaseRouteHandler
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.tenancy.service import Admission, Outcome, Principal, Tenancy

PRINCIPAL = "quanta_principal"
RATE_HEADERS = "quanta_rate_headers"
ADMISSION = "quanta_admission"


def tenancy_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Tenancy:
    tenancy: Tenancy = connection.app.state["tenancy"]
    return tenancy


def _state(scope: Scope | dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = scope.setdefault("state", {})  # type: ignore[union-attr]
    return state


async def require_api_key(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    tenancy = tenancy_of(connection)
    principal = await tenancy.authenticate(connection.headers.get("authorization"))
    state = _state(connection.scope)
    state[PRINCIPAL] = principal
    state[RATE_HEADERS] = tenancy.headers(principal)


async def require_admin(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    tenancy_of(connection).check_admin(connection.headers.get("authorization"))


def principal_of(scope: Scope | dict[str, Any]) -> Principal:
    principal: Principal = _state(scope)[PRINCIPAL]
    return principal


class RequestGate:
    """One request's way through its quotas (made by ``provide_context``)."""

    def __init__(self, tenancy: Tenancy, scope: Scope | dict[str, Any], request_id: str) -> None:
        self._tenancy = tenancy
        self._state = _state(scope)
        self._principal = principal_of(scope)
        self._request_id = request_id
        self._admission: Admission | None = None

    def admit(self, reserve_tokens: int) -> None:
        """Reserve ``reserve_tokens`` (prompt + max_tokens × n) or raise the 429."""
        self._admission = self._tenancy.admit(self._principal, self._request_id, reserve_tokens)
        self._state[ADMISSION] = self._admission
        self._state[RATE_HEADERS] = self._tenancy.headers(self._principal)

    def bind(self, outcome: Callable[[], Outcome]) -> None:
        if self._admission is not None:
            self._admission.bind(outcome)


def tenancy_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        state = _state(scope)

        # Not a coroutine of its own: it runs for every chunk of a stream, the headers only on
        # the first.
        def send_with_limits(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start" and (extra := state.get(RATE_HEADERS)):
                headers = MutableScopeHeaders.from_message(message)
                for name, value in extra.items():
                    headers[name] = value
            return send(message)

        try:
            await app(scope, receive, send_with_limits)
        finally:
            admission: Admission | None = state.pop(ADMISSION, None)
            if admission is not None:
                admission.close()

    return middleware
