"""One request's run through the core, as a sequence of per-choice updates.

    start()    submit: queued, or the refusal raised as an ApiError (429/503, retry-after)
    updates()  TokenEvent ─▶ ChoiceText (detokenize, stop strings, logprobs) ─▶ Update(text)
               ChoiceFinished ──────────────────────────────────────────────▶ Update(finish)

A stop string ends its choice at once for the client; the core's request is cancelled when
every choice has stopped or finished (the core cancels a request, not a choice). Leaving the
iteration early (a client gone, an error) cancels the request and frees its KV. A token its
tenant's quota has no room for (``Meter.allows``) ends every choice there with "length".

Billing is the tenancy's (``app/tenancy/meter.py``); a generation only reports to its meter,
and keeps no account of its own:

    running(run)       at the start and whenever a choice ends (or the run is refused):
                       the run's status, prompt, cached tokens and timings
    mark_sent()        just before a write (a stream's event, the whole response): the
                       output tokens the client holds once it lands (``Meter.sending``)

Whether the write reached the client is the tenancy middleware's to tell the meter.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from app.openai.choices import ChoiceText, Piece, ToolCall
from app.openai.prompt_plan import PromptPlan
from app.openai.schemas import PromptTokensDetails, ServerTiming, Usage
from app.openai.stop import StopMatcher
from app.server.context import RequestContext
from app.server.core import Core, Handle
from app.server.errors import ApiError, GenerationFailed, Overloaded, RateLimited
from app.server.metrics import Metrics
from app.tenancy.meter import Meter, Run
from quanta_core.requests import (
    ChoiceResult,
    ChoiceTimings,
    FinishReason,
    GenerationRequest,
    RejectionKind,
    TokenEvent,
)
from quanta_core.scheduler.admission import Refused

Finish = Literal["stop", "length", "tool_calls"]
_WHOLE = (FinishReason.STOP, FinishReason.LENGTH)


@dataclass(frozen=True, slots=True)
class Update:
    index: int
    piece: Piece
    finish_reason: Finish | None = None
    timing: ServerTiming | None = None
    tool_calls: tuple[ToolCall, ...] = ()


def core_request(core: Core, plan: PromptPlan, n: int, ctx: RequestContext) -> GenerationRequest:
    """What the core is asked to run for ``plan``: ``n`` choices, for ``ctx``'s tenant."""
    return GenerationRequest(
        request_id=ctx.request_id,
        prompt_tokens=plan.prompt_tokens,
        max_tokens=plan.max_tokens,
        sampling=plan.sampling,
        n=n,
        tenant=ctx.tenant,
        slo_class=ctx.slo_class,
        weight=ctx.weight,
        key_id=ctx.key_id,
        prefix_hash=plan.prefix_hash,
        cache_salt=ctx.tenant if core.prefix_cache_per_tenant else None,
    )


