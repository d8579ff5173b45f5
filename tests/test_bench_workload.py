"""Workloads: arrivals by seed, lengths, plans, trace replay scaling, files and presets."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.lab.bench.prompts import prompt_token_ids, request_body
from quanta_core.metrics import SloTargets
from quanta_core.requests import SloClass
from quanta_core.workload import (
    DistKind,
    Endpoint,
    TenantSpec,
    TraceSpec,
    WorkloadError,
    WorkloadSpec,
    arrival_times,
    build_plan,
    fixed,
    load_workload,
    parse_azure_csv,
    parse_length,
    preset,
    replay,
    workload_from_dict,
)


def test_arrivals_are_deterministic_by_seed_with_the_right_mean_rate() -> None:
    a = arrival_times(random.Random(7), rate=4.0, count=20_000)
    assert a == arrival_times(random.Random(7), rate=4.0, count=20_000)
    assert a != arrival_times(random.Random(8), rate=4.0, count=20_000)
    assert a[0] == 0.0
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)
    # Poisson: the gaps' coefficient of variation is 1.
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


def test_burstiness_changes_the_spread_not_the_mean() -> None:
    a = arrival_times(random.Random(1), rate=2.0, burstiness=0.25, count=20_000)
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert statistics.fmean(gaps) == pytest.approx(0.5, rel=0.05)
    # gamma with shape k: CV = 1/√k = 2.
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(2.0, rel=0.1)


def test_an_infinite_rate_sends_everything_at_once_and_a_duration_bounds_arrivals() -> None:
    assert arrival_times(random.Random(0), math.inf, count=5) == [0.0] * 5
    timed = arrival_times(random.Random(0), 10.0, duration_s=3.0)
    assert timed and max(timed) < 3.0
    with pytest.raises(ValueError):
        arrival_times(random.Random(0), math.inf, duration_s=1.0)


def test_length_distributions() -> None:
    rng = random.Random(3)
    assert parse_length(64).sample(rng) == 64
    u = parse_length({"dist": "uniform", "min": 10, "max": 20})
    assert {u.sample(rng) for _ in range(500)} == set(range(10, 21))
    ln = parse_length({"dist": "lognormal", "mean": 100, "std": 50, "max": 10_000})
    assert ln.kind is DistKind.LOGNORMAL
    assert statistics.fmean(ln.sample(rng) for _ in range(20_000)) == pytest.approx(100, rel=0.05)
    clipped = parse_length({"dist": "normal", "mean": 10, "std": 100, "min": 5, "max": 15})
    assert all(5 <= clipped.sample(rng) <= 15 for _ in range(200))


def test_the_twenty_at_once_preset() -> None:
    spec = preset("twenty-at-once")
    plan = build_plan(spec)
    assert len(plan) == 20
    assert {(p.arrival, p.output_tokens) for p in plan} == {(0.0, 128)}
    with pytest.raises(WorkloadError):
        preset("nope")


def two_tenants(**kw: object) -> WorkloadSpec:
    base = WorkloadSpec(
        name="two",
        tenants=(
            TenantSpec("a", share=3, prompt=parse_length({"dist": "uniform", "min": 5, "max": 50})),
            TenantSpec("b", share=1, slo_class=SloClass.BATCH, output=fixed(7)),
        ),
        seed=11,
        requests=40,
        rate=8.0,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_plans_split_by_share_and_repeat_by_seed() -> None:
    plan = build_plan(two_tenants())
    assert plan == build_plan(two_tenants())
    assert plan != build_plan(two_tenants(seed=12))
    assert [p.index for p in plan] == list(range(40))
    assert sum(p.tenant == "a" for p in plan) == 30
    arrivals = [p.arrival for p in plan]
    assert arrivals == sorted(arrivals)  # type: ignore[type-var]
    assert {p.output_tokens for p in plan if p.tenant == "b"} == {7}
    assert {p.slo_class for p in plan if p.tenant == "b"} == {SloClass.BATCH}
    # Closed loop: the same kind of requests, no arrival times.
    closed = build_plan(two_tenants(users=3))
    assert len(closed) == 40 and {p.arrival for p in closed} == {None}


def test_prompts_are_exact_lengths_and_share_only_the_declared_prefix() -> None:
    spec = WorkloadSpec("p", (TenantSpec("t", prompt=fixed(40), prefix_tokens=16),), requests=2)
    first, second = build_plan(spec)
    a, b = prompt_token_ids(0, first), prompt_token_ids(0, second)
    assert len(a) == len(b) == 40
    assert a[:16] == b[:16] and a[16:] != b[16:]
    assert prompt_token_ids(0, first) == a  # same seed, same prompt
    body = request_body(
        first, model="m", endpoint=Endpoint.COMPLETIONS, seed=0, ignore_eos=True, temperature=0.0
    )
    assert body["prompt"] == a and body["max_tokens"] == 128 and body["ignore_eos"] is True
    chat = request_body(
        first, model="m", endpoint=Endpoint.CHAT, seed=0, ignore_eos=True, temperature=0.0
    )
    assert len(chat["messages"][0]["content"].split()) == 40


TRACE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.0000000,400,40
2023-11-16 18:15:46.5000000,1000,10
2023-11-16 18:15:48.0000000,100,300
2023-11-16 18:15:51.2500000,80,4
"""


