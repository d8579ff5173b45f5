"""The HTTP surface against a scripted fake core: shapes, streaming, errors (no model)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.server.app import create_app
from app.server.core import Core
from app.server.settings import Settings
from quanta_core.requests import RejectionKind
from quanta_core.scheduler import Refused
from tests.fakes import MODEL, ByteTokenizer, FakeDriver, fake_core
from tests.tenancy_setup import fresh_db

MSGS = [{"role": "user", "content": "Say hi"}]


def make_app(driver: FakeDriver, gate: threading.Event | None = None) -> Litestar:
    def factory(_: Settings) -> Core:
        if gate is not None:
            gate.wait(10)
        return fake_core(driver)

    db = fresh_db()
    api_keys.append(db.create_key())
    return create_app(db.settings(max_body_bytes=64 * 1024, grace_s=3.0), core_factory=factory)


api_keys: list[str] = []  # the key of the app made last: the clients below send it


def authorized(app: Litestar) -> AsyncTestClient[Litestar]:
    client: AsyncTestClient[Litestar] = AsyncTestClient(app)
    client.headers["authorization"] = f"Bearer {api_keys[-1]}"
    return client


@pytest.fixture
def driver() -> FakeDriver:
    return FakeDriver()


@pytest.fixture
async def client(driver: FakeDriver) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with authorized(make_app(driver)) as c:
        await wait_ready(c)
        yield c


async def wait_ready(c: AsyncTestClient[Litestar]) -> None:
    import asyncio

    for _ in range(200):
        if (await c.get("/readyz")).status_code == 200:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never ready")


def events(body: str) -> list[Any]:
    lines = [line.removeprefix("data: ") for line in body.split("\n\n") if line]
    assert lines[-1] == "[DONE]", lines[-1]
    return [json.loads(line) for line in lines[:-1]]


async def chat(c: AsyncTestClient[Litestar], **fields: Any) -> Any:
    return await c.post("/v1/chat/completions", json={"model": MODEL, "messages": MSGS, **fields})


# ---- life cycle ----


async def test_not_ready_until_the_core_is_built_then_ready_then_drained() -> None:
    gate, driver = threading.Event(), FakeDriver()
    async with authorized(make_app(driver, gate)) as c:
        assert (await c.get("/healthz")).status_code == 200
        starting = await c.get("/readyz")
        assert (starting.status_code, starting.json()["status"]) == (503, "starting")
        refused = await chat(c)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "not_ready"
        assert refused.headers["retry-after"] == "1"
        gate.set()
        await wait_ready(c)
        assert (await chat(c)).status_code == 200
    assert driver.stopped_with == 3.0  # the lifespan drained the driver with the grace period


async def test_every_response_carries_x_request_id(client: AsyncTestClient[Litestar]) -> None:
    for response in [await client.get("/healthz"), await client.get("/nope"), await chat(client)]:
        assert len(response.headers["x-request-id"]) == 32
    echoed = await client.get("/healthz", headers={"x-request-id": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"


# ---- chat ----


async def test_chat_completion_shape_usage_and_timing(
    client: AsyncTestClient[Litestar], driver: FakeDriver
) -> None:
    driver.cached_tokens = 4
    r = await chat(client, max_tokens=50, user="u")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello world", "refusal": None}
    assert choice["finish_reason"] == "stop" and choice["logprobs"] is None
    assert set(choice["quanta"]) == {
        "queue_s",
        "prefill_s",
        "e2e_s",
        "preemptions",
        "cached_tokens",
        "ttft_estimate_s",
    }
    prompt = len(ByteTokenizer().encode_chat(MSGS))
    assert body["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 11,
        "total_tokens": prompt + 11,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert driver.submitted[0].max_tokens == 50


async def test_max_tokens_ends_with_length(client: AsyncTestClient[Litestar]) -> None:
    body = (await chat(client, max_completion_tokens=5)).json()
    assert body["choices"][0]["message"]["content"] == "Hello"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5


async def test_stream_chunks_as_openai_sends_them(client: AsyncTestClient[Litestar]) -> None:
    r = await chat(client, stream=True, stream_options={"include_usage": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = events(r.text)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert text == "Hello world"
    final = chunks[-2]["choices"][0]
    assert final["delta"] == {} and final["finish_reason"] == "stop" and "quanta" in final
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 11


async def test_a_stop_string_across_chunks_is_never_emitted(
    client: AsyncTestClient[Litestar], driver: FakeDriver
) -> None:
    driver.script = ["The answer<END> and more"]  # one byte per token: the stop spans 5 chunks
    r = await chat(
        client, stream=True, stop=["<END>", "zzz"], stream_options={"include_usage": True}
    )
    chunks = events(r.text)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "The answer"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == len("The answer<END>")
    assert driver.cancelled == {driver.submitted[0].request_id}  # the core stops generating
    whole = (await chat(client, stop="<END>")).json()
    assert whole["choices"][0]["message"]["content"] == "The answer"


async def test_n_choices_each_with_its_own_finish(
    client: AsyncTestClient[Litestar], driver: FakeDriver
) -> None:
    driver.script = ["one", "two two"]
    body = (await chat(client, n=2)).json()
    assert [c["message"]["content"] for c in body["choices"]] == ["one", "two two"]
    assert driver.submitted[0].n == 2
    assert body["usage"]["completion_tokens"] == 10
    chunks = events((await chat(client, n=2, stream=True)).text)
    finished = {c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]}
    assert finished == {0, 1}


async def test_chat_logprobs(client: AsyncTestClient[Litestar], driver: FakeDriver) -> None:
    driver.script = ["ab"]
    body = (await chat(client, logprobs=True, top_logprobs=2)).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == ["a", "b"]
    assert content[0]["bytes"] == [97] and content[0]["logprob"] == -0.5
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["a", "?"]
    assert driver.submitted[0].sampling.logprobs == 2


async def test_ignore_eos_runs_to_max_tokens(client: AsyncTestClient[Litestar]) -> None:
    body = (await chat(client, ignore_eos=True, max_tokens=14)).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 14


# ---- completions ----


async def test_completion_whole_and_streamed_with_logprobs(
    client: AsyncTestClient[Litestar],
) -> None:
    fields = {"model": MODEL, "prompt": "Once", "max_tokens": 5, "logprobs": 1}
    body = (await client.post("/v1/completions", json=fields)).json()
    assert body["object"] == "text_completion"
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("Hello", "length")
    assert choice["logprobs"]["tokens"] == list("Hello")
    assert choice["logprobs"]["text_offset"] == [0, 1, 2, 3, 4]
    assert choice["logprobs"]["top_logprobs"][0] == {"H": -0.5}
    assert body["usage"]["prompt_tokens"] == 4
    streamed = events((await client.post("/v1/completions", json={**fields, "stream": True})).text)
    assert "".join(c["choices"][0]["text"] for c in streamed) == "Hello"
    assert streamed[-1]["choices"][0]["finish_reason"] == "length"


# ---- errors ----


def assert_error(r: Any, status: int, code: str | None, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (code, param)
    assert "x-request-id" in r.headers
    return error


async def test_unknown_and_invalid_parameters_are_400s_naming_them(
    client: AsyncTestClient[Litestar],
) -> None:
    error = assert_error(
        await chat(client, frobnicate=1), 400, "unrecognized_argument", "frobnicate"
    )
    assert error["type"] == "invalid_request_error" and "frobnicate" in error["message"]
    assert_error(await chat(client, temperature=3), 400, "invalid_parameter", "temperature")
    assert_error(await chat(client, n=0), 400, "invalid_parameter", "n")
    assert_error(await chat(client, stop=["a"] * 17), 400, "invalid_parameter", "stop")
    bad_part = [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": bad_part})
    assert_error(r, 400, "invalid_parameter", "messages[0].content[0].type")
    r = await client.post("/v1/chat/completions", json={"messages": MSGS})
    assert_error(r, 400, "missing_required_parameter", "model")
    r = await client.post(
        "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "error" in r.json()
    r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "echo": True})
    assert_error(r, 400, "unrecognized_argument", "echo")


async def test_context_length_exceeded(client: AsyncTestClient[Litestar]) -> None:
    error = assert_error(
        await chat(client, max_tokens=600), 400, "context_length_exceeded", "messages"
    )
    assert "512" in error["message"]


async def test_unknown_model_is_404(client: AsyncTestClient[Litestar]) -> None:
    r = await client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": MSGS})
    assert_error(r, 404, "model_not_found", "model")
    assert_error(await client.get("/v1/models/gpt-9"), 404, "model_not_found", "model")


async def test_an_oversized_body_is_413(client: AsyncTestClient[Litestar]) -> None:
    huge = [{"role": "user", "content": "x" * 100_000}]
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": huge})
    assert_error(r, 413, "request_too_large", None)


async def test_a_rejected_request_is_503_before_and_an_sse_error_never_needed(
    client: AsyncTestClient[Litestar], driver: FakeDriver
) -> None:
    driver.refuse = Refused("queue full")
    assert_error(await chat(client), 503, "overloaded", None)
    assert_error(await chat(client, stream=True), 503, "overloaded", None)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_refusal_is_429_or_503_with_the_estimated_retry_after(
    client: AsyncTestClient[Litestar], driver: FakeDriver, stream: bool
) -> None:
    driver.refuse = Refused("over share", RejectionKind.TENANT_OVER_SHARE, 2.2)
    over = await chat(client, stream=stream)
    assert_error(over, 429, "rate_limit_exceeded", None)
    assert over.json()["error"]["type"] == "requests"
    assert (over.headers["retry-after"], over.headers["retry-after-ms"]) == ("3", "2200")
    driver.refuse = Refused("busy", RejectionKind.OVERLOADED, 0.3)
    busy = await chat(client, stream=stream)
    assert_error(busy, 503, "overloaded", None)
    assert (busy.headers["retry-after"], busy.headers["retry-after-ms"]) == ("1", "300")
    driver.refuse = Refused("the server is stopping")
    plain = await chat(client, stream=stream)
    assert_error(plain, 503, "overloaded", None)
    assert plain.headers["retry-after"] == "1"


async def test_an_error_after_the_stream_started_is_an_sse_error_event(
    client: AsyncTestClient[Litestar], driver: FakeDriver
) -> None:
    driver.fail_after = 3
    r = await chat(client, stream=True)
    assert r.status_code == 200
    *chunks, last = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
    assert "".join(json.loads(c)["choices"][0]["delta"].get("content", "") for c in chunks) == "Hel"
    error = json.loads(last)["error"]
    assert (error["code"], error["type"]) == ("generation_failed", "server_error")
    assert "engine died" in error["message"]
    assert_error(await chat(client), 500, "generation_failed", None)


# ---- models, metrics, OpenAPI ----


async def test_models(client: AsyncTestClient[Litestar]) -> None:
    listed = (await client.get("/v1/models")).json()
    assert listed["object"] == "list" and listed["data"][0]["id"] == MODEL
    one = (await client.get(f"/v1/models/{MODEL}")).json()
    assert (one["object"], one["owned_by"], one["max_model_len"]) == ("model", "quanta", 512)


async def test_metrics_in_vllm_style(client: AsyncTestClient[Litestar]) -> None:
    await chat(client)
    text = (await client.get("/metrics")).text
    for name in [
        "quanta:num_requests_running",
        "quanta:num_requests_waiting",
        "quanta:kv_cache_usage_perc",
        "quanta:prefix_cache_hits_total",
        "quanta:num_preemptions_total",
    ]:
        assert f"\n{name} " in text, name
    for name in [
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "request_queue_time_seconds",
        "e2e_request_latency_seconds",
    ]:
        # labelled by the tenant's name (what a dashboard's reader knows)
        assert re.search(rf'quanta:{name}_count{{class="interactive",tenant="test"}} ', text)


async def test_openapi_describes_the_endpoints(client: AsyncTestClient[Litestar]) -> None:
    doc = (await client.get("/docs/openapi.json")).json()
    paths = doc["paths"]
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/models/{model_id}",
        "/healthz",
        "/readyz",
        "/metrics",
    ]:
        assert path in paths, path
    post = paths["/v1/chat/completions"]["post"]
    assert set(post["responses"]) >= {"200", "400", "404", "413", "503"}
    content = post["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/event-stream"}
    sse = content["text/event-stream"]["schema"]
    assert "ChatCompletionChunk" in sse["$defs"]
    assert "ErrorResponse" in json.dumps(post["responses"]["400"])
    body = json.dumps(post["requestBody"])
    assert "ChatCompletionRequest" in body
