"""What ``Driver.submit`` returns: an async stream of one request's events and its results."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

from quanta_core.requests import (
    ChoiceFinished,
    ChoiceResult,
    ChoiceTimings,
    FinishReason,
    GenerationRequest,
    TokenEvent,
)

Event = TokenEvent | ChoiceFinished


class RequestHandle:
    """``async for event in handle`` yields ``TokenEvent``s and one ``ChoiceFinished`` per
    choice, in order per choice, and stops after the last choice finished;
    ``await handle.results()`` gives one ``ChoiceResult`` per choice, in index order.
    Both may be used, in any order: the stream buffers what was not read yet.
    """

    def __init__(self, request: GenerationRequest, arrival: float) -> None:
        self.request = request
        self.arrival = arrival
        # A deque and one waiter, not an asyncio.Queue: this is on every token's way.
        self._events: deque[Event] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._results: dict[int, ChoiceResult] = {}
        self._done = asyncio.Event()

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def pending(self) -> bool:
        """Events pushed that the consumer has not taken yet."""
        return bool(self._events)

    def push(self, event: Event) -> None:
        if self.done:
            return  # a late event for a choice already failed by the driver
        if isinstance(event, ChoiceFinished):
            self._results[event.result.index] = event.result
            if len(self._results) == self.request.n:
                self._done.set()
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, reason: FinishReason, error: str, now: float) -> None:
        """Finish every choice that is still open (the driver could not run it)."""
        for index in range(self.request.n):
            if index not in self._results:
                self.push(ChoiceFinished(self._failed_result(index, reason, error, now)))

    def _failed_result(
        self, index: int, reason: FinishReason, error: str, now: float
    ) -> ChoiceResult:
        return ChoiceResult(
            request_id=self.request_id,
            index=index,
            finish_reason=reason,
            prompt_tokens=len(self.request.prompt_tokens),
            cached_tokens=0,
            completion_tokens=0,
            output_tokens=(),
            timings=ChoiceTimings(arrival=self.arrival, finished=now),
            error=error,
        )

    async def __aiter__(self) -> AsyncIterator[Event]:
        finished, n, events = 0, self.request.n, self._events
        while finished < n:
            if not events:
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
                self._waiter = None
            event = events.popleft()
            if isinstance(event, ChoiceFinished):
                finished += 1
            yield event

    async def results(self) -> list[ChoiceResult]:
        await self._done.wait()
        return [self._results[i] for i in range(self.request.n)]
