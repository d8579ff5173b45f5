"""The Grafana dashboard in docs/grafana/: every query returns data against a running server.

With Prometheus installed (Debian's, scripts/prometheus_for_tests.sh) the queries are
evaluated by a real Prometheus scraping a real ``quanta run`` under traffic; without it, each
query's series are checked in a scrape of that server.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_process import ROOT, ServerProcess, free_port, start_server
from tests.tenancy_setup import bearer, fresh_db

DASHBOARD = ROOT / "docs" / "grafana" / "quanta-dashboard.json"
METRIC = re.compile(r"\b((?:vllm|quanta):[a-z_]+)")


def queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    found = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    assert found and all(isinstance(q, str) and q for q in found)
    return found


def concrete(query: str) -> str:
    """The query as Grafana sends it: its variables filled in."""
    return query.replace("$__rate_interval", "20s").replace("$model_name", ".*")


def traffic(server: ServerProcess, keys: list[str], seconds: float) -> None:
    """Streams and plain completions from two tenants, one of them over its quota."""
    model = httpx.get(f"{server.url}/v1/models", headers=server.auth).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "Count."}], "max_tokens": 8}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for key in keys:
            with httpx.stream(
                "POST",
                f"{server.url}/v1/chat/completions",
                json={**body, "stream": True},
                headers=bearer(key),
                timeout=60,
            ) as r:
                r.read()
            httpx.post(
                f"{server.url}/v1/chat/completions", json=body, headers=bearer(key), timeout=60
            )


def prometheus(server: ServerProcess, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = folder / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: quanta\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{server.port}']\n"
    )
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "prometheus.log").open("wb"),
    )
    return process, f"http://127.0.0.1:{port}"


def evaluate(url: str, query: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": concrete(query)}, timeout=10)
    body = r.json()
    assert body["status"] == "success", (query, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.mark.model
def test_every_dashboard_query_returns_data(model_path: Path, tmp_path: Path) -> None:
    db = fresh_db(tmp_path / "db")
    limited = db.create_key("limited", max_requests_per_1_minute=3)
    server = start_server("--n-ctx", "1024", "--threads", "1", db=db)
    watcher = None
    try:
        server.wait_ready()
        if shutil.which("prometheus") is None:
            traffic(server, [server.api_key, limited], 3.0)
            scrape = httpx.get(f"{server.url}/metrics").text
            for query in queries():
                for name in METRIC.findall(query):
                    assert re.search(rf"^{re.escape(name)}(\{{| )", scrape, re.M), (query, name)
            return
        watcher, url = prometheus(server, tmp_path)
        background = threading.Thread(
            target=traffic, args=(server, [server.api_key, limited], 12.0), daemon=True
        )
        background.start()
        results: dict[str, list[dict[str, Any]]] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                results = {q: evaluate(url, q) for q in queries()}
            except httpx.TransportError:
                continue
            if all(any(not math.isnan(float(s["value"][1])) for s in r) for r in results.values()):
                break
        background.join()
        empty = [q for q, r in results.items() if not r]
        assert not empty, empty
        for query, result in results.items():
            assert any(not math.isnan(float(s["value"][1])) for s in result), query
        # the per-tenant panels name the tenants
        by_tenant = next(q for q in queries() if "quanta:requests_total" in q)
        assert {s["metric"]["tenant"] for s in results[by_tenant]} >= {"limited"}
        refusals = next(q for q in queries() if "quanta:refusals_total" in q)
        assert "rate_limit_exceeded" in {s["metric"]["reason"] for s in results[refusals]}
    finally:
        if watcher is not None:
            watcher.terminate()
            watcher.wait(30)
        server.stop()
