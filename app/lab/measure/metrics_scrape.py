"""What a /metrics scrape costs a loaded Quanta: its latency, and the tokens/s it takes away.

    quanta bench metrics-scrape     # ~2 minutes

Starts ``quanta run`` (defaults, a throw-away database), keeps STREAMS long streamed requests
going, and in turns of ROUND_S seconds either scrapes /metrics SCRAPE_HZ times a second (the
Gateway API Inference Extension's endpoint picker refreshes every 50 ms by default) or leaves
it alone, counting the streamed tokens the clients receive. Prints and writes
bench/results/metrics/scrape.json: scrape latency idle and under load (p50, p99), the body's
size, and tokens/s with and without scraping as a ratio per pair of turns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from app.lab.measure.common import console, environment, write_results
from app.lab.server import QuantaServer

STREAMS = 8
SCRAPE_HZ = 20.0  # the picker's default refresh, 50 ms
ROUND_S = 10.0
ROUNDS = 4  # pairs of turns: scraping, not scraping
OUT = Path("bench/results/metrics/scrape.json")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def scrape_latencies(client: httpx.Client, n: int, hz: float) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        body = client.get("/metrics").content
        times.append(time.perf_counter() - t0)
        size = len(body)
        time.sleep(max(0.0, 1.0 / hz - times[-1]))
    return times, size


class Load:
    """STREAMS clients streaming long completions; ``tokens`` counts the chunks received."""

    def __init__(self, url: str, key: str, model: str) -> None:
        self.tokens = 0
        self._url = url
        self._stop = threading.Event()
        self._lock = threading.Lock()
        body = {"model": model, "prompt": "Tell a long story.", "max_tokens": 2000}
        self._body = {**body, "stream": True, "ignore_eos": True}
        self._headers = {"authorization": f"Bearer {key}"}
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(STREAMS)]

    def _run(self) -> None:
        with httpx.Client(base_url=self._url, headers=self._headers, timeout=None) as c:
            while not self._stop.is_set():
                try:
                    self._stream(c)
                except httpx.HTTPError:
                    return  # the server stopped under it: the measurement is over

    def _stream(self, c: httpx.Client) -> None:
        with c.stream("POST", "/v1/completions", json=self._body) as r:
            for line in r.iter_lines():
                if self._stop.is_set():
                    return
                if line.startswith("data: {"):
                    with self._lock:
                        self.tokens += 1

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()


def main() -> None:
    parser = argparse.ArgumentParser(prog="quanta bench metrics-scrape", description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with QuantaServer.fresh("--log-level", "warning", prefix="quanta-metrics-") as server:
        key = server.tenant_key("bench")
        client = httpx.Client(base_url=server.url, timeout=10.0)
        model = client.get("/v1/models", headers={"authorization": f"Bearer {key}"}).json()
        idle, size = scrape_latencies(client, 200, SCRAPE_HZ)
        loaded: list[float] = []
        ratios, with_tps, without_tps = [], [], []
        with Load(server.url, key, model["data"][0]["id"]) as load:
            time.sleep(5.0)  # every stream past its prefill
            for _ in range(ROUNDS):
                n0, t0 = load.tokens, time.perf_counter()
                times, _ = scrape_latencies(client, int(ROUND_S * SCRAPE_HZ), SCRAPE_HZ)
                loaded += times
                scraping = (load.tokens - n0) / (time.perf_counter() - t0)
                n0, t0 = load.tokens, time.perf_counter()
                time.sleep(ROUND_S)
                quiet = (load.tokens - n0) / (time.perf_counter() - t0)
                with_tps.append(scraping)
                without_tps.append(quiet)
                ratios.append(scraping / quiet)
                console.print(f"tokens/s scraping {scraping:.1f}, not {quiet:.1f}")
    ms = 1000.0
    results: dict[str, Any] = {
        "environment": environment(
            streams=STREAMS, scrape_hz=SCRAPE_HZ, round_s=ROUND_S, load_avg=os.getloadavg()
        ),
        "body_bytes": size,
        "idle_ms": {"p50": percentile(idle, 0.5) * ms, "p99": percentile(idle, 0.99) * ms},
        "loaded_ms": {"p50": percentile(loaded, 0.5) * ms, "p99": percentile(loaded, 0.99) * ms},
        "tokens_per_s_scraping": with_tps,
        "tokens_per_s_not": without_tps,
        "ratio_scraping_over_not": ratios,
        "ratio_median": statistics.median(ratios),
    }
    console.print(
        f"/metrics: {size} bytes; idle p50 {results['idle_ms']['p50']:.2f} ms "
        f"p99 {results['idle_ms']['p99']:.2f} ms; under {STREAMS} streams p50 "
        f"{results['loaded_ms']['p50']:.2f} ms p99 {results['loaded_ms']['p99']:.2f} ms; "
        f"tokens/s scraping {SCRAPE_HZ:.0f}/s over not: median ratio {results['ratio_median']:.3f}"
    )
    write_results(args.out, results)