class Generation:
    def __init__(
        self,
        core: Core,
        plan: PromptPlan,
        request: GenerationRequest,
        ctx: RequestContext,
        metrics: Metrics,
        meter: Meter | None,
        *,
        logprobs: bool,
    ) -> None:
        self._core = core
        self._ctx = ctx
        self._metrics = metrics
        self._meter = meter  # None: nothing is metered (no quotas)
        self.prompt_tokens = len(plan.prompt_tokens)
        n = request.n
        self._choices = [
            ChoiceText(
                core.tokenizer.detokenizer(),
                StopMatcher(plan.stops),
                core.tokenizer,
                logprobs,
                plan.stop_token_ids,
            )
            for _ in range(n)
        ]
        self._results: dict[int, ChoiceResult] = {}
        self._handle: Handle | None = None
        self._refused = False
        self._cancelled = False
        self._produced = 0
        self._request = request
        if meter is not None:
            meter.running(Run(prompt_tokens=self.prompt_tokens))

    @property
    def request(self) -> GenerationRequest:
        return self._request

    @property
    def finished(self) -> bool:
        return len(self._results) == len(self._choices)

    def start(self) -> None:
        """Submit the request: queued or started, or the refusal raised as an ``ApiError``."""
        try:
            self._handle = self._core.driver.submit(self._request)
        except Refused as refused:
            self._refused = True
            self._report()
            raise _refusal(refused) from None

    async def updates(self) -> AsyncIterator[Update]:
        if self._handle is None:
            raise RuntimeError("updates() before start()")
        try:
            async for event in self._handle:
                if isinstance(event, TokenEvent):
                    choice = self._choices[event.index]
                    if choice.stopped:
                        continue
                    meter = self._meter
                    if meter is not None and not meter.allows(self._produced + 1):
                        for update in self._out_of_quota():
                            yield update
                        return
                    self._produced += 1
                    piece = choice.push(event)
                    if choice.stopped:
                        self._cancel_when_all_stopped()
                    if piece.text or piece.logprobs:
                        yield Update(event.index, piece)
                else:
                    yield self._finish(event.result)
        finally:
            if not self.finished:
                self.cancel()

    def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            self._core.driver.cancel(self._ctx.request_id)

    def mark_sent(self) -> None:
        """Everything released so far is being written to the client now."""
        if self._meter is not None:
            self._meter.sending(sum(self._sent_tokens(i) for i in range(len(self._choices))))

    def _sent_tokens(self, index: int) -> int:
        """A choice's output tokens the client has: all of them once it ended whole (its
        end token too, which is charged though never shown), else those released."""
        choice, result = self._choices[index], self._results.get(index)
        if choice.stopped or (result is not None and result.finish_reason in _WHOLE):
            return self._completion_tokens(index)
        return choice.released

    def _report(self) -> None:
        """Tell the meter what the run is now (its results changed)."""
        if self._meter is None:
            return
        reasons = {r.finish_reason for r in self._results.values()}
        if self._refused or FinishReason.REJECTED in reasons:
            status = "rejected"
        elif FinishReason.ERROR in reasons:
            status = "error"
        else:
            status = "completed" if self.finished else "cancelled"
        timings = [r.timings for r in self._results.values()]
        queue = [t.queue_s for t in timings if t.queue_s is not None]
        ttft = [t.first_token - t.arrival for t in timings if t.first_token is not None]
        self._meter.running(
            Run(
                status,
                self.prompt_tokens,
                max((r.cached_tokens for r in self._results.values()), default=0),
                min(queue, default=None),
                min(ttft, default=None),
            )
        )

    def usage(self) -> Usage:
        completion = sum(self._completion_tokens(i) for i in range(len(self._choices)))
        cached = max((r.cached_tokens for r in self._results.values()), default=0)
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion,
            total_tokens=self.prompt_tokens + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )

    def _completion_tokens(self, index: int) -> int:
        choice, result = self._choices[index], self._results.get(index)
        if choice.stopped or result is None:
            return choice.n_tokens
        return result.completion_tokens

    def _cancel_when_all_stopped(self) -> None:
        if all(c.stopped or i in self._results for i, c in enumerate(self._choices)):
            self.cancel()

    def _out_of_quota(self) -> list[Update]:
        """End every running choice here, as if it had reached max_tokens."""
        self.cancel()
        updates = []
        for index, choice in enumerate(self._choices):
            if index in self._results:
                continue
            self._results[index] = ChoiceResult(
                self._ctx.request_id,
                index,
                FinishReason.LENGTH,
                self.prompt_tokens,
                0,
                choice.n_tokens,
                (),
                ChoiceTimings(arrival=0.0),
            )
            if choice.stopped:
                continue
            updates.append(Update(index, choice.finish(), "length"))
        self._report()
        return updates

    def _finish(self, result: ChoiceResult) -> Update:
        self._results[result.index] = result
        self._report()
        self._metrics.observe(result, self._ctx.tenant, self._ctx.slo_class.value)
        if self._ctx.record is not None:
            self._ctx.record.finished(result)
        choice = self._choices[result.index]
        reason: Finish
        if choice.stopped:
            reason, piece = "stop", Piece("", ())
        elif result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            piece = choice.finish()
            reason = "stop" if choice.stopped else result.finish_reason.value  # type: ignore[assignment]
        else:
            raise _failure(result)
        return Update(result.index, piece, reason, _timing(result))


def _timing(result: ChoiceResult) -> ServerTiming:
    t = result.timings
    return ServerTiming(
        queue_s=t.queue_s,
        prefill_s=t.prefill_s,
        e2e_s=None if t.finished is None else t.finished - t.arrival,
        preemptions=result.preemptions,
        cached_tokens=result.cached_tokens,
        ttft_estimate_s=t.ttft_estimate_s,
    )


def _failure(result: ChoiceResult) -> ApiError:
    why = result.error or result.finish_reason.value
    if result.finish_reason is FinishReason.REJECTED:  # shed from the queue
        return _refusal(Refused(why, result.rejection, result.retry_after_s))
    if result.finish_reason is FinishReason.CANCELLED:
        return Overloaded(f"the request was cancelled by the server: {why}")
    return GenerationFailed(f"generation failed: {why}")


def _refusal(refused: Refused) -> ApiError:
    """Admission's refusal: 429 when the tenant is over its share, else 503; both carry the
    scheduler's estimate of when trying again may work."""
    message = f"the request was not admitted: {refused.reason}"
    if refused.retry_after_s is None:
        return Overloaded(message)
    headers = {
        "retry-after": str(max(1, math.ceil(refused.retry_after_s))),
        "retry-after-ms": str(max(1, math.ceil(refused.retry_after_s * 1000))),
    }
    if refused.rejection is RejectionKind.TENANT_OVER_SHARE:
        return RateLimited(message, kind="requests", code="rate_limit_exceeded", headers=headers)
    error = Overloaded(message)
    error.headers.update(headers)
    return error
