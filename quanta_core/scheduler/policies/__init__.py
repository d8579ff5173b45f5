"""Policies by name: ``make_policy("slo", config)``."""

from __future__ import annotations

from quanta_core.scheduler.config import PolicyName, SchedulerConfig
from quanta_core.scheduler.policies.base import Policy
from quanta_core.scheduler.policies.baselines import FcfsPolicy, SequentialPolicy, StaticPolicy
from quanta_core.scheduler.policies.fair import SloPolicy, VtcPolicy
from quanta_core.scheduler.policies.horizon import HorizonPolicy

POLICIES: dict[PolicyName, type[Policy]] = {
    cls.name: cls
    for cls in (SequentialPolicy, StaticPolicy, FcfsPolicy, VtcPolicy, SloPolicy, HorizonPolicy)
}


def make_policy(name: PolicyName | str, config: SchedulerConfig | None = None) -> Policy:
    try:
        policy = PolicyName(name)
    except ValueError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown scheduling policy {name!r} (known: {known})") from None
    return POLICIES[policy].from_config(config or SchedulerConfig(policy=policy))
