"""QUANTA_CORS_ALLOW_ORIGINS: a browser app on an allowed origin may call the API."""

from __future__ import annotations

from pathlib import Path

from litestar.testing import AsyncTestClient

from tests.fakes import FakeDriver
from tests.tenancy_setup import fake_app, fresh_db

PREFLIGHT = {
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, content-type",
}


async def test_allowed_origins_get_cors_headers_and_others_none(tmp_path: Path) -> None:
    app = fake_app(fresh_db(tmp_path), FakeDriver(), cors_allow_origins=["https://ui.example"])
    async with AsyncTestClient(app) as c:
        ok = await c.options(
            "/v1/chat/completions", headers={"origin": "https://ui.example", **PREFLIGHT}
        )
        assert ok.status_code == 204
        assert ok.headers["access-control-allow-origin"] == "https://ui.example"
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        models = await c.get("/v1/models", headers={"origin": "https://ui.example"})
        assert models.headers["access-control-allow-origin"] == "https://ui.example"
        other = await c.get("/v1/models", headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


async def test_no_cors_headers_by_default(tmp_path: Path) -> None:
    async with AsyncTestClient(fake_app(fresh_db(tmp_path), FakeDriver())) as c:
        r = await c.get("/v1/models", headers={"origin": "https://ui.example"})
        assert "access-control-allow-origin" not in r.headers
