"""The long-prompt scenario suite (``quanta bench scenarios --suite long``): its workloads,
its real-text prompts, its key figures and ratio table, and the suite against stub servers.

Prompts are cut from a small corpus by a word tokenizer (one id per word) where the model is
not the point; one test tokenizes the standard library with the default model's own
vocabulary, as the command does.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from app.lab.bench import long_cells
from app.lab.bench.cli import write_tables
from app.lab.bench.long_scenarios import (
    CAPACITY_UNITS,
    LOAD,
    OUTPUT,
    SYSTEM_PROMPT,
    TEMPERATURE,
    Machine,
    build,
    coding,
    conv_replay,
    representative_start,
    request_units,
    shared_prefix,
)
from app.lab.bench.scenario_table import ratios_markdown
from app.lab.bench.servers import Running, ServerSpec
from app.lab.bench.suite import groups, run_suite, scenario_prompts, server_spec
from app.lab.bench.text_prompts import (
    DISTINCT_HEAD,
    Corpus,
    model_tokenizer,
    prompt_ids_for,
    stdlib_corpus,
)
from app.lab.bench.workloads import make_plan
from quanta_core.metrics import RequestRecord
from quanta_core.metrics.slo import SloTargets
from quanta_core.requests import SloClass
from quanta_core.workload import TraceRow, read_trace
from tests.bench_stub import Script, StubServer

WORDS = [f"w{i}" for i in range(5000)]


def word_tokenize(text: str) -> list[int]:
    """One id per word (a stand-in for a model's tokenizer)."""
    return [hash(w) % 100_000 for w in text.split()]


SMALL = Corpus("\n".join(" ".join(WORDS[i : i + 12]) for i in range(0, len(WORDS), 12)))


# ---- real-text prompts ----


def test_corpus_windows_start_at_a_line_and_wrap_around() -> None:
    corpus = Corpus("ab\ncd\nef")
    assert corpus.window(0, 4) == "cd\ne"  # from the line after the offset's
    assert corpus.window(4, 5) == "ef" + "ab\n"  # past the end: from the start again
    assert corpus.window(7, 3) == "ab\n"  # the last line has no successor: the first
    with pytest.raises(ValueError):
        Corpus("")


def test_prompts_are_exactly_planned_and_distinct_unless_shared_on_purpose() -> None:
    machine = Machine()
    bucket = next(s for s in build(machine) if s.name == "len-1k-x8")
    plan = make_plan(bucket.spec)
    prompts = prompt_ids_for(bucket.spec, plan, word_tokenize, SMALL)
    assert [len(prompts[r.index]) for r in plan] == [1000] * 8
    heads = {tuple(p[:DISTINCT_HEAD]) for p in prompts.values()}
    assert len(heads) == 8
    assert prompt_ids_for(bucket.spec, plan, word_tokenize, SMALL) == prompts  # seeded

    shared = shared_prefix(5)
    plan = make_plan(shared.spec)
    prompts = prompt_ids_for(shared.spec, plan, word_tokenize, SMALL)
    assert {tuple(prompts[r.index][:SYSTEM_PROMPT]) for r in plan} == {
        tuple(prompts[0][:SYSTEM_PROMPT])
    }
    tails = {tuple(prompts[r.index][SYSTEM_PROMPT : SYSTEM_PROMPT + 16]) for r in plan}
    assert len(tails) == 5  # the user turns differ
    assert all(len(prompts[r.index]) == r.prompt_tokens for r in plan)


def test_prompts_with_the_models_tokenizer_are_real_text_of_the_planned_length() -> None:
    from app.server.settings import ModelNotFoundError, default_model_path

    try:
        model = default_model_path()
    except ModelNotFoundError:
        pytest.skip("no default model")
    tokenize = model_tokenizer(model)
    scenario = coding(Machine(), 6)
    plan = make_plan(scenario.spec)
    prompts = prompt_ids_for(scenario.spec, plan, tokenize, stdlib_corpus())
    assert [len(prompts[r.index]) for r in plan] == [r.prompt_tokens for r in plan]
    assert len({tuple(p[:DISTINCT_HEAD]) for p in prompts.values()}) == len(plan)
    # text, not one id repeated: many distinct tokens in each prompt
    assert all(len(set(p)) > len(p) / 10 for p in prompts.values())


# ---- the workloads ----


def test_cpu_buckets_hold_the_issues_points_on_one_start_per_length() -> None:
    suite = build(Machine())
    by = {s.name: s for s in suite}
    assert len(by) == len(suite)
    eight = make_plan(by["len-1k-x8"].spec)
    assert [(r.prompt_tokens, r.output_tokens, r.arrival) for r in eight] == [
        (1000, OUTPUT, 0.0)
    ] * 8
    assert [r.prompt_tokens for r in make_plan(by["len-3k-x4"].spec)] == [3000] * 4
    assert by["len-1k-x8"].spec.temperature == TEMPERATURE and by["len-1k-x8"].spec.ignore_eos
    assert all(s.n_ctx is None for s in suite)  # Quanta at its own default context

    lengths = [[s.name for s in g] for g in groups(suite) if g[0].kind == "bucket"]
    assert lengths[1] == ["len-1k-x1", "len-1k-x4", "len-1k-x8"]
    spec = server_spec([by["len-1k-x1"], by["len-1k-x8"]])
    assert spec.n_ctx is None
    assert spec.llama_slots == 8 and spec.llama_context == 8 * 1280  # 1,128 rounded to 256s
    gpu = {s.name for s in build(Machine(gpu=True))}
    assert {"len-16k-x1", "len-2k-x64", "len-8k-x16"} <= gpu


def test_the_replay_keeps_recorded_lengths_and_runs_at_three_quarters_of_capacity() -> None:
    rows = read_trace(str(Path("bench/traces/azure_llm_2023_conv.csv")))
    for machine in (Machine(), Machine(speed_factor=2.0)):
        scenario = conv_replay(machine, 12)
        plan = make_plan(scenario.spec)
        assert len(plan) == 12
        trace = scenario.spec.trace
        assert trace is not None
        first = next(k for k, r in enumerate(rows) if r.arrival >= trace.start_s)
        recorded = rows[first : first + 12]
        assert [(r.prompt_tokens, r.output_tokens) for r in plan] == [
            (r.prompt_tokens, r.output_tokens) for r in recorded
        ]
        mean = request_units(
            sum(r.prompt_tokens for r in plan) / 12, sum(r.output_tokens for r in plan) / 12
        )
        rate = 11 / (plan[-1].arrival or 0.0)
        assert rate == pytest.approx(LOAD * CAPACITY_UNITS / machine.speed_factor / mean)
        longest = max(r.prompt_tokens + r.output_tokens for r in plan)
        assert scenario.llama_ctx is not None and scenario.llama_ctx >= 8 * longest


def test_a_representative_window_has_the_traces_median_prompt() -> None:
    rows = [TraceRow(float(i), p, 10) for i, p in enumerate([50] * 6 + [1000, 900, 1100] * 6)]
    # the trace's median is 950; the first window within 10 %: 50, 1000, 900 (median 900)
    assert representative_start(rows, 3, None) == 5
    assert representative_start(rows, 3, max_prompt=500) == 0  # none fits: from the start


def test_the_coding_stream_is_mixed_lengths_poisson_at_three_quarters() -> None:
    scenario = coding(Machine(speed_factor=0.5), 24)
    plan = make_plan(scenario.spec)
    assert len(plan) == 24
    assert all(33 <= r.prompt_tokens <= 3718 and 6 <= r.output_tokens <= 94 for r in plan)
    assert len({r.prompt_tokens for r in plan}) > 12
    (coder,) = scenario.spec.tenants
    assert coder.slo_class is SloClass.INTERACTIVE
    assert coder.rate == pytest.approx(LOAD * CAPACITY_UNITS * 2 / request_units(850, 50))


def test_the_shared_prefix_is_one_user_at_a_time() -> None:
    scenario = shared_prefix(6)
    plan = make_plan(scenario.spec)
    assert scenario.spec.users == 1
    assert all(r.prefix_tokens == SYSTEM_PROMPT < r.prompt_tokens for r in plan)


# ---- key figures ----


def _record(
    index: int,
    sent: float,
    first: float,
    gap: float = 0.1,
    n: int = 4,
    prompt: int = 100,
    slo_class: SloClass = SloClass.INTERACTIVE,
    cached: int | None = None,
) -> RequestRecord:
    times = tuple(first + gap * k for k in range(n))
    return RequestRecord(
        f"r{index}",
        "t",
        slo_class,
        sent,
        prompt,
        n,
        finished=times[-1],
        token_times=times,
        server_cached_tokens=cached,
    )


def test_prefix_figures_compare_the_later_first_tokens_with_the_first() -> None:
    records = [
        _record(2, 10.0, 10.5, cached=1500),
        _record(0, 0.0, 4.0),
        _record(1, 5.0, 5.8, cached=1500),
        _record(3, 12.0, 12.6, cached=1500),
    ]
    key = long_cells.prefix(records)
    assert key["first_ttft_s"] == 4.0
    assert key["later_ttft_median_s"] == pytest.approx(0.6)
    assert key["ratio"] == pytest.approx(0.15)
    assert key["later_cached_tokens_mean"] == 1500
    failed_first = [RequestRecord("r0", "t", SloClass.INTERACTIVE, 0.0, 1, 1, ok=False)]
    assert long_cells.prefix(failed_first + records[:1])["ratio"] is None


def test_goodput_counts_the_targets_and_the_length_grown_target() -> None:
    targets = SloTargets(ttft_s=2.0, tpot_s=0.25)
    records = [
        _record(0, 0.0, 1.0, prompt=100),  # on target
        _record(1, 0.0, 5.0, prompt=1000),  # within 2 s + 1,000 x 6.4 ms = 8.4 s
        _record(2, 0.0, 9.0, prompt=1000),  # late either way
        _record(3, 0.0, 1.0, gap=0.5, prompt=10),  # too slow a stream
    ]
    key = long_cells.goodput(records, targets, 0.0064)
    assert (key["goodput"], key["goodput_length_target"]) == (1, 2)
    assert key["goodput_fraction"] == 0.25
    assert "goodput_length_target" not in long_cells.goodput(records, targets, None)


def test_flood_long_figures_are_the_interactive_tenants() -> None:
    records = [
        _record(0, 0.0, 0.5, gap=0.1),
        _record(1, 1.0, 2.0, gap=0.3),
        _record(2, 0.0, 20.0, gap=1.0, n=3, prompt=3500, slo_class=SloClass.BATCH),
    ]
    key = long_cells.flood_long(records)
    assert (key["interactive_served"], key["interactive_requests"]) == (2, 2)
    assert key["interactive_ttft_p50_s"] == pytest.approx(0.75)
    assert key["interactive_itl_p99_s"] == pytest.approx(0.3)
    assert key["batch_tokens_per_s"] == pytest.approx(3 / 22.0)


def test_the_ratio_table_divides_quanta_by_each_llama_server() -> None:
    def cell(server: str, tps: float, p50: float, ratio: float) -> dict[str, object]:
        return {
            "scenario": "shared-prefix",
            "kind": "prefix",
            "server": server,
            "tokens_per_s": tps,
            "ttft_p50_s": p50,
            "ttft_p99_s": None,
            "key": {"ratio": ratio},
        }

    table = ratios_markdown([cell("quanta", 30.0, 1.0, 0.1), cell("llama-server", 20.0, 2.0, 0.5)])
    row = next(line for line in table.splitlines() if "| llama-server |" in line)
    assert row == (
        "| shared-prefix | llama-server | 1.50× | 0.50× | — | later / first TTFT "
        "| 0.20× (0.10 / 0.50) |"
    )
    assert "llama-server-kvu" not in table  # not run: no row


# ---- the suite against stubs ----


class Stubs:
    """A launcher of live stubs that keeps each start's spec and the requests' bodies."""

    def __init__(self) -> None:
        self.starts: list[ServerSpec] = []
        self.bodies: dict[str, dict[str, Any]] = {}

    @contextmanager
    def __call__(self, name: str, spec: ServerSpec) -> Iterator[Running]:
        self.starts.append(spec)
        server = StubServer({}, live=True, default=Script((0.01, 0.02, 0.03), 0.04))
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(timeout=10)
        try:
            yield Running(server.url, {})
        finally:
            self.bodies.update(server.bodies)
            asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)


