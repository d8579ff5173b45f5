"""Who is asking: the one place tenancy (API keys, quotas; issue 5) will plug in.

For now every request is tenant ``default`` in the interactive class and any Authorization
header, or none, is accepted. An auth/limits step replaces ``provide_context``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Request

from app.request_id import request_id_of
from quanta_core.requests import SloClass

DEFAULT_TENANT = "default"


@dataclass(frozen=True, slots=True)
class RequestContext:
    request_id: str  # unique, the core's id for the request
    tenant: str
    slo_class: SloClass
    weight: float = 1.0


async def provide_context(request: Request[Any, Any, Any]) -> RequestContext:
    return RequestContext(request_id_of(request.scope), DEFAULT_TENANT, SloClass.INTERACTIVE)
