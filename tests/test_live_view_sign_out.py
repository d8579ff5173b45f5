"""The live view's sign-in cookie opens its data; signing out takes it away."""

from __future__ import annotations

from pathlib import Path

from litestar.testing import AsyncTestClient

from tests.fakes import FakeDriver
from tests.tenancy_setup import ADMIN_KEY, fake_app, fresh_db


async def test_sign_out_closes_the_view(tmp_path: Path) -> None:
    async with AsyncTestClient(fake_app(fresh_db(tmp_path), FakeDriver())) as c:
        assert (await c.get("/admin/ui/state")).status_code == 401
        signed = await c.post("/admin/ui/login", data={"key": ADMIN_KEY}, follow_redirects=False)
        assert signed.status_code == 303 and "quanta_live_view" in c.cookies
        assert (await c.get("/admin/ui/static/live.js")).status_code == 200
        page = (await c.get("/admin/ui/")).text
        assert 'action="/admin/ui/logout"' in page
        out = await c.post("/admin/ui/logout", follow_redirects=False)
        assert out.status_code == 303 and out.headers["location"] == "/admin/ui"
        assert "quanta_live_view" not in c.cookies
        assert (await c.get("/admin/ui/state")).status_code == 401
        assert 'id="key"' in (await c.get("/admin/ui/")).text  # the sign-in form
