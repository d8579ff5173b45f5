"""The async driver with the fake executor: streams, cancel, crash, stop."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest

from quanta_core.clock import VirtualClock
from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import StepPlan, StepResult
from quanta_core.requests import ChoiceFinished, FinishReason, GenerationRequest, TokenEvent
from quanta_core.scheduler import Driver, Refused, Scheduler, SchedulerConfig
from tests.scheduler_harness import expected_tokens, prompt


def make_driver(
    executor: FakeExecutor | None = None, overlap: bool = False, **config: object
) -> Driver:
    executor = executor or FakeExecutor()
    clock = VirtualClock()
    cfg = SchedulerConfig(check_integrity=True, **config)  # type: ignore[arg-type]
    return Driver(Scheduler(cfg, executor.info, clock), executor, clock, overlap=overlap)


async def test_submit_streams_tokens_then_the_result() -> None:
    driver = make_driver()
    await driver.start()
    handle = driver.submit(GenerationRequest("a", prompt(12), max_tokens=5))
    events = [e async for e in handle]
    want = expected_tokens(prompt(12), 5)
    assert [e.token for e in events if isinstance(e, TokenEvent)] == want
    assert isinstance(events[-1], ChoiceFinished)
    [result] = await handle.results()
    assert result.finish_reason is FinishReason.LENGTH and result.output_tokens == tuple(want)
    await driver.stop(grace_s=1.0)
    stats = driver.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (0, 0, 0.0)


async def test_many_concurrent_requests_with_choices_all_finish_exactly() -> None:
    driver = make_driver(FakeExecutor(n_ctx=256, n_seq_max=6), max_running=4, token_budget=32)
    await driver.start()
    handles = [
        driver.submit(GenerationRequest(f"r{i}", prompt(10 + 7 * i, base=50 * i), 8, n=1 + i % 3))
        for i in range(10)
    ]
    for i, handle in enumerate(handles):
        results = await handle.results()
        assert [r.index for r in results] == list(range(1 + i % 3))
        for r in results:
            assert r.output_tokens == tuple(expected_tokens(prompt(10 + 7 * i, base=50 * i), 8))
    await driver.stop(grace_s=1.0)
    driver.scheduler.check_integrity()
    assert driver.scheduler.kv.stats().active_blocks == 0


async def test_cancel_ends_the_stream_and_frees_the_blocks() -> None:
    driver = make_driver()
    await driver.start()
    handle = driver.submit(GenerationRequest("a", prompt(40), max_tokens=10_000))
    seen = 0
    async for event in handle:
        if isinstance(event, TokenEvent):
            seen += 1
            if seen == 3:
                assert driver.cancel("a")
        else:
            assert event.result.finish_reason is FinishReason.CANCELLED
    [result] = await handle.results()
    assert result.completion_tokens >= 3
    assert not driver.cancel("a")
    await driver.stop(grace_s=1.0)
    assert driver.scheduler.kv.stats().active_blocks == 0
    assert driver.executor.memory_stats().sequences[0].pos_max < 40  # only cache is left


async def test_engine_death_is_invisible_in_the_streams() -> None:
    executor = FakeExecutor(crash_at_step=3)
    driver = make_driver(executor)
    await driver.start()
    handles = [
        driver.submit(GenerationRequest(f"r{i}", prompt(9, base=100 * i), max_tokens=6))
        for i in range(3)
    ]
    for i, handle in enumerate(handles):
        tokens = [e.token async for e in handle if isinstance(e, TokenEvent)]
        assert tokens == expected_tokens(prompt(9, base=100 * i), 6)
    assert executor.restarts == 1
    assert driver.stats().engine_deaths == 1
    await driver.stop(grace_s=1.0)


async def test_stop_rejects_new_requests_and_fails_what_outlives_the_grace() -> None:
    driver = make_driver()
    await driver.start()
    long = driver.submit(GenerationRequest("long", prompt(8), max_tokens=1_000_000))
    async for _ in long:
        break  # it runs
    await driver.stop(grace_s=0.0)
    [result] = await long.results()
    assert result.finish_reason is FinishReason.ERROR and result.error
    with pytest.raises(Refused) as late:
        driver.submit(GenerationRequest("late", prompt(8), max_tokens=1))
    assert late.value.reason == "the server is stopping" and late.value.rejection is None
    assert driver.scheduler.kv.stats().active_blocks == 0


async def test_stop_lets_in_flight_requests_finish_within_the_grace() -> None:
    driver = make_driver()
    await driver.start()
    handle = driver.submit(GenerationRequest("a", prompt(8), max_tokens=20))
    queued = driver.submit(GenerationRequest("q", prompt(8), max_tokens=20))
    async for _ in handle:
        break  # "a" has run a step; "q" too (same step), so both are in flight
    never_ran = driver.submit(GenerationRequest("never", prompt(8), max_tokens=20))
    driver.scheduler.stop_admitting()  # what stop() does first: "never" has not run yet
    await driver.stop(grace_s=30.0)
    assert [r.finish_reason for r in await handle.results()] == [FinishReason.LENGTH]
    assert [r.finish_reason for r in await queued.results()] == [FinishReason.LENGTH]
    [refused] = await never_ran.results()  # queued, then refused: its handle says so
    assert refused.finish_reason is FinishReason.REJECTED
    assert refused.error == "the server is stopping"


async def test_a_duplicate_request_id_is_rejected() -> None:
    driver = make_driver()
    await driver.start()
    first = driver.submit(GenerationRequest("a", prompt(8), max_tokens=3))
    with pytest.raises(Refused) as dup:
        driver.submit(GenerationRequest("a", prompt(8), max_tokens=3))
    assert "already in flight" in dup.value.reason
    [ok] = await first.results()
    assert ok.finish_reason is FinishReason.LENGTH
    await driver.stop(grace_s=1.0)


@dataclass
class GatedExecutor(FakeExecutor):
    """Its step blocks until the event loop opens the gate: a blocked loop would deadlock."""

    gate: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)

    def step(self, plan: StepPlan) -> StepResult:
        self.entered.set()
        if not self.gate.wait(timeout=10):
            raise RuntimeError("the event loop never opened the gate")
        return super().step(plan)


async def test_the_step_runs_off_the_event_loop() -> None:
    executor = GatedExecutor()
    driver = make_driver(executor)
    await driver.start()
    handle = driver.submit(GenerationRequest("a", prompt(8), max_tokens=2))
    while not executor.entered.is_set():
        await asyncio.sleep(0)  # the loop keeps running while the step is in its thread
    executor.gate.set()
    [result] = await handle.results()
    assert result.finish_reason is FinishReason.LENGTH
    await driver.stop(grace_s=1.0)


# ---- overlap: the next step goes out before the streams take the last one's tokens ----


class LoopStepped(FakeExecutor):
    """A fake stepped from the loop, as the real engine is; it notes, at every step sent,
    how many tokens the stream had taken by then."""

    def __init__(self, seen: list[int], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.seen = seen
        self.seen_at_step: list[int] = []

    def start_step(self, plan: StepPlan) -> asyncio.Future[StepResult]:
        self.seen_at_step.append(len(self.seen))
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self.step, plan)  # the loop is free meanwhile


@pytest.mark.parametrize("overlap", [False, True])
async def test_steps_overlap_the_streams_only_when_asked(overlap: bool) -> None:
    tokens: list[int] = []
    executor = LoopStepped(tokens)
    driver = make_driver(executor, overlap=overlap)
    await driver.start()
    handle = driver.submit(GenerationRequest("a", prompt(4), max_tokens=6))
    async for event in handle:
        if isinstance(event, TokenEvent):
            tokens.append(event.token)
    assert tokens == expected_tokens(prompt(4), 6)
    await driver.stop(grace_s=1.0)
    # Step k (k >= 1) decodes the token step k-1 sampled. Without overlap the stream has
    # taken that token before step k is sent; with it, step k is sent first.
    sent = executor.seen_at_step[1:6]
    if overlap:
        assert sent == [0, 1, 2, 3, 4]
    else:
        assert sent == [1, 2, 3, 4, 5]


async def test_overlap_keeps_every_stream_exact_through_cancels_and_a_crash() -> None:
    executor = FakeExecutor(n_ctx=256, n_seq_max=6, crash_at_step=5)
    driver = make_driver(executor, overlap=True, max_running=4, token_budget=32)
    await driver.start()
    handles = [
        driver.submit(GenerationRequest(f"r{i}", prompt(10 + 7 * i, base=50 * i), 8, n=1 + i % 3))
        for i in range(10)
    ]
    victim = driver.submit(GenerationRequest("v", prompt(30), max_tokens=10_000))
    async for event in victim:
        if isinstance(event, TokenEvent):
            driver.cancel("v")
    [cancelled] = await victim.results()
    assert cancelled.finish_reason is FinishReason.CANCELLED
    for i, handle in enumerate(handles):
        for r in await handle.results():
            assert r.output_tokens == tuple(expected_tokens(prompt(10 + 7 * i, base=50 * i), 8))
    await driver.stop(grace_s=1.0)
    driver.scheduler.check_integrity()
    assert driver.scheduler.kv.stats().active_blocks == 0