def test_the_long_suite_runs_each_group_on_one_start_with_real_text(tmp_path: Path) -> None:
    machine = Machine(speed_factor=0.02)  # a fast machine: the open-loop streams last ~1 s
    suite = [s for s in build(machine, scale=0.1) if s.name in ("len-128-x1", "len-128-x4")]
    suite.append(shared_prefix(3))
    servers = ("quanta", "llama-server")
    stubs = Stubs()
    cells = run_suite(suite, servers, stubs, tmp_path, log=lambda _: None, tokenize=word_tokenize)
    write_tables(tmp_path)

    assert len(stubs.starts) == 2 * len(servers)  # len-128's two points share a start
    assert [(c["scenario"], c["server"]) for c in cells] == [
        ("len-128-x1", "quanta"),
        ("len-128-x4", "quanta"),
        ("len-128-x1", "llama-server"),
        ("len-128-x4", "llama-server"),
        ("shared-prefix", "quanta"),
        ("shared-prefix", "llama-server"),
    ]
    assert all(c["failed"] == 0 and c["served"] == c["requests"] for c in cells)
    # the last start's bodies are shared-prefix's: the real-text prompts, as planned
    prompts = scenario_prompts(suite, word_tokenize)["shared-prefix"]
    assert {rid: body["prompt"] for rid, body in stubs.bodies.items()} == {
        f"r{i}": ids for i, ids in prompts.items()
    }
    prefix = next(c for c in cells if c["scenario"] == "shared-prefix")
    assert prefix["kind"] == "prefix" and prefix["key"]["ratio"] is not None
    table = (tmp_path / "table.md").read_text()
    assert "| len-128-x4 | llama-server |" in table
    assert json.loads((tmp_path / "figures.json").read_text())[0]["scenario"] == "len-128-x1"
    assert cells[0]["tokens_per_s"] is not None
