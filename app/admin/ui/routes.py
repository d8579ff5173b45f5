"""``/admin/ui``: the page, its sign-in, its data (polled by the page) and its static files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.di import NamedDependency
from litestar.enums import RequestEncodingType
from litestar.params import Body
from litestar.response import Redirect, Template
from litestar.static_files import create_static_files_router
from litestar.types import ControllerRouterHandler

from app.admin.ui.auth import PATH, require_live_view, sign_in, signed_in, signed_out
from app.admin.ui.view import LiveState, live_state
from app.server.errors import InvalidApiKey, NotReady
from app.server.state import ServerState
from app.tenancy.gate import tenancy_of

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
POLL_MS = 1000  # how often the page reads /admin/ui/state


class SignIn(msgspec.Struct):
    key: str


class LiveViewController(Controller):
    path = PATH
    tags = ("Admin",)
    include_in_schema = False

    @get("/", summary="The scheduler's live view (a sign-in form without the admin key)")
    async def page(self, request: Request[Any, Any, Any]) -> Template:
        if not signed_in(request):
            return Template("login.html", context={"error": None})
        return Template("live.html", context={"poll_ms": POLL_MS, "path": PATH})

    @post("/login", status_code=303)
    async def login(
        self,
        data: Annotated[SignIn, Body(media_type=RequestEncodingType.URL_ENCODED)],
        request: Request[Any, Any, Any],
    ) -> Redirect | Template:
        try:
            cookie = sign_in(request, data.key)
        except InvalidApiKey:
            return Template(
                "login.html", context={"error": "That is not the admin key."}, status_code=401
            )
        return Redirect(PATH, status_code=303, cookies=[cookie])

    @post("/logout", status_code=303)
    async def logout(self) -> Redirect:
        """Forget the view's cookie: the sign-in form again."""
        return Redirect(PATH, status_code=303, cookies=[signed_out()])

    @get("/state", guards=[require_live_view], summary="The live view's data")
    async def state(
        self, request: Request[Any, Any, Any], server: NamedDependency[ServerState]
    ) -> LiveState:
        tenants = tenancy_of(request).directory.tenants

        def name(tenant_id: str) -> str:
            tenant = tenants.get(tenant_id)
            return tenant.name if tenant is not None else tenant_id

        live = live_state(server.ready_core(), name)
        if live is None:
            raise NotReady("this core gives no snapshot")
        return live


LIVE_VIEW_HANDLERS: list[ControllerRouterHandler] = [
    LiveViewController,
    create_static_files_router(
        path=f"{PATH}/static", directories=[STATIC], guards=[require_live_view]
    ),
]
