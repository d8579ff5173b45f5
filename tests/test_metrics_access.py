"""``/metrics``: an optional bearer token, one charset in its Content-Type, tenants by name."""

from __future__ import annotations

import asyncio
from pathlib import Path

from litestar.testing import AsyncTestClient

from tests.fakes import MODEL, FakeDriver
from tests.tenancy_setup import bearer, fake_app, fresh_db

TOKEN = "metrics-token-0123456789abcdef"


async def test_metrics_needs_its_token_where_one_is_set(tmp_path: Path) -> None:
    db = fresh_db(tmp_path)
    key = db.create_key("acme")
    async with AsyncTestClient(fake_app(db, FakeDriver(), metrics_token=TOKEN)) as c:
        for _ in range(200):
            if (await c.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        assert (await c.post("/v1/chat/completions", json=body, headers=bearer(key))).is_success
        for headers in ({}, bearer("x" * 30), bearer(key)):
            refused = await c.get("/metrics", headers=headers)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "invalid_metrics_token"
        ok = await c.get("/metrics", headers=bearer(TOKEN))
        assert ok.status_code == 200
        assert ok.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert (
            'quanta:requests_total{class="interactive",status="200",tenant="acme"} 1.0' in ok.text
        )
        assert f'vllm:generation_tokens_total{{model_name="{MODEL}"}}' in ok.text


async def test_metrics_is_open_without_a_token(tmp_path: Path) -> None:
    async with AsyncTestClient(fake_app(fresh_db(tmp_path), FakeDriver())) as c:
        r = await c.get("/metrics")
        assert r.status_code == 200 and "vllm:num_requests_running" in r.text
