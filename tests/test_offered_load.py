"""The offered-load reading the default policy refuses by (``policies.load``)."""

from __future__ import annotations

import pytest

from quanta_core.scheduler.policies.load import OfferedLoad, Work, request_work
from quanta_core.scheduler.step_cost import attended_k

# A line that prices a step's sequence at 1 s and nothing else: work of n sequences is n s.
PER_SEQ = (0.0, 1.0, 0.0, 0.0)


def seqs(n: float) -> Work:
    return Work(seqs=n)


def test_the_load_is_the_work_of_the_window_over_its_span() -> None:
    load = OfferedLoad(window_s=60.0, min_s=5.0)
    assert load.load(0.0, PER_SEQ) == 0.0
    load.add(0.0, seqs(4.0))
    assert load.load(1.0, PER_SEQ) == pytest.approx(4.0 / 5.0)  # read over min_s at first
    load.add(10.0, seqs(8.0))
    assert load.load(20.0, PER_SEQ) == pytest.approx(12.0 / 20.0)  # then over the time since
    load.add(65.0, seqs(30.0))  # the first has left the window
    assert load.load(65.0, PER_SEQ) == pytest.approx(38.0 / 60.0)
    assert load.load(200.0, PER_SEQ) == 0.0  # all gone


def test_a_burst_reads_as_overload_only_past_min_s_of_work() -> None:
    load = OfferedLoad(window_s=60.0, min_s=5.0)
    for _ in range(4):
        load.add(0.0, seqs(1.0))
    assert load.load(0.0, PER_SEQ) < 1.0
    assert load.load(0.0, PER_SEQ, seqs(2.0)) > 1.0  # the arrival's own counts
    load.add(0.0, seqs(2.0))
    assert load.load(0.0, PER_SEQ) > 1.0


def test_admitted_work_is_priced_at_the_line_of_the_moment_it_is_read() -> None:
    # Admitted while the line still held its prior (a prompt token at 6 ms), read once the
    # steps have taught it the machine's (3 ms): the same work, half the load.
    load = OfferedLoad(window_s=60.0, min_s=5.0)
    load.add(0.0, request_work(2000, 0, 0, 512))
    prior = (0.0, 0.0, 0.006, 0.0)
    learnt = (0.0, 0.0, 0.003, 0.0)
    assert load.load(10.0, learnt) == pytest.approx(load.load(10.0, prior) / 2)


def test_a_request_is_its_prompt_in_full_passes_and_its_tokens_a_stream_each() -> None:
    theta = (0.5, 0.25, 0.001, 0.002)  # base, per sequence, per token, per thousand pairs
    work = request_work(prompt=1200, computed=200, outputs=10, chunk=512)
    prefill = 2 * 0.5 + 2 * 0.25 + (1000 - 2) * 0.001 + attended_k(200, 1000) * 0.002
    decode = 10 * 0.25 + 10 * (1200 + 5) / 1000 * 0.002  # no base: a decode step is shared
    assert work.seconds(theta) == pytest.approx(prefill + decode)
    # a smaller pass takes more steps, each paying the base and its sequence
    assert request_work(1200, 200, 10, 128).seconds(theta) > work.seconds(theta)


def test_bad_windows_are_refused() -> None:
    with pytest.raises(ValueError):
        OfferedLoad(window_s=5.0, min_s=10.0)
    with pytest.raises(ValueError):
        OfferedLoad(window_s=0.0, min_s=0.0)
