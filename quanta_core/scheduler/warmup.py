"""A few real steps before the server is ready, so that the step-cost model starts from this
machine's measured costs instead of its prior.

The policies that plan against step costs (``slo``, ``quanta``) learn them online from
every step; a burst that arrives first (twenty people at once) would otherwise be admitted
and projected on the prior, which is another machine's. ``warm_up`` runs a small workload of
its own through the scheduler and the engine, synchronously: full-budget prefill steps,
then decode steps of ``streams`` sequences, the two shapes the cost model's terms are fitted
to. It leaves nothing behind but what the policy learnt (and a few cached prefix blocks).
"""

from __future__ import annotations

import msgspec

from quanta_core.engine.protocol import Executor
from quanta_core.engine.types import GREEDY
from quanta_core.predictor import LengthPredictor
from quanta_core.requests import GenerationRequest, SloClass
from quanta_core.scheduler.scheduler import Scheduler

WARMUP_TENANT = "quanta-warmup"


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
    steps = 0
    kept = scheduler.predictor
    scheduler.predictor = LengthPredictor()  # its answers teach the length predictor nothing
    try:
        while scheduler.has_work:
            plan = scheduler.schedule()
            scheduler.update(plan, executor.step(plan))
            steps += 1
    finally:
        scheduler.predictor = kept
    scheduler.drain_events()
    scheduler.policy.after_warm_up(WARMUP_TENANT)
    return steps
