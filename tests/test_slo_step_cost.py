"""The step-cost model and the running count it sets under the inter-token target.

Step "times" here are the model's own predictions (or a fake engine that reports a multiple
of them): nothing is measured, so nothing depends on this machine's speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import pytest

from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import StepPlan, StepResult, StepTimings
from quanta_core.requests import SloClass
from quanta_core.scheduler import SloConfig
from quanta_core.scheduler.fair_policies import SloPolicy
from quanta_core.scheduler.step_cost import StepCostModel
from tests.scheduler_harness import Harness, prompt

INTER, BATCH = SloClass.INTERACTIVE, SloClass.BATCH
TARGET = SloConfig().interactive_itl_s * SloConfig().itl_headroom  # 0.2 s


def tokens(plan: StepPlan) -> int:
    return sum(len(s.tokens) for s in plan.slices)


def test_the_prior_passes_through_the_measured_figures() -> None:
    cost = StepCostModel(SloConfig())
    assert cost.estimate(1, 1) == pytest.approx(0.010)  # one stream: ~10 ms
    assert cost.estimate(16, 16) == pytest.approx(0.0925)  # 16 streams: ~100 ms
    assert cost.estimate(64, 64) == pytest.approx(0.3565)  # 64 streams: ~350 ms
    assert 256 / cost.estimate(1, 256) == pytest.approx(221, abs=1)  # prefill ~220 tokens/s


def test_caps_under_a_target() -> None:
    cost = StepCostModel(SloConfig())
    assert cost.max_seqs(TARGET, 64) == 35  # 4.5 + 5.5 x 35 = 197 ms
    assert cost.max_seqs(TARGET, 16) == 16
    assert cost.max_seqs(0.001, 16) == 1  # never below one stream
    assert cost.max_tokens(1, TARGET, 512) == 1 + 42  # one stream and a 42-token chunk
    assert cost.max_tokens(30, TARGET, 512) == 30 + 6
    assert cost.max_tokens(40, TARGET, 512) == 40  # over the target already: decodes only
    assert cost.prefill_s(100, 0, 43) == pytest.approx(
        2 * cost.estimate(1, 42) + cost.estimate(1, 16)
    )


def test_measurements_correct_the_prior_per_batch_size_bucket() -> None:
    cost = StepCostModel(SloConfig(step_ewma_alpha=0.5))
    cost.observe(16, 16, 0.0)  # no timing (a fake engine): ignored
    assert cost.estimate(16, 16) == pytest.approx(0.0925)
    for _ in range(20):
        cost.observe(16, 16, 2 * 0.0925)
    assert cost.estimate(12, 12) == pytest.approx(2 * cost.prior(12, 12), rel=1e-4)  # 9-16
    assert cost.estimate(4, 4) == pytest.approx(cost.prior(4, 4))  # another bucket: untouched
    cost.observe(16, 16, 0.0925)
    assert cost.estimate(16, 16) == pytest.approx(1.5 * 0.0925, rel=1e-4)  # EWMA


def mixed_load(policy: str, executor: FakeExecutor | None = None) -> Harness:
    h = Harness.make(executor or FakeExecutor(n_ctx=8192), policy=policy, max_running=16)
    for k in range(20):
        h.submit(f"b{k}", prompt(300, base=100 + k), max_tokens=40, tenant="etl", slo_class=BATCH)
    for k in range(12):
        h.submit(f"i{k}", prompt(120, base=500 + k), max_tokens=30, tenant="chat", slo_class=INTER)
    return h


def test_steps_with_interactive_streams_decoding_stay_under_the_itl_target() -> None:
    h = mixed_load("slo")
    cost = StepCostModel(SloConfig())
    gaps = 0  # steps that put a gap between two tokens of an interactive stream
    while h.sched.has_work:
        plan = h.cycle()
        if any(s.owner.startswith("i") and s.start_pos > 120 for s in plan.slices):
            gaps += 1
            assert cost.estimate(len(plan.slices), tokens(plan)) <= TARGET + 1e-9
    assert gaps > 30
    # fcfs fills steps to the token budget: a 512-token step is ~2.3 s for every stream
    h = mixed_load("fcfs")
    h.run()
    worst = max(cost.estimate(len(p.slices), tokens(p)) for p in h.plans if p.slices)
    assert worst > 9 * SloConfig().interactive_itl_s


@dataclass
class SlowFake(FakeExecutor):
    """Reports every step as ``slowdown`` times the prior's estimate."""

    slowdown: float = 3.0

    def step(self, plan: StepPlan) -> StepResult:
        result = super().step(plan)
        n = len(plan.slices)
        seconds = self.slowdown * StepCostModel(SloConfig()).prior(n, tokens(plan)) if n else 0.0
        return msgspec.structs.replace(result, timings=StepTimings(total_s=seconds))


def test_a_slower_engine_than_the_prior_learns_a_smaller_running_count() -> None:
    def running_counts(executor: FakeExecutor) -> tuple[list[int], Harness]:
        """Two interactive requests arrive every 5 steps for 300 steps."""
        h = Harness.make(executor, policy="slo", max_running=16)
        counts = []
        for step in range(300):
            if step % 5 == 0:
                for k in range(2):
                    h.submit(f"i{step}-{k}", prompt(8, base=100 + step), 60, tenant=f"t{k}")
            counts.append(len(h.cycle().slices))
        return counts, h

    prior_counts, _ = running_counts(FakeExecutor(n_ctx=8192))
    assert max(prior_counts) == 16  # the prior: 16 streams fit 200 ms (92 ms)
    slow_counts, h = running_counts(SlowFake(n_ctx=8192))
    policy = h.sched.policy
    assert isinstance(policy, SloPolicy)
    # three times slower: 3 x (4.5 + 5.5 n) ms <= 200 ms  ->  n <= 11
    assert policy.cost.max_seqs(TARGET, 16) == 11
    # it learns within the first steps; from then on the running count keeps to the cap
    assert max(slow_counts[60:]) == 11
