"""One request as the instrument saw it: the row every figure is computed from.

The bench client fills it from a stream over HTTP; the simulator will fill it from the virtual
clock. All times are seconds since the start of the run, on one clock:

    sent        first_token                         finished
     │ queue_s │ prefill_s │                            │
     ├─────────┴───────────┤ token 0   token 1 … token n-1
     │◄──────── TTFT ─────►│◄─gap─►│◄─gap─►│           │
     │◄───────────────────────── end-to-end ──────────►│

``token_times`` holds the arrival of every streamed token (token 0 is the first token), so
TTFT is ``token_times[0] - sent`` and the gaps are consecutive differences. The server's own
split (``server_*``) is ``None`` where the server does not report it (any non-Quanta server).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from quanta_core.requests import SloClass


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    tenant: str
    slo_class: SloClass
    sent: float  # the request left the client (the "arrival" of every deadline)
    prompt_tokens: int
    max_tokens: int
    ok: bool = True
    finished: float | None = None
    token_times: tuple[float, ...] = field(default=(), repr=False)
    output_tokens: int | None = None  # the server's count (usage); None: count the stream
    scheduled: float | None = None  # when the workload wanted it sent (a cap may delay it)
    weight: float = 1.0  # the tenant's share within its class, for service figures
    error: str | None = None
    status: int | None = None  # HTTP status
    server_queue_s: float | None = None
    server_prefill_s: float | None = None
    server_e2e_s: float | None = None
    server_preemptions: int | None = None
    server_cached_tokens: int | None = None
    server_ttft_estimate_s: float | None = None  # the server's admission estimate of the TTFT
    retry_after_s: float | None = None  # a 429/503's retry-after header
    attempt: int = 0  # 0: the first try; k: the k-th retry after a rejection

    # ---- derived ----

    @property
    def n_output(self) -> int:
        return self.output_tokens if self.output_tokens is not None else len(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent if self.token_times else None

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.sent

    @property
    def itls(self) -> tuple[float, ...]:
        """Every inter-token gap, in order."""
        t = self.token_times
        return tuple(b - a for a, b in pairwise(t))

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (end-to-end − TTFT) / (tokens − 1)."""
        if self.finished is None or not self.token_times or self.n_output < 2:
            return None
        return (self.finished - self.token_times[0]) / (self.n_output - 1)

    # ---- rows in a JSON file ----

    def to_row(self) -> dict[str, Any]:
        # Field by field: dataclasses.asdict deep-copies every token time (seconds per run).
        row = {name: getattr(self, name) for name in self.__dataclass_fields__}
        row["slo_class"] = self.slo_class.value
        row["token_times"] = list(self.token_times)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RequestRecord:
        known = {k: v for k, v in row.items() if k in cls.__dataclass_fields__}
        known["slo_class"] = SloClass(known["slo_class"])
        known["token_times"] = tuple(known.get("token_times", ()))
        return cls(**known)
