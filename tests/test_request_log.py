"""One log line per request, when it ends, with who, what and how long; one format (text or
JSON) for every line; and no key, admin key or secret in any of it."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.server.logs import configure_logging
from tests.fakes import MODEL, FakeDriver
from tests.server_process import start_server
from tests.tenancy_setup import ADMIN, ADMIN_KEY, SECRET_KEY, bearer, fake_app, fresh_db

Client = AsyncTestClient[Litestar]
FIELDS = [
    "request_id",
    "tenant",
    "key_id",
    "class",
    "reason",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "queue_s",
    "prefill_s",
    "e2e_s",
    "finish_reason",
]
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The process's logging as ``quanta run`` sets it (JSON), into a buffer."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    configure_logging("info", "json")
    buffer = io.StringIO()
    root.handlers[0].setStream(buffer)  # type: ignore[attr-defined]
    yield buffer
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logging.getLogger("uvicorn.access").disabled = False


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Client, str]]:
    db = fresh_db(tmp_path)
    key = db.create_key("acme", max_requests_per_1_minute=2)
    async with AsyncTestClient(fake_app(db, FakeDriver())) as c:
        for _ in range(200):
            if (await c.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        yield c, key


def request_lines(buffer: io.StringIO) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    return [line for line in lines if line["logger"] == "quanta.request"]


async def test_one_json_line_per_request_with_its_fields(
    served: tuple[Client, str], json_log: io.StringIO
) -> None:
    client, key = served
    assert (await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))).is_success
    streamed = await client.post(
        "/v1/chat/completions", json={**BODY, "stream": True}, headers=bearer(key)
    )
    assert streamed.is_success
    limited = await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
    assert limited.status_code == 429
    wrong = await client.post("/v1/chat/completions", json=BODY, headers=bearer("qk-" + "x" * 43))
    assert wrong.status_code == 401
    lines = request_lines(json_log)
    assert [(line["message"]) for line in lines] == [
        "POST /v1/chat/completions 200",
        "POST /v1/chat/completions 200",
        "POST /v1/chat/completions 429",
        "POST /v1/chat/completions 401",
    ]
    for line in lines:
        assert list(line)[4:] == FIELDS
    done, stream, refused, unknown = lines
    for line in (done, stream):
        assert (line["tenant"], line["class"], line["reason"]) == ("acme", "interactive", None)
        assert str(line["key_id"]).startswith("key_")
        assert line["prompt_tokens"] == 12 and line["cached_tokens"] == 0
        assert line["output_tokens"] == 5 and line["finish_reason"] == "length"
        for timing in ("queue_s", "prefill_s", "e2e_s"):
            assert isinstance(line[timing], float) and line[timing] >= 0
    assert done["request_id"] != stream["request_id"]
    assert (refused["tenant"], refused["reason"], refused["output_tokens"]) == (
        "acme",
        "rate_limit_exceeded",
        0,
    )
    assert (unknown["tenant"], unknown["key_id"], unknown["reason"]) == (
        "-",
        None,
        "invalid_api_key",
    )
    # the counters behind /metrics agree
    text = (await client.get("/metrics")).text
    assert 'quanta:requests_total{class="interactive",status="200",tenant="acme"} 2.0' in text
    assert (
        'quanta:refusals_total{class="interactive",reason="rate_limit_exceeded",tenant="acme"} 1.0'
        in text
    )
    assert 'quanta:generation_tokens_total{class="interactive",tenant="acme"} 10.0' in text
    assert (
        f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL}"}} 2.0' in text
    )


async def test_text_format_is_one_line_of_key_values(
    served: tuple[Client, str], json_log: io.StringIO
) -> None:
    configure_logging("info", "text")
    buffer = io.StringIO()
    logging.getLogger().handlers[0].setStream(buffer)  # type: ignore[attr-defined]
    client, key = served
    await client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
    (line,) = [s for s in buffer.getvalue().splitlines() if " quanta.request " in s]
    assert " INFO quanta.request POST /v1/chat/completions 200 request_id=" in line
    assert " tenant=acme " in line and " finish_reason=length" in line


@pytest.mark.model
def test_no_key_admin_key_or_secret_in_a_servers_log(model_path: Path, tmp_path: Path) -> None:
    """A real ``quanta run`` logging JSON, through every path a key travels: completions with
    a good, a wrong, a rotated key; the admin API with a wrong and the right admin key,
    creating and rotating keys. Its whole output is then searched for every secret."""
    log = tmp_path / "server.log"
    server = start_server(
        "--n-ctx", "512", "--threads", "1", log=log, env={"QUANTA_LOG_FORMAT": "json"}
    )
    secrets = [ADMIN_KEY, SECRET_KEY, server.api_key]
    try:
        server.wait_ready()
        url = server.url
        body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        body["model"] = httpx.get(f"{url}/v1/models", headers=server.auth).json()["data"][0]["id"]
        assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=server.auth).is_success
        wrong = "qk-" + "w" * 43
        secrets.append(wrong)
        assert (
            httpx.post(f"{url}/v1/chat/completions", json=body, headers=bearer(wrong)).status_code
            == 401
        )
        assert (
            httpx.get(f"{url}/admin/v1/tenants", headers=bearer("qa-" + "z" * 40)).status_code
            == 401
        )
        secrets.append("qa-" + "z" * 40)
        tenant = httpx.post(f"{url}/admin/v1/tenants", json={"name": "logs"}, headers=ADMIN).json()
        made = httpx.post(
            f"{url}/admin/v1/tenants/{tenant['id']}/keys", json={}, headers=ADMIN
        ).json()
        rotated = httpx.post(
            f"{url}/admin/v1/keys/{made['id']}/rotate", json={}, headers=ADMIN
        ).json()
        secrets += [made["value"], rotated["value"]]
        for value in (made["value"], rotated["value"]):
            with httpx.stream(
                "POST",
                f"{url}/v1/chat/completions",
                json={**body, "stream": True},
                headers=bearer(value),
            ) as r:
                assert r.status_code == 200
                r.read()
        assert httpx.get(f"{url}/metrics").status_code == 200
    finally:
        assert server.stop() == 0
    text = log.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line JSON
    requests = [line for line in lines if line["logger"] == "quanta.request"]
    assert len(requests) >= 8
    for secret in secrets:
        assert secret not in text
        assert secret[-12:] not in text  # not even a tail
