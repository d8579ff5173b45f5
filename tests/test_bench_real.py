"""A short real run: ``quanta bench run`` against a real ``quanta run`` with the default model.

Asserts behaviour only (every request answered with exactly the workload's token count, the
server's latency split read, the results file and plots written), never a timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli
from app.lab.bench.report import load_result
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.model

WORKLOAD = """
name = "smoke"
seed = 4
requests = 4
rate = inf
concurrency = 3
[[tenants]]
name = "a"
prompt = 16
output = 6
[[tenants]]
name = "b"
class = "batch"
prompt = { dist = "uniform", min = 8, max = 24 }
output = 4
"""


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    proc = start_server("--n-ctx", "512", "--threads", "1", "--grace", "5")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def test_bench_run_against_quanta(server: ServerProcess, tmp_path: Path) -> None:
    (tmp_path / "smoke.toml").write_text(WORKLOAD)
    out = tmp_path / "smoke.json"
    args = ["bench", "run", "--url", server.url, "--workload", str(tmp_path / "smoke.toml")]
    args += ["--out", str(out), "--label", "smoke", "--quiet"]
    key = getattr(server, "api_key", None)  # a tenant key, where the server has tenancy
    if key is not None:
        args += ["--api-key", key]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "first word seen by the 1st" in result.output

    data = load_result(out)
    rows = data["requests"]
    assert [r["ok"] for r in rows] == [True] * 4, [r["error"] for r in rows]
    # ignore-EOS and max_tokens: exactly the workload's lengths, streamed token by token.
    for r in rows:
        assert r["output_tokens"] == r["max_tokens"]
        assert len(r["token_times"]) == r["max_tokens"]
        assert r["server_queue_s"] is not None and r["server_prefill_s"] is not None
        assert r["server_preemptions"] == 0
    assert {r["tenant"] for r in rows} == {"a", "b"}
    assert data["server_kind"] == "quanta"
    assert data["summary"]["overall"]["completed"] == 4
    assert data["environment"]["server"]["models"]["data"]
    for suffix in ("cdf", "ttft", "service", "tokens"):
        assert (tmp_path / f"smoke.{suffix}.png").exists()
