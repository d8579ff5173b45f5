"""The simulator's prompt ids: the same numbers as the formula they are defined by."""

from __future__ import annotations

import random

from quanta_core.sim.prompts import _stream


def test_the_stream_is_its_formula_exactly() -> None:
    rng = random.Random(5)
    for _ in range(50):
        seed, n = rng.randrange(2**32), rng.randrange(0, 600)
        low, span = rng.randrange(0, 2000), rng.randrange(1, 50_000)
        expected = [low + (seed + 7919 * k + (k * k) % 104729) % span for k in range(n)]
        got = _stream(seed, n, low, span)
        assert got == expected
        assert all(type(t) is int for t in got)  # not numpy's ints: they go into msgspec
