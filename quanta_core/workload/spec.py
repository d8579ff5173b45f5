"""What a benchmark (or a simulation) sends: tenants, arrivals, lengths, SLO targets.

A workload is either synthetic (tenants with length distributions and arrival rates) or a
trace replay (arrival times and lengths from a trace, spread over the tenants by share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from quanta_core.metrics.slo import SloTargets, default_targets
from quanta_core.requests import SloClass
from quanta_core.workload.lengths import LengthDist, fixed


class Endpoint(StrEnum):
    COMPLETIONS = "completions"  # prompt sent as token ids: exact prompt lengths
    CHAT = "chat"  # prompt sent as text of about that many tokens


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    api_key: str | None = None  # None: the bench's --api-key
    slo_class: SloClass = SloClass.INTERACTIVE
    weight: float = 1.0  # its share of service within its class (fairness figures)
    share: float = 1.0  # its share of the workload's requests and rate
    rate: float | None = None  # its own requests/s; None: the workload's rate × share
    requests: int | None = None  # its own request count; None: the workload's × share
    prompt: LengthDist = field(default_factory=lambda: fixed(32))
    output: LengthDist = field(default_factory=lambda: fixed(128))
    prefix_tokens: int = 0  # a prompt prefix shared by all of its requests (a system prompt)
    # closed loop: this many of the workload's users are this tenant's own, sending only its
    # requests (None: the users take every tenant's requests in plan order; the bench only)
    users: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "api_key": None if self.api_key is None else "***",
            "class": self.slo_class.value,
            "weight": self.weight,
            "share": self.share,
            "rate": self.rate,
            "requests": self.requests,
            "prompt": self.prompt.as_dict(),
            "output": self.output.as_dict(),
            "prefix_tokens": self.prefix_tokens,
            "users": self.users,
        }


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """Replay of an Azure LLM inference trace (TIMESTAMP, ContextTokens, GeneratedTokens).

    Arrival times are multiplied by ``time_scale`` (10 = ten times slower) and lengths by
    ``prompt_scale`` / ``output_scale``, then clipped, so a trace recorded on GPUs fits a CPU.
    """

    path: str
    time_scale: float = 1.0
    prompt_scale: float = 1.0
    output_scale: float = 1.0
    max_prompt: int | None = None
    max_output: int | None = None
    start_s: float = 0.0  # skip the trace's first seconds (before scaling)
    duration_s: float | None = None  # replay this much of it (after scaling)
    limit: int | None = None  # at most this many requests

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "time_scale": self.time_scale,
            "prompt_scale": self.prompt_scale,
            "output_scale": self.output_scale,
            "max_prompt": self.max_prompt,
            "max_output": self.max_output,
            "start_s": self.start_s,
            "duration_s": self.duration_s,
            "limit": self.limit,
        }


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    tenants: tuple[TenantSpec, ...]
    seed: int = 0
    requests: int | None = 20  # in all (open loop: split over tenants by share)
    duration_s: float | None = None  # open loop: stop arrivals after this; closed: stop sending
    rate: float = math.inf  # requests/s in all; inf: all at once
    burstiness: float = 1.0
    concurrency: int | None = None  # cap on requests in flight (open loop)
    users: int | None = None  # closed loop: this many users, each waits for its answer
    think_s: float = 0.0  # closed loop: pause between a user's answer and next question
    endpoint: Endpoint = Endpoint.COMPLETIONS
    ignore_eos: bool = True  # output lengths follow the workload, not the model
    temperature: float = 0.0
    targets: dict[SloClass, SloTargets] = field(default_factory=default_targets)
    window_s: float = 5.0  # fairness windows
    trace: TraceSpec | None = None

    @property
    def closed_loop(self) -> bool:
        return self.users is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "requests": self.requests,
            "duration_s": self.duration_s,
            "rate": "inf" if math.isinf(self.rate) else self.rate,
            "burstiness": self.burstiness,
            "concurrency": self.concurrency,
            "users": self.users,
            "think_s": self.think_s,
            "endpoint": self.endpoint.value,
            "ignore_eos": self.ignore_eos,
            "temperature": self.temperature,
            "window_s": self.window_s,
            "slo": {c.value: t.as_dict() for c, t in self.targets.items()},
            "tenants": [t.as_dict() for t in self.tenants],
            "trace": None if self.trace is None else self.trace.as_dict(),
        }
