"""The simulated executor: the engine's contract, and the same scheduler decisions as the fake."""

from __future__ import annotations

import msgspec
import pytest

from quanta_core.clock import VirtualClock
from quanta_core.engine.errors import EngineInputError
from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.protocol import Executor
from quanta_core.engine.types import SeqSlice, Stash, StepPlan
from quanta_core.requests import ChoiceFinished, GenerationRequest
from quanta_core.scheduler import Scheduler, SchedulerConfig
from quanta_core.scheduler.config import PolicyName
from quanta_core.sim.cost_model import CostModel, StepFeatures
from quanta_core.sim.executor import SimExecutor
from quanta_core.sim.step_trace import SpeedProfile

MODEL = CostModel(per_pass=0.01, per_decode=0.002, per_prefill=0.003, per_batch_kv=0.5)


def _sim() -> SimExecutor:
    return SimExecutor(FakeExecutor().info, MODEL)


def test_step_time_is_the_cost_models_prediction_from_the_state_before_the_plan() -> None:
    ex = _sim()
    prefill = StepPlan(slices=(SeqSlice(0, tuple(range(10, 20)), 0, sample=True, owner="a"),))
    r1 = ex.step(prefill)
    # 10 tokens at 0..9 attend 55 pairs; 10 batch tokens x 10 cells held; the chunk samples
    features = StepFeatures(1, 0, 10, 0.055, 1e-4, sampled_chunks=1)
    assert r1.timings.total_s == pytest.approx(MODEL.predict(features))
    # ... so its last token is priced as a decode token, its other 9 as prefill tokens
    assert r1.timings.total_s == pytest.approx(0.01 + 0.002 + 9 * 0.003 + 0.5 * 1e-4)
    unsampled = _sim().step(StepPlan(slices=(SeqSlice(0, tuple(range(10, 20)), 0),)))
    assert unsampled.timings.total_s == pytest.approx(0.01 + 10 * 0.003 + 0.5 * 1e-4)
    token = r1.outputs[0].token
    r2 = ex.step(StepPlan(slices=(SeqSlice(0, (token,), 10, sample=True, owner="a"),)))
    assert r2.timings.total_s == pytest.approx(0.01 + 0.002 + 0.5 * 11e-6)  # 11 cells held
    stashed = ex.step(StepPlan(kv_ops=(Stash(0, "k"),)))
    assert stashed.stashed[0].n_bytes == 11 * ex.info.kv_bytes_per_token
    assert ex.memory_stats().n_stashes == 1


def test_an_invalid_plan_is_refused_and_changes_nothing() -> None:
    ex = _sim()
    ex.step(StepPlan(slices=(SeqSlice(0, (5, 6, 7), 0),)))
    bad = StepPlan(slices=(SeqSlice(1, (5,), 0), SeqSlice(0, (9,), 2)))  # seq 0 holds 3
    with pytest.raises(EngineInputError):
        ex.step(bad)
    assert [(m.seq, m.pos_max) for m in ex.memory_stats().sequences] == [(0, 2)]
    # Refused at its third slice, after two were taken in: both are put back.
    twice = StepPlan(slices=(SeqSlice(0, (8,), 3), SeqSlice(2, (5,), 0), SeqSlice(0, (9,), 4)))
    with pytest.raises(EngineInputError, match="twice"):
        ex.step(twice)
    assert [(m.seq, m.pos_max) for m in ex.memory_stats().sequences] == [(0, 2)]
    ex.step(StepPlan(slices=(SeqSlice(0, (8,), 3),)))  # and the mirror goes on from there
    assert [(m.seq, m.pos_max) for m in ex.memory_stats().sequences] == [(0, 3)]


def test_tokens_are_deterministic_never_eog_and_continue_after_a_replay() -> None:
    def stream(ex: SimExecutor, owner: str, n: int, replayed: tuple[int, ...] = ()) -> list[int]:
        return [ex.sample(owner, len(replayed)) for _ in range(n)]

    a, b = _sim(), _sim()
    first = stream(a, "r1/0", 50)
    assert first == stream(b, "r1/0", 50)
    assert stream(a, "r2/0", 50) != first
    assert all(t not in a.info.eog_tokens and 0 < t < a.info.n_vocab for t in first)
    # A new sampler fed 20 replayed tokens goes on as if it had sampled them itself.
    c = _sim()
    assert stream(c, "r1/0", 30, replayed=tuple(first[:20])) == first[20:]


