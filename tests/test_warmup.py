"""The warm-up before ready teaches step costs and leaves no tenant behind, whatever the policy."""

from __future__ import annotations

import pytest

from quanta_core.clock import VirtualClock
from quanta_core.engine.fake import FakeExecutor
from quanta_core.scheduler import POLICIES, Scheduler, SchedulerConfig
from quanta_core.scheduler.warmup import warm_up


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_warm_up_tenant_is_forgotten(policy: str) -> None:
    ex = FakeExecutor()
    sched = Scheduler(SchedulerConfig(policy=policy), ex.info, VirtualClock())  # type: ignore[arg-type]
    assert warm_up(sched, ex) > 0
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting, stats.tenants) == (0, 0, ())
