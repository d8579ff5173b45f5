"""From an OpenAI request to the core's terms: prompt tokens, a token budget, a sampler chain.

Everything here is a pure function of the request and the model's few facts, so it is
tested without a model; every rejection names the parameter at fault.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from app.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseFormat,
)
from app.openai.tools import ToolSetup, chat_messages, template_tools, tool_setup
from app.server.core import Grammars, Tokenizer
from app.server.errors import ContextLengthExceeded, InvalidParameter, UnsupportedParameter
from quanta_core.engine.types import SamplingParams

SEED_MASK = 0xFFFFFFFF  # llama.cpp seeds are 32-bit


@dataclass(frozen=True, slots=True)
class PromptPlan:
    """One OpenAI request in the core's terms."""

    prompt_tokens: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    stops: tuple[str, ...]
    # The leading system messages' hash: what predicts the answer's length (quanta_core.predictor)
    prefix_hash: str | None = None
    tools: ToolSetup | None = None  # the request's tools: its answers are read for calls
    stop_token_ids: frozenset[int] = frozenset()
    answer_prefix: str = ""  # the answer's start, put in the prompt: its text comes first


def system_prompt_hash(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """A short hash of a chat's leading system messages (None: it has none)."""
    head = []
    for m in messages:
        if m["role"] != "system":
            break
        head.append(m["content"])
    if not head:
        return None
    return hashlib.blake2b("\x00".join(head).encode(), digest_size=8).hexdigest()


def check_stream_options(request: ChatCompletionRequest | CompletionRequest) -> None:
    if request.stream_options is not None and not request.stream:
        raise InvalidParameter(
            "stream_options", "stream_options is only allowed when 'stream' is true"
        )


def chat_plan(
    request: ChatCompletionRequest, tokenizer: Tokenizer, grammars: Grammars, n_ctx: int
) -> PromptPlan:
    check_stream_options(request)
    if request.top_logprobs is not None and not request.logprobs:
        raise InvalidParameter("top_logprobs", "top_logprobs requires 'logprobs' to be true")
    setup = tool_setup(
        request.tools, request.tool_choice, request.parallel_tool_calls, tokenizer.chat_template
    )
    messages = chat_messages(request.messages, setup)
    if request.continue_final_message and messages[-1]["role"] != "assistant":
        raise InvalidParameter(
            "continue_final_message", "continue_final_message needs a final assistant message"
        )
    try:
        prompt = tokenizer.encode_chat(
            messages,
            tools=template_tools(setup) if setup is not None else None,
            continue_final_message=request.continue_final_message,
            add_generation_prompt=request.add_generation_prompt,
            extra=request.chat_template_kwargs,
        )
    except ValueError as exc:  # ChatTemplateError: the model's template refused the messages
        raise InvalidParameter("messages", f"the chat template failed: {exc}") from exc
    spec = None if setup is None else setup.grammar(answer_schema(request.response_format))
    answer_prefix = ""
    if spec is not None:
        # An answer that must call starts the same way every time: that start is prompt.
        spec = dataclasses.replace(spec, prefilled=True)
        answer_prefix = spec.prefix()
        prompt += tokenizer.encode(answer_prefix, add_special=False, parse_special=True)
    wanted = request.max_completion_tokens or request.max_tokens
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    plan = _plan(request, prompt, wanted, "messages", logprobs, tokenizer, grammars, n_ctx)
    stop_ids = frozenset(request.stop_token_ids or ())
    if any(t >= tokenizer.n_vocab for t in stop_ids):
        raise InvalidParameter("stop_token_ids", f"token ids must be below {tokenizer.n_vocab}")
    if spec is not None:
        grammar = _compile(lambda: grammars.tool_calls(spec), "tools")
        plan = dataclasses.replace(
            plan, sampling=msgspec.structs.replace(plan.sampling, grammar=grammar)
        )
    return dataclasses.replace(
        plan,
        prefix_hash=system_prompt_hash(messages),
        tools=setup if setup is not None and setup.parses else None,
        stop_token_ids=stop_ids,
        answer_prefix=answer_prefix,
    )


def answer_schema(response_format: ResponseFormat | None) -> str | None:
    """``response_format``'s schema as JSON text (None: free text)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return json.dumps({"type": "object"})
    spec = response_format.json_schema
    if spec is None or not spec.schema_:
        return None  # refused where the grammar is made
    return json.dumps(spec.schema_)


def completion_plan(
    request: CompletionRequest, tokenizer: Tokenizer, grammars: Grammars, n_ctx: int
) -> PromptPlan:
    check_stream_options(request)
    prompt = completion_prompt(request.prompt, tokenizer)
    return _plan(
        request, prompt, request.max_tokens, "prompt", request.logprobs, tokenizer, grammars, n_ctx
    )


def completion_prompt(prompt: str | list[str | int | list[int]], tokenizer: Tokenizer) -> list[int]:
    one: str | list[Any] = prompt
    if isinstance(prompt, list) and not all(isinstance(p, int) for p in prompt):
        if len(prompt) != 1 or isinstance(prompt[0], int):
            raise UnsupportedParameter("prompt", "send one prompt per request, not a batch")
        one = prompt[0]  # type: ignore[assignment]
    if isinstance(one, str):
        tokens = tokenizer.encode(one, add_special=True)
    else:
        tokens = [int(t) for t in one]
        if any(t >= tokenizer.n_vocab for t in tokens):
            raise InvalidParameter("prompt", f"token ids must be below {tokenizer.n_vocab}")
    if not tokens:
        raise InvalidParameter("prompt", "the prompt is empty")
    return tokens


def _plan(
    request: ChatCompletionRequest | CompletionRequest,
    prompt: list[int],
    wanted: int | None,
    prompt_param: str,
    logprobs: int | None,
    tokenizer: Tokenizer,
    grammars: Grammars,
    n_ctx: int,
) -> PromptPlan:
    # No budget given: whatever the context leaves (as vLLM does).
    max_tokens = wanted if wanted is not None else n_ctx - len(prompt)
    if len(prompt) + max(max_tokens, 1) > n_ctx:
        raise ContextLengthExceeded(n_ctx, len(prompt), max(max_tokens, 0), prompt_param)
    if request.min_tokens > max_tokens:
        raise InvalidParameter(
            "min_tokens", f"min_tokens ({request.min_tokens}) exceeds max_tokens ({max_tokens})"
        )
    sampling = SamplingParams(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=max(request.top_k or 0, 0),
        min_p=request.min_p or 0.0,
        repetition_penalty=(
            1.0 if request.repetition_penalty is None else request.repetition_penalty
        ),
        min_tokens=request.min_tokens,
        seed=None if request.seed is None else request.seed & SEED_MASK,
        presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        logit_bias=logit_bias(request.logit_bias, tokenizer.n_vocab),
        grammar=grammar(request.response_format, grammars),
        ignore_eos=request.ignore_eos,
        logprobs=logprobs,
    )
    return PromptPlan(tuple(prompt), max_tokens, sampling, tuple(request.stop_strings()))


def logit_bias(bias: Mapping[str, float] | None, n_vocab: int) -> tuple[tuple[int, float], ...]:
    if not bias:
        return ()
    pairs = []
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidParameter(
                "logit_bias", f"logit_bias keys must be token ids, got {key!r}"
            ) from None
        if not 0 <= token < n_vocab:
            raise InvalidParameter("logit_bias", f"token id {token} is outside [0, {n_vocab})")
        pairs.append((token, float(value)))
    return tuple(sorted(pairs))


def grammar(response_format: ResponseFormat | None, grammars: Grammars) -> str | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return grammars.json_object()
    spec = response_format.json_schema
    if spec is None or not spec.schema_:
        raise InvalidParameter(
            "response_format.json_schema", "json_schema needs a 'json_schema' with a 'schema'"
        )
    return _compile(lambda: grammars.json_schema(spec.schema_), "response_format.json_schema")


def _compile(make: Callable[[], str], param: str) -> str:
    try:
        return make()
    except (ValueError, TypeError, KeyError, NotImplementedError, RecursionError) as exc:
        raise InvalidParameter(param, f"the JSON schema cannot be enforced: {exc}") from exc
