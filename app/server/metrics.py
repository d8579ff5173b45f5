"""Prometheus metrics in vLLM's style, on a registry of the app's own (never the global one).

Gauges and counters of the scheduler are read from the core at scrape time; latency
histograms are observed here as each choice finishes, labelled by tenant and class.

The gauges an llm-d / Gateway API Inference Extension endpoint picker reads by default are
also exported under vLLM's names, with the same values (docs/model-server-protocol.md):
``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc`` and
``vllm:cache_config_info{block_size,num_gpu_blocks}``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.server.core import CoreStats
from quanta_core.requests import ChoiceResult

LABELS = ("tenant", "class")
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


class _CoreCollector(Collector):
    def __init__(self, stats: Callable[[], CoreStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self._stats() or CoreStats()
        for prefix in ("quanta", "vllm"):
            yield GaugeMetricFamily(
                f"{prefix}:num_requests_running", "Requests with KV in the engine.", stats.running
            )
            yield GaugeMetricFamily(
                f"{prefix}:num_requests_waiting", "Requests queued for admission.", stats.waiting
            )
            yield GaugeMetricFamily(
                f"{prefix}:kv_cache_usage_perc",
                "Fraction of KV blocks in use (0..1).",
                stats.kv_usage,
            )
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "The KV cache's geometry, in the labels (always 1).",
            labels=["block_size", "num_gpu_blocks"],
        )
        cache.add_metric([str(stats.block_size), str(stats.num_blocks)], 1.0)
        yield cache
        yield CounterMetricFamily(
            "quanta:prefix_cache_hits",
            "Prompt tokens served from the prefix cache.",
            stats.prefix_cache_hits,
        )
        yield CounterMetricFamily(
            "quanta:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            stats.prefix_cache_queries,
        )
        yield CounterMetricFamily(
            "quanta:num_preemptions",
            "Sequences preempted (stashed or dropped).",
            stats.preemptions,
        )
        yield from _fairness(stats)


def _fairness(stats: CoreStats) -> Iterable[Metric]:
    """Queue state per class and VTC counters per tenant and class (fair policies only)."""
    by_class = GaugeMetricFamily(
        "quanta:num_requests_waiting_by_class", "Requests queued, per SLO class.", labels=["class"]
    )
    for slo_class, waiting in stats.waiting_by_class:
        by_class.add_metric([slo_class], waiting)
    yield by_class
    families = {
        name: GaugeMetricFamily(f"quanta:tenant_{name}", doc, labels=list(LABELS))
        for name, doc in (
            ("virtual_tokens", "VTC counter: weighted service received (input + 2 x output)."),
            ("requests_waiting", "Requests queued, per tenant and class."),
            ("requests_running", "Requests on the engine, per tenant and class."),
        )
    }
    for tenant, slo_class, counter, waiting, running in stats.tenants:
        families["virtual_tokens"].add_metric([tenant, slo_class], counter)
        families["requests_waiting"].add_metric([tenant, slo_class], waiting)
        families["requests_running"].add_metric([tenant, slo_class], running)
    yield from families.values()


class Metrics:
    def __init__(self, stats: Callable[[], CoreStats | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_CoreCollector(stats))

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, registry=self.registry, buckets=buckets)

        self.ttft = histogram(
            "quanta:time_to_first_token_seconds", "Arrival to first token.", _LATENCY_BUCKETS
        )
        self.itl = histogram(
            "quanta:inter_token_latency_seconds", "Gap between tokens of a choice.", _ITL_BUCKETS
        )
        self.queue = histogram(
            "quanta:request_queue_time_seconds", "Arrival to first scheduled.", _LATENCY_BUCKETS
        )
        self.e2e = histogram(
            "quanta:e2e_request_latency_seconds", "Arrival to finish.", _LATENCY_BUCKETS
        )

    def observe(self, result: ChoiceResult, tenant: str, slo_class: str) -> None:
        t = result.timings
        labels = (tenant, slo_class)
        if t.first_token is not None:
            self.ttft.labels(*labels).observe(t.first_token - t.arrival)
        if t.queue_s is not None:
            self.queue.labels(*labels).observe(t.queue_s)
        if t.finished is not None:
            self.e2e.labels(*labels).observe(t.finished - t.arrival)
        itl = self.itl.labels(*labels)
        times = result.token_times
        for earlier, later in itertools.pairwise(times):
            itl.observe(later - earlier)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
