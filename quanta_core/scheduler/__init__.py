"""The scheduler core: requests, policies, the plan/update cycle and its async driver."""

from quanta_core.scheduler.config import PolicyName, SchedulerConfig
from quanta_core.scheduler.driver import Driver
from quanta_core.scheduler.handle import Event, RequestHandle
from quanta_core.scheduler.policies import POLICIES, AdmitDecision, Policy, make_policy
from quanta_core.scheduler.preemption import PreemptionCosts, PreemptMode
from quanta_core.scheduler.request import Request, RequestStatus
from quanta_core.scheduler.scheduler import Scheduler, SchedulerStats

__all__ = [
    "POLICIES",
    "AdmitDecision",
    "Driver",
    "Event",
    "Policy",
    "PolicyName",
    "PreemptMode",
    "PreemptionCosts",
    "Request",
    "RequestHandle",
    "RequestStatus",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "make_policy",
]
