"""The prefix cache through the HTTP API, in both KV layouts, with the real engine: a tenant's
cached prompt is a hit for that tenant only (unless the admin shares the cache), and a request
longer than a sequence can hold is a 400 at once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest
from openai import OpenAI

from tests.server_process import ServerProcess, start_server
from tests.tenancy_setup import fresh_db

pytestmark = pytest.mark.model

N_CTX = 2048
LAYOUTS = {
    "one-buffer": {"QUANTA_KV_UNIFIED": "true"},
    # 4 streams of 512 cells: a sequence holds at most 512 tokens
    "stream-per-slot": {"QUANTA_KV_UNIFIED": "false", "QUANTA_N_SEQ_MAX": "4"},
}
SYSTEM = "You are a helpful assistant who answers in one short sentence. " * 6


@dataclass
class Served:
    server: ServerProcess
    a: OpenAI  # tenant a's key
    b: OpenAI  # tenant b's key
    model: str
    max_len: int  # the most tokens one request may hold (the engine's context, or a slot)


def serve(env: dict[str, str]) -> Iterator[Served]:
    db = fresh_db()
    proc = start_server("--n-ctx", str(N_CTX), "--threads", "1", db=db, env=env)
    try:
        proc.wait_ready()
        url = f"{proc.url}/v1"
        a = OpenAI(base_url=url, api_key=proc.api_key, max_retries=0)
        b = OpenAI(base_url=url, api_key=db.create_key("tenant-b"), max_retries=0)
        card = a.models.list().data[0]
        yield Served(proc, a, b, card.id, (card.model_extra or {})["max_model_len"])
    finally:
        assert proc.stop() == 0


@pytest.fixture(scope="module", params=list(LAYOUTS))
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    yield from serve(LAYOUTS[request.param])


def cached(client: OpenAI, model: str, question: str) -> int:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=2)  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return r.usage.prompt_tokens_details.cached_tokens or 0


def test_another_tenant_never_hits_a_tenants_cached_prompt(served: Served) -> None:
    assert cached(served.a, served.model, "What is a cat?") == 0
    # b guesses a's system prompt right: no hit, so b learns nothing of what a sent
    assert cached(served.b, served.model, "What is a dog?") == 0
    # a's own next request shares the cached system prompt (whole 16-token blocks)
    assert cached(served.a, served.model, "What is a cow?") >= 64
    # and b's own cache serves b
    assert cached(served.b, served.model, "What is a hen?") >= 64


def test_an_admin_may_share_the_cache_across_tenants() -> None:
    env = {**LAYOUTS["stream-per-slot"], "QUANTA_PREFIX_CACHE_SHARING": "global"}
    for s in serve(env):
        assert cached(s.a, s.model, "What is a cat?") == 0
        assert cached(s.b, s.model, "What is a dog?") >= 64


def test_a_request_longer_than_a_sequence_holds_is_a_400_at_once(served: Served) -> None:
    client, model, limit = served.a, served.model, served.max_len
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt=[7] * (limit + 1), max_tokens=1)
    assert err.value.code == "context_length_exceeded"
    assert f"maximum context length is {limit} tokens" in err.value.message
    # the prompt fits, but not with the answer asked for
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt=[7] * (limit - 10), max_tokens=11)
    assert err.value.code == "context_length_exceeded"
    # max_tokens omitted: the answer is capped at what the sequence holds
    words = " ".join(["cat"] * (limit - 60))
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": words}],
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.usage is not None and r.usage.prompt_tokens < limit
    assert r.usage.prompt_tokens + r.usage.completion_tokens == limit
    assert r.choices[0].finish_reason == "length"
