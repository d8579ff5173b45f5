"""Admission's answer to a new request, given at once: start now, queue, or reject."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from quanta_core.requests import RejectionKind
from quanta_core.scheduler.choice import Choice


class AdmissionDecision(Enum):
    START = "start"  # runs at the next step
    QUEUE = "queue"  # waits; its class target is expected to be met
    REJECT = "reject"  # finished at once (REJECTED) with a reason and a retry-after


@dataclass(frozen=True, slots=True)
class AdmissionVerdict:
    decision: AdmissionDecision
    reason: str | None = None  # REJECT: why, for the client
    rejection: RejectionKind | None = None  # REJECT: 429 (tenant over its share) or 503
    retry_after_s: float | None = None  # REJECT: when the same request may be admitted
    shed: tuple[Choice, ...] = ()  # queued requests to reject to make room for this one
    shed_retry_after_s: float | None = None  # what those are told

    @classmethod
    def reject(cls, reason: str, kind: RejectionKind, retry_after_s: float) -> AdmissionVerdict:
        return cls(AdmissionDecision.REJECT, reason, kind, retry_after_s)


class Refused(Exception):
    """A request refused at submission (``Driver.submit`` raises it): it never reached a
    queue. ``rejection`` says whose limit it met (None: the request itself, or a server that
    is stopping or failed); ``retry_after_s`` when the same request may be admitted."""

    def __init__(
        self,
        reason: str,
        rejection: RejectionKind | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.rejection = rejection
        self.retry_after_s = retry_after_s

    @classmethod
    def of(cls, verdict: AdmissionVerdict) -> Refused:
        return cls(verdict.reason or "refused", verdict.rejection, verdict.retry_after_s)
