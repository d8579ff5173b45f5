"""The worker's decode ahead (``EngineConfig.decode_ahead``): the same tokens as without it,
and after every step the engine's memory as the plans made it, whatever the plans that follow
do with the sequences decoded ahead (finish, preempt, stash, restore, new prompts beside)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quanta_core.clock import VirtualClock
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor
from quanta_core.engine.types import SamplingParams
from quanta_core.requests import ChoiceFinished, GenerationRequest
from quanta_core.scheduler import Scheduler, SchedulerConfig

pytestmark = pytest.mark.model

STEP_S = 0.05  # the virtual clock's step: the scheduler's times, not the engine's


def requests(
    prompts: list[tuple[int, ...]], every: int, lengths: int
) -> list[tuple[int, GenerationRequest]]:
    """(the step it arrives at, the request), one every ``every`` steps, with answers of one
    length or of ``lengths`` different ones (streams then end while others decode)."""
    out = []
    for i, prompt in enumerate(prompts):
        sampling = (
            SamplingParams(temperature=0.8, seed=7 + i, repetition_penalty=1.3, ignore_eos=True)
            if i % 3 == 2  # a seeded chain with state: it samples at plan time, as ever
            else SamplingParams(temperature=0.0, ignore_eos=True)
        )
        req = GenerationRequest(
            request_id=f"r{i}",
            prompt_tokens=prompt,
            max_tokens=24 + 9 * (i % lengths),
            sampling=sampling,
        )
        out.append((every * i, req))
    return out


Held = dict[int, int]  # seq -> tokens the engine holds


def serve(
    model_path: Path, ahead: bool, n_ctx: int, every: int, budget: int, lengths: int
) -> tuple[dict[str, tuple[int, ...]], list[Held], int, int]:
    """Every request's tokens, what the engine held after each step, the slices decoded
    ahead and the preemptions."""
    config = EngineConfig(
        model_path=str(model_path), n_ctx=n_ctx, n_seq_max=8, n_batch=512, decode_ahead=ahead
    )
    clock = VirtualClock()
    tokens: dict[str, tuple[int, ...]] = {}
    memory: list[Held] = []
    with LlamaCppExecutor.start(config) as executor:
        scheduler = Scheduler(
            SchedulerConfig(check_integrity=True, token_budget=budget),
            executor.info,
            clock,
        )
        vocab = executor.info.n_vocab
        prompts = [
            tuple((37 * i + 11 * k) % (vocab - 10) + 5 for k in range(30 + 7 * i)) for i in range(7)
        ]
        todo = requests(prompts, every, lengths)
        decoded_ahead = step = 0
        while todo or scheduler.has_work:
            while todo and todo[0][0] <= step:
                scheduler.submit(todo.pop(0)[1])
            plan = scheduler.schedule()
            if not plan.is_empty:
                result = executor.step(plan)
                decoded_ahead += result.decoded_ahead
                events = scheduler.update(plan, result)
                for event in events:
                    if isinstance(event, ChoiceFinished):
                        tokens[event.result.request_id] = event.result.output_tokens
                memory.append({m.seq: m.pos_max + 1 for m in executor.memory_stats().sequences})
            step += 1
            clock.advance_to(step * STEP_S)
        return tokens, memory, decoded_ahead, scheduler.num_preemptions


def test_decoding_ahead_changes_no_token(model_path: Path) -> None:
    # All prompts in the first step, then decodes of all until they end together: every batch
    # is the one it would be without the lookahead, so every logit is. (Where the batches
    # differ, llama.cpp's sums over them may round otherwise, as in any server whose batches
    # change with its load: the next test.)
    plain, held, none_ahead, preempted = serve(model_path, False, 4096, 0, 512, lengths=1)
    ahead, held_ahead, decoded_ahead, _ = serve(model_path, True, 4096, 0, 512, lengths=1)
    assert none_ahead == 0 and preempted == 0
    assert len(plain) == 7 and all(len(t) == 24 for t in plain.values())
    assert ahead == plain  # greedy and seeded chains alike
    assert held_ahead == held
    # Every decode but each stream's first was ready when its plan came.
    assert decoded_ahead == sum(len(t) - 1 for t in plain.values())


def test_plans_that_preempt_restore_and_start_prompts_find_the_memory_they_made(
    model_path: Path,
) -> None:
    # Too little room for all: preemptions (stash and restore, or recompute), prompts started
    # in chunks beside running decodes, streams that end while others decode.
    plain, held, _, preempted = serve(model_path, False, 384, 3, 64, lengths=4)
    ahead, held_ahead, decoded_ahead, preempted_ahead = serve(model_path, True, 384, 3, 64, 4)
    assert preempted > 0 and preempted_ahead == preempted
    assert {r: len(t) for r, t in ahead.items()} == {r: len(t) for r, t in plain.items()}
    # After every step the engine holds what the plans left, the lookahead not counted.
    assert held_ahead == held
    assert decoded_ahead > sum(len(t) for t in plain.values()) / 2
