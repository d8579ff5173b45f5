"""What the scheduler is doing right now, as plain data: for a person watching (the live view).

Nothing here runs per step. Admission decisions are kept, one small record per request, in a
bounded log; the driver keeps its recent steps as they are, in a bounded deque (one append,
no counting). A snapshot walks the queues, the running set and the block pool only when asked:

    running   request  tenant  class  [p p p p | o o o . . . . .]  prompt, output / max_tokens
    waiting   request  tenant  class  waited 1.2 s  (preempted: its KV stashed or dropped)
    blocks    a a s a c c c f f f f f ...   a: a running sequence's, s: shared by several,
                                            c: cached prefix only, f: free
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from quanta_core.engine.types import StepPlan, StepResult
from quanta_core.kv.block_pool import Block
from quanta_core.scheduler.admission import AdmissionDecision, AdmissionVerdict
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.policies.base import TenantStats

DECISIONS_KEPT = 64  # the view lists the latest; older ones are gone
STEPS_KEPT = 1024  # a whole rate window's steps while a step takes 5 ms or more
RATE_WINDOW_S = 5.0  # step time and tokens/s are over the steps of the last five seconds


@dataclass(frozen=True, slots=True)
class Decision:
    """Admission's answer to one request (or a shed: a queued one rejected for another)."""

    at: float  # the core's clock
    request_id: str
    tenant: str
    slo_class: str
    decision: str  # start · queue · reject · shed
    reason: str


class DecisionLog:
    """The latest admission decisions, oldest first; bounded."""

    def __init__(self, maxlen: int = DECISIONS_KEPT) -> None:
        self._log: deque[Decision] = deque(maxlen=maxlen)

    def record(self, now: float, r: Choice, verdict: AdmissionVerdict, waiting: int) -> None:
        decision = verdict.decision
        if verdict.reason is not None:
            reason = verdict.reason
        elif decision is AdmissionDecision.START:
            reason = "room to start at the next step"
        else:
            reason = f"queued behind {waiting} waiting"
        self._log.append(
            Decision(now, r.request_id, r.tenant, r.slo_class.value, decision.value, reason)
        )

    def shed(self, now: float, r: Choice, reason: str) -> None:
        self._log.append(Decision(now, r.request_id, r.tenant, r.slo_class.value, "shed", reason))

    def latest(self) -> tuple[Decision, ...]:
        return tuple(self._log)


@dataclass(frozen=True, slots=True)
class ChoiceView:
    request_id: str
    index: int
    tenant: str
    slo_class: str
    status: str  # running · waiting · preempted · blocked
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    computed_tokens: int  # held by the engine (prompt and output)
    age_s: float  # since arrival
    preemptions: int

    @classmethod
    def of(cls, r: Choice, now: float) -> ChoiceView:
        return cls(
            r.request_id,
            r.index,
            r.tenant,
            r.slo_class.value,
            r.status.value,
            r.prompt_len,
            r.num_output,
            r.max_tokens,
            r.num_computed_tokens,
            now - r.arrival,
            r.preemptions,
        )


@dataclass(frozen=True, slots=True)
class StepRates:
    """The engine's recent pace, over the steps of the last ``window_s``."""

    window_s: float
    steps: int
    mean_step_s: float  # a whole engine call, as the caller timed it
    tokens_per_s: float  # computed: prompt (prefill) and decode tokens
    output_tokens_per_s: float  # sampled


Step = tuple[float, StepPlan, StepResult]  # (when it ended, on the core's clock; plan; result)


def step_rates(steps: Iterable[Step], now: float, window_s: float = RATE_WINDOW_S) -> StepRates:
    recent = [(plan, result) for t, plan, result in steps if t > now - window_s]
    if not recent:
        return StepRates(window_s, 0, 0.0, 0.0, 0.0)
    busy = sum(result.timings.total_s for _, result in recent)
    tokens = sum(plan.num_tokens for plan, _ in recent)
    outputs = sum(len(result.outputs) for _, result in recent)
    return StepRates(
        window_s, len(recent), busy / len(recent), tokens / window_s, outputs / window_s
    )


def block_map(blocks: Sequence[Block]) -> str:
    """One character per KV block, in block-id order (see the module's diagram)."""
    chars = []
    for b in blocks:
        if b.n_active:
            chars.append("s" if len(b.seqs) > 1 else "a")
        else:
            chars.append("c" if b.seqs else "f")
    return "".join(chars)


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    now: float
    policy: str
    block_size: int
    blocks: str  # block_map
    running: tuple[ChoiceView, ...]  # admission order
    waiting: tuple[ChoiceView, ...]  # oldest first
    tenants: tuple[TenantStats, ...]  # fair policies: counters and queues per tenant and class
    decisions: tuple[Decision, ...]  # oldest first
    rates: StepRates
