"""The scheduler core: requests, policies, the plan/update cycle and its async driver."""

from quanta_core.scheduler.admission import AdmissionDecision, AdmissionVerdict
from quanta_core.scheduler.config import PolicyName, SchedulerConfig, StepLimits
from quanta_core.scheduler.driver import Driver
from quanta_core.scheduler.handle import Event, RequestHandle
from quanta_core.scheduler.policies import AdmitDecision, Policy, TenantStats
from quanta_core.scheduler.preemption import PreemptionCosts, PreemptMode
from quanta_core.scheduler.registry import POLICIES, make_policy
from quanta_core.scheduler.request import Request, RequestStatus
from quanta_core.scheduler.scheduler import Scheduler, SchedulerStats
from quanta_core.scheduler.slo import QueueBound, SloConfig

__all__ = [
    "POLICIES",
    "AdmissionDecision",
    "AdmissionVerdict",
    "AdmitDecision",
    "Driver",
    "Event",
    "Policy",
    "PolicyName",
    "PreemptMode",
    "PreemptionCosts",
    "QueueBound",
    "Request",
    "RequestHandle",
    "RequestStatus",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "SloConfig",
    "StepLimits",
    "TenantStats",
    "make_policy",
]
