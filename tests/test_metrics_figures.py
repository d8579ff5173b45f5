"""The metric maths on hand-made rows: no server, no clock, every figure by hand."""

from __future__ import annotations

import pytest

from quanta_core.metrics import (
    RequestRecord,
    SloTargets,
    cumulative_service,
    distribution,
    fairness,
    jain_index,
    meets_slo,
    meets_smooth_slo,
    summarize,
    tokens_on_time,
)
from quanta_core.metrics.slo import token_deadlines
from quanta_core.requests import SloClass

INTERACTIVE = SloTargets(ttft_s=1.0, tpot_s=0.5, itl_s=0.5)


def rec(
    tokens: tuple[float, ...],
    *,
    sent: float = 0.0,
    finished: float | None = None,
    tenant: str = "t",
    prompt: int = 10,
    weight: float = 1.0,
    slo: SloClass = SloClass.INTERACTIVE,
    ok: bool = True,
    rid: str = "r",
) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        tenant=tenant,
        slo_class=slo,
        sent=sent,
        prompt_tokens=prompt,
        max_tokens=len(tokens),
        ok=ok,
        finished=finished if finished is not None else (tokens[-1] if tokens else sent),
        token_times=tokens,
        weight=weight,
    )


def test_per_request_latencies() -> None:
    r = rec((1.0, 1.5, 2.5, 3.0), sent=0.5)
    assert r.ttft == 0.5
    assert r.itls == (0.5, 1.0, 0.5)
    assert r.e2e == 2.5
    assert r.tpot == pytest.approx((3.0 - 1.0) / 3)
    assert rec((1.0,)).tpot is None  # one token: no time *per output token* after the first


def test_the_server_count_wins_over_the_streamed_chunks_for_tpot() -> None:
    # 3 chunks carried 5 tokens (a chunk may hold several): TPOT divides by 4, not 2.
    r = RequestRecord("r", "t", SloClass.INTERACTIVE, 0.0, 1, 5, True, 3.0, (1.0, 2.0, 3.0), 5)
    assert r.n_output == 5 and r.tpot == 0.5


def test_goodput_needs_every_target_of_the_class() -> None:
    assert meets_slo(rec((1.0, 1.5, 2.0)), INTERACTIVE)  # TTFT 1 ≤ 1, TPOT 0.5 ≤ 0.5
    assert not meets_slo(rec((1.01, 1.5)), INTERACTIVE)  # TTFT over
    assert not meets_slo(rec((0.1, 1.2)), INTERACTIVE)  # TPOT 1.1 over
    assert not meets_slo(rec((0.1, 0.2), ok=False), INTERACTIVE)  # failed: never good
    deadline = SloTargets(deadline_s=5.0)
    assert meets_slo(rec((4.0, 5.0), slo=SloClass.BATCH), deadline)
    assert not meets_slo(rec((4.0, 5.5), slo=SloClass.BATCH), deadline)


def test_smooth_goodput_catches_a_stall_that_the_average_hides() -> None:
    # TTFT 0.2 and TPOT (2.1-0.2)/4 = 0.475 meet the targets on average, but token 1 came at
    # 1.8 while its deadline was 0 + 1.0 + 1 × 0.5 = 1.5.
    r = rec((0.2, 1.8, 1.9, 2.0, 2.1))
    assert token_deadlines(r, INTERACTIVE) == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert meets_slo(r, INTERACTIVE)
    assert not meets_smooth_slo(r, INTERACTIVE)
    assert tokens_on_time(r, INTERACTIVE) == 4
    steady = rec((0.9, 1.4, 1.9, 2.4, 2.9))
    assert meets_smooth_slo(steady, INTERACTIVE) and tokens_on_time(steady, INTERACTIVE) == 5


def test_jain_index() -> None:
    assert jain_index([5, 5, 5, 5]) == 1.0
    assert jain_index([1, 0, 0, 0]) == 0.25
    assert jain_index([1, 2, 3]) == pytest.approx(36 / 42)
    assert jain_index([0, 0]) == 1.0  # nobody served: nobody was favoured


