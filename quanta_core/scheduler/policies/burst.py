"""The calm burst (``quanta``): a burst that reaches a calm machine is queued, not refused,
and served first token first.

Calm: no interactive request waits for its first token, the interactive streams are fewer
than the inter-token-sized set, and no interactive request was refused in the last
``quiet_s`` (overload that arrives in bursts is not calm). An interactive arrival within
``window_s`` of the machine's last calm moment is in the burst:

    calm ──arrival within window_s──> burst member (admitted up to grace_s late)
      ^                                   │ first token (or end)
      └──── queue empty, streams few, ────┘
            no refusal for quiet_s

While a member waits for its first token the running set may grow to what a step of
``step_s`` holds (``QuantaPolicy.running_cap``), and its first token is owed
(``QuantaPolicy.first_tokens_owed``).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from quanta_core.requests import SloClass
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.slo import SloConfig


@dataclass(frozen=True, slots=True)
class BurstRule:
    window_s: float  # an arrival this soon after the last calm moment is in a burst
    quiet_s: float  # an interactive refusal this recent: not calm
    grace_s: float  # a member may be admitted this far past its first-token target
    step_s: float  # the set's step while a member waits (the smooth gap, planned)

    @classmethod
    def from_config(cls, config: SloConfig) -> BurstRule:
        return cls(
            window_s=config.burst_window_s,
            quiet_s=config.burst_quiet_s,
            grace_s=config.burst_grace * config.interactive_ttft_s,
            step_s=config.burst_itl_s * config.grow_headroom,
        )


class CalmBurst:
    """The burst's state: when the machine was last calm, when it last refused, and the
    members still waiting for their first token."""

    def __init__(self, rule: BurstRule) -> None:
        self.rule = rule
        self.calm_at = -math.inf
        self.refused_at = -math.inf
        self.members: set[Choice] = set()

    def note(self, now: float, queued: int, running: Collection[Choice], itl_cap: int) -> None:
        """Remember ``now`` as calm if it is: no interactive request ``queued``, no recent
        refusal, and ``running``'s interactive streams all decoding and fewer than
        ``itl_cap`` (batch does not count: it yields or is preempted)."""
        if queued > 0 or now - self.refused_at < self.rule.quiet_s:
            return
        inter = [r for r in running if r.slo_class is SloClass.INTERACTIVE]
        if any(r.first_token is None for r in inter) or len(inter) >= itl_cap:
            return
        self.calm_at = now

    def is_burst(self, arrival: float) -> bool:
        return arrival - self.calm_at < self.rule.window_s

    def refused(self, at: float) -> None:
        self.refused_at = at

    def join(self, r: Choice) -> None:
        self.members.add(r)

    def waiting(self) -> bool:
        """Whether a member still waits for its first token (the others are let go)."""
        self.members = {r for r in self.members if r.first_token is None and not r.is_finished}
        return bool(self.members)
