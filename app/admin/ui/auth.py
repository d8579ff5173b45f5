"""Who may see the live view: the admin key, as a bearer header or as the view's cookie.

A browser cannot send a bearer header when it opens a page, so the login form trades the admin
key for a cookie: a digest of the admin key's hash under this view's own label. It opens the
live view only (the admin REST API still wants the bearer key), and it stops working when the
admin key changes. HttpOnly and SameSite=Strict: no script reads it, no other site sends it.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.handlers import BaseRouteHandler

from app.server.errors import InvalidApiKey
from app.tenancy.gate import tenancy_of
from app.tenancy.keys import same_digest, sha256_hex
from app.tenancy.service import Tenancy

COOKIE = "quanta_live_view"
PATH = "/admin/ui"


def _token(tenancy: Tenancy) -> str | None:
    wanted = tenancy.admin_hash
    return None if wanted is None else sha256_hex(f"quanta-live-view:{wanted}")


def signed_in(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    tenancy = tenancy_of(connection)
    authorization = connection.headers.get("authorization")
    if authorization:
        try:
            tenancy.check_admin(authorization)
        except InvalidApiKey:
            return False
        return True
    token, given = _token(tenancy), connection.cookies.get(COOKIE)
    return token is not None and given is not None and same_digest(given, token)


async def require_live_view(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    if not signed_in(connection):
        raise InvalidApiKey("sign in with the admin key", code="invalid_admin_key")


def sign_in(connection: ASGIConnection[Any, Any, Any, Any], key: str) -> Cookie:
    """The view's cookie for ``key``, or ``InvalidApiKey``."""
    tenancy = tenancy_of(connection)
    tenancy.check_admin(f"Bearer {key}")
    token = _token(tenancy)
    assert token is not None  # check_admin passed: there is an admin key
    return Cookie(key=COOKIE, value=token, path=PATH, httponly=True, samesite="strict")


def signed_out() -> Cookie:
    """The view's cookie, expired: the browser drops it."""
    return Cookie(
        key=COOKIE, value="", path=PATH, httponly=True, samesite="strict", max_age=0, expires=0
    )
