"""The MC-SF projection rule (``quanta_core.scheduler.policies.memory``): exact admit/hold
decisions on tiny pools."""

from __future__ import annotations

import pytest

from quanta_core.requests import GenerationRequest
from quanta_core.scheduler.choice import Choice
from quanta_core.scheduler.policies.memory import (
    KvDemand,
    MemoryGate,
    fits,
    max_tokens_remaining,
    peak_blocks,
)


def test_peak_is_just_before_a_completion() -> None:
    # block_size 4: a (4 cells, 2 to go), b (2, 5), c (3, 4)
    #   t=0: 1 + 1 + 1 = 3;  t=2: ceil(6/4) + ceil(4/4) + ceil(5/4) = 2 + 1 + 2 = 5
    #   t=4: b ceil(6/4) + c ceil(7/4) = 4;  t=5: b ceil(7/4) = 2
    demands = [KvDemand(4, 2), KvDemand(2, 5), KvDemand(3, 4)]
    assert peak_blocks(demands, 4) == 5
    assert fits(demands[:2], demands[2], capacity_blocks=5, block_size=4)
    assert not fits(demands[:2], demands[2], capacity_blocks=4, block_size=4)


def test_fits_now_but_not_later_is_held() -> None:
    # Cells (block_size 1), 10 of them. Beside a (2 held, 6 to go: 8 cells at its end) a twin
    # needs 4 cells now but 16 at t=6: held. A short one (2, 1) holds 3 beside a's 3 at t=1,
    # and a alone peaks at 8: it fits.
    a = KvDemand(2, 6)
    assert not fits([a], KvDemand(2, 6), capacity_blocks=10, block_size=1)
    assert fits([a], KvDemand(2, 1), capacity_blocks=10, block_size=1)
    assert fits([a], KvDemand(2, 2), capacity_blocks=10, block_size=1)  # t=2: 4 + 4 = 8
    assert not fits([a], KvDemand(2, 4), capacity_blocks=10, block_size=1)  # t=4: 6 + 6


def test_a_sequence_holds_its_cells_through_its_last_token() -> None:
    # a ends after 1 more token holding 6 cells; the candidate holds 3 then: 9 cells.
    a = KvDemand(5, 1)
    assert not fits([a], KvDemand(2, 4), capacity_blocks=8, block_size=1)
    assert fits([a], KvDemand(2, 4), capacity_blocks=9, block_size=1)


def test_idle_engine_admits_anything() -> None:
    assert fits([], KvDemand(1000, 1000), capacity_blocks=1, block_size=16)


def _choice(request_id: str, prompt_len: int, max_tokens: int, generated: int = 0) -> Choice:
    req = GenerationRequest(request_id, tuple(range(1, prompt_len + 1)), max_tokens)
    r = Choice.choices_of(req, 0.0, 1)[0]
    r.tokens.extend([7] * generated)
    return r


def test_gate_projects_max_tokens_of_choices() -> None:
    gate = MemoryGate()
    gate.set_pool(num_blocks=6, block_size=4)
    # running: 4-token prompt, 8 of 10 generated -> 12 cells, 2 to go: 14 cells = 4 blocks
    running = [_choice("a", 4, 10, generated=8)]
    assert max_tokens_remaining(running[0]) == 2
    # 2-token prompt, 2 tokens: t=0: 3 + 1 = 4 blocks; t=2: 4 + 1 = 5 blocks
    assert gate.admits(_choice("b", 2, 2), running)
    # 2-token prompt, 6 tokens: t=2: 4 + 1 = 5 blocks; t=6: 2 blocks, a has ended
    assert gate.admits(_choice("c", 2, 6), running)
    # 8-token prompt: t=2: 4 + ceil(10/4) = 7 blocks > 6
    assert not gate.admits(_choice("d", 8, 6), running)
    assert gate.holds == 1
    assert gate.admits(_choice("d", 8, 6), [])


def test_gate_needs_the_pool() -> None:
    with pytest.raises(RuntimeError, match="set_pool"):
        MemoryGate().admits(_choice("a", 2, 2), [_choice("b", 2, 2)])