def test_a_decode_run_samples_the_tokens_steps_one_by_one_would() -> None:
    # Runs small and large (sampled in one array pass from 256 tokens on), sampler chains
    # new and going on, and a tiny vocabulary whose tokens often land on the EOG ids.
    for n_vocab in (FakeExecutor().info.n_vocab, 4):
        info = msgspec.structs.replace(FakeExecutor().info, n_vocab=n_vocab, eog_tokens=(0, 2))
        bulk, one = SimExecutor(info, MODEL), SimExecutor(info, MODEL)
        owners = [f"r{i}/0" for i in range(12)]
        seqs = list(range(len(owners)))
        prompts = StepPlan(slices=tuple(SeqSlice(q, (5, 6), 0, sample=False) for q in seqs))
        bulk.step(prompts)
        starts = [2] * len(owners)
        for steps in (3, 40, 7, 100):
            got = bulk.decode(seqs, starts, owners, steps)
            want = [[one.sample(o, 0) for _ in range(steps)] for o in owners]
            assert got == want
            assert all(type(t) is int and t not in (0, 2) for row in got for t in row)
            starts = [s + steps for s in starts]


def test_it_satisfies_the_executor_protocol() -> None:
    ex: Executor = _sim()
    assert ex.info.n_seq_max == 16


# ---- one scheduler, two executors ----


def _drive(executor: Executor, config: SchedulerConfig) -> tuple[list[object], list[object]]:
    """Run the same arrivals on an equal clock; return the plans' shapes and the finishes."""
    clock = VirtualClock()
    sched = Scheduler(config, executor.info, clock)
    arrivals = {0: 6, 3: 4, 10: 5, 25: 3}  # cycle -> requests submitted then
    shapes: list[object] = []
    finishes: list[object] = []
    n = 0
    for cycle in range(2000):
        clock.advance_to(float(cycle))
        for _ in range(arrivals.get(cycle, 0)):
            prompt = tuple(range(100 + n, 100 + n + 30 + 7 * (n % 5)))
            sched.submit(GenerationRequest(f"r{n}", prompt, 12 + 5 * (n % 4)))
            n += 1
        if not sched.has_work and cycle > max(arrivals):
            break
        plan = sched.schedule()
        if plan.is_empty:
            continue
        result = executor.step(plan)
        events = sched.update(plan, result)
        # Token values differ between the executors; everything else must not.
        shapes.append(
            (
                plan.kv_ops,
                [(s.seq, s.start_pos, len(s.tokens), s.sample, s.owner) for s in plan.slices],
                plan.release,
            )
        )
        for e in events:
            if isinstance(e, ChoiceFinished):
                r = e.result
                finishes.append((cycle, r.request_id, r.finish_reason, r.completion_tokens))
    sched.check_integrity()
    return shapes, finishes


@pytest.mark.parametrize("policy", ["fcfs", "static", "sequential", "vtc"])
def test_the_scheduler_decides_the_same_under_the_fake_and_the_simulated_executor(
    policy: str,
) -> None:
    fake = FakeExecutor(n_ctx=512, n_seq_max=8)
    sim = SimExecutor(fake.info, MODEL)
    # A pool of 16 blocks of 16 tokens: running requests outgrow it and get preempted.
    config = SchedulerConfig(
        policy=PolicyName(policy),
        max_running=6,
        token_budget=64,
        num_kv_blocks=16,
        check_integrity=True,
    )
    fake_shapes, fake_finishes = _drive(fake, config)
    sim_shapes, sim_finishes = _drive(sim, config)
    assert len(fake_finishes) == 18
    assert sim_shapes == fake_shapes
    assert sim_finishes == fake_finishes


def test_a_speed_profile_times_each_step_by_the_factor_at_its_virtual_start() -> None:
    clock = VirtualClock()
    profile = SpeedProfile(bin_s=10.0, factors=(0.5, 2.0))
    ex = SimExecutor(FakeExecutor().info, MODEL, lambda: profile.at(clock.now()))
    prefill = StepPlan(slices=(SeqSlice(0, tuple(range(10, 20)), 0, sample=True, owner="a"),))
    alone = _sim().step(prefill).timings.total_s
    assert ex.step(prefill).timings.total_s == pytest.approx(0.5 * alone)
    clock.advance_to(12.0)
    decode = StepPlan(slices=(SeqSlice(0, (1,), 10, sample=True, owner="a"),))
    assert ex.step(decode).timings.total_s == pytest.approx(2.0 * (0.01 + 0.002 + 0.5 * 11e-6))
