"""``/admin/v1`` on a real migrated SQLite file, with the fake core: tenants, keys, quotas."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from tests.fakes import MODEL, FakeDriver
from tests.tenancy_setup import ADMIN, bearer, fake_app, fresh_db

Client = AsyncTestClient[Litestar]
MSGS = [{"role": "user", "content": "Say hi"}]


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    async with AsyncTestClient(fake_app(fresh_db(tmp_path), FakeDriver())) as c:
        for _ in range(200):
            if (await c.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        yield c


async def admin(c: Client, method: str, path: str, **kw: Any) -> Any:
    return await c.request(method, f"/admin/v1{path}", headers=ADMIN, **kw)


async def new_tenant(c: Client, name: str = "acme", **kw: Any) -> dict[str, Any]:
    r = await admin(c, "POST", "/tenants", json={"name": name, **kw})
    assert r.status_code == 201, r.text
    return dict(r.json())


async def new_key(c: Client, tenant_id: str, **kw: Any) -> dict[str, Any]:
    r = await admin(c, "POST", f"/tenants/{tenant_id}/keys", json=kw)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def chat(c: Client, key: str) -> Any:
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 3}
    return await c.post("/v1/chat/completions", json=body, headers=bearer(key))


async def test_the_admin_api_needs_the_admin_key(client: Client) -> None:
    assert (await client.get("/admin/v1/tenants")).status_code == 401
    wrong = await client.get("/admin/v1/tenants", headers=bearer("x" * 40))
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_admin_key"
    t = await new_tenant(client)
    key = await new_key(client, t["id"])
    # a tenant key is not an admin key
    assert (await client.get("/admin/v1/usage", headers=bearer(key["value"]))).status_code == 401


async def test_tenants_create_list_paginate_get_update_delete(client: Client) -> None:
    made = [await new_tenant(client, f"t{i}", weight=i + 1) for i in range(5)]
    assert made[0]["object"] == "tenant" and made[0]["status"] == "active"
    page = (await admin(client, "GET", "/tenants", params={"limit": 2})).json()
    assert [t["id"] for t in page["data"]] == [m["id"] for m in made[:2]]
    assert page["has_more"] is True
    rest = await admin(client, "GET", "/tenants", params={"limit": 10, "after": page["last_id"]})
    assert [t["id"] for t in rest.json()["data"]] == [m["id"] for m in made[2:]]
    assert rest.json()["has_more"] is False
    got = (await admin(client, "GET", f"/tenants/{made[1]['id']}")).json()
    assert got["weight"] == 2.0 and got["counters"]["concurrent_requests"] == 0
    r = await admin(client, "PATCH", f"/tenants/{made[1]['id']}", json={"weight": 3.5})
    assert r.json()["weight"] == 3.5
    dup = await admin(client, "PATCH", f"/tenants/{made[1]['id']}", json={"name": "t0"})
    assert dup.status_code == 409
    assert (await admin(client, "DELETE", f"/tenants/{made[1]['id']}")).status_code == 204
    assert (await admin(client, "GET", f"/tenants/{made[1]['id']}")).status_code == 404
    actions = [e["action"] for e in (await admin(client, "GET", "/audit_log")).json()["data"]]
    assert actions[:2] == ["tenant.delete", "tenant.update"]


async def test_a_key_is_shown_once_then_only_redacted(client: Client) -> None:
    t = await new_tenant(client)
    key = await new_key(client, t["id"], name="ci", slo_class="batch")
    value = key["value"]
    assert value.startswith("qk-") and key["slo_class"] == "batch"
    assert value.startswith(key["redacted_value"].rstrip("…"))
    got = (await admin(client, "GET", f"/keys/{key['id']}")).json()
    listed = (await admin(client, "GET", f"/tenants/{t['id']}/keys")).json()["data"]
    for shown in (got, listed[0]):
        assert "value" not in shown and shown["redacted_value"] == key["redacted_value"]
    audit = (await admin(client, "GET", "/audit_log")).text
    assert value not in audit
    assert (await chat(client, value)).status_code == 200
    own = (await client.get("/v1/key", headers=bearer(value))).json()
    assert own["id"] == key["id"] and own["slo_class"] == "batch"
    # last_used_at reaches the database through the ledger writer
    for _ in range(100):
        if (await admin(client, "GET", f"/keys/{key['id']}")).json()["last_used_at"]:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("last_used_at never written")


async def test_missing_and_bad_keys_are_401_invalid_api_key(client: Client) -> None:
    body = {"model": MODEL, "messages": MSGS}
    for headers in ({}, bearer("qk-nope"), {"authorization": "Basic abc"}):
        r = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert (await client.get("/v1/models")).status_code == 401


async def test_revocation_is_immediate(client: Client) -> None:
    t = await new_tenant(client)
    key = await new_key(client, t["id"])
    assert (await chat(client, key["value"])).status_code == 200
    r = await admin(client, "POST", f"/keys/{key['id']}/revoke")
    assert r.json()["status"] == "revoked" and r.json()["revoked_at"]
    refused = await chat(client, key["value"])
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert (await admin(client, "POST", f"/keys/{key['id']}/rotate", json={})).status_code == 409


async def test_rotation_keeps_the_old_value_for_the_grace_period_only(client: Client) -> None:
    t = await new_tenant(client)
    key = await new_key(client, t["id"])
    old = key["value"]
    r = await admin(client, "POST", f"/keys/{key['id']}/rotate", json={"grace_period_s": 3600})
    new = r.json()["value"]
    assert new != old and r.json()["id"] == key["id"]
    assert r.json()["previous_expires_at"] > time.time() + 3500
    assert (await chat(client, old)).status_code == 200  # in grace
    assert (await chat(client, new)).status_code == 200
    r = await admin(client, "POST", f"/keys/{key['id']}/rotate", json={"grace_period_s": 0})
    newest = r.json()["value"]
    assert (await chat(client, new)).status_code == 401  # no grace: gone at once
    assert (await chat(client, old)).status_code == 401
    assert (await chat(client, newest)).status_code == 200


async def test_an_expired_key_stops_working(client: Client) -> None:
    t = await new_tenant(client)
    key = await new_key(client, t["id"], expires_at=time.time() + 0.3)
    assert (await chat(client, key["value"])).status_code == 200
    await asyncio.sleep(0.4)
    r = await chat(client, key["value"])
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]


async def test_a_suspended_tenant_gets_403_until_reactivated(client: Client) -> None:
    t = await new_tenant(client)
    key = await new_key(client, t["id"])
    await admin(client, "PATCH", f"/tenants/{t['id']}", json={"status": "suspended"})
    r = await chat(client, key["value"])
    assert r.status_code == 403 and r.json()["error"]["code"] == "tenant_suspended"
    await admin(client, "PATCH", f"/tenants/{t['id']}", json={"status": "active"})
    assert (await chat(client, key["value"])).status_code == 200
    await admin(client, "DELETE", f"/tenants/{t['id']}")
    assert (await chat(client, key["value"])).status_code == 401


async def test_quotas_put_get_delete_for_tenants_and_keys(client: Client) -> None:
    t = await new_tenant(client)
    key = await new_key(client, t["id"])
    assert (await admin(client, "GET", f"/tenants/{t['id']}/quota")).status_code == 404
    body = {"max_requests_per_1_minute": 10, "max_concurrent_requests": 2}
    r = await admin(client, "PUT", f"/tenants/{t['id']}/quota", json=body)
    assert r.status_code == 200
    got = (await admin(client, "GET", f"/tenants/{t['id']}/quota")).json()
    assert got["max_requests_per_1_minute"] == 10 and got["max_tokens_per_1_day"] is None
    await admin(client, "PUT", f"/keys/{key['id']}/quota", json={"max_tokens_per_1_day": 500})
    own = (await client.get("/v1/key", headers=bearer(key["value"]))).json()
    assert own["limits"]["tenant"]["max_requests_per_1_minute"] == 10
    assert own["limits"]["key"]["max_tokens_per_1_day"] == 500
    assert (await admin(client, "DELETE", f"/keys/{key['id']}/quota")).status_code == 204
    assert (await admin(client, "DELETE", f"/tenants/{t['id']}/quota")).status_code == 204
    own = (await client.get("/v1/key", headers=bearer(key["value"]))).json()
    assert own["limits"]["key"] is None
    assert own["limits"]["tenant"]["max_requests_per_1_minute"] is None


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/tenants", {"name": ""}),
        ("POST", "/tenants", {"name": "ok", "weight": -1}),
        ("POST", "/tenants", {"name": "ok", "colour": "red"}),
        ("POST", "/tenants", {"name": "has space"}),
        ("POST", "/tenants", [1, 2]),
        ("PUT", "/tenants/{tenant}/quota", {"max_requests_per_1_minute": -5}),
        ("PUT", "/tenants/{tenant}/quota", {"max_requests_per_1_minute": "ten"}),
        ("POST", "/tenants/{tenant}/keys", {"slo_class": "premium"}),
        ("POST", "/tenants/{tenant}/keys", {"expires_at": 1000.0}),
        ("PATCH", "/tenants/{tenant}", {"status": "deleted"}),
        ("PATCH", "/tenants/{tenant}", {}),
        ("POST", "/keys/{key}/rotate", {"grace_period_s": -1}),
    ],
)
async def test_malformed_admin_input_is_a_400_and_writes_nothing(
    client: Client, method: str, path: str, body: Any
) -> None:
    t = await new_tenant(client)
    key = await new_key(client, t["id"])
    before = (await admin(client, "GET", "/audit_log", params={"limit": 100})).json()["data"]
    r = await admin(client, method, path.format(tenant=t["id"], key=key["id"]), json=body)
    assert r.status_code in (400, 422), r.text
    assert r.json()["error"]["message"]
    after = (await admin(client, "GET", "/audit_log", params={"limit": 100})).json()["data"]
    assert after == before
    tenants = (await admin(client, "GET", "/tenants")).json()["data"]
    assert [x["name"] for x in tenants] == ["acme"]
    assert (await admin(client, "GET", f"/tenants/{t['id']}/quota")).status_code == 404


async def test_bad_query_parameters_are_400(client: Client) -> None:
    assert (await admin(client, "GET", "/tenants", params={"limit": 0})).status_code == 400
    assert (await admin(client, "GET", "/usage", params={"bucket_width": "2m"})).status_code == 400
    r = await admin(client, "GET", "/usage", params={"group_by": "model"})
    assert r.status_code == 400
