"""Weighted shares between tenants whose requests all run at once: weighted fair queuing of
one class's decoding streams, step by step.

VTC orders who starts; once every tenant's requests hold a slot, each stream gets a token
per step whatever its tenant's weight (weights 1 and 2, all streams running: 1 : 1). A
fairness that holds only while requests queue is not one, so each step the tenant with the
lowest counter among the class's running tenants runs all its streams, and every other
tenant runs only as many decoding streams as keep its counter within ``lag`` of where the
lowest one's will be after the step::

    counter  low    ──●── + n_low · cost_low ──┐
                                               bar = low + n_low · cost_low + lag
    counter  ahead  ──────────●── + k · cost ≤ bar   →  k of its n streams run

    cost = output_cost / weight: a sampled token in the counters (``vtc``)

A prompt is charged as it is computed, in a lump (a 64-token prompt of a weight-1 tenant is
32 of its tokens' worth): a hard bar would stop all that tenant's streams until the others
caught up, seconds on a CPU. So a tenant ahead keeps ``floor`` of its matching rate (the
streams whose tokens move its counter as fast as the lowest one's moves) in every step: a
lump is repaid by slower streams, not stalled ones; in steady state the bar binds first.

The share comes before the inter-token target: a tenant ahead of its share gets fewer
tokens, and the target decides only which of its streams wait. The streams that waited
longest for a token run first, so the ones that sit out take turns and each stream's gap
grows evenly (weights 1 : 2, as many streams each: every light stream gets a token every
other step) instead of a few streams stalling. Where steps are short against the target
(a GPU) that gap stays within it; where the running set is sized to the target (a 2-core
CPU) it cannot, and the light tenant's streams slow by its share, as any weighted server's
would. A stream still to get its first token, or with prompt left to compute, never sits
out: only decoding streams do.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.slo import SloConfig

_MIN_WEIGHT = 1e-6
_TURN_MEMORY = 8  # the tokens a stream's turn is told by: sit-out cycles up to this long


@dataclass(frozen=True, slots=True)
class ShareRule:
    """``lag``: the weighted tokens a tenant may lead the lowest running one by;
    ``output_cost``: a sampled token's cost in the counters (VTC's, before the weight);
    ``floor``: the fraction of its matching rate a tenant ahead runs in every step."""

    lag: float = 32.0
    output_cost: float = 2.0
    floor: float = 0.5

    @classmethod
    def from_config(cls, config: SloConfig) -> ShareRule:
        return cls(config.fair_lag, config.output_cost)


def decoding(r: Choice) -> bool:
    """Whether ``r`` is past its first token with only its next token to compute."""
    return (
        r.first_token is not None
        and bool(r.token_times)
        and r.num_tokens - r.num_computed_tokens <= 1
    )


def sit_out(
    running: Collection[Choice], counter: Mapping[str, float], rule: ShareRule
) -> set[Choice]:
    """The decoding streams of ``running`` (one class's) that sit out this step so that
    each tenant stays within ``rule.lag`` of the lowest ``counter`` among them."""
    by_tenant: dict[str, list[Choice]] = {}
    for r in running:
        by_tenant.setdefault(r.tenant, []).append(r)
    if len(by_tenant) < 2 or math.isinf(rule.lag):
        return set()
    low = min(by_tenant, key=lambda t: (counter.get(t, 0.0), t))
    step = sum(_cost(r, rule) for r in by_tenant[low] if decoding(r))  # low's counter moves
    bar = counter.get(low, 0.0) + rule.lag + step
    held: set[Choice] = set()
    for tenant, mine in by_tenant.items():
        streams = [r for r in mine if decoding(r)]
        if tenant == low or not streams:
            continue
        cost = _cost(streams[0], rule)
        k = max(
            math.floor((bar - counter.get(tenant, 0.0)) / cost), math.ceil(rule.floor * step / cost)
        )
        k = max(0, min(len(streams), k))
        streams.sort(key=_turn)
        held.update(streams[k:])
    return held


def _turn(r: Choice) -> tuple[tuple[float, ...], int, int]:
    """The order a tenant's streams run in when only some may: the longest waiting for a
    token first, and among those last served together, the one that waited longer before
    (its earlier tokens, latest first), so that the streams that sit out take turns."""
    return tuple(reversed(r.token_times[-_TURN_MEMORY:])), r.order, r.index


def _cost(r: Choice, rule: ShareRule) -> float:
    return rule.output_cost / max(r.weight, _MIN_WEIGHT)