def test_service_difference_counts_only_backlogged_windows_and_weights() -> None:
    # a (weight 2) is outstanding over [0, 4); b over [0, 3) and [5, 6); windows of 1 s.
    a = rec((0.5, 1.5, 2.5, 3.5), tenant="a", prompt=4, weight=2.0, finished=4.0)
    b1 = rec((0.5, 2.5), tenant="b", prompt=2, finished=3.0)
    b2 = rec((5.5,), tenant="b", prompt=2, sent=5.0, finished=6.0)
    f = fairness([a, b1, b2], window_s=1.0)
    # Both backlogged in [0,1), [1,2), [2,3); b is not in [3,4); a is not in [4,5), [5,6).
    #   [0,1): a (4 + 2)/2 = 3, b 2 + 2 = 4 · [1,2): a 2/2 = 1, b 0 · [2,3): a 1, b 2
    assert [w.service for w in f.windows] == [
        {"a": 3.0, "b": 4.0},
        {"a": 1.0, "b": 0.0},
        {"a": 1.0, "b": 2.0},
    ]
    assert [w.difference for w in f.windows] == [1.0, 1.0, 1.0]
    assert f.max_difference == 1.0 and f.mean_difference == 1.0
    assert f.windows[1].jain == 0.5
    assert f.min_jain == 0.5
    assert f.mean_jain == pytest.approx((49 / 50 + 0.5 + 9 / 10) / 3)


def test_one_tenant_has_no_fairness_windows() -> None:
    assert fairness([rec((1.0,)), rec((2.0,))], window_s=1.0).windows == ()


def test_cumulative_service_per_tenant() -> None:
    a = rec((0.5, 1.5), tenant="a", prompt=4)
    b = rec((2.5,), tenant="b", prompt=1, weight=0.5)
    assert cumulative_service([a, b], bin_s=1.0) == {"a": [6.0, 8.0, 8.0], "b": [0.0, 0.0, 6.0]}


def test_percentiles_are_nearest_rank_order_statistics() -> None:
    values = [i / 100 for i in range(100, 0, -1)]  # 1 s … 10 ms, unsorted on purpose
    d = distribution(values)
    assert d.count == 100
    assert d.p50_ms == pytest.approx(500)
    assert d.p90_ms == pytest.approx(900)
    assert d.p99_ms == pytest.approx(990)
    assert d.max_ms == pytest.approx(1000)
    assert d.mean_ms == pytest.approx(505)
    # Four values: the median is the 2nd (a latency someone saw), not the 2.5 between.
    small = distribution([0.004, 0.001, 0.003, 0.002])
    assert (small.p50_ms, small.p90_ms, small.p99_ms) == pytest.approx((2.0, 4.0, 4.0))
    one = distribution([0.25])
    assert one.p50_ms == one.p99_ms == one.max_ms == pytest.approx(250)
    assert distribution([]).p50_ms is None


def test_summary_groups_add_up_and_failures_count_against_goodput() -> None:
    rows = [
        rec((1.0, 1.5), tenant="a", rid="r0"),
        rec((0.5,), tenant="b", rid="r1", ok=False),
        rec((2.0, 3.0), tenant="b", rid="r2", slo=SloClass.BATCH),
    ]
    s = summarize(rows, {SloClass.INTERACTIVE: INTERACTIVE})
    assert s.duration_s == 3.0
    assert (s.overall.requests, s.overall.completed, s.overall.failed) == (3, 2, 1)
    # batch keeps its default target (a 120 s deadline): r2 is good.
    assert s.overall.good == 2 and s.classes["batch"].good == 1
    assert s.tenants["a"].requests_per_s + s.tenants["b"].requests_per_s == pytest.approx(
        s.overall.requests_per_s
    )
    assert s.ttft_ranks == {1: 0.5, 2: 1.0, 3: 2.0}
    d = s.as_dict()
    assert d["overall"]["goodput_fraction"] == pytest.approx(2 / 3)
    assert d["targets"]["batch"] == {
        "ttft_s": None,
        "tpot_s": None,
        "itl_s": None,
        "deadline_s": 120.0,
    }


def test_rows_round_trip() -> None:
    r = rec((1.0, 2.0), slo=SloClass.BATCH)
    assert RequestRecord.from_row(r.to_row()) == r
