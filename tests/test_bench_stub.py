"""The instrument against a stub server with scripted timings: every figure by hand.

The script (seconds; all four requests are sent at 0; targets below):

    r0  alice  interactive  prompt 10  tokens 1, 2, 3, 4               done 4
    r1  alice  interactive  prompt 20  tokens 0.5, 3.0, 3.1, 3.2, 3.3  done 3.3
    r2  bob    interactive  prompt 10  tokens 2, 3, 5, 8               done 8 (preempted once)
    r3  carol  batch        prompt 5   tokens 6, 7                     done 7

    interactive: TTFT ≤ 1.5 s, TPOT ≤ 1 s, smooth pace 1 s/token; batch: done within 10 s

    r0  TTFT 1    TPOT 1     good  smooth: deadlines 1.5 2.5 3.5 4.5        → all 4 on time
    r1  TTFT 0.5  TPOT 0.7   good  deadlines 1.5 2.5 3.5 4.5 5.5, 3.0 late  → 4 of 5
    r2  TTFT 2    TPOT 2     bad   deadlines 1.5 2.5 3.5 4.5                → 0 on time
    r3  e2e 7 ≤ 10           good  smooth good                              → 2 of 2
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from app.cli import cli
from app.lab.bench.client import Target
from app.lab.bench.compare import comparison_rows, print_comparison
from app.lab.bench.plots import plot_all
from app.lab.bench.processes import Senders, processes_for
from app.lab.bench.report import build_result, load_result, records_of, write_result
from app.lab.bench.runner import RunOptions, run_plan
from app.lab.bench.table import print_result
from quanta_core.metrics import RequestRecord, SloTargets, summarize
from quanta_core.requests import SloClass
from quanta_core.workload import PlannedRequest, TenantSpec, WorkloadSpec, build_plan, fixed
from tests.bench_stub import Script, SteppedClock, StubServer

TARGETS = {
    SloClass.INTERACTIVE: SloTargets(ttft_s=1.5, tpot_s=1.0, itl_s=1.0),
    SloClass.BATCH: SloTargets(deadline_s=10.0),
}
SPEC = WorkloadSpec(
    name="stub",
    tenants=(
        TenantSpec("alice", prompt=fixed(10), output=fixed(4), requests=2, api_key="key-a"),
        TenantSpec("bob", prompt=fixed(10), output=fixed(4), requests=1),
        TenantSpec("carol", slo_class=SloClass.BATCH, prompt=fixed(5), output=fixed(2), requests=1),
    ),
    requests=None,
    rate=math.inf,
    targets=TARGETS,
    window_s=2.0,
)
StubRun = tuple[list[RequestRecord], SteppedClock, StubServer]
Q = {"e2e_s": None, "cached_tokens": 0}
SCRIPTS = {
    "r0": Script((1, 2, 3, 4), 4, {**Q, "queue_s": 0.25, "prefill_s": 0.75, "preemptions": 0}),
    "r1": Script((0.5, 3.0, 3.1, 3.2, 3.3), 3.3),  # no ``quanta`` object: like other servers
    "r2": Script((2, 3, 5, 8), 8, {**Q, "queue_s": 1.5, "prefill_s": 0.5, "preemptions": 1}),
    "r3": Script((6, 7), 7, {**Q, "queue_s": 5.0, "prefill_s": 1.0, "preemptions": 0}),
}


async def run_stub() -> StubRun:
    plan = build_plan(SPEC)
    # All arrive at 0, in tenant order; alice's second request is longer than her first.
    assert [p.tenant for p in plan] == ["alice", "alice", "bob", "carol"]
    plan[1] = PlannedRequest(1, 0.0, "alice", SloClass.INTERACTIVE, 20, 5)
    clock = SteppedClock()
    async with StubServer(SCRIPTS, clock) as stub:
        target = Target(url=stub.url, model="stub-model")
        records = await run_plan(SPEC, plan, target, RunOptions(api_key="default"), clock=clock)
    return records, clock, stub


@pytest.fixture
async def stub_run() -> StubRun:
    return await run_stub()


def by_id(records: list[RequestRecord]) -> dict[str, RequestRecord]:
    return {r.request_id: r for r in records}


async def test_the_client_records_every_scripted_timestamp(stub_run: StubRun) -> None:
    records, _, stub = stub_run
    r = by_id(records)
    assert r["r0"].token_times == (1, 2, 3, 4)
    assert r["r0"].ttft == 1 and r["r0"].e2e == 4 and r["r0"].tpot == 1
    assert r["r0"].itls == (1, 1, 1)
    assert r["r1"].token_times == (0.5, 3.0, 3.1, 3.2, 3.3)
    assert r["r1"].tpot == pytest.approx(0.7)
    assert r["r2"].ttft == 2 and r["r2"].tpot == 2 and r["r2"].finished == 8
    # The server's split is read from the ``quanta`` extension, absent on r1 (other servers).
    assert (r["r2"].server_queue_s, r["r2"].server_prefill_s) == (1.5, 0.5)
    assert r["r2"].server_preemptions == 1
    assert r["r1"].server_queue_s is None
    assert all(x.ok and x.sent == 0 for x in records)
    # Requests carry the workload's lengths, ignore-EOS, and the tenant's own key.
    body = stub.bodies["r0"]
    assert body["max_tokens"] == 4 and body["ignore_eos"] is True and body["stream"] is True
    assert len(body["prompt"]) == 10 and body["model"] == "stub-model"
    assert stub.headers["r0"]["authorization"] == "Bearer key-a"
    assert stub.headers["r2"]["authorization"] == "Bearer default"


async def test_the_figures_come_out_as_computed_by_hand(stub_run: StubRun) -> None:
    records, _, _ = stub_run
    s = summarize(records, TARGETS, window_s=2.0, bin_s=1.0)
    assert s.duration_s == 8
    o = s.overall
    assert (o.requests, o.completed, o.failed) == (4, 4, 0)
    assert o.output_tokens == 15 and o.input_tokens == 45
    assert o.requests_per_s == 4 / 8 and o.output_tokens_per_s == 15 / 8
    assert (o.good, o.smooth_good, o.tokens_on_time) == (3, 2, 10)
    assert o.goodput_per_s == 3 / 8 and o.smooth_goodput_per_s == 2 / 8
    assert o.preemptions == 1
    # TTFTs 0.5, 1, 2, 6 s: nearest-rank percentiles are values someone saw.
    assert o.ttft.count == 4
    assert o.ttft.p50_ms == pytest.approx(1000)
    assert o.ttft.p90_ms == pytest.approx(6000)
    assert o.ttft.max_ms == pytest.approx(6000)
    assert o.ttft.mean_ms == pytest.approx(2375)
    assert o.queue.count == 3 and o.queue.p50_ms == pytest.approx(1500, rel=1e-3)
    inter, batch = s.classes["interactive"], s.classes["batch"]
    assert (inter.requests, inter.good, inter.smooth_good, inter.tokens_on_time) == (3, 2, 1, 8)
    assert (batch.requests, batch.good, batch.smooth_good) == (1, 1, 1)
    assert s.tenants["alice"].good == 2 and s.tenants["bob"].good == 0
    assert s.ttft_ranks == {1: 0.5, 2: 1.0, 4: 6.0}
    assert s.tokens_per_s == [1, 1, 2, 6, 1, 1, 1, 1, 1]
    # Fairness between alice and bob, 2 s windows; both backlogged in [0,2) and [2,4) only.
    #   [0,2): alice 20+2 (r2 at 0.5) + 10+2 (r0 at 1) = 34, bob 0   → diff 34, Jain 1/2
    #   [2,4): alice 2+2 (r0) + 4×2 (r2) = 12, bob 10+2+2 = 14        → diff 2, Jain 676/680
    f = s.fairness["interactive"]
    assert [(w.start, w.end) for w in f.windows] == [(0, 2), (2, 4)]
    assert [w.service for w in f.windows] == [{"alice": 34, "bob": 0}, {"alice": 12, "bob": 14}]
    assert f.max_difference == 34 and f.mean_difference == 18
    assert f.min_jain == 0.5
    assert f.mean_jain == pytest.approx((0.5 + 676 / 680) / 2)
    assert s.fairness["batch"].windows == ()


async def test_results_file_table_plots_and_compare(stub_run: StubRun, tmp_path: Path) -> None:
    records, _, _ = stub_run
    summary = summarize(records, TARGETS, window_s=2.0)
    result = build_result(
        label="stub", spec=SPEC, flags={}, env={"host": "test"}, records=records, summary=summary
    )
    out = tmp_path / "stub.json"
    write_result(result, out)
    loaded = load_result(out)
    assert loaded["server_kind"] == "quanta"
    assert loaded["config"]["workload"]["rate"] == "inf"
    assert loaded["config"]["workload"]["tenants"][0]["api_key"] == "***"  # never the key
    # The raw rows are enough to recompute every figure.
    again = summarize(records_of(loaded), TARGETS, window_s=2.0)
    assert again.as_dict() == summary.as_dict() == loaded["summary"]
    assert loaded["service"]["cumulative"]["alice"][-1] == 34 + 12 + 2  # +r0's token at 4

    console = Console(record=True, width=250)
    print_result(loaded, console)
    text = console.export_text()
    assert "first word seen by the 1st 0.50 s, 2nd 1.00 s, 4th 6.00 s" in text
    assert "Jain mean 0.747" in text

    paths = plot_all(loaded, records, out)
    assert [p.name for p in paths] == [
        "stub.cdf.png",
        "stub.ttft.png",
        "stub.service.png",
        "stub.tokens.png",
    ]
    assert all(p.stat().st_size > 1000 for p in paths)

    slower = load_result(out)
    slower["label"] = "slower"
    slower["summary"]["overall"]["ttft"]["p50_ms"] *= 2
    rows = {(g, f): (a, b) for g, f, a, b in comparison_rows(loaded, slower)}
    assert rows[("all", "TTFT p50")][1] == pytest.approx(2 * rows[("all", "TTFT p50")][0])
    assert rows[("all", "goodput/s")] == (3 / 8, 3 / 8)
    assert rows[("all", "first word #4 (s)")] == (6.0, 6.0)
    console = Console(record=True, width=200)
    print_comparison(loaded, slower, console)
    text = console.export_text()
    assert "A = stub   B = slower" in text and "2.00×" in text


async def test_a_refused_request_is_a_failed_row_not_a_crash() -> None:
    spec = WorkloadSpec(name="refused", tenants=(TenantSpec("t", output=fixed(3)),), requests=1)
    clock = SteppedClock()
    async with StubServer({"r0": Script(status=429)}, clock) as stub:
        target = Target(url=stub.url, model="m")
        [record] = await run_plan(spec, build_plan(spec), target, RunOptions(), clock=clock)
    assert not record.ok and record.status == 429 and "scripted" in (record.error or "")
    s = summarize([record])
    assert (s.overall.failed, s.overall.rejected, s.overall.good) == (1, 1, 0)
    assert s.overall.ttft.count == 0


LIVE = Script(token_times=(0.01, 0.02, 0.03), done=0.03)


async def test_the_concurrency_cap_holds_in_open_loop() -> None:
    spec = WorkloadSpec(
        name="capped", tenants=(TenantSpec("t", output=fixed(3)),), requests=12, concurrency=3
    )
    async with StubServer({}, live=True, default=LIVE) as stub:
        records = await run_plan(spec, build_plan(spec), Target(stub.url, "m"), RunOptions())
    assert [r.ok for r in records] == [True] * 12
    assert [len(r.token_times) for r in records] == [3] * 12
    assert 1 <= stub.max_in_flight <= 3


async def test_closed_loop_users_wait_for_their_answers() -> None:
    spec = WorkloadSpec(
        name="closed", tenants=(TenantSpec("t", output=fixed(3)),), requests=10, users=2
    )
    async with StubServer({}, live=True, default=LIVE) as stub:
        records = await run_plan(spec, build_plan(spec), Target(stub.url, "m"), RunOptions())
    assert len(records) == 10 and all(r.ok and r.scheduled is None for r in records)
    assert 1 <= stub.max_in_flight <= 2


async def test_a_plan_sent_from_several_processes_is_one_run_on_one_clock() -> None:
    spec = WorkloadSpec(name="burst", tenants=(TenantSpec("t", output=fixed(3)),), requests=13)
    plan = build_plan(spec)
    attempts: list[RequestRecord] = []
    async with StubServer({}, live=True, default=LIVE) as stub:
        with Senders(spec, plan, Target(stub.url, "m"), RunOptions(), 3) as senders:
            records = await asyncio.to_thread(senders.run, attempts.append)
    # every request once, in plan order, each answered in full
    assert [r.request_id for r in records] == [f"r{i}" for i in range(13)]
    assert [len(r.token_times) for r in records if r.ok] == [3] * 13
    assert sorted(a.request_id for a in attempts) == sorted(r.request_id for r in records)
    # one clock: all sent at the run's start, the tokens after their own sends
    assert all(0 <= r.sent < 1.0 for r in records)
    assert all(r.sent < r.token_times[0] < r.sent + 1.0 for r in records)
    assert stub.max_in_flight > 1


def test_the_number_of_sending_processes() -> None:
    burst = WorkloadSpec(name="b", tenants=(TenantSpec("t"),), requests=200)
    assert processes_for(burst, 200, 4) == 4
    assert processes_for(burst, 3, 4) == 3  # no process without a request
    assert 1 <= processes_for(burst, 200, None) <= 8
    assert processes_for(burst, 10, None) == 1  # one per 32 requests
    closed = WorkloadSpec(name="c", tenants=(TenantSpec("t"),), requests=20, users=4)
    capped = WorkloadSpec(name="k", tenants=(TenantSpec("t"),), requests=20, concurrency=2)
    for shared in (closed, capped):
        assert processes_for(shared, 20, None) == 1
        with pytest.raises(ValueError, match="shared state"):
            processes_for(shared, 20, 2)
    with pytest.raises(ValueError, match="at least 1"):
        processes_for(burst, 200, 0)


async def test_the_compare_and_run_commands(stub_run: StubRun, tmp_path: Path) -> None:
    records, _, _ = stub_run
    for label in ("a", "b"):
        result = build_result(
            label=label,
            spec=SPEC,
            flags={},
            env={},
            records=records,
            summary=summarize(records, TARGETS, window_s=2.0),
        )
        write_result(result, tmp_path / f"{label}.json")
    runner = CliRunner()
    out = runner.invoke(
        cli, ["bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    )
    assert out.exit_code == 0 and "A = a   B = b" in out.output and "1.00×" in out.output
    (tmp_path / "bad.toml").write_text("[[tenants]]\nname = 'x'\npromt = 3\n")
    bad = runner.invoke(cli, ["bench", "run", "--workload", str(tmp_path / "bad.toml")])
    assert bad.exit_code == 2 and "unknown key(s) promt" in bad.output
    not_results = runner.invoke(
        cli, ["bench", "compare", str(tmp_path / "bad.toml"), str(tmp_path / "a.json")]
    )
    assert not_results.exit_code == 2
