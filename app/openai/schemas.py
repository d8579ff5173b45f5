"""OpenAI's request and response bodies as msgspec structs.

Requests are strict: an unknown field is a 400 naming it, never silently ignored. Beside
OpenAI's fields they take the vLLM extensions that common clients send (guidellm, aiperf,
llm-d's tools): ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos`` and
``stream_options.continuous_usage_stats``; each is honoured. Responses carry one extension,
``quanta`` on a finished choice: the server's split of its latency.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1
PositiveInt = Annotated[int, Meta(ge=1, le=MAX_INT32)]
Seed = Annotated[int, Meta(ge=-(2**63), le=MAX_INT64)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
TopK = Annotated[int, Meta(ge=-1)]  # vLLM: -1 or 0 turn it off
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=10.0)]  # 1 is off; vLLM asks only > 0
StopString = Annotated[str, Meta(min_length=1, max_length=1024)]
Stop = StopString | Annotated[list[StopString], Meta(max_length=16)]
Choices = Annotated[int, Meta(ge=1, le=16)]
TokenId = Annotated[int, Meta(ge=0, le=MAX_INT32)]


class _Request(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


# ---- requests ----


class TextPart(_Request, kw_only=True, tag_field="type", tag="text"):
    text: str


FunctionName = Annotated[str, Meta(pattern="^[a-zA-Z0-9_.-]{1,64}$")]


class ToolCallFunctionIn(_Request, kw_only=True):
    name: str
    arguments: str  # JSON, as the model wrote it


class ToolCallIn(_Request, kw_only=True):
    """A call the assistant made, as the client sends the history back."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunctionIn


class ChatMessageIn(_Request, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's
    tool_call_id: str | None = None  # a tool result's: which call it answers
    refusal: str | None = None  # an assistant's, as the SDKs echo it back

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Request, kw_only=True):
    include_usage: bool = False
    # vLLM's extension: with include_usage, every chunk carries the usage so far.
    continuous_usage_stats: bool = False


class JsonSchemaSpec(_Request, kw_only=True):
    name: str
    schema_: dict[str, Any] = msgspec.field(default_factory=dict, name="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(_Request, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class FunctionDef(_Request, kw_only=True):
    name: FunctionName
    description: str | None = None
    # A JSON schema; its keywords that the grammar cannot enforce are a 400 naming them.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Request, kw_only=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Request, kw_only=True):
    name: str


class NamedToolChoice(_Request, kw_only=True):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class Prediction(_Request, kw_only=True):
    type: Literal["content"]
    content: str | list[TextPart]


class _Sampling(_Request, kw_only=True):
    """The parameters both endpoints share."""

    model: str
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    n: Choices = 1
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: (
        Annotated[dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]], Meta(max_length=1024)]
        | None
    ) = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    # vLLM's extensions
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    # no end-of-generation token before this many
    min_tokens: Annotated[int, Meta(ge=0, le=MAX_INT32)] = 0
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: Annotated[list[ChatMessageIn], Meta(min_length=1)]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: Annotated[list[ToolDef], Meta(min_length=1, max_length=128)] | None = None
    tool_choice: ToolChoice | None = None  # "auto" with tools, else "none"
    parallel_tool_calls: bool | None = None  # true: one or more calls per answer
    # Parameters the SDKs send by default, accepted (docs/api.md says what each does here):
    # honoured:
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=64)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    modalities: list[Literal["text"]] | None = None  # text is all this server makes
    # accepted and ignored: nothing is stored, no tier or reasoning budget to choose, and
    # a predicted output changes only speed, not the answer.
    store: bool | None = None
    metadata: Annotated[dict[str, str], Meta(max_length=16)] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    prediction: Prediction | None = None


# One prompt: text, or token ids; a list of one text or one token-id list is accepted too.
# (msgspec allows one array type per union, so the list's shape is checked in prompt_plan.py.)
Prompt = str | Annotated[list[str | TokenId | list[TokenId]], Meta(min_length=1)]


class CompletionRequest(_Sampling, kw_only=True):
    prompt: Prompt
    max_tokens: PositiveInt = 16
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None


# ---- responses ----


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ServerTiming(msgspec.Struct):
    """Quanta's extension: where one choice's time went on the server (seconds)."""

    queue_s: float | None
    prefill_s: float | None
    e2e_s: float | None
    preemptions: int
    cached_tokens: int
    ttft_estimate_s: float | None = None  # admission's projected time to the first token


class TopLogprobOut(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprobOut]


class ChatLogprobs(msgspec.Struct):
    content: list[TokenLogprob]
    refusal: None = None


class FunctionCallOut(msgspec.Struct):
    name: str
    arguments: str  # JSON


class ToolCallOut(msgspec.Struct):
    id: str
    function: FunctionCallOut
    type: Literal["function"] = "function"


class ChatMessageOut(msgspec.Struct):
    role: Literal["assistant"]
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


FinishReasonOut = Literal["stop", "length", "tool_calls"]


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonOut
    quanta: ServerTiming | UnsetType = UNSET


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class FunctionCallDelta(msgspec.Struct, omit_defaults=True):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionCallDelta | UnsetType = UNSET


class Delta(msgspec.Struct):
    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonOut | None
    quanta: ServerTiming | UnsetType = UNSET


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    system_fingerprint: str | None = None
    usage: Usage | UnsetType | None = UNSET


class CompletionLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReasonOut | None
    quanta: ServerTiming | UnsetType = UNSET


class Completion(msgspec.Struct):
    """Both the whole response and, with ``stream``, each chunk (as OpenAI does)."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: Literal["text_completion"] = "text_completion"
    system_fingerprint: str | None = None
    usage: Usage | UnsetType | None = UNSET


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str
    object: Literal["model"] = "model"
    max_model_len: int | None = None


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    error: ErrorBody


# ---- /tokenize and /detokenize (vLLM's and llama-server's extension) ----


class TokenizeRequest(_Request, kw_only=True):
    """One of ``prompt`` (vLLM), ``content`` (llama-server) or ``messages`` (rendered by
    the model's chat template, as vLLM does)."""

    model: str | None = None
    prompt: str | None = None
    content: str | None = None
    messages: Annotated[list[ChatMessageIn], Meta(min_length=1)] | None = None
    add_special_tokens: bool = True  # vLLM's name
    add_special: bool | None = None  # llama-server's name (wins when given)
    add_generation_prompt: bool = True


class TokenizeResponse(msgspec.Struct):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeRequest(_Request, kw_only=True):
    model: str | None = None
    tokens: Annotated[list[TokenId], Meta(max_length=1_000_000)]


class DetokenizeResponse(msgspec.Struct):
    prompt: str  # vLLM's name
    content: str  # llama-server's name


class ResponseEvent(msgspec.Struct):
    """One event of a streamed response (``event: <type>`` then this as ``data:``): the
    other fields depend on ``type`` (``response.created``, ``response.output_text.delta``,
    ``response.completed``, … as OpenAI's Responses API sends them)."""

    type: str
    sequence_number: int
