"""``quanta bench scenarios`` against stub servers: every scenario runs against every server
in turn, through the same client, and lands in one table and its files.

The stub answers every request with three tokens 10 ms apart; in the overload scenario the
first request is refused once (503, retry-after 50 ms), so the retry path is exercised.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.lab.bench.cli import write_tables
from app.lab.bench.scenarios import ALL
from app.lab.bench.servers import Running, ServerSpec
from app.lab.bench.suite import run_suite
from tests.bench_stub import Script, StubServer

SERVERS = ("quanta", "fcfs")
TOKENS = Script((0.01, 0.02, 0.03), 0.04)


@contextmanager
def stub(name: str, spec: ServerSpec) -> Iterator[Running]:
    """A live stub in its own thread and event loop (the suite runs its client in its own)."""
    scripts = {}
    if spec.tenants[0].name == "alice":  # the overload scenario
        scripts["r0"] = Script(status=503, retry_after_s=0.05)
    server = StubServer(scripts, live=True, default=TOKENS)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(timeout=10)
    try:
        yield Running(server.url, {})
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def test_every_scenario_runs_against_every_server_into_one_table(tmp_path: Path) -> None:
    scenarios = [make(0.05) for make in ALL.values()]
    cells = run_suite(scenarios, SERVERS, stub, tmp_path, log=lambda _: None)
    write_tables(tmp_path)

    assert [(c["scenario"], c["server"]) for c in cells] == [
        (s.name, server) for s in scenarios for server in SERVERS
    ]
    for c in cells:
        assert (tmp_path / f"{c['scenario']}-{c['server']}.json").is_file()
        assert c["failed"] == 0
    for s in scenarios:
        assert (tmp_path / f"{s.name}.png").is_file()
    by = {(c["scenario"], c["server"]): c for c in cells}

    twenty = by[("twenty", "quanta")]
    assert twenty["served"] == twenty["requests"] == 1
    assert twenty["smooth_fraction"] == 1.0
    assert twenty["ttft_p50_s"] is not None and twenty["ttft_p50_s"] >= 0.01

    overload = by[("overload", "quanta")]["key"]
    assert overload["refused_first_try"] == 1
    assert overload["refusals_with_retry_after"] == 1
    assert overload["retries"] == 1 and overload["retries_admitted_fraction"] == 1.0

    flood = by[("flood", "fcfs")]["key"]
    assert flood["interactive_served_fraction"] == 1.0
    assert flood["batch_tokens"] == 3 * ALL["flood"](0.05).spec.tenants[1].requests  # type: ignore[operator]

    weights = by[("weights", "quanta")]["key"]
    assert set(weights["weighted_service"]) <= {"one", "two"}

    figures = json.loads((tmp_path / "figures.json").read_text())
    assert len(figures) == len(cells)
    # a part run again replaces its own cells and keeps the others
    run_suite([ALL["twenty"](0.05)], ("quanta",), stub, tmp_path, log=lambda _: None)
    again = json.loads((tmp_path / "figures.json").read_text())
    assert [(c["scenario"], c["server"]) for c in again] == [
        (c["scenario"], c["server"]) for c in figures
    ]
    table = (tmp_path / "table.md").read_text()
    for s in scenarios:
        assert f"| {s.name} | quanta |" in table and f"| {s.name} | fcfs |" in table
