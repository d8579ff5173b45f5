"""Weighted shares between tenants whose requests all run at once.

VTC orders who starts; once every tenant's requests hold a slot, each gets a token per
step whatever its weight (two tenants of weights 1 and 2, all streams running, split
1 : 1). So, step by step, a tenant whose counter leads the lowest counter of its class's
running tenants by more than ``lag`` weighted tokens sits out: batch always (it has no
inter-token target), an interactive stream only where its next token, one step later,
still comes within the inter-token target of its last one (that target comes first; the
policy asks only in steps that carry no prefill, whose length it knows).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from quanta_core.scheduler.choice import Choice


def leading(ranks: Mapping[str, float], lag: float) -> set[str]:
    """The tenants whose rank leads the lowest of ``ranks`` by more than ``lag``; none with
    fewer than two tenants."""
    if len(ranks) < 2:
        return set()
    low = min(ranks.values())
    return {t for t, c in ranks.items() if c - low > lag}


def can_sit_out(r: Choice, now: float, step_s: float, itl_s: float) -> bool:
    """Whether decoding stream ``r`` may skip the step starting ``now`` (``step_s`` long, as
    the one after it): its next token, a step later, is still within ``itl_s`` of its last
    one. A stream still to get its first token never sits out."""
    if r.first_token is None or not r.token_times or r.num_tokens - r.num_computed_tokens > 1:
        return False
    return now - r.token_times[-1] + 2 * step_s <= itl_s


def held_back(
    running: Collection[Choice],
    ranks: Mapping[str, float],
    lag: float,
    now: float,
    step_s: float,
    itl_s: float | None,
) -> set[Choice]:
    """Running requests of ``ranks``' leading tenants that sit out this step: all of them
    when ``itl_s`` is None (batch), else those that ``can_sit_out``."""
    ahead = leading(ranks, lag)
    if not ahead:
        return set()
    mine = (r for r in running if r.tenant in ahead)
    if itl_s is None:
        return set(mine)
    return {r for r in mine if can_sit_out(r, now, step_s, itl_s)}
