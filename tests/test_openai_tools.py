"""Tools and the Responses API on a real ``quanta run`` with the default model (SmolLM2-135M,
whose template knows no tools: the generic format), parsed by the real openai SDK.

The model's choices do not matter here; the shapes do, and every call must be valid: with
``required`` or a named function the answer is held by the grammar to a call of the schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI

from tests.server_process import ServerProcess, running_server

pytestmark = pytest.mark.model

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": {"get_weather": "The weather in a city", "add": "Adds a and b"}[name],
            "parameters": schema,
            "strict": True,
        },
    }
    for name, schema in SCHEMAS.items()
]
ASK = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    with running_server("--n-ctx", "4096", "--threads", "2", "--grace", "5") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)


@pytest.fixture(scope="module")
def model(client: OpenAI) -> str:
    return client.models.list().data[0].id


def valid_call(call: Any) -> dict[str, Any]:
    """The call's arguments, checked against its function's schema."""
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return dict(arguments)


# ---- chat completions ----


def test_a_named_function_is_called_with_valid_arguments(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=60, seed=1
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    valid_call(calls[0])
    assert choice.message.content is None


def test_a_streamed_call_equals_the_whole_one(client: OpenAI, model: str) -> None:
    ask: dict[str, Any] = {
        "model": model,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 60,
        "seed": 5,
    }
    whole = client.chat.completions.create(**ask)
    with client.chat.completions.stream(**ask) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function and deltas[0].function.name  # id, name first
    assert len(deltas) >= 2  # then the arguments, in pieces
    (streamed,) = final.choices[0].message.tool_calls or []
    (expected,) = whole.choices[0].message.tool_calls or []
    assert streamed.function.name == expected.function.name  # type: ignore[union-attr]
    assert streamed.function.arguments == expected.function.arguments  # type: ignore[union-attr]
    valid_call(streamed)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_parallel_calls_have_their_own_ids_and_indexes(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", n=4, max_tokens=100, seed=3
    )
    many = [c.message.tool_calls for c in r.choices if len(c.message.tool_calls or []) >= 2]
    assert many, [c.message.tool_calls for c in r.choices]
    for calls in many:
        assert calls is not None
        assert len({call.id for call in calls}) == len(calls)
        for call in calls:
            valid_call(call)
    stream = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        n=4,
        max_tokens=100,
        seed=3,
        stream=True,
    )
    indexes: dict[int, set[int]] = {}
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                indexes.setdefault(choice.index, set()).add(delta.index)
    assert any(len(seen) >= 2 for seen in indexes.values())
    assert all(seen == set(range(len(seen))) for seen in indexes.values())


def test_tool_choice_none_answers_in_text(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=30
    )
    message = r.choices[0].message
    assert message.tool_calls is None and isinstance(message.content, str)
    assert "<tool_call>" not in message.content
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_tool_result_turn(client: OpenAI, model: str) -> None:
    first = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=60
    )
    assistant = first.choices[0].message
    (call,) = assistant.tool_calls or []
    history: list[Any] = [
        *ASK,
        assistant.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    second = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, max_tokens=30
    )
    choice = second.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    for made in choice.message.tool_calls or []:
        valid_call(made)


def test_a_hundred_strict_answers_at_temperature_one_all_validate(
    client: OpenAI, model: str
) -> None:
    def sample(seed: int) -> list[Any]:
        r = client.chat.completions.create(
            model=model,
            messages=ASK,
            tools=TOOLS,
            tool_choice=NAMED if seed % 2 else "required",
            parallel_tool_calls=False,
            temperature=1.0,
            n=15,
            max_tokens=40,
            seed=seed,
        )
        return list(r.choices)

    with ThreadPoolExecutor(7) as pool:
        choices = [c for batch in pool.map(sample, range(7)) for c in batch]
    assert len(choices) >= 100
    ended = [c for c in choices if c.finish_reason != "length"]
    assert len(ended) >= 50, [c.finish_reason for c in choices]
    for c in ended:
        assert c.finish_reason == "tool_calls"
        (call,) = c.message.tool_calls
        valid_call(call)
    # Cut short: `length`, and no half call passed on (as a call or as text).
    cut = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice=NAMED, n=4, max_tokens=3
    )
    for c in cut.choices:
        assert c.finish_reason == "length"
        assert c.message.tool_calls is None and not c.message.content


def test_unenforceable_schemas_and_bad_choices_are_400s(client: OpenAI, model: str) -> None:
    ranged = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    bad = [{"type": "function", "function": {"name": "f", "parameters": ranged}}]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=model, messages=ASK, tools=bad, max_tokens=5)
    assert exc.value.body["param"] == "tools"  # type: ignore[index]
    assert "minimum" in exc.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=model,
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert exc.value.body["param"] == "tool_choice"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=model, messages=[*ASK, {"role": "tool", "content": "x"}], tools=TOOLS
        )
    assert exc.value.body["param"] == "messages[1].tool_call_id"  # type: ignore[index]


def test_json_object_ends_within_its_budget(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        response_format={"type": "json_object"},
        n=4,
        temperature=1.0,
        seed=11,
        max_tokens=100,
    )
    for c in r.choices:
        assert "\t" not in (c.message.content or "")  # whitespace is at most one space
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content or ""), dict)


def test_default_client_parameters_are_accepted(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=5,
        store=False,
        metadata={"who": "test"},
        service_tier="auto",
        reasoning_effort="low",
        modalities=["text"],
        prediction={"type": "content", "content": "hello"},
        user="someone",
        extra_body={"chat_template_kwargs": {"x": 1}, "stop_token_ids": [2]},
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=model, messages=ASK, max_tokens=5, extra_body={"frobnicate": 1}
        )
    assert exc.value.body["param"] == "frobnicate"  # type: ignore[index]


def test_continue_final_message(client: OpenAI, model: str) -> None:
    start = "The capital of France is"
    r = client.chat.completions.create(
        model=model,
        messages=[*ASK, {"role": "assistant", "content": start}],
        max_tokens=5,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert not (r.choices[0].message.content or "").startswith("<|im_start|>")


# ---- the Responses API ----


def test_responses_whole_and_streamed(client: OpenAI, model: str) -> None:
    r = client.responses.create(
        model=model, input="Say hi", instructions="Be brief.", max_output_tokens=12
    )
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.usage is not None and r.usage.output_tokens > 0
    assert isinstance(r.output_text, str)
    events = list(
        client.responses.create(model=model, input="Say hi", max_output_tokens=12, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text


def test_responses_function_calls(client: OpenAI, model: str) -> None:
    tools: Any = [
        {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}
    ]
    choice: Any = {"type": "function", "name": "get_weather"}
    r = client.responses.create(
        model=model, input=ASK[0]["content"], tools=tools, tool_choice=choice, max_output_tokens=60
    )
    (call,) = [item for item in r.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    with client.responses.stream(
        model=model, input=ASK[0]["content"], tools=tools, tool_choice=choice, max_output_tokens=60
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    (streamed,) = [item for item in final.output if item.type == "function_call"]
    jsonschema.validate(json.loads(streamed.arguments), WEATHER)
    # the result goes back as an item, and the answer is read
    again = client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": ASK[0]["content"]},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"},
        ],
        tools=tools,
        max_output_tokens=20,
    )
    assert again.status in ("completed", "incomplete")


def test_previous_response_id_continues_a_conversation_per_tenant(
    client: OpenAI, model: str, server: ServerProcess
) -> None:
    first = client.responses.create(model=model, input="My name is Ada.", max_output_tokens=8)
    second = client.responses.create(
        model=model,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=8,
    )
    assert second.previous_response_id == first.id
    # the conversation was carried: the second prompt holds the first turn and its answer
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(second.id).id == second.id
    other = OpenAI(
        base_url=f"{server.url}/v1", api_key=server.db.create_key("other"), max_retries=0
    )
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.create(
            model=model, input="x", previous_response_id=first.id, max_output_tokens=2
        )
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(first.id)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    unstored = client.responses.create(model=model, input="x", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


# ---- the small endpoints ----


def test_model_card_tokenize_and_detokenize(
    client: OpenAI, model: str, server: ServerProcess
) -> None:
    card = client.models.retrieve(model)
    assert (card.model_extra or {})["max_model_len"] == 4096
    r = httpx.post(
        f"{server.url}/tokenize",
        json={"model": model, "prompt": "Hello world"},
        headers=server.auth,
    )
    body = r.json()
    assert r.status_code == 200 and body["count"] == len(body["tokens"]) > 0
    back = httpx.post(
        f"{server.url}/detokenize", json={"tokens": body["tokens"]}, headers=server.auth
    ).json()
    assert back["prompt"].endswith("Hello world") and back["content"] == back["prompt"]
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": ASK}, headers=server.auth).json()
    first = client.chat.completions.create(model=model, messages=ASK, max_tokens=1)
    assert first.usage is not None and chat["count"] == first.usage.prompt_tokens
    assert httpx.post(f"{server.url}/tokenize", json={"prompt": "x"}).status_code == 401
