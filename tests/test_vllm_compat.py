"""vLLM's client-visible extensions on a real ``quanta run``, through the real openai SDK:
``/health``, the sampling extensions, continuous usage in streams, model aliases, and the
``vllm:*`` gauges beside the ``quanta:*`` ones."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.model

ALIASES = ("smol", "gpt-4o-mini")
ASK = [{"role": "user", "content": "Say hello."}]
REPEAT = "one one one one one one one one one one one"


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    proc = start_server(
        "--n-ctx",
        "2048",
        "--n-seq-max",
        "8",
        "--threads",
        "1",
        "--grace",
        "5",
        env={"QUANTA_SERVED_MODEL_NAMES": ",".join(ALIASES)},
    )
    try:
        health: list[int] = []
        deadline = time.monotonic() + 120
        while (not health or health[-1] != 200) and time.monotonic() < deadline:
            try:  # /health answers 503 until the model is up, then 200
                health.append(httpx.get(f"{proc.url}/health", timeout=1.0).status_code)
            except httpx.TransportError:
                assert proc.process.poll() is None
            time.sleep(0.02)
        assert set(health) <= {200, 503} and health[-1] == 200
        proc.wait_ready()
        yield proc
    finally:
        assert proc.stop() == 0


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)


@pytest.fixture(scope="module")
def model(client: OpenAI) -> str:
    return client.models.list().data[0].id


def chat(client: OpenAI, model: str, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=model, messages=ASK, max_tokens=24, temperature=0, extra_body=extra
    )


def test_health_is_200_when_ready(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_every_alias_is_listed_and_served(client: OpenAI, model: str) -> None:
    assert [m.id for m in client.models.list().data] == [model, *ALIASES]
    plain = chat(client, model)
    for alias in ALIASES:
        assert client.models.retrieve(alias).id == alias
        reply = chat(client, alias)
        assert reply.choices[0].message.content == plain.choices[0].message.content
        assert reply.model == model  # responses name the model by its primary name
    with pytest.raises(openai.NotFoundError):
        chat(client, "not-an-alias")


def test_top_k_and_min_p_of_one_sample_the_greedy_answer(client: OpenAI, model: str) -> None:
    greedy = chat(client, model).choices[0].message.content
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        for seed in (1, 2):
            r = client.chat.completions.create(
                model=model,
                messages=ASK,
                max_tokens=24,
                temperature=1.0,
                seed=seed,
                extra_body=extra,
            )
            assert r.choices[0].message.content == greedy, extra
    # top_k -1 is vLLM's "off", as 0 is
    assert chat(client, model, top_k=-1).choices[0].message.content == greedy


def test_repetition_penalty_changes_a_repetitive_answer(client: OpenAI, model: str) -> None:
    def complete(**extra: Any) -> str:
        r = client.completions.create(
            model=model, prompt=REPEAT, max_tokens=8, temperature=0, extra_body=extra
        )
        return r.choices[0].text

    plain = complete()  # greedy, it repeats itself ("-to-many-to-many")
    assert complete(repetition_penalty=1.0) == plain  # 1 is off
    assert complete(repetition_penalty=1.8) != plain  # a penalty breaks the loop


def test_min_tokens_holds_back_the_end_and_ignore_eos_ignores_it(
    client: OpenAI, model: str
) -> None:
    short = client.chat.completions.create(model=model, messages=ASK, max_tokens=200, temperature=0)
    n = short.usage.completion_tokens
    assert short.choices[0].finish_reason == "stop" and n < 190
    longer = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=n + 20,
        temperature=0,
        extra_body={"min_tokens": n + 6},
    )
    assert longer.usage.completion_tokens >= n + 6
    r = client.completions.create(
        model=model,
        prompt="Hi.",
        max_tokens=n + 10,
        temperature=0,
        extra_body={"min_tokens": n + 4, "ignore_eos": True},
    )
    assert r.usage.completion_tokens == n + 10 and r.choices[0].finish_reason == "length"


def test_min_tokens_above_max_tokens_is_a_400(client: OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, model, min_tokens=25)
    assert err.value.body["param"] == "min_tokens"  # type: ignore[index]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_continuous_usage_puts_the_usage_so_far_on_every_chunk(
    client: OpenAI, model: str, endpoint: str
) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    if endpoint == "chat":
        stream: Any = client.chat.completions.create(
            model=model, messages=ASK, max_tokens=12, stream=True, stream_options=options
        )
    else:
        stream = client.completions.create(
            model=model, prompt="Hello", max_tokens=12, stream=True, stream_options=options
        )
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == chunks[-1].usage.total_tokens - (
        chunks[-1].usage.prompt_tokens
    )
    assert counts[-1] >= 1 and len(set(counts)) > 1  # it grew as the tokens came
    assert chunks[-1].choices == []  # the final usage chunk, as with include_usage alone


def test_continuous_usage_without_include_usage_adds_nothing(client: OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=6,
        stream=True,
        stream_options={"continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
    )
    assert all(c.usage is None for c in stream)


def test_the_extensions_on_both_endpoints_and_unknown_ones_still_refused(
    client: OpenAI, model: str
) -> None:
    extensions = {
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "min_tokens": 2,
        "ignore_eos": False,
    }
    assert chat(client, model, **extensions).usage.completion_tokens >= 2
    r = client.completions.create(model=model, prompt="Hi", max_tokens=4, extra_body=extensions)
    assert r.usage.completion_tokens >= 2
    for bad in ({"best_of_n": 2}, {"stream_options_x": 1}):
        with pytest.raises(openai.BadRequestError) as err:
            chat(client, model, **bad)
        assert err.value.code == "unrecognized_argument"
        assert err.value.body["param"] == next(iter(bad))  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model,
            messages=ASK,
            stream=True,
            stream_options={"include_usage": True, "per_token": True},  # type: ignore[typeddict-unknown-key]
        )
    assert err.value.body["param"] == "stream_options.per_token"  # type: ignore[index]
    for bad_value in ({"top_k": -2}, {"min_p": 1.5}, {"repetition_penalty": 0}):
        with pytest.raises(openai.BadRequestError) as err:
            chat(client, model, **bad_value)
        assert err.value.code == "invalid_parameter"


def gauges(server: ServerProcess) -> dict[str, str]:
    text = httpx.get(f"{server.url}/metrics").text
    found = re.findall(r"^((?:quanta|vllm):[a-z_]+(?:\{[^}]*\})?) (\S+)$", text, re.M)
    # vllm:* gauges carry vLLM's model_name label: named here without it
    return {re.sub(r'\{model_name="[^"]*"\}$', "", k): v for k, v in found}


def test_vllm_gauges_carry_the_quanta_values_under_load(
    server: ServerProcess, client: OpenAI, model: str
) -> None:
    done = threading.Event()

    def load() -> None:
        while not done.is_set():
            client.completions.create(
                model=model, prompt="Count:", max_tokens=48, extra_body={"ignore_eos": True}
            )

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        seen_running = False
        for _ in range(40):
            g = gauges(server)
            for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
                assert g[f"vllm:{name}"] == g[f"quanta:{name}"], name
            seen_running |= float(g["vllm:num_requests_running"]) > 0
            if seen_running and float(g["vllm:kv_cache_usage_perc"]) > 0:
                break
        assert seen_running
    finally:
        done.set()
        for t in threads:
            t.join()
    info = [k for k in gauges(server) if k.startswith("vllm:cache_config_info")]
    # 8 slots of 2048 tokens in blocks of 16 tokens
    assert info == ['vllm:cache_config_info{block_size="16",num_gpu_blocks="1024"}']
