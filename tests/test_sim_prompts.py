"""The simulator's prompt ids: the same numbers as the formula they are defined by."""

from __future__ import annotations

import random

from quanta_core.requests import SloClass
from quanta_core.sim.prompts import _stream, always_in_vocabulary, prompt_ids
from quanta_core.workload import Endpoint, PlannedRequest


def test_the_stream_is_its_formula_exactly() -> None:
    rng = random.Random(5)
    for _ in range(50):
        seed, n = rng.randrange(2**32), rng.randrange(0, 600)
        low, span = rng.randrange(0, 2000), rng.randrange(1, 50_000)
        expected = [low + (seed + 7919 * k + (k * k) % 104729) % span for k in range(n)]
        got = _stream(seed, n, low, span)
        assert got == expected
        assert all(type(t) is int for t in got)  # not numpy's ints: they go into msgspec


def test_always_in_vocabulary_holds_for_every_prompt_it_is_said_of() -> None:
    for n_vocab in range(2, 120):
        ids = {
            t
            for endpoint in (Endpoint.COMPLETIONS, Endpoint.CHAT)
            for i in range(30)
            for t in prompt_ids(
                i, PlannedRequest(i, 0.0, "t", SloClass.INTERACTIVE, 60, 1, 10), endpoint, n_vocab
            )
        }
        if always_in_vocabulary(n_vocab):
            assert max(ids) < n_vocab and min(ids) >= 0
    assert always_in_vocabulary(49152)
    assert not always_in_vocabulary(40)  # the chat template's head runs past 40
