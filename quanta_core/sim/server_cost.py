"""The server's own time around each engine step, which the engine waits through.

On a machine with as many cores as llama.cpp threads the driver hands each step's tokens to
the HTTP streams *between* steps (``Driver._hand_over``), and the cycle's thread hops, the
scheduler's bookkeeping and the worker's socket run there too: the engine is idle meanwhile.
The real inter-token gap is the engine's step plus this; the simulator adds it to every step:

    server_s = per_cycle_s + per_token_s * tokens handed out (sampled slices)

Measured on the real server by ``quanta bench http-overhead`` (HTTP streaming against the
engine alone at 1, 8 and 16 streams; its ``server_cost``), or read from real servers' step
traces (``quanta bench fidelity server-cost``: the gap before each step and its boundary), given
to ``quanta sim`` with ``--server-cycle-ms`` and ``--server-token-ms``.

A request also costs the server its intake before the scheduler sees it (its HTTP handler:
the key, the body, tokenizing, admission), ``per_request_s``, run one request at a time on
the server's event loop: a burst of N reaches the scheduler over N * per_request_s, the k-th
at k * per_request_s. (The loop's time for intake and for the cycles are not charged against
each other: a burst's intake mostly comes before its first steps.) A served burst's records
measure it: the gaps between the scheduler's arrivals, each ``sent`` + TTFT - its
``queue_s`` - its ``prefill_s`` (``bench/results/gpu/README.md``: 1.1-1.3 ms on the H200
host). ``quanta sim --server-request-ms``. Zero for all three: the engine alone.

A cost model may carry the server's costs measured on its machine (``meta["server_cost_ms"]``,
``in_meta`` / ``of_meta``): `quanta sim` then simulates the served server by default, the
flags override them. The GPU bench writes them from its served runs' step traces
(``quanta_core.sim.step_trace.server_cost_of``) and intake bursts.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quanta_core.engine.types import StepPlan

META_KEY = "server_cost_ms"


@dataclass(frozen=True, slots=True)
class ServerCost:
    per_cycle_s: float = 0.0
    per_token_s: float = 0.0
    per_request_s: float = 0.0  # each request's intake, one at a time, before the scheduler

    def __post_init__(self) -> None:
        if self.per_cycle_s < 0 or self.per_token_s < 0 or self.per_request_s < 0:
            raise ValueError(f"a server cost cannot be negative: {self}")

    def seconds(self, plan: StepPlan) -> float:
        """The server's time for the cycle that ran ``plan``."""
        if not self.per_token_s:
            return self.per_cycle_s
        return self.per_cycle_s + self.per_token_s * streamed_tokens(plan)

    def in_meta(self, source: str) -> dict[str, Any]:
        """The cost model's ``meta["server_cost_ms"]`` entry for this cost (in ms)."""
        return {
            "per_cycle": 1e3 * self.per_cycle_s,
            "per_token": 1e3 * self.per_token_s,
            "per_request": 1e3 * self.per_request_s,
            "from": source,
        }

    @classmethod
    def of_meta(cls, meta: Mapping[str, Any]) -> ServerCost | None:
        """The server cost a cost model's ``meta`` carries; None if it has none."""
        entry = meta.get(META_KEY)
        if not isinstance(entry, Mapping):
            return None
        try:
            ms = [float(entry.get(k, 0.0)) for k in ("per_cycle", "per_token", "per_request")]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cost model meta {META_KEY!r} is not a server cost: {exc}") from exc
        return cls(*(v / 1e3 for v in ms))

    def decode_seconds(self, n_seqs: int) -> float:
        """``seconds`` of a plan in which ``n_seqs`` sequences each decode (and sample) one
        token."""
        if not self.per_token_s:
            return self.per_cycle_s
        return self.per_cycle_s + self.per_token_s * n_seqs


def streamed_tokens(plan: StepPlan) -> int:
    """The tokens a step hands to streams: one per sampled slice."""
    return sum(1 for s in plan.slices if s.sample)


def fit_server_cost(points: Sequence[tuple[float, float]]) -> ServerCost:
    """``seconds = per_cycle + per_token * tokens`` by least squares over ``(tokens, seconds)``
    points, both coefficients >= 0 (one of them 0 where the line would go negative)."""
    if not points:
        raise ValueError("no points to fit a server cost on")
    tokens = [float(n) for n, _ in points]
    seconds = [max(0.0, s) for _, s in points]
    if len(set(tokens)) < 2:
        return ServerCost(per_cycle_s=statistics.fmean(seconds))
    per_token, per_cycle = statistics.linear_regression(tokens, seconds)
    if per_token < 0:
        return ServerCost(per_cycle_s=statistics.fmean(seconds))
    if per_cycle < 0:  # through the origin
        slope = sum(n * s for n, s in zip(tokens, seconds, strict=True)) / sum(
            n * n for n in tokens
        )
        return ServerCost(per_token_s=slope)
    return ServerCost(per_cycle_s=per_cycle, per_token_s=per_token)
