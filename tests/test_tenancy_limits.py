"""Quotas on ``/v1`` with the fake core on a real migrated SQLite file: each limit is hit
exactly at its value, with OpenAI's body and headers; refusals charge nothing; usage is
reconciled with what was served; the ledger and counters survive a restart."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from quanta_core.scheduler import Refused
from tests.fakes import MODEL, FakeDriver
from tests.tenancy_setup import ADMIN, TenancyDb, bearer, fake_app, fresh_db, over_http, serving

Client = AsyncTestClient[Litestar]
MSGS = [{"role": "user", "content": "Say hi"}]
PROMPT = 16  # the fake byte tokenizer: "<user>Say hi\n<a>"


@pytest.fixture
def db(tmp_path: Path) -> TenancyDb:
    return fresh_db(tmp_path)


@pytest.fixture
def driver() -> FakeDriver:
    return FakeDriver()


@pytest.fixture
async def client(db: TenancyDb, driver: FakeDriver) -> AsyncIterator[Client]:
    async with serving(db, driver) as c:
        yield c


async def tenant_with_key(c: Client, name: str = "acme", **quota: int) -> tuple[str, str, str]:
    t = (await c.post("/admin/v1/tenants", json={"name": name}, headers=ADMIN)).json()
    if quota:
        r = await c.put(f"/admin/v1/tenants/{t['id']}/quota", json=quota, headers=ADMIN)
        assert r.status_code == 200
    k = (await c.post(f"/admin/v1/tenants/{t['id']}/keys", json={}, headers=ADMIN)).json()
    return t["id"], k["id"], k["value"]


async def chat(c: Client, key: str, max_tokens: int = 4, **fields: Any) -> Any:
    body = {"model": MODEL, "messages": MSGS, "max_tokens": max_tokens, "ignore_eos": True}
    return await c.post("/v1/chat/completions", json={**body, **fields}, headers=bearer(key))


async def counters(c: Client, tenant_id: str) -> dict[str, int]:
    r = await c.get(f"/admin/v1/tenants/{tenant_id}", headers=ADMIN)
    return dict(r.json()["counters"])


def assert_429(r: Any, code: str, kind: str, *, should_retry: bool) -> dict[str, Any]:
    assert r.status_code == 429, r.text
    error: dict[str, Any] = r.json()["error"]
    assert error["code"] == code and error["type"] == kind
    assert int(r.headers["retry-after"]) >= 1
    assert int(r.headers["retry-after-ms"]) >= 1
    assert (r.headers.get("x-should-retry") == "false") is not should_retry
    return error


async def test_requests_per_minute_exactly_at_the_limit(client: Client) -> None:
    tenant, _, key = await tenant_with_key(client, max_requests_per_1_minute=3)
    for left in (2, 1, 0):
        r = await chat(client, key)
        assert r.status_code == 200
        assert r.headers["x-ratelimit-limit-requests"] == "3"
        assert r.headers["x-ratelimit-remaining-requests"] == str(left)
        assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    refused = await chat(client, key)
    error = assert_429(refused, "rate_limit_exceeded", "requests", should_retry=True)
    assert "requests per min (RPM): Limit 3, Used 3, Requested 1" in error["message"]
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # the refused request consumed nothing
    assert await counters(client, tenant) == {
        "requests_last_minute": 3,
        "tokens_last_minute": 3 * (PROMPT + 4),
        "tokens_today": 3 * (PROMPT + 4),
        "concurrent_requests": 0,
    }


async def test_tokens_per_minute_exactly_at_the_limit_and_a_too_large_request(
    client: Client,
) -> None:
    tenant, _, key = await tenant_with_key(client, max_tokens_per_1_minute=2 * (PROMPT + 4))
    first = await chat(client, key)
    assert first.headers["x-ratelimit-remaining-tokens"] == str(PROMPT + 4)
    second = await chat(client, key)
    assert second.headers["x-ratelimit-remaining-tokens"] == "0"
    error = assert_429(await chat(client, key), "rate_limit_exceeded", "tokens", should_retry=True)
    assert "tokens per min (TPM)" in error["message"]
    long_prompt = [{"role": "user", "content": "x" * 2 * (PROMPT + 4)}]
    too_large = await chat(client, key, messages=long_prompt)
    error = assert_429(too_large, "rate_limit_exceeded", "tokens", should_retry=False)
    assert "Request too large" in error["message"]
    assert (await counters(client, tenant))["tokens_last_minute"] == 2 * (PROMPT + 4)


async def test_a_request_longer_than_the_budget_left_is_served_up_to_it(client: Client) -> None:
    # max_tokens is a ceiling, not a claim: the request is served what the quota has left
    # and ends there as if it had reached max_tokens; the next one waits for the minute.
    tenant, _, key = await tenant_with_key(client, max_tokens_per_1_minute=PROMPT + 10)
    r = await chat(client, key, max_tokens=100)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 10
    assert (await counters(client, tenant))["tokens_last_minute"] == PROMPT + 10
    assert_429(await chat(client, key), "rate_limit_exceeded", "tokens", should_retry=True)


async def test_a_chat_without_max_tokens_fits_a_small_quota(client: Client) -> None:
    # The SDK omits max_tokens: the whole context would be 512 - PROMPT tokens. It is
    # admitted, served the 300 tokens the minute allows in all, streamed, and cut there.
    tenant, _, key = await tenant_with_key(client, max_tokens_per_1_minute=300)
    body = {"model": MODEL, "messages": MSGS, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    r = await client.post("/v1/chat/completions", json=body, headers=bearer(key))
    assert r.status_code == 200, r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line[6:10] == '{"id']
    reasons = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert reasons == ["length"]
    assert events[-1]["usage"]["total_tokens"] == 300
    assert (await counters(client, tenant))["tokens_last_minute"] == 300


async def test_a_quota_reserves_the_likely_output_and_concurrent_requests_share_it(
    db: TenancyDb,
) -> None:
    # The predictor says 5 tokens: each request reserves its prompt + 5, so two requests of
    # max_tokens 100 start side by side where prompt + max_tokens would fit once; both run
    # past the prediction and the quota ends them when it is spent, never after.
    limit = 2 * PROMPT + 40
    driver = FakeDriver(delay_s=0.02, likely_output=5)
    with over_http(fake_app(db, driver)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            tenant, _, key = await tenant_with_key(c, max_tokens_per_1_minute=limit)  # type: ignore[arg-type]
            body = {"model": MODEL, "messages": MSGS, "max_tokens": 100, "ignore_eos": True}
            body |= {"stream": True, "stream_options": {"include_usage": True}}
            async with c.stream(
                "POST", "/v1/chat/completions", json=body, headers=bearer(key)
            ) as first:
                lines = first.aiter_lines()
                assert (await anext(lines)).startswith("data: ")  # the first is running
                second = await c.post("/v1/chat/completions", json=body, headers=bearer(key))
                rest = [line async for line in lines]
            assert first.status_code == second.status_code == 200, second.text
            assert first.headers["x-ratelimit-remaining-tokens"] == str(limit - PROMPT - 5)
            assert second.headers["x-ratelimit-remaining-tokens"] == str(limit - 2 * (PROMPT + 5))
            usages = [
                json.loads(line[6:])["usage"]
                for line in [*rest, *second.text.splitlines()]
                if line.startswith("data: {") and '"usage":{' in line
            ]
            assert sum(u["total_tokens"] for u in usages) == limit
            assert (await counters(c, tenant))["tokens_last_minute"] == limit  # type: ignore[arg-type]


async def test_tokens_per_day_spent_is_insufficient_quota(client: Client) -> None:
    _, _, key = await tenant_with_key(client, max_tokens_per_1_day=2 * (PROMPT + 4))
    assert (await chat(client, key)).status_code == 200
    assert (await chat(client, key)).status_code == 200
    error = assert_429(
        await chat(client, key, max_tokens=1),
        "insufficient_quota",
        "insufficient_quota",
        should_retry=False,
    )
    assert "tokens per day (TPD)" in error["message"]


async def test_a_key_quota_applies_on_top_of_its_tenant(client: Client) -> None:
    _, key_id, key = await tenant_with_key(client, max_requests_per_1_minute=10)
    r = await client.put(
        f"/admin/v1/keys/{key_id}/quota", json={"max_requests_per_1_minute": 1}, headers=ADMIN
    )
    assert r.status_code == 200
    assert (await chat(client, key)).status_code == 200
    error = assert_429(
        await chat(client, key), "rate_limit_exceeded", "requests", should_retry=True
    )
    assert f"key {key_id}" in error["message"]


async def test_tokens_are_reserved_at_admission_then_reconciled(client: Client) -> None:
    tenant, _, key = await tenant_with_key(client, max_tokens_per_1_minute=1000)
    r = await chat(client, key, max_tokens=50, ignore_eos=False)  # stops after "Hello world"
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == len("Hello world")
    # the headers were written at admission: prompt + max_tokens reserved
    assert r.headers["x-ratelimit-remaining-tokens"] == str(1000 - PROMPT - 50)
    got = await counters(client, tenant)
    assert got["tokens_last_minute"] == got["tokens_today"] == usage["total_tokens"]
    own = (await client.get("/v1/key", headers=bearer(key))).json()
    assert own["key_usage"]["tokens_last_minute"] == usage["total_tokens"]


def test_concurrency_is_released_after_a_client_disconnects(db: TenancyDb) -> None:
    driver = FakeDriver(delay_s=0.02)
    with over_http(fake_app(db, driver)) as url:
        admin = httpx.Client(base_url=url, headers=ADMIN)
        t = admin.post("/admin/v1/tenants", json={"name": "acme"}).json()
        admin.put(f"/admin/v1/tenants/{t['id']}/quota", json={"max_concurrent_requests": 1})
        key = admin.post(f"/admin/v1/tenants/{t['id']}/keys", json={}).json()["value"]
        user = httpx.Client(base_url=url, headers=bearer(key), timeout=30)
        body = {"model": MODEL, "messages": MSGS, "max_tokens": 400, "ignore_eos": True}

        def in_flight() -> int:
            return int(
                admin.get(f"/admin/v1/tenants/{t['id']}").json()["counters"]["concurrent_requests"]
            )

        with user.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")  # streaming: it holds the one slot
            assert in_flight() == 1
            refused = user.post("/v1/chat/completions", json={**body, "max_tokens": 1})
            error = assert_429(refused, "rate_limit_exceeded", "requests", should_retry=True)
            assert "concurrent requests" in error["message"]
        # the client has gone: the slot comes back without the stream ever finishing
        for _ in range(300):
            if in_flight() == 0:
                break
            time.sleep(0.01)
        assert in_flight() == 0
        assert driver.cancelled  # and the core was told
        ok = user.post("/v1/chat/completions", json={**body, "max_tokens": 2})
        assert ok.status_code == 200


async def test_a_request_the_core_rejects_is_not_charged(
    client: Client, driver: FakeDriver
) -> None:
    tenant, _, key = await tenant_with_key(client, max_requests_per_1_minute=5)
    driver.refuse = Refused("queue full")
    assert (await chat(client, key)).status_code == 503
    assert await counters(client, tenant) == {
        "requests_last_minute": 0,
        "tokens_last_minute": 0,
        "tokens_today": 0,
        "concurrent_requests": 0,
    }


async def test_every_authenticated_response_carries_the_rate_limit_headers(
    client: Client,
) -> None:
    _, _, key = await tenant_with_key(
        client, max_requests_per_1_minute=5, max_tokens_per_1_minute=500
    )
    for r in (
        await client.get("/v1/models", headers=bearer(key)),
        await client.get("/v1/key", headers=bearer(key)),
        await chat(client, key, temperature=9),  # a 400
        await chat(client, key, stream=True),
    ):
        assert r.headers["x-ratelimit-limit-requests"] == "5", r.status_code
        assert r.headers["x-ratelimit-limit-tokens"] == "500"
        assert "x-ratelimit-remaining-tokens" in r.headers
        assert "x-ratelimit-reset-tokens" in r.headers


async def test_a_tenant_sees_its_own_usage_and_nobody_elses(client: Client) -> None:
    a_tenant, a_key_id, a_key = await tenant_with_key(client, "a")
    b_tenant, _, b_key = await tenant_with_key(client, "b")
    await chat(client, a_key)
    await chat(client, a_key)
    own_a = (await client.get("/v1/key", headers=bearer(a_key))).json()
    own_b = (await client.get("/v1/key", headers=bearer(b_key))).json()
    assert own_a["tenant_id"] == a_tenant and own_a["id"] == a_key_id
    assert own_a["tenant_usage"]["requests_last_minute"] == 2
    assert own_b["tenant_id"] == b_tenant and own_b["tenant_usage"]["requests_last_minute"] == 0
    assert a_tenant not in str(own_b) and a_key_id not in str(own_b)
    for path in ("/admin/v1/usage", f"/admin/v1/tenants/{a_tenant}", "/admin/v1/audit_log"):
        assert (await client.get(path, headers=bearer(b_key))).status_code == 401


async def usage(c: Client, **params: Any) -> list[dict[str, Any]]:
    r = await c.get("/admin/v1/usage", params=params, headers=ADMIN)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


async def test_usage_buckets_match_the_tokens_served(client: Client) -> None:
    a, a_key_id, a_key = await tenant_with_key(client, "a")
    b, _, b_key = await tenant_with_key(client, "b")
    served: dict[str, int] = {a: 0, b: 0}
    for key, tenant, n in ((a_key, a, 3), (b_key, b, 7)):
        r = await chat(client, key, max_tokens=n)
        served[tenant] += r.json()["usage"]["total_tokens"]
    await chat(client, a_key, max_tokens=5)
    served[a] += PROMPT + 5
    for _ in range(100):  # the ledger is written off the request path
        if sum(u["requests"] for u in await usage(client, bucket_width="1m")) == 3:
            break
        await asyncio.sleep(0.05)
    for width in ("1m", "1h", "1d"):
        rows = await usage(client, bucket_width=width, group_by=["tenant", "class"])
        totals = {u["tenant_id"]: u["total_tokens"] for u in rows}
        assert totals == served, width
        assert {u["slo_class"] for u in rows} == {"interactive"}
        assert all(u["end_time"] - u["start_time"] in (60, 3600, 86400) for u in rows)
    by_key = await usage(client, bucket_width="1d", group_by=["key"], key_id=a_key_id)
    assert [(u["key_id"], u["requests"]) for u in by_key] == [(a_key_id, 2)]
    assert by_key[0]["completion_tokens"] == 3 + 5


async def test_a_restart_keeps_the_counters(db: TenancyDb) -> None:
    async with serving(db) as c:
        tenant, _, key = await tenant_with_key(c, max_requests_per_1_minute=3)
        assert (await chat(c, key)).status_code == 200
        assert (await chat(c, key)).status_code == 200
    # stopped: the ledger was flushed at shutdown; a new server rebuilds from it
    async with serving(db) as c:
        assert await counters(c, tenant) == {
            "requests_last_minute": 2,
            "tokens_last_minute": 2 * (PROMPT + 4),
            "tokens_today": 2 * (PROMPT + 4),
            "concurrent_requests": 0,
        }
        assert (await chat(c, key)).status_code == 200
        assert (await chat(c, key)).status_code == 429
    async with serving(db) as c:  # rebuilt again: set from the ledger, never added twice
        assert (await counters(c, tenant))["requests_last_minute"] == 3
