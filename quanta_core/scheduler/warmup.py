"""A few real steps before the server is ready, so that the step-cost model starts from this
machine's measured costs instead of its prior.

The policies that plan against step costs (``slo``, ``quanta``) learn them online from
every step; a burst that arrives first (twenty people at once) would otherwise be admitted
and projected on the prior, which is another machine's. ``warm_up`` runs a small workload of
its own through the scheduler and the engine, synchronously: full-budget prefill steps,
then decode steps of ``streams`` sequences, the two shapes the cost model's terms are fitted
to. It leaves nothing behind but what the policy learnt (and a few cached prefix blocks).

The attention probe. The prior is the reference CPU's, attention's price included, and that
price is not learnt online (``step_cost``): on a GPU a step's attended pair costs a hundred
times less, so priced at the CPU's a 2,000-token prompt looks like seconds of attention, and
a decode step at long contexts like a full inter-token gap. Where the machine prefills fast
enough that a long prompt costs well under a second (``PROBE_BUDGET_S``: a GPU; a CPU takes
seconds a thousand tokens and keeps the reference's price), the warm-up also prefills two
long prompts in full-budget chunks (the later chunks attend many more pairs than the first)
and decodes them a few tokens; the four terms fitted to its steps (``fit_steps``) become the
cost model's prior (``reseed``), then learnt online as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from quanta_core.engine.protocol import Executor
from quanta_core.engine.types import GREEDY, StepPlan, StepResult
from quanta_core.predictor import LengthPredictor
from quanta_core.requests import GenerationRequest, SloClass
from quanta_core.scheduler.scheduler import Scheduler
from quanta_core.scheduler.step_cost import Sample, StepCostModel, attended_k, fit_steps

WARMUP_TENANT = "quanta-warmup"
# The probe's prompt: long enough that its last chunk attends ~7x its first's pairs at a
# GPU's 2,048-token budget, no longer than a slot holds; under PROBE_MIN_TOKENS attention is
# too small a part of a step to measure apart.
PROBE_TOKENS = 8192
PROBE_MIN_TOKENS = 2048
PROBE_OUTPUT = 4
# The probe runs only where the short workload's prefill rate puts PROBE_MIN_TOKENS within
# this: it must not hold a server's start for long.
PROBE_BUDGET_S = 1.0


def warm_up(
    scheduler: Scheduler,
    executor: Executor,
    *,
    streams: int = 16,
    prompt_tokens: int = 16,
    output_tokens: int = 8,
) -> int:
    """Run the warm-up workload to its end; returns the number of steps it took."""
    sampling = msgspec.structs.replace(GREEDY, ignore_eos=True)
    n_vocab = scheduler.info.n_vocab
    for k in range(streams):
        base = 1000 + 97 * k  # distinct prompts: no prefix is shared
        prompt = tuple((base + i) % n_vocab for i in range(prompt_tokens))
        scheduler.submit(
            GenerationRequest(
                f"{WARMUP_TENANT}-{k}",
                prompt,
                output_tokens,
                sampling=sampling,
                tenant=WARMUP_TENANT,
                slo_class=SloClass.BATCH,  # admitted whatever the prior says
            )
        )
    kept = scheduler.predictor
    scheduler.predictor = LengthPredictor()  # its answers teach the length predictor nothing
    samples: list[Sample] = []
    try:
        steps = _run(scheduler, executor, samples)
        # The first step pays the engine's start: a slower rate (the probe's decision is the
        # safer for it), and left out of the fit.
        probe = _probe_tokens(scheduler, samples)
        if probe:
            kept_samples = samples[1:]
            for k in range(2):  # the first pays the long shapes' first use: measured apart
                samples = []
                prompt = tuple((50_000 + 131 * k + i) % n_vocab for i in range(probe))
                scheduler.submit(
                    GenerationRequest(
                        f"{WARMUP_TENANT}-probe-{k}",
                        prompt,
                        PROBE_OUTPUT,
                        sampling=sampling,
                        tenant=WARMUP_TENANT,
                        slo_class=SloClass.BATCH,
                    )
                )
                steps += _run(scheduler, executor, samples)
            cost = getattr(scheduler.policy, "cost", None)
            if isinstance(cost, StepCostModel) and samples:
                cost.reseed(fit_steps([*kept_samples, *samples], cost.prior_theta))
    finally:
        scheduler.predictor = kept
    scheduler.drain_events()
    scheduler.policy.after_warm_up(WARMUP_TENANT)
    return steps


def _run(scheduler: Scheduler, executor: Executor, samples: list[Sample]) -> int:
    """Step until nothing is left; each timed step's features into ``samples``."""
    steps = 0
    while scheduler.has_work:
        plan = scheduler.schedule()
        result = executor.step(plan)
        scheduler.update(plan, result)
        steps += 1
        sample = _sample(plan, result)
        if sample is not None:
            samples.append(sample)
    return steps


def _sample(plan: StepPlan, result: StepResult) -> Sample | None:
    seconds = result.timings.total_s or result.timings.engine_s
    if not plan.slices or seconds <= 0:
        return None
    n_tokens = sum(len(s.tokens) for s in plan.slices)
    pairs = sum(attended_k(s.start_pos, len(s.tokens)) for s in plan.slices)
    return (len(plan.slices), n_tokens, pairs, seconds)


def _probe_tokens(scheduler: Scheduler, samples: Sequence[Sample]) -> int:
    """The probe's prompt length, 0 where it would not be cheap (or the short workload's
    steps were not timed: a fake engine), or a slot cannot hold a long enough one."""
    prefill = [(n_tokens, seconds) for n_seqs, n_tokens, _, seconds in samples if n_tokens > n_seqs]
    if not prefill:
        return 0
    rate = sum(t for t, _ in prefill) / sum(s for _, s in prefill)  # tokens a second
    length = min(PROBE_TOKENS, scheduler.max_seq_tokens - PROBE_OUTPUT - 1)
    if length < PROBE_MIN_TOKENS or PROBE_MIN_TOKENS / rate > PROBE_BUDGET_S:
        return 0
    return length
