"""Who is asking: the tenant, key, SLO class and weight behind a request, and its quota gate.

``ApiKeyAuthentication`` (app/tenancy/gate.py) has put the key's ``Principal`` in
``request.user`` before ``request_context`` runs; the core gets the tenant id, class and weight
from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Request

from app.server.request_id import request_id_of
from app.server.request_log import RequestRecord, record_of
from app.tenancy.gate import RequestGate, tenancy_of
from app.tenancy.service import Principal
from quanta_core.requests import SloClass


@dataclass(frozen=True, slots=True)
class RequestContext:
    request_id: str  # unique, the core's id for the request
    tenant: str  # the tenant's id
    slo_class: SloClass
    weight: float = 1.0
    key_id: str | None = None
    gate: RequestGate | None = None  # None: no quotas (a context made outside a request)
    record: RequestRecord | None = None  # what the request log says when it ends


def request_context(request: Request[Principal, str, Any]) -> RequestContext:
    request_id = request_id_of(request.scope)
    principal = request.user
    gate = RequestGate(tenancy_of(request), principal, request.scope, request_id)
    return RequestContext(
        request_id,
        principal.tenant.id,
        principal.key.slo_class,
        principal.tenant.weight,
        principal.key.id,
        gate,
        record_of(request.scope),
    )
