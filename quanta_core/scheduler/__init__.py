"""The scheduler core: requests, policies, the plan/update cycle and its async driver."""

from quanta_core.scheduler.admission import AdmissionDecision, AdmissionVerdict, Refused
from quanta_core.scheduler.choice import Choice, ChoiceStatus
from quanta_core.scheduler.config import PolicyName, SchedulerConfig, StepLimits
from quanta_core.scheduler.driver import Driver
from quanta_core.scheduler.handle import Event, RequestHandle
from quanta_core.scheduler.policies import POLICIES, make_policy
from quanta_core.scheduler.policies.base import Policy, StartDecision, TenantStats
from quanta_core.scheduler.preemption import PreemptionCosts, PreemptMode
from quanta_core.scheduler.scheduler import Scheduler, SchedulerStats
from quanta_core.scheduler.slo import QueueBound, SloConfig

__all__ = [
    "POLICIES",
    "AdmissionDecision",
    "AdmissionVerdict",
    "Choice",
    "ChoiceStatus",
    "Driver",
    "Event",
    "Policy",
    "PolicyName",
    "PreemptMode",
    "PreemptionCosts",
    "QueueBound",
    "Refused",
    "RequestHandle",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "SloConfig",
    "StartDecision",
    "StepLimits",
    "TenantStats",
    "make_policy",
]
