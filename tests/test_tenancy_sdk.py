"""Tenancy through a real ``quanta run`` with the real model, driven by the ``openai`` SDK.

One server process for the module (n_ctx 1024, one thread, a few tokens per request).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from tests.server_process import ServerProcess, running_server
from tests.tenancy_setup import fresh_db

pytestmark = pytest.mark.model

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]  # token ids: the prompt is exactly 8 tokens


@pytest.fixture(scope="module")
def server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = fresh_db(tmp_path_factory.mktemp("tenancy"))
    with running_server("--n-ctx", "1024", "--threads", "1", "--grace", "5", db=db) as proc:
        yield proc


@pytest.fixture(scope="module")
def admin(server: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=f"{server.url}/admin/v1", headers=server.admin, timeout=30)


@pytest.fixture(scope="module")
def model(server: ServerProcess) -> str:
    sdk = OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)
    return sdk.models.list().data[0].id


def tenant(admin: httpx.Client, name: str, **quota: int) -> tuple[str, str]:
    t = admin.post("/tenants", json={"name": name}).json()
    if quota:
        assert admin.put(f"/tenants/{t['id']}/quota", json=quota).status_code == 200
    key = admin.post(f"/tenants/{t['id']}/keys", json={}).json()
    return t["id"], key["value"]


def sdk(server: ServerProcess, key: str) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)


def complete(client: OpenAI, model: str, max_tokens: int = 3, **kw: Any) -> Any:
    return client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
        **kw,
    )


def test_a_bad_key_and_a_revoked_key_are_authentication_errors(
    server: ServerProcess, admin: httpx.Client, model: str
) -> None:
    with pytest.raises(openai.AuthenticationError) as bad:
        sdk(server, "qk-not-a-key").models.list()
    assert bad.value.code == "invalid_api_key"
    tenant_id, key = tenant(admin, "revoked")
    assert complete(sdk(server, key), model).usage is not None
    key_id = admin.get(f"/tenants/{tenant_id}/keys").json()["data"][0]["id"]
    admin.post(f"/keys/{key_id}/revoke")
    with pytest.raises(openai.AuthenticationError):
        complete(sdk(server, key), model)


def test_the_request_limit_is_a_rate_limit_error_with_openai_headers(
    server: ServerProcess, admin: httpx.Client, model: str
) -> None:
    _, key = tenant(admin, "rpm", max_requests_per_1_minute=2)
    client = sdk(server, key)
    raw = client.completions.with_raw_response.create(
        model=model, prompt=PROMPT, max_tokens=1, extra_body={"ignore_eos": True}
    )
    assert raw.headers["x-ratelimit-remaining-requests"] == "1"
    complete(client, model, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as refused:
        complete(client, model, max_tokens=1)
    response = refused.value.response
    assert refused.value.code == "rate_limit_exceeded"
    assert response.headers["x-ratelimit-limit-requests"] == "2"
    assert int(response.headers["retry-after-ms"]) > 0
    assert int(response.headers["retry-after"]) >= 1


def test_usage_matches_the_tokens_served(
    server: ServerProcess, admin: httpx.Client, model: str
) -> None:
    tenant_id, key = tenant(admin, "usage", max_tokens_per_1_day=10_000)
    client = sdk(server, key)
    served = 0
    for n in (2, 5):
        r = complete(client, model, max_tokens=n)
        assert r.usage is not None and r.usage.completion_tokens == n
        assert r.usage.prompt_tokens == len(PROMPT)
        served += r.usage.total_tokens
    own = httpx.get(f"{server.url}/v1/key", headers={"authorization": f"Bearer {key}"}).json()
    assert own["tenant_usage"]["tokens_today"] == served
    for _ in range(100):
        rows = admin.get("/usage", params={"bucket_width": "1m", "tenant_id": tenant_id}).json()
        if sum(row["requests"] for row in rows["data"]) == 2:
            break
        time.sleep(0.05)
    assert sum(row["total_tokens"] for row in rows["data"]) == served
    day = admin.get("/usage", params={"bucket_width": "1d", "tenant_id": tenant_id}).json()
    assert [row["completion_tokens"] for row in day["data"]] == [2 + 5]


def test_a_client_that_disconnects_gives_its_concurrency_slot_back(
    server: ServerProcess, admin: httpx.Client, model: str
) -> None:
    tenant_id, key = tenant(admin, "slots", max_concurrent_requests=1)
    client = sdk(server, key)

    def in_flight() -> int:
        return int(admin.get(f"/tenants/{tenant_id}").json()["counters"]["concurrent_requests"])

    stream = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=200, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    assert in_flight() == 1
    with pytest.raises(openai.RateLimitError):
        complete(client, model, max_tokens=1)
    stream.close()  # the client leaves mid-stream
    for _ in range(300):
        if in_flight() == 0:
            break
        time.sleep(0.02)
    assert in_flight() == 0
    assert complete(client, model, max_tokens=1).usage is not None
