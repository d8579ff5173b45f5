"""From OpenAI requests to the core's terms, and every rejection naming its param (no model)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from app.openai.prompt_plan import chat_plan, completion_plan
from app.openai.schemas import ChatCompletionRequest, CompletionRequest
from app.server.errors import ApiError, ContextLengthExceeded
from tests.fakes import ByteTokenizer, FakeGrammars

TOK, GRAMMARS = ByteTokenizer(), FakeGrammars()
MSGS = [{"role": "user", "content": "hi"}]


def chat(n_ctx: int = 512, **fields: Any) -> Any:
    request = msgspec.convert({"model": "m", "messages": MSGS, **fields}, ChatCompletionRequest)
    return chat_plan(request, TOK, GRAMMARS, n_ctx)


def completion(n_ctx: int = 512, **fields: Any) -> Any:
    request = msgspec.convert({"model": "m", "prompt": "hi", **fields}, CompletionRequest)
    return completion_plan(request, TOK, GRAMMARS, n_ctx)


def rejected(make: Any, **fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        make(**fields)
    return info.value


def test_every_sampling_parameter_reaches_the_sampler_chain() -> None:
    plan = chat(
        temperature=0.7,
        top_p=0.9,
        seed=7,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias={"65": 5, "66": -100},
        ignore_eos=True,
        logprobs=True,
        top_logprobs=3,
        stop=["x", "yz"],
        max_completion_tokens=9,
        user="u1",
    )
    s = plan.sampling
    assert (s.temperature, s.top_p, s.seed) == (0.7, 0.9, 7)
    assert (s.presence_penalty, s.frequency_penalty) == (0.5, -0.5)
    assert s.logit_bias == ((65, 5.0), (66, -100.0))
    assert (s.ignore_eos, s.logprobs, s.grammar) == (True, 3, None)
    assert (plan.stops, plan.max_tokens) == (("x", "yz"), 9)
    assert plan.prompt_tokens == tuple(TOK.encode_chat(MSGS))


def test_defaults_are_openais() -> None:
    plan = chat()
    assert (plan.sampling.temperature, plan.sampling.top_p, plan.sampling.logprobs) == (
        1.0,
        1.0,
        None,
    )
    assert plan.max_tokens == 512 - len(plan.prompt_tokens)  # the rest of the context
    assert completion().max_tokens == 16


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert chat(max_tokens=5, max_completion_tokens=7).max_tokens == 7
    assert chat(max_tokens=5).max_tokens == 5


def test_stop_may_be_one_string() -> None:
    assert chat(stop="\n").stops == ("\n",)


def test_logprobs_mapping() -> None:
    assert chat(logprobs=True).sampling.logprobs == 0
    assert completion(logprobs=2).sampling.logprobs == 2
    assert completion(logprobs=0).sampling.logprobs == 0


def test_response_formats_become_grammars() -> None:
    assert chat(response_format={"type": "text"}).sampling.grammar is None
    assert chat(response_format={"type": "json_object"}).sampling.grammar == "root ::= object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert "integer" in (chat(response_format=fmt).sampling.grammar or "")


def test_a_schema_the_converter_refuses_is_a_400_on_json_schema() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}
    assert rejected(chat, response_format=fmt).param == "response_format.json_schema"
    assert rejected(chat, response_format={"type": "json_schema"}).param == (
        "response_format.json_schema"
    )


def test_prompt_plus_max_tokens_over_the_context_is_context_length_exceeded() -> None:
    error = rejected(chat, n_ctx=64, max_tokens=60)
    assert isinstance(error, ContextLengthExceeded)
    assert (error.status_code, error.code, error.param) == (
        400,
        "context_length_exceeded",
        "messages",
    )
    assert rejected(completion, n_ctx=64, prompt="x" * 64).code == "context_length_exceeded"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"999": 1}}, "logit_bias"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_invalid_values_name_their_param(fields: dict[str, Any], param: str) -> None:
    error = rejected(chat, **fields)
    assert (error.status_code, error.param) == (400, param)


def test_a_template_that_refuses_the_messages_is_a_400_on_messages() -> None:
    request = msgspec.convert(
        {"model": "m", "messages": [{"role": "assistant", "content": "RAISE"}]},
        ChatCompletionRequest,
    )
    with pytest.raises(ApiError) as info:
        chat_plan(request, TOK, GRAMMARS, 512)
    assert info.value.param == "messages"


def test_completion_prompts() -> None:
    assert completion(prompt=[1, 2, 3]).prompt_tokens == (1, 2, 3)
    assert completion(prompt=["ab"]).prompt_tokens == (97, 98)
    assert completion(prompt=[[5, 6]]).prompt_tokens == (5, 6)
    assert rejected(completion, prompt=["a", "b"]).code == "unsupported_parameter"
    assert rejected(completion, prompt=[300]).param == "prompt"
    assert rejected(completion, prompt="").param == "prompt"


def test_seeds_are_folded_into_32_bits() -> None:
    assert chat(seed=-1).sampling.seed == 0xFFFFFFFF


def test_vllm_extensions_reach_the_sampler_chain() -> None:
    for make in (chat, completion):
        s = make(top_k=40, min_p=0.05, repetition_penalty=1.3, min_tokens=4, max_tokens=8).sampling
        assert (s.top_k, s.min_p, s.repetition_penalty, s.min_tokens) == (40, 0.05, 1.3, 4)
    off = chat(top_k=-1).sampling  # vLLM's "off"
    assert (off.top_k, off.min_p, off.repetition_penalty, off.min_tokens) == (0, 0.0, 1.0, 0)


def test_min_tokens_above_the_budget_is_rejected() -> None:
    assert rejected(completion, min_tokens=17).param == "min_tokens"  # max_tokens is 16
    assert completion(min_tokens=16).sampling.min_tokens == 16
