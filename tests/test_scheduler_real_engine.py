"""The scheduler core driving the real engine: prefix sharing, n choices, a killed worker."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quanta_core.clock import WallClock
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor
from quanta_core.engine.llama_cpp.tokenizer import Tokenizer
from quanta_core.engine.types import (
    CopyPrefix,
    EngineInfo,
    MemoryStats,
    SamplingParams,
    StepPlan,
    StepResult,
    Truncate,
)
from quanta_core.requests import ChoiceResult, FinishReason, GenerationRequest
from quanta_core.scheduler import Driver, Scheduler, SchedulerConfig

pytestmark = pytest.mark.model

SYSTEM = (
    "You are a careful assistant. You answer in one short sentence, you never invent facts, "
    "and when you do not know something you say so plainly.\n"
)


@dataclass
class Recording:
    """The real executor, with every plan it ran kept, and an optional kill before step k."""

    inner: LlamaCppExecutor
    plans: list[StepPlan] = field(default_factory=list)
    kill_before_step: int | None = None

    @property
    def info(self) -> EngineInfo:
        return self.inner.info

    def step(self, plan: StepPlan) -> StepResult:
        if self.kill_before_step == len(self.plans) and self.inner.pid is not None:
            self.kill_before_step = None
            os.kill(self.inner.pid, signal.SIGKILL)
            os.waitpid(self.inner.pid, 0)  # dead for sure before the step is sent
        result = self.inner.step(plan)
        self.plans.append(plan)
        return result

    def memory_stats(self) -> MemoryStats:
        return self.inner.memory_stats()

    def restart(self) -> None:
        self.inner.restart()

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def tok(model_path: Path) -> Tokenizer:
    return Tokenizer.load(str(model_path))


@pytest.fixture(params=[True, False], ids=["one-buffer", "stream-per-slot"])
async def serving(
    model_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Driver, Recording]]:
    config = EngineConfig(
        model_path=str(model_path),
        n_ctx=2048,
        n_seq_max=8,
        n_batch=256,
        threads=2,
        kv_unified=request.param,
    )
    executor = Recording(LlamaCppExecutor.start(config))
    scheduler = Scheduler(
        SchedulerConfig(block_size=16, check_integrity=True), executor.info, WallClock()
    )
    driver = Driver(scheduler, executor, WallClock())
    await driver.start()
    yield driver, executor
    await driver.stop(grace_s=5)
    executor.close()


async def run(driver: Driver, request: GenerationRequest) -> list[ChoiceResult]:
    return await driver.submit(request).results()


def computed_tokens(plans: list[StepPlan], owner_prefix: str) -> int:
    return sum(len(s.tokens) for p in plans for s in p.slices if s.owner.startswith(owner_prefix))


async def test_a_shared_prefix_is_copied_not_computed(
    serving: tuple[Driver, Recording], tok: Tokenizer
) -> None:
    driver, executor = serving
    a = tok.encode(SYSTEM + "Question: what colour is the sky?\nAnswer:")
    b = tok.encode(SYSTEM + "Question: what do cows eat?\nAnswer:")
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert shared >= 32

    first = await run(driver, GenerationRequest("a", tuple(a), 12))
    assert first[0].cached_tokens == 0
    plans_before = len(executor.plans)
    second = await run(driver, GenerationRequest("b", tuple(b), 12))

    cached = second[0].cached_tokens
    assert cached == shared // 16 * 16  # whole blocks only
    copies = [
        op for p in executor.plans[plans_before:] for op in p.kv_ops if isinstance(op, CopyPrefix)
    ]
    assert [c.n_tokens for c in copies] == [cached]
    # b computed only its own tokens: the prompt past the cached blocks, then one per decode
    # step (the last generated token is never fed back).
    completion = second[0].completion_tokens
    assert computed_tokens(executor.plans[plans_before:], "b/") == (
        len(b) - cached + completion - 1
    )

    # The same request with nothing cached gives the same tokens.
    await driver.stop(grace_s=5)
    held = executor.memory_stats().sequences  # the old scheduler's cache holders
    executor.step(StepPlan(kv_ops=tuple(Truncate(m.seq) for m in held)))
    scheduler = Scheduler(SchedulerConfig(enable_prefix_cache=False), executor.info, WallClock())
    fresh = Driver(scheduler, executor, WallClock())
    await fresh.start()
    alone = await run(fresh, GenerationRequest("b-alone", tuple(b), 12))
    await fresh.stop(grace_s=5)
    assert alone[0].cached_tokens == 0
    assert alone[0].output_tokens == second[0].output_tokens


async def test_n_choices_share_the_prompt_and_match_one_greedy_choice(
    serving: tuple[Driver, Recording], tok: Tokenizer
) -> None:
    driver, executor = serving
    prompt = tuple(tok.encode(SYSTEM + "Name a fruit."))
    greedy = SamplingParams(temperature=0.0, ignore_eos=True)  # choice 0 runs on while 1, 2 join
    single = await run(driver, GenerationRequest("one", prompt, 10, greedy))
    results = await run(driver, GenerationRequest("three", prompt, 10, greedy, n=3))
    assert [r.index for r in results] == [0, 1, 2]
    assert {r.output_tokens for r in results} == {single[0].output_tokens}
    # Choices 1 and 2 computed only the last prompt token, then their own decodes.
    for r in results[1:]:
        owner = f"three/{r.index}"
        assert computed_tokens(executor.plans, owner) == 1 + r.completion_tokens - 1


async def test_a_killed_worker_loses_no_token_and_repeats_none(
    serving: tuple[Driver, Recording], tok: Tokenizer
) -> None:
    """After the restart each request is recomputed from its prompt plus exactly the tokens
    it had streamed, and streams on from there: nothing lost, nothing sent twice.

    The continuation is not compared with an uninterrupted run: llama.cpp's logits depend on
    the batch a sequence is computed in (flash attention over the unified KV buffer), so a
    recompute prefilled beside another sequence may take the other side of a near tie than
    token-by-token decoding did. What the recovery owes is the context, checked exactly here.
    """
    driver, executor = serving
    prompts = [tuple(tok.encode(SYSTEM + q)) for q in ("Count to five.", "Say hello.")]
    first_plan = len(executor.plans)
    executor.kill_before_step = first_plan + 6  # mid-decode of both
    handles = [driver.submit(GenerationRequest(f"k{i}", p, 16)) for i, p in enumerate(prompts)]
    streamed: dict[str, list[int]] = {h.request_id: [] for h in handles}
    for h in handles:
        async for event in h:
            if hasattr(event, "token"):
                streamed[h.request_id].append(event.token)
    results = [(await h.results())[0] for h in handles]
    assert executor.inner.restarts == 1
    for i, (prompt, r) in enumerate(zip(prompts, results, strict=True)):
        assert r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        assert streamed[f"k{i}"] == list(r.output_tokens)
        slices = [s for p in executor.plans[first_plan:] for s in p.slices if s.owner == f"k{i}/0"]
        # The one slice from position 0 past the prompt: the recompute after the restart.
        recomputes = [
            k for k, s in enumerate(slices) if s.start_pos == 0 and len(s.tokens) > len(prompt)
        ]
        assert len(recomputes) == 1
        k = recomputes[0]
        before = list(r.output_tokens[: len(slices[k].tokens) - len(prompt)])
        assert len(before) >= 1  # killed mid-decode: some tokens had been streamed
        assert slices[k].tokens == prompt + tuple(before)
        assert list(slices[k].replay) == before
        # Every slice after the recompute sampled one new token, streamed once.
        sampled_after = sum(1 for s in slices[k:] if s.sample)
        assert len(before) + sampled_after == r.completion_tokens  # the end token counts
