"""The offered-load reading the default policy refuses by (``policies.load``)."""

from __future__ import annotations

import pytest

from quanta_core.scheduler.policies.load import OfferedLoad


def test_the_load_is_the_work_of_the_window_over_its_span() -> None:
    load = OfferedLoad(window_s=60.0, min_s=5.0)
    assert load.load(0.0) == 0.0
    load.add(0.0, 4.0)
    assert load.load(1.0) == pytest.approx(4.0 / 5.0)  # read over min_s at first
    load.add(10.0, 8.0)
    assert load.load(20.0) == pytest.approx(12.0 / 20.0)  # then over the time since
    load.add(65.0, 30.0)  # the first has left the window
    assert load.load(65.0) == pytest.approx(38.0 / 60.0)
    assert load.load(200.0) == 0.0  # all gone


def test_a_burst_reads_as_overload_only_past_min_s_of_work() -> None:
    load = OfferedLoad(window_s=60.0, min_s=5.0)
    for _ in range(4):
        load.add(0.0, 1.0)
    assert load.load(0.0) < 1.0
    load.add(0.0, 2.0)
    assert load.load(0.0) > 1.0


def test_bad_windows_are_refused() -> None:
    with pytest.raises(ValueError):
        OfferedLoad(window_s=5.0, min_s=10.0)
    with pytest.raises(ValueError):
        OfferedLoad(window_s=0.0, min_s=0.0)
