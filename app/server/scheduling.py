"""The scheduler's config from the server's settings: ``quanta run``'s, and ``quanta sim``'s
and ``quanta calibrate``'s, which run with the same defaults (apart from ``assemble``, which
imports llama.cpp).
"""

from __future__ import annotations

from app.server.settings import Settings
from quanta_core.scheduler import SchedulerConfig, SloConfig


def scheduler_config(settings: Settings) -> SchedulerConfig:
    interactive, batch, total = settings.queue_bounds()
    return SchedulerConfig(
        policy=settings.policy,  # type: ignore[arg-type]  # validated by SchedulerConfig
        block_size=settings.block_size,
        max_running=settings.max_running,
        token_budget=settings.step_token_budget(),
        enable_prefix_cache=settings.prefix_cache,
        prefix_cache_tokens=settings.prefix_cache_tokens,
        slo=SloConfig(
            interactive_ttft_s=settings.interactive_ttft_s,
            interactive_itl_s=settings.interactive_itl_s,
            batch_deadline_s=settings.batch_deadline_s,
            batch_aging_s=settings.batch_aging_s,
            interactive_queue=interactive,
            batch_queue=batch,
            total_queue=total,
        ),
    )
