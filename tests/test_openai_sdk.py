"""A real ``quanta run`` with the default model, driven by the real openai SDK.

One server process for the module (n_ctx 2048, small max_tokens), so the module stays fast.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from quanta_core.engine.llama_cpp.tokenizer import Tokenizer
from tests.server_process import ServerProcess, running_server

pytestmark = pytest.mark.model

N_CTX = 2048
ASK = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    with running_server("--n-ctx", str(N_CTX), "--threads", "1", "--grace", "5") as proc:
        yield proc


@pytest.fixture(scope="module")
def tok(model_path: Path) -> Iterator[Tokenizer]:
    t = Tokenizer.load(str(model_path))
    yield t
    t.close()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)


@pytest.fixture
def aclient(server: ServerProcess) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)


@pytest.fixture(scope="module")
def model(client: OpenAI) -> str:
    return client.models.list().data[0].id


def metrics(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    found = re.findall(r"^(quanta:[a-z_]+) ([0-9.e+-]+)$", text, re.M)
    return {name: float(value) for name, value in found}


# ---- models and the plain path ----


def test_models_list_and_get(client: OpenAI, model: str) -> None:
    assert model == "SmolLM2-135M-Instruct.Q4_1"
    assert client.models.retrieve(model).id == model


def test_chat_greedy_usage_matches_the_tokens(client: OpenAI, model: str, tok: Tokenizer) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert r.usage is not None
    assert r.usage.prompt_tokens == len(tok.encode_chat(ASK))
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert len(choice.logprobs.content) == 12
    assert "".join(e.token for e in choice.logprobs.content) == choice.message.content
    assert all(len(e.top_logprobs) == 2 for e in choice.logprobs.content)
    extra = choice.model_extra or {}
    assert set(extra["quanta"]) >= {"queue_s", "prefill_s", "preemptions"}


async def test_async_stream_equals_the_whole_answer(aclient: AsyncOpenAI, model: str) -> None:
    whole = await aclient.chat.completions.create(
        model=model, messages=ASK, max_completion_tokens=16, temperature=0
    )
    stream = await aclient.chat.completions.create(
        model=model,
        messages=ASK,
        max_completion_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_sync_stream_of_a_completion(client: OpenAI, model: str) -> None:
    stream = client.completions.create(
        model=model,
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
        stream=True,
        logprobs=1,
    )
    chunks = list(stream)
    whole = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=1
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    lp, usage = whole.choices[0].logprobs, whole.usage
    assert lp is not None and lp.tokens is not None and usage is not None
    assert len(lp.tokens) == usage.completion_tokens


async def test_async_completion(aclient: AsyncOpenAI, model: str) -> None:
    r = await aclient.completions.create(model=model, prompt="1, 2, 3,", max_tokens=6)
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length")


# ---- parameters ----


def test_same_seed_same_text(client: OpenAI, model: str) -> None:
    def sample(seed: int) -> str:
        r = client.chat.completions.create(
            model=model, messages=ASK, max_tokens=16, temperature=1.0, top_p=0.95, seed=seed
        )
        return r.choices[0].message.content or ""

    assert sample(1234) == sample(1234)


def test_n_two_choices_from_one_prompt(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=8,
        n=2,
        temperature=1.0,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage is not None and r.usage.completion_tokens == 16
    stream = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=8, n=2, stream=True
    )
    finished = {c.choices[0].index for c in stream if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_logit_bias_bites(client: OpenAI, model: str, tok: Tokenizer) -> None:
    plain = client.chat.completions.create(model=model, messages=ASK, max_tokens=1, temperature=0)
    first = plain.choices[0].message.content or ""
    banned = tok.encode(first, add_special=False)[0]
    biased = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=1,
        temperature=0,
        logit_bias={str(banned): -100},
        user="someone",
    )
    assert biased.choices[0].message.content != first


def test_presence_and_frequency_penalties_run(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=8,
        temperature=0,
        presence_penalty=1.5,
        frequency_penalty=1.5,
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].finish_reason == "length"


def test_stop_strings_across_chunk_boundaries(client: OpenAI, model: str, tok: Tokenizer) -> None:
    prompt = [{"role": "user", "content": "Write a sentence about the sea."}]
    r = client.chat.completions.create(
        model=model,
        messages=prompt,
        max_tokens=30,
        temperature=0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    tokens = [e.token for e in r.choices[0].logprobs.content]  # type: ignore[union-attr]
    text = "".join(tokens)
    # A stop string made of the end of one token and the start of the next, mid-answer.
    k = next(i for i in range(3, len(tokens) - 1) if len(tokens[i]) >= 2 and tokens[i + 1])
    stop = tokens[k][-2:] + tokens[k + 1][:2]
    expected = text[: text.index(stop)]
    stream = client.chat.completions.create(
        model=model,
        messages=prompt,
        max_tokens=30,
        temperature=0,
        stop=[stop, "@@@"],
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = [c for c in stream if c.choices]
    pieces = [c.choices[0].delta.content or "" for c in chunks]
    assert "".join(pieces) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    whole = client.chat.completions.create(
        model=model,
        messages=prompt,
        max_tokens=30,
        temperature=0,
        stop=stop,
        extra_body={"ignore_eos": True},
    )
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason == "stop"


def test_json_object_mode_parses(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        max_tokens=80,
        temperature=0,
        messages=[{"role": "user", "content": "Give a JSON object with a name and an age."}],
        response_format={"type": "json_object"},
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def test_json_schema_mode_parses_and_matches(client: OpenAI, model: str) -> None:
    schema = {
        "type": "object",
        "properties": {
            "colour": {"type": "string", "enum": ["red", "green", "blue"]},
            "count": {"type": "integer"},
        },
        "required": ["colour", "count"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=model,
        max_tokens=40,
        temperature=0,
        messages=ASK,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    value = json.loads(r.choices[0].message.content or "")
    assert value["colour"] in ("red", "green", "blue") and isinstance(value["count"], int)


def test_prefix_cache_hits_are_reported_as_cached_tokens(client: OpenAI, model: str) -> None:
    long = [{"role": "system", "content": "You are a helpful assistant. " * 12}, *ASK]
    client.chat.completions.create(model=model, messages=long, max_tokens=2)
    again = client.chat.completions.create(model=model, messages=long, max_tokens=2)
    details = again.usage.prompt_tokens_details  # type: ignore[union-attr]
    assert details is not None and details.cached_tokens is not None
    assert details.cached_tokens >= 32  # at least two 16-token blocks of the shared prefix


# ---- disconnects and errors ----


def test_a_disconnect_cancels_the_request_and_frees_its_kv(
    server: ServerProcess, model: str
) -> None:
    body = {
        "model": model,
        "messages": ASK,
        "max_tokens": 1500,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, headers=server.auth
    ) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
        assert metrics(server)["quanta:num_requests_running"] == 1
        assert metrics(server)["quanta:kv_cache_usage_perc"] > 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = metrics(server)
        if m["quanta:num_requests_running"] == 0 and m["quanta:kv_cache_usage_perc"] == 0:
            break
        time.sleep(0.05)
    m = metrics(server)
    assert m["quanta:num_requests_running"] == 0 and m["quanta:kv_cache_usage_perc"] == 0


def test_a_client_that_gives_up_on_a_whole_answer_cancels_it(
    server: ServerProcess, model: str
) -> None:
    body = {"model": model, "messages": ASK, "max_tokens": 1500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=1.0, headers=server.auth)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and metrics(server)["quanta:num_requests_running"]:
        time.sleep(0.05)
    m = metrics(server)
    assert m["quanta:num_requests_running"] == 0 and m["quanta:kv_cache_usage_perc"] == 0


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.body
    assert isinstance(body, dict)
    # The SDK hands over the inner object; curl sees {"error": {...}}.
    return body.get("error", body)  # type: ignore[no-any-return]


def test_unknown_parameter_is_a_400_naming_it(client: OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model, messages=ASK, max_tokens=2, extra_body={"frobnicate": 1}
        )
    error = error_of(info.value)
    assert (error["param"], error["code"]) == ("frobnicate", "unrecognized_argument")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=ASK, tools=[])
    assert error_of(info.value)["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=ASK, temperature=9)
    assert (error_of(info.value)["param"], error_of(info.value)["code"]) == (
        "temperature",
        "invalid_parameter",
    )


def test_context_length_exceeded(client: OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=N_CTX)
    assert error_of(info.value)["code"] == "context_length_exceeded"


async def test_unknown_model_is_404(aclient: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await aclient.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=2)
    assert (error_of(info.value)["code"], error_of(info.value)["param"]) == (
        "model_not_found",
        "model",
    )


def test_oversized_body_is_413(server: ServerProcess, model: str) -> None:
    huge = [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": model, "messages": huge},
        headers=server.auth,
    )
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert r.headers["x-request-id"]


def test_every_response_has_a_request_id(client: OpenAI, model: str) -> None:
    raw = client.chat.completions.with_raw_response.create(model=model, messages=ASK, max_tokens=1)
    assert raw.headers["x-request-id"]
    assert httpx.get(f"{client.base_url}models/none").headers["x-request-id"]


def test_metrics_names(server: ServerProcess) -> None:
    text = httpx.get(f"{server.url}/metrics").text
    for name in [
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prefix_cache_hits_total",
        "num_preemptions_total",
    ]:
        assert f"quanta:{name} " in text
    # labelled by the tenant's name (the server's test tenant)
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert re.search(rf'quanta:{name}_count{{class="interactive",tenant="test-\w+"}}', text)
