"""The SLO settings reach the scheduler's config, and its state reaches ``/metrics``."""

from __future__ import annotations

import pytest

from app.server.core import CoreStats
from app.server.metrics import Metrics
from app.server.scheduling import scheduler_config
from app.server.settings import Settings
from quanta_core.engine.fake import FakeExecutor
from quanta_core.requests import FinishReason, SloClass
from quanta_core.scheduler import PolicyName, QueueBound, SloConfig
from tests.scheduler_harness import Harness, prompt


def test_settings_default_to_the_core_defaults_and_pass_through() -> None:
    assert scheduler_config(Settings(n_ctx=256)).slo == SloConfig()  # short: bounds as the core's
    config = scheduler_config(
        Settings(
            policy="slo",
            interactive_ttft_s=1.5,
            interactive_itl_s=0.1,
            batch_deadline_s=60.0,
            batch_aging_s=5.0,
            interactive_queue_requests=8,
            interactive_queue_tokens=800,
            batch_queue_requests=9,
            batch_queue_tokens=900,
            queue_requests=10,
            queue_tokens=1000,
        )
    )
    assert config.policy is PolicyName.SLO
    slo = config.slo
    assert (slo.interactive_ttft_s, slo.interactive_itl_s) == (1.5, 0.1)
    assert (slo.batch_deadline_s, slo.batch_aging_s) == (60.0, 5.0)
    assert slo.interactive_queue == QueueBound(8, 800)
    assert slo.batch_queue == QueueBound(9, 900)
    assert slo.total_queue == QueueBound(10, 1000)


def test_counters_and_queues_are_exposed_per_tenant_and_class() -> None:
    stats = CoreStats(
        waiting=3,
        waiting_by_class=(("batch", 2), ("interactive", 1)),
        tenants=(("acme", "interactive", 12.5, 1, 2), ("etl", "batch", 300.0, 2, 0)),
    )
    text = Metrics(lambda: stats).exposition().decode()
    assert 'quanta:num_requests_waiting_by_class{class="batch"} 2.0' in text
    assert 'quanta:tenant_virtual_tokens{class="interactive",tenant="acme"} 12.5' in text
    assert 'quanta:tenant_requests_waiting{class="batch",tenant="etl"} 2.0' in text
    assert 'quanta:tenant_requests_running{class="interactive",tenant="acme"} 2.0' in text


def test_unset_queue_bounds_scale_with_the_running_slots() -> None:
    short = {"n_ctx": 256}  # short requests: the token bounds are not the KV's cells
    cpu = scheduler_config(Settings(_env_file=None, **short)).slo  # type: ignore[call-arg]
    gpu = scheduler_config(Settings(_env_file=None, n_seq_max=256, **short)).slo  # type: ignore[call-arg]
    assert gpu.interactive_queue == QueueBound(
        4 * cpu.interactive_queue.max_requests, 4 * cpu.interactive_queue.max_tokens
    )
    assert gpu.batch_queue.max_requests == 4 * cpu.batch_queue.max_requests
    assert gpu.total_queue.max_tokens == 4 * cpu.total_queue.max_tokens
    capped = scheduler_config(
        Settings(_env_file=None, n_seq_max=256, max_running=128, queue_requests=300, **short)  # type: ignore[call-arg]
    ).slo
    assert capped.interactive_queue.max_requests == 2 * cpu.interactive_queue.max_requests
    assert capped.total_queue == QueueBound(300, 2 * cpu.total_queue.max_tokens)  # as set


def test_unset_queue_token_bounds_hold_a_running_set_of_the_longest_requests() -> None:
    # 16 slots of 8,192 tokens: 16 requests of 8,000 tokens at once must be able to wait for
    # their first step, not be refused by a token bound sized for short prompts.
    slo = scheduler_config(Settings(_env_file=None, n_ctx=8192, n_seq_max=16)).slo  # type: ignore[call-arg]
    for bound in (slo.interactive_queue, slo.batch_queue, slo.total_queue):
        assert bound.max_tokens >= 16 * 8192


@pytest.mark.parametrize(("n_seq_max", "admitted"), [(64, 64), (256, 256)])
def test_a_crowd_the_size_of_the_running_set_waits_instead_of_being_refused(
    n_seq_max: int, admitted: int
) -> None:
    # 256 people at once, before any step: each waits in the interactive queue for its first
    # step. A 256-slot engine runs them all at once, so its default queue holds them all; a
    # 64-slot one keeps the bound it was sized for and refuses the rest.
    settings = Settings(_env_file=None, n_seq_max=n_seq_max)  # type: ignore[call-arg]
    config = scheduler_config(settings)
    h = Harness.make(
        FakeExecutor(n_ctx=256 * 64, n_seq_max=n_seq_max),
        policy=config.policy,
        max_running=config.max_running,
        slo=config.slo,
    )
    for k in range(256):
        h.submit(f"p{k}", prompt(16, base=100 + k), max_tokens=8, slo_class=SloClass.INTERACTIVE)
    refused = [r for r in h.results().values() if r.finish_reason is FinishReason.REJECTED]
    assert 256 - len(refused) == admitted
    h.run()
    done = [r for r in h.results().values() if r.finish_reason is FinishReason.LENGTH]
    assert len(done) == admitted
