"""What the web layer hands the core, and what it gets back.

handle = driver.submit(GenerationRequest(...))
async for event in handle:          # TokenEvent | ChoiceFinished, in order per choice
    ...
results = await handle.results()    # one ChoiceResult per choice, index order
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from quanta_core.engine.types import GREEDY, SamplingParams, TopLogprob


class SloClass(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class FinishReason(StrEnum):
    STOP = "stop"  # end-of-generation token (not emitted as a token)
    LENGTH = "length"  # max_tokens reached, or the context is full
    CANCELLED = "cancelled"  # cancel(request_id): the client left, or a stop string matched
    REJECTED = "rejected"  # admission refused it; ``error`` says why
    ERROR = "error"  # the engine failed it; ``error`` says why


class RejectionKind(StrEnum):
    """Why admission refused a request: the web layer answers 429 or 503 by it."""

    TENANT_OVER_SHARE = "tenant_over_share"  # its tenant's own backlog is in the way (429)
    OVERLOADED = "overloaded"  # the machine cannot meet the class target for anyone (503)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = GREEDY
    n: int = 1  # choices sharing the prompt's KV; choice i has index i
    tenant: str = "default"
    slo_class: SloClass = SloClass.INTERACTIVE
    weight: float = 1.0  # the tenant's share within its class (fairness policies)
    # What predicts the answer's length (quanta_core.predictor): the API key's id and a hash
    # of the prompt's leading instructions (a chat's system message); None: unknown.
    key_id: str | None = None
    prefix_hash: str | None = None
    # Prompts share cached KV only with prompts of the same salt (vLLM's ``cache_salt``):
    # the web layer salts with the tenant, so no tenant learns another's prompts from
    # ``cached_tokens``. None: shared with every unsalted request.
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class TokenEvent:
    request_id: str
    index: int  # which choice
    token: int
    logprob: float | None = None
    top_logprobs: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ChoiceTimings:
    """Seconds on the core's clock; ``None`` where the moment never came."""

    arrival: float
    admitted: float | None = None
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    ttft_estimate_s: float | None = None  # admission's projection of first_token - arrival

    @property
    def queue_s(self) -> float | None:
        """Waiting: arrival until the first step that computed any of its tokens."""
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def prefill_s(self) -> float | None:
        """Working: first step until the first token."""
        if self.first_token is None or self.first_scheduled is None:
            return None
        return self.first_token - self.first_scheduled


@dataclass(frozen=True, slots=True)
class ChoiceResult:
    request_id: str
    index: int
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    completion_tokens: int
    output_tokens: tuple[int, ...]
    timings: ChoiceTimings
    preemptions: int = 0
    error: str | None = None
    token_times: tuple[float, ...] = field(default=(), repr=False)
    # REJECTED by admission (or shed from the queue): why, and when trying again may work
    rejection: RejectionKind | None = None
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class ChoiceFinished:
    """The last event of one choice."""

    result: ChoiceResult
