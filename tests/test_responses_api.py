"""``/v1/responses`` and tools on the real app with the scripted fake core (no model): the
stored conversation per tenant, the event sequence, and calls read out of the answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.server.app import create_app
from tests.fakes import MODEL, FakeDriver, fake_core
from tests.tenancy_setup import TenancyDb, bearer, fresh_db

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
TOOL = {
    "type": "function",
    "name": "add",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
Client = AsyncTestClient[Litestar]


@pytest.fixture
def db(tmp_path: Path) -> TenancyDb:
    return fresh_db(tmp_path)


@pytest.fixture
def driver() -> FakeDriver:
    return FakeDriver(script=["Hello there"])


@pytest.fixture
async def client(db: TenancyDb, driver: FakeDriver) -> AsyncIterator[Client]:
    app = create_app(db.settings(), core_factory=lambda _: fake_core(driver, n_ctx=8192))
    async with AsyncTestClient(app) as c:
        for _ in range(200):
            if (await c.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        yield c


def prompt_of(driver: FakeDriver) -> str:
    return bytes(driver.submitted[-1].prompt_tokens).decode()


async def test_a_conversation_continues_for_its_tenant_only(
    client: Client, db: TenancyDb, driver: FakeDriver
) -> None:
    key, other = db.create_key("acme"), db.create_key("globex")
    first = await client.post(
        "/v1/responses", json={"model": MODEL, "input": "I am Ada."}, headers=bearer(key)
    )
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["status"] == "completed" and body["output"][0]["type"] == "message"
    assert body["output"][0]["content"][0]["text"] == "Hello there"
    ask = {"model": MODEL, "input": "Who am I?", "previous_response_id": body["id"]}
    second = await client.post(
        "/v1/responses", json={**ask, "instructions": "Be kind."}, headers=bearer(key)
    )
    assert second.status_code == 200
    prompt = prompt_of(driver)
    assert prompt.index("Be kind.") < prompt.index("I am Ada.") < prompt.index("Hello there")
    assert prompt.index("Hello there") < prompt.index("Who am I?")
    for r in (
        await client.post("/v1/responses", json=ask, headers=bearer(other)),
        await client.get(f"/v1/responses/{body['id']}", headers=bearer(other)),
        await client.delete(f"/v1/responses/{body['id']}", headers=bearer(other)),
    ):
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "response_not_found"
    got = await client.get(f"/v1/responses/{body['id']}", headers=bearer(key))
    assert got.json() == body
    gone = await client.delete(f"/v1/responses/{body['id']}", headers=bearer(key))
    assert gone.json() == {"id": body["id"], "object": "response", "deleted": True}
    assert (await client.get(f"/v1/responses/{body['id']}", headers=bearer(key))).status_code == 404
    unstored = await client.post(
        "/v1/responses", json={"model": MODEL, "input": "x", "store": False}, headers=bearer(key)
    )
    r = await client.get(f"/v1/responses/{unstored.json()['id']}", headers=bearer(key))
    assert r.status_code == 404


async def events(client: Client, key: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    async with client.stream(
        "POST", "/v1/responses", json={**body, "stream": True}, headers=bearer(key)
    ) as r:
        assert r.status_code == 200
        kind = None
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["type"] == kind
                out.append(event)
    return out


async def test_a_streamed_response_with_text_and_a_call(
    client: Client, db: TenancyDb, driver: FakeDriver
) -> None:
    key = db.create_key("acme")
    driver.script = ["Sure. " + CALL]
    sent = await events(client, key, {"model": MODEL, "input": "Add.", "tools": [TOOL]})
    assert [e["type"] for e in sent] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len("Sure. "),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    final = sent[-1]["response"]
    message, call = final["output"]
    assert message["content"][0]["text"] == "Sure. "
    assert (call["name"], json.loads(call["arguments"])) == ("add", {"a": 1, "b": 2})
    assert call["call_id"].startswith("call_") and final["usage"]["output_tokens"] > 0
    # the call's result goes back as an item, and is shown to the model as a tool result
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Add."}]},
        {**call, "id": "fc_1"},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "3"},
    ]
    r = await client.post(
        "/v1/responses", json={"model": MODEL, "input": items, "tools": [TOOL]}, headers=bearer(key)
    )
    assert r.status_code == 200, r.text
    assert "<tool_response>\n3\n</tool_response>" in prompt_of(driver)


async def test_a_cut_response_is_incomplete(
    client: Client, db: TenancyDb, driver: FakeDriver
) -> None:
    key = db.create_key("acme")
    body = {"model": MODEL, "input": "x", "max_output_tokens": 3}
    r = await client.post("/v1/responses", json=body, headers=bearer(key))
    assert r.json()["status"] == "incomplete"
    assert r.json()["incomplete_details"] == {"reason": "max_output_tokens"}
    sent = await events(client, key, body)
    assert sent[-1]["type"] == "response.incomplete"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, None),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
        ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ],
)
async def test_bad_requests_are_4xx_naming_the_parameter(
    client: Client, db: TenancyDb, body: dict[str, Any], param: str | None
) -> None:
    key = db.create_key("acme")
    r = await client.post("/v1/responses", json={"model": MODEL, **body}, headers=bearer(key))
    assert r.status_code in (400, 404), r.text
    if param is not None:
        assert r.json()["error"]["param"] == param


async def test_chat_tool_calls_stream_as_openai_streams_them(
    client: Client, db: TenancyDb, driver: FakeDriver
) -> None:
    key = db.create_key("acme")
    driver.script = [CALL + "\n" + CALL.replace('"a": 1', '"a": 7')]
    tools = [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Add."}], "tools": tools}
    whole = (await client.post("/v1/chat/completions", json=body, headers=bearer(key))).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [
        json.loads(c["function"]["arguments"])["a"] for c in choice["message"]["tool_calls"]
    ] == [
        1,
        7,
    ]
    deltas = []
    async with client.stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=bearer(key)
    ) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                for c in chunk["choices"]:
                    deltas.extend(c["delta"].get("tool_calls", []))
                    finish = c["finish_reason"] or None
    assert finish == "tool_calls"
    assert [d["index"] for d in deltas] == [0, 0, 1, 1]
    assert deltas[0]["id"].startswith("call_") and deltas[0]["function"]["name"] == "add"
    assert "id" not in deltas[1] and json.loads(deltas[1]["function"]["arguments"])["a"] == 1


async def test_stop_token_ids_end_a_choice(
    client: Client, db: TenancyDb, driver: FakeDriver
) -> None:
    key = db.create_key("acme")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "stop_token_ids": [ord("t")],
    }
    r = await client.post("/v1/chat/completions", json=body, headers=bearer(key))
    choice = r.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("Hello ", "stop")


async def test_tokenize_and_detokenize(client: Client, db: TenancyDb) -> None:
    key = db.create_key("acme")
    r = await client.post("/tokenize", json={"content": "hi"}, headers=bearer(key))
    assert r.json() == {"tokens": [104, 105], "count": 2, "max_model_len": 8192}
    r = await client.post("/detokenize", json={"tokens": [104, 105]}, headers=bearer(key))
    assert r.json() == {"prompt": "hi", "content": "hi"}
    r = await client.post("/detokenize", json={"tokens": [300]}, headers=bearer(key))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    r = await client.post("/tokenize", json={"prompt": "a", "content": "b"}, headers=bearer(key))
    assert r.status_code == 400
