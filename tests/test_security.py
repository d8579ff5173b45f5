"""Security checks through the public API: no tenant reaches the admin surface or another
tenant's data, the admin key is compared in constant time, and request sizes are bounded."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.tenancy import keys
from tests.fakes import MODEL, FakeDriver
from tests.tenancy_setup import ADMIN, ADMIN_KEY, bearer, fake_app, fresh_db

Client = AsyncTestClient[Litestar]
MSGS = [{"role": "user", "content": "Say hi"}]


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[Client, str, str]]:
    db = fresh_db(tmp_path)
    a, b = db.create_key("tenant-a"), db.create_key("tenant-b")
    async with AsyncTestClient(fake_app(db, FakeDriver(), max_body_bytes=64 * 1024)) as c:
        for _ in range(200):
            if (await c.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        yield c, a, b


async def test_a_tenant_key_opens_no_admin_operation(setup: tuple[Client, str, str]) -> None:
    client, a, _ = setup
    doc = (await client.get("/docs/openapi.json")).json()
    for path, item in doc["paths"].items():
        if not path.startswith("/admin/"):
            continue
        concrete = path.replace("{tenant_id}", "ten_x").replace("{key_id}", "key_x")
        for method in item:
            r = await client.request(method.upper(), concrete, headers=bearer(a), json={})
            assert r.status_code == 401, (method, path, r.text)


async def test_a_tenant_sees_only_its_own_key_and_usage(setup: tuple[Client, str, str]) -> None:
    client, a, b = setup
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 3}
    assert (await client.post("/v1/chat/completions", json=body, headers=bearer(b))).is_success
    own_a = (await client.get("/v1/key", headers=bearer(a))).json()
    own_b = (await client.get("/v1/key", headers=bearer(b))).json()
    assert own_a["tenant_id"] != own_b["tenant_id"]
    assert own_a["tenant_usage"]["requests_last_minute"] == 0  # b's request is not a's
    assert own_b["tenant_usage"]["requests_last_minute"] == 1
    # The endpoint takes no parameter that could name another key.
    other = await client.get(f"/v1/key?id={own_b['id']}", headers=bearer(a))
    assert other.json()["id"] == own_a["id"]


async def test_the_admin_key_is_compared_in_constant_time(
    setup: tuple[Client, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, _ = setup
    compared: list[Any] = []
    original = hmac.compare_digest

    def recording(x: bytes, y: bytes) -> bool:
        compared.append((x, y))
        return original(x, y)

    monkeypatch.setattr(keys.hmac, "compare_digest", recording)
    assert (await client.get("/admin/v1/tenants", headers=bearer("x" * 40))).status_code == 401
    assert (await client.get("/admin/v1/tenants", headers=ADMIN)).status_code == 200
    assert len(compared) == 2
    assert all(ADMIN_KEY.encode() not in pair for pair in compared)  # digests, not keys


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 17}, "n"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"stop": "y" * 1025}, "stop"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
        ({"seed": 2**63}, "seed"),
    ],
)
async def test_sizes_and_counts_are_bounded(
    setup: tuple[Client, str, str], extra: dict[str, Any], param: str
) -> None:
    client, a, _ = setup
    body = {"model": MODEL, "messages": MSGS, **extra}
    r = await client.post("/v1/chat/completions", json=body, headers=bearer(a))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_a_body_over_the_limit_is_a_413(setup: tuple[Client, str, str]) -> None:
    client, a, _ = setup
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 70_000}]}
    r = await client.post("/v1/chat/completions", json=body, headers=bearer(a))
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
