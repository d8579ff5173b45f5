"""One log line per request, written when it ends, and the request counters.

    2026-12-05T09:00:00.123Z INFO quanta.request POST /v1/chat/completions 200
      request_id=… tenant=acme key_id=key_… class=interactive reason=- prompt_tokens=12
      cached_tokens=0 output_tokens=40 queue_s=0.0010 prefill_s=0.0200 e2e_s=0.8500
      finish_reason=stop

Filled in as the request goes (``RequestRecord`` in the scope's state): the status from the
response's start, the refusal's code from the error handler (``ERROR_CODE``), the tokens
and timings from the generation (``app.openai``), the tenant and key from the authenticated
principal. Probes and scrapes (/healthz, /readyz, /health, /metrics) are logged at debug
level. Nothing of the request's headers is read here: keys never reach a log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.server.errors import ERROR_CODE
from app.server.logs import FIELDS
from app.server.metrics import Metrics
from app.server.request_id import request_id_of
from app.tenancy.meter import Meter
from app.tenancy.service import Principal
from quanta_core.requests import ChoiceResult, FinishReason

log = logging.getLogger("quanta.request")

RECORD = "quanta_request_record"
QUIET_PATHS = frozenset({"/healthz", "/readyz", "/health", "/metrics"})
NO_TENANT = "-"


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    method: str
    path: str
    started: float  # time.perf_counter()
    status: int = 0
    meter: Meter | None = None  # the request's meter: what reached the client
    results: list[ChoiceResult] = field(default_factory=list)

    def finished(self, result: ChoiceResult) -> None:
        self.results.append(result)

    def finish_reason(self, status: str | None) -> str | None:
        """What the client was told, one per distinct reason (``stop,length``). A choice
        ended by a stop string is cancelled in the core and ``stop`` to the client."""
        reasons = set()
        for r in self.results:
            reason = r.finish_reason
            if reason is FinishReason.CANCELLED and status == "completed":
                reason = FinishReason.STOP
            reasons.add("abort" if reason is FinishReason.CANCELLED else reason.value)
        if not reasons and status == "cancelled":
            reasons.add("abort")
        return ",".join(sorted(reasons)) or None

    def fields(self, principal: Principal | None, reason: str | None) -> dict[str, Any]:
        out = self.meter.outcome() if self.meter is not None else None
        queue = [r.timings.queue_s for r in self.results if r.timings.queue_s is not None]
        prefill = [r.timings.prefill_s for r in self.results if r.timings.prefill_s is not None]
        return {
            "request_id": self.request_id,
            "tenant": principal.tenant.name if principal is not None else NO_TENANT,
            "key_id": principal.key.id if principal is not None else None,
            "class": principal.key.slo_class.value if principal is not None else NO_TENANT,
            "reason": reason,
            "prompt_tokens": out.prompt_tokens if out is not None else 0,
            "cached_tokens": out.cached_tokens if out is not None else 0,
            "output_tokens": out.completion_tokens if out is not None else 0,
            "queue_s": min(queue, default=None),
            "prefill_s": min(prefill, default=None),
            "e2e_s": time.perf_counter() - self.started,
            "finish_reason": self.finish_reason(out.status if out is not None else None),
        }


def record_of(scope: Scope | dict[str, Any]) -> RequestRecord | None:
    state: dict[str, Any] = scope.get("state", {})  # type: ignore[assignment]
    record: RequestRecord | None = state.get(RECORD)
    return record


def request_log(app: ASGIApp, metrics: Metrics) -> ASGIApp:
    """``app`` (the whole application, its exception handlers included), logging and
    counting each HTTP request when its call ends."""

    async def logged(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        record = RequestRecord(
            request_id_of(scope), scope["method"], scope["path"], time.perf_counter()
        )
        scope.setdefault("state", {})[RECORD] = record  # type: ignore[typeddict-item]

        # Not a coroutine of its own: it runs for every chunk of a stream.
        def send_noting(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            return send(message)

        try:
            await app(scope, receive, send_noting)
        finally:
            _ended(record, scope, metrics)

    return logged


def _ended(record: RequestRecord, scope: Scope, metrics: Metrics) -> None:
    user = scope.get("user")
    principal = user if isinstance(user, Principal) else None
    status = record.status or 500  # the app raised before answering: the server's 500
    reason = scope.get("state", {}).get(ERROR_CODE) if status >= 400 else None
    fields = record.fields(principal, reason or (str(status) if status >= 400 else None))
    if record.path.startswith("/v1/"):
        metrics.request_ended(
            fields["tenant"],
            fields["class"],
            status,
            fields["reason"],
            (fields["prompt_tokens"], fields["cached_tokens"], fields["output_tokens"]),
            fields["finish_reason"],
        )
    level = logging.DEBUG if record.path in QUIET_PATHS else logging.INFO
    if log.isEnabledFor(level):
        log.log(level, "%s %s %d", record.method, record.path, status, extra={FIELDS: fields})
