"""One choice of a generation request, as the scheduler tracks it.

A ``GenerationRequest`` with ``n`` choices becomes ``n`` ``Choice`` objects, one sequence each.
Its tokens grow in one list; the engine holds the first ``num_computed_tokens`` of them:

    tokens       [p p p p p p | o o o]       prompt_len = 6, 3 output tokens
    computed     [x x x x x x   x x]         num_computed_tokens = 8: the last token is next
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import msgspec

from quanta_core.engine.types import SamplingParams, SeqOutput, TopLogprob
from quanta_core.kv.prefix_cache import BlockChain, root_hash
from quanta_core.requests import (
    ChoiceResult,
    ChoiceTimings,
    FinishReason,
    GenerationRequest,
    RejectionKind,
    SloClass,
)


class ChoiceStatus(Enum):
    BLOCKED = "blocked"  # choice i > 0 waits for choice 0's prompt to be computed
    WAITING = "waiting"  # in the queue, never ran
    RUNNING = "running"  # holds a sequence id
    PREEMPTED = "preempted"  # back in the queue: stashed (``stash_key``) or to recompute
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Choice:
    request_id: str
    index: int
    tokens: list[int]
    prompt_len: int
    max_tokens: int
    sampling: SamplingParams
    tenant: str
    slo_class: SloClass
    weight: float
    arrival: float
    order: int  # submission order, the tie-breaker of every queue
    key_id: str | None = None  # what predicts its length (GenerationRequest)
    prefix_hash: str | None = None
    length_keys: tuple[str, ...] = ()  # the length predictor's keys for it, once computed
    status: ChoiceStatus = ChoiceStatus.WAITING
    num_computed_tokens: int = 0
    seq: int | None = None
    parent: Choice | None = None  # choice 0, for choices i > 0
    siblings_blocked: list[Choice] = field(default_factory=list)  # choice 0's, until prompt done
    # preemption and recovery
    stash_key: str | None = None
    stash_tokens: int = 0
    restored_key: str | None = None  # the stash restored by the plan in flight
    needs_replay: bool = False  # the worker's sampler is gone: replay outputs on next sample
    has_sampler: bool = False
    engine_deaths: int = 0
    preemptions: int = 0
    # outcome
    eog_tokens: int = 0  # an end-of-generation token counted but not emitted
    logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[tuple[TopLogprob, ...]] = field(default_factory=list)
    cached_tokens: int | None = None  # set at first admission
    finish_reason: FinishReason | None = None
    error: str | None = None
    rejection: RejectionKind | None = None
    retry_after_s: float | None = None
    # fairness: prompt tokens charged so far (a recompute is not charged twice)
    charged_input: int = 0
    # admission's projected seconds from arrival to the first token (None: no projection)
    ttft_estimate: float | None = None
    # timestamps on the core's clock
    admitted: float | None = None
    first_scheduled: float | None = None
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    preempted_at: list[float] = field(default_factory=list)
    resumed_at: list[float] = field(default_factory=list)
    # its tokens' block hashes, computed once (a restore or recompute hashes nothing again)
    block_chain: BlockChain = field(default_factory=BlockChain)
    # the waiting queue's lazy-deletion stamp
    queue_stamp: int = 0
    owner: str = ""  # the worker's name for this choice's sampler chain: "request_id/index"

    def __post_init__(self) -> None:
        self.owner = f"{self.request_id}/{self.index}"

    @classmethod
    def choices_of(cls, req: GenerationRequest, arrival: float, order: int) -> list[Choice]:
        root = root_hash(req.cache_salt)
        choices = [
            cls(
                request_id=req.request_id,
                index=i,
                tokens=list(req.prompt_tokens),
                prompt_len=len(req.prompt_tokens),
                max_tokens=req.max_tokens,
                sampling=_choice_sampling(req.sampling, i),
                tenant=req.tenant,
                slo_class=req.slo_class,
                weight=req.weight,
                arrival=arrival,
                order=order,
                key_id=req.key_id,
                prefix_hash=req.prefix_hash,
                block_chain=BlockChain(root=root),
            )
            for i in range(req.n)
        ]
        for sibling in choices[1:]:
            sibling.parent = choices[0]
            sibling.status = ChoiceStatus.BLOCKED
        choices[0].siblings_blocked = choices[1:]
        return choices

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def is_finished(self) -> bool:
        return self.status is ChoiceStatus.FINISHED

    def charge_input(self, start: int, end: int) -> int:
        """How many prompt tokens a step computing ``[start, end)`` computed for the first
        time (a prefix-cache hit was never computed; a recompute was, before)."""
        if self.charged_input >= self.prompt_len:
            return 0  # all charged already: a decode step, the common case
        end = min(end, self.prompt_len)
        new = max(end - max(start, self.charged_input), 0)
        self.charged_input = max(self.charged_input, end)
        return new

    def append_output(self, out: SeqOutput, now: float) -> None:
        self.tokens.append(out.token)
        self.token_times.append(now)
        if self.sampling.logprobs is not None:
            self.logprobs.append(out.logprob)
            self.top_logprobs.append(out.top_logprobs)

    def result(self) -> ChoiceResult:
        if self.finish_reason is None:
            raise RuntimeError(f"{self.owner} has no result: it is {self.status.value}")
        return ChoiceResult(
            request_id=self.request_id,
            index=self.index,
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_len,
            cached_tokens=self.cached_tokens or 0,
            # vLLM's count: the end-of-generation token is counted, never emitted.
            completion_tokens=self.num_output + self.eog_tokens,
            output_tokens=tuple(self.output),
            timings=ChoiceTimings(
                arrival=self.arrival,
                admitted=self.admitted,
                first_scheduled=self.first_scheduled,
                first_token=self.first_token,
                finished=self.finished,
                ttft_estimate_s=self.ttft_estimate,
            ),
            preemptions=self.preemptions,
            error=self.error,
            token_times=tuple(self.token_times),
            rejection=self.rejection,
            retry_after_s=self.retry_after_s,
        )


def _choice_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """Choice ``i`` of a seeded request draws with ``seed + i``: the same request repeats
    exactly, and its choices still differ from each other."""
    if sampling.seed is None or index == 0:
        return sampling
    return msgspec.structs.replace(sampling, seed=(sampling.seed + index) & 0xFFFFFFFF)