def test_trace_replay_scales_time_and_lengths() -> None:
    rows = parse_azure_csv(TRACE)
    assert [r.arrival for r in rows] == [0.0, 0.5, 2.0, 5.25]
    spec = TraceSpec(
        path="-", time_scale=2.0, prompt_scale=0.5, output_scale=0.5, max_prompt=300, max_output=100
    )
    out = list(replay(rows, spec))
    assert [r.arrival for r in out] == [0.0, 1.0, 4.0, 10.5]
    assert [r.prompt_tokens for r in out] == [200, 300, 50, 40]
    assert [r.output_tokens for r in out] == [20, 5, 100, 2]
    skipped = list(replay(rows, TraceSpec(path="-", start_s=0.5, limit=2)))
    assert [(r.arrival, r.prompt_tokens) for r in skipped] == [(0.0, 1000), (1.5, 100)]
    short = list(replay(rows, TraceSpec(path="-", time_scale=2.0, duration_s=5.0)))
    assert len(short) == 3


def test_trace_times_are_strptimes_seconds_across_days_and_shapes() -> None:
    # Midnight, a day and a month boundary, a leap day, and a shape strptime reads leniently.
    text = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-02-28 23:59:59.9999999,1,1
2024-02-29 00:00:00.0000001,2,2
2024-03-01 12:34:56.5,3,3
2024-3-1 12:34:57,4,4
"""
    rows = parse_azure_csv(text)
    t0 = datetime(2024, 2, 28, 23, 59, 59, tzinfo=UTC).timestamp() + 0.9999999
    want = [
        datetime(2024, 2, 28, 23, 59, 59, tzinfo=UTC).timestamp() + 0.9999999,
        datetime(2024, 2, 29, tzinfo=UTC).timestamp() + 0.0000001,
        datetime(2024, 3, 1, 12, 34, 56, tzinfo=UTC).timestamp() + 0.5,
        datetime(2024, 3, 1, 12, 34, 57, tzinfo=UTC).timestamp(),
    ]
    assert [r.arrival for r in rows] == [t - t0 for t in want]
    assert [r.prompt_tokens for r in rows] == [1, 2, 3, 4]
    with pytest.raises(ValueError):
        parse_azure_csv("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-02-30 00:00:00,1,1\n")


def test_a_trace_workload_file_replays_the_trace(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(TRACE)
    (tmp_path / "w.toml").write_text(
        """
name = "replay"
seed = 3
[[tenants]]
name = "a"
[[tenants]]
name = "b"
class = "batch"
[trace]
path = "t.csv"
time_scale = 10
output_scale = 0.1
"""
    )
    spec = load_workload(tmp_path / "w.toml")
    assert spec.trace is not None and spec.trace.path == str(tmp_path / "t.csv")
    from quanta_core.workload import read_trace

    plan = build_plan(spec, read_trace(spec.trace.path))
    assert [p.arrival for p in plan] == [0.0, 5.0, 20.0, 52.5]
    assert [p.output_tokens for p in plan] == [4, 1, 30, 1]
    assert {p.tenant for p in plan} <= {"a", "b"}


def test_workload_files(tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text(
        """
name = "mixed"
seed = 5
requests = 12
rate = inf
concurrency = 4
[slo.interactive]
ttft_s = 3.0
tpot_s = 0.5
[[tenants]]
name = "alice"
api_key = "k-alice"
share = 2
prompt = { dist = "uniform", min = 8, max = 16 }
output = 32
[[tenants]]
name = "bob"
class = "batch"
weight = 2
"""
    )
    spec = load_workload(tmp_path / "w.toml")
    assert spec.rate == math.inf and spec.concurrency == 4 and spec.requests == 12
    assert spec.targets[SloClass.INTERACTIVE] == SloTargets(ttft_s=3.0, tpot_s=0.5)
    assert spec.targets[SloClass.BATCH] == SloTargets(deadline_s=120.0)  # the default
    alice, bob = spec.tenants
    assert alice.api_key == "k-alice" and alice.share == 2 and alice.output == fixed(32)
    assert bob.slo_class is SloClass.BATCH and bob.weight == 2
    (tmp_path / "w.yaml").write_text("name: y\nrequests: 3\ntenants:\n  - name: t\n    output: 5\n")
    assert build_plan(load_workload(tmp_path / "w.yaml"))[0].output_tokens == 5
    with pytest.raises(WorkloadError, match="unknown key"):
        workload_from_dict({"tenants": [{"name": "x", "promt": 5}]})
    with pytest.raises(WorkloadError):
        workload_from_dict({"rate": -1})


def test_the_shipped_workload_files_load() -> None:
    root = Path(__file__).resolve().parents[1] / "bench" / "workloads"
    files = sorted(root.glob("*.toml"))
    assert files
    for path in files:
        spec = load_workload(path)
        if spec.trace is None or Path(spec.trace.path).exists():
            assert spec.tenants
