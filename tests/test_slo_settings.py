"""The SLO settings reach the scheduler's config, and its state reaches ``/metrics``."""

from __future__ import annotations

from app.server.core import CoreStats
from app.server.metrics import Metrics
from app.server.scheduling import scheduler_config
from app.server.settings import Settings
from quanta_core.scheduler import PolicyName, QueueBound, SloConfig


def test_settings_default_to_the_core_defaults_and_pass_through() -> None:
    assert scheduler_config(Settings()).slo == SloConfig()
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
