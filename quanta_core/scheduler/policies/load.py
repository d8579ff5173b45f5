"""Admitted load: the engine-seconds of interactive work let in lately, per second.

Refusing a request whose first token the projection puts past its target is honest under
sustained overload, where a queue only grows. Below capacity it is not: traffic of mixed
prompt lengths (a coding assistant's: 30 to 4,000 tokens) comes in clumps, and a clump
behind a long prompt projects past the target although the queue drains a minute later. So
the policy refuses on the target only while the work admitted over the last ``window_s``,
with the arrival's own, would exceed the time it came in; below that, it queues. Refused
work is not counted: a client that sends again at once when refused (a closed loop that
ignores retry-after) would else read as an overload of its own making and be refused for
good; under a real overload the admitted work alone reaches the engine's capacity within
``min_s`` and the target bounds the rest.

    load(t) = price(work admitted in (t - window_s, t]) / max(min(t - first, window_s), min_s)

``min_s`` keeps the first arrivals from reading as overload (a burst on an idle machine is
the calm-burst rule's) and a lone arrival from reading as idle.

What a request costs. Each is priced alone (``request_work``): its prompt in full engine
passes, as prompts run below capacity (``QuantaPolicy.first_token_budget``), and each of
its expected tokens at what one stream adds to a decode step (the step's own cost is
shared). The work is kept in the step-cost line's own terms (steps, sequences, tokens,
attended pairs) and priced when the load is read, at the line learnt by then: priced in
seconds at admission, the first arrivals' work would stay in the window at the prior's
price, which is another machine's (the reference CPU's prior prefills at about half this
CPU's rate, so a stream at 3/4 of capacity read as overload for a minute).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from quanta_core.scheduler.step_cost import Vec, attended_k


@dataclass(frozen=True, slots=True)
class Work:
    """Engine work in the terms of the step-cost line (``step_cost``): the steps (each
    pays its base), the sequences in them, the tokens beyond one a sequence, and the
    thousand (query, key) pairs attended."""

    steps: float = 0.0
    seqs: float = 0.0
    tokens: float = 0.0
    pairs_k: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(
            self.steps + other.steps,
            self.seqs + other.seqs,
            self.tokens + other.tokens,
            self.pairs_k + other.pairs_k,
        )

    def __sub__(self, other: Work) -> Work:
        return self + other.times(-1.0)

    def times(self, k: float) -> Work:
        return Work(self.steps * k, self.seqs * k, self.tokens * k, self.pairs_k * k)

    def seconds(self, theta: Vec) -> float:
        """Its price on the line ``theta`` (base, per sequence, per token, per thousand
        pairs)."""
        base, seq, token, attn = theta
        return base * self.steps + seq * self.seqs + token * self.tokens + attn * self.pairs_k


def request_work(prompt: int, computed: int, outputs: int, chunk: int) -> Work:
    """A request of ``prompt`` tokens, ``computed`` of them in the KV already, and
    ``outputs`` tokens expected, alone on the engine: the rest of its prompt in steps of
    ``chunk`` tokens, then each output token one sequence of a decode step, attending over
    the context it has reached."""
    todo = max(prompt - computed, 1)
    steps = math.ceil(todo / max(chunk, 1))
    prefill = Work(steps, steps, todo - steps, attended_k(computed, todo))
    decode = Work(0.0, outputs, 0.0, outputs * (prompt + outputs / 2) / 1000)
    return prefill + decode


class OfferedLoad:
    def __init__(self, window_s: float, min_s: float) -> None:
        if window_s <= 0 or not 0 < min_s <= window_s:
            raise ValueError(f"need 0 < min_s <= window_s, got {min_s}, {window_s}")
        self.window_s = window_s
        self.min_s = min_s
        self._arrivals: deque[tuple[float, Work]] = deque()  # (time, work)
        self._sum = Work()
        self._first: float | None = None

    def add(self, now: float, work: Work) -> None:
        if self._first is None:
            self._first = now
        self._arrivals.append((now, work))
        self._sum += work
        self._expire(now)

    def load(self, now: float, theta: Vec, extra: Work | None = None) -> float:
        """Work per second over the window priced on the line ``theta`` (1: as much as the
        engine serves), with ``extra`` more arriving now."""
        self._expire(now)
        first = now if self._first is None else self._first
        span = max(min(now - first, self.window_s), self.min_s)
        work = self._sum if extra is None else self._sum + extra
        return work.seconds(theta) / span

    def _expire(self, now: float) -> None:
        while self._arrivals and self._arrivals[0][0] <= now - self.window_s:
            self._sum -= self._arrivals.popleft()[1]
        if not self._arrivals:
            self._sum = Work()  # no drift from float sums
