"""The OpenAPI document says what the server does: error bodies, 404s, bounds, ``Allow``.

(The fuzzing of both surfaces against this document is ``test_api_fuzz.py``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from tests.fakes import FakeDriver
from tests.tenancy_setup import ADMIN, fake_app, fresh_db

Client = AsyncTestClient[Litestar]
ERROR = {"$ref": "#/components/schemas/ErrorResponse"}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    async with AsyncTestClient(fake_app(fresh_db(tmp_path), FakeDriver())) as c:
        for _ in range(200):
            if (await c.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        yield c


async def document(client: Client) -> dict[str, Any]:
    doc: dict[str, Any] = (await client.get("/docs/openapi.json")).json()
    return doc


async def test_every_error_is_documented_in_openais_shape(client: Client) -> None:
    doc = await document(client)
    for path, item in doc["paths"].items():
        for method, op in item.items():
            errors = {s: r for s, r in op["responses"].items() if s[0] in "45"}
            for status, response in errors.items():
                schema = response["content"]["application/json"]["schema"]
                assert schema == ERROR, (method, path, status)
            if "{" in path:
                assert "404" in errors, (method, path)
            if path.startswith(("/v1/", "/admin/")):
                assert {"401", "503"} <= set(errors), (method, path)
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"400", "401", "403", "404", "413", "429", "503"} <= set(chat)
    assert "text/event-stream" in chat["200"]["content"]
    update = doc["components"]["schemas"]["TenantUpdate"]
    assert update["minProperties"] == 1 and update["additionalProperties"] is False
    assert update["properties"]["weight"]["exclusiveMinimum"] == 0


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("start_time=9223372036854775808", "start_time"),
        ("end_time=100000000000000000000", "end_time"),
        ("end_time=-100000000000000000000", "end_time"),
        ("tenant_id=", "tenant_id"),
        ("key_id=" + "k" * 65, "key_id"),
    ],
)
async def test_usage_parameters_out_of_bounds_are_400s_naming_them(
    client: Client, query: str, param: str
) -> None:
    r = await client.get(f"/admin/v1/usage?{query}", headers=ADMIN)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/admin/v1/usage", "start_time"),
        ("/admin/v1/usage", "end_time"),
        ("/admin/v1/audit_log", "after"),
    ],
)
async def test_a_lower_bound_the_server_checks_is_in_the_document(
    client: Client, path: str, param: str
) -> None:
    doc = await document(client)
    schemas = {p["name"]: p["schema"] for p in doc["paths"][path]["get"]["parameters"]}
    assert schemas[param]["minimum"] == 0
    r = await client.get(f"{path}?{param}=-1", headers=ADMIN)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert (await client.get(f"{path}?{param}=0", headers=ADMIN)).status_code == 200


async def test_the_last_representable_time_is_served(client: Client) -> None:
    r = await client.get(
        "/admin/v1/usage?bucket_width=1m&start_time=0&end_time=253402300799", headers=ADMIN
    )
    assert r.status_code == 200 and r.json()["data"] == []


async def test_a_quota_past_its_bound_is_a_400(client: Client) -> None:
    t = (await client.post("/admin/v1/tenants", json={"name": "acme"}, headers=ADMIN)).json()
    body = {"max_tokens_per_1_day": 2**63}
    r = await client.put(f"/admin/v1/tenants/{t['id']}/quota", json=body, headers=ADMIN)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens_per_1_day"


async def test_options_allows_every_method_of_the_path(client: Client) -> None:
    r = await client.options("/admin/v1/tenants/ten_x", headers=ADMIN)
    assert r.headers["allow"] == "DELETE, GET, OPTIONS, PATCH"
    r = await client.options("/admin/v1/keys/key_x", headers=ADMIN)
    assert r.headers["allow"] == "GET, OPTIONS, PATCH"
