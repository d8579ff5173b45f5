"""Prometheus metrics in vLLM's style, on a registry of the app's own (never the global one).

Two families side by side:

    vllm:*    vLLM's names, labels and units (``model_name``), so dashboards written for vLLM
              read a Quanta server: request and token counters, latency histograms, the
              scheduler's gauges (the ones an llm-d endpoint picker reads by default too:
              docs/model-server-protocol.md)
    quanta:*  the same gauges, and per tenant (by name) and class: requests by status,
              refusals by reason, tokens, latency histograms, the fair policies' counters

Gauges and counters of the scheduler are read from the core at scrape time; histograms are
observed as each choice finishes; request and token counters when each request ends
(``app.server.request_log``), counting what reached the client, as the usage ledger does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.server.core import CoreStats
from quanta_core.requests import ChoiceResult

LABELS = ("tenant", "class")
MODEL = ("model_name",)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)

Names = Callable[[str], str]  # a tenant's id -> its name


def _same(tenant_id: str) -> str:
    return tenant_id


class _CoreCollector(Collector):
    def __init__(
        self, stats: Callable[[], CoreStats | None], model: Callable[[], str], names: Names
    ) -> None:
        self._stats = stats
        self._model = model
        self._names = names

    def collect(self) -> Iterable[Metric]:
        stats = self._stats() or CoreStats()
        model = [self._model()]
        for name, doc, value in (
            ("num_requests_running", "Requests with KV in the engine.", stats.running),
            ("num_requests_waiting", "Requests queued for admission.", stats.waiting),
            ("kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).", stats.kv_usage),
        ):
            yield GaugeMetricFamily(f"quanta:{name}", doc, value)
            labelled = GaugeMetricFamily(f"vllm:{name}", doc, labels=MODEL)
            labelled.add_metric(model, value)
            yield labelled
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "The KV cache's geometry, in the labels (always 1).",
            labels=["block_size", "num_gpu_blocks"],
        )
        cache.add_metric([str(stats.block_size), str(stats.num_blocks)], 1.0)
        yield cache
        hits, queries = stats.prefix_cache_hits, stats.prefix_cache_queries
        for name, doc, value in (
            ("prefix_cache_hits", "Prompt tokens served from the prefix cache.", hits),
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", queries),
            ("num_preemptions", "Sequences preempted (stashed or dropped).", stats.preemptions),
        ):
            yield CounterMetricFamily(f"quanta:{name}", doc, value)
            counter = CounterMetricFamily(f"vllm:{name}", doc, labels=MODEL)
            counter.add_metric(model, value)
            yield counter
        yield from _fairness(stats, self._names)


def _fairness(stats: CoreStats, names: Names) -> Iterable[Metric]:
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
        labels = [names(tenant), slo_class]
        families["virtual_tokens"].add_metric(labels, counter)
        families["requests_waiting"].add_metric(labels, waiting)
        families["requests_running"].add_metric(labels, running)
    yield from families.values()


class Metrics:
    """The server's registry. ``names`` gives a tenant's name for its id (labels are names:
    what a dashboard's reader knows); ``model`` the served model's name once it is loaded."""

    def __init__(
        self,
        stats: Callable[[], CoreStats | None],
        names: Names = _same,
        model: Callable[[], str] = lambda: "",
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_CoreCollector(stats, model, names))
        self._names = names
        self._model = model

        def histogram(
            name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = LABELS
        ) -> Histogram:
            return Histogram(name, doc, labels, registry=self.registry, buckets=buckets)

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        # quanta:*, per tenant and class
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
        self.requests = counter(
            "quanta:requests",
            "API requests ended, by HTTP status.",
            ("tenant", "class", "status"),
        )
        self.refusals = counter(
            "quanta:refusals",
            "API requests refused or failed, by the error's code (rate_limit_exceeded, "
            "insufficient_quota, overloaded, invalid_api_key…).",
            ("tenant", "class", "reason"),
        )
        self.prompt_tokens = counter(
            "quanta:prompt_tokens", "Prompt tokens of requests served.", LABELS
        )
        self.cached_tokens = counter(
            "quanta:cached_prompt_tokens", "Prompt tokens served from the prefix cache.", LABELS
        )
        self.output_tokens = counter(
            "quanta:generation_tokens", "Output tokens that reached their client.", LABELS
        )
        # vllm:*, per model
        self.v_prompt = counter("vllm:prompt_tokens", "Number of prefill tokens processed.", MODEL)
        self.v_generation = counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", MODEL
        )
        self.v_success = counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ("model_name", "finished_reason"),
        )
        self.v_ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _LATENCY_BUCKETS,
            MODEL,
        )
        self.v_itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _ITL_BUCKETS,
            MODEL,
        )
        self.v_tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            _ITL_BUCKETS,
            MODEL,
        )
        self.v_e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            _LATENCY_BUCKETS,
            MODEL,
        )
        self.v_queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _LATENCY_BUCKETS,
            MODEL,
        )
        self.v_prefill = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            _LATENCY_BUCKETS,
            MODEL,
        )
        self.v_decode = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            _LATENCY_BUCKETS,
            MODEL,
        )
        self.v_prompt_len = histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            _TOKEN_BUCKETS,
            MODEL,
        )
        self.v_output_len = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            _TOKEN_BUCKETS,
            MODEL,
        )

    def observe(self, result: ChoiceResult, tenant: str, slo_class: str) -> None:
        """A choice finished: its latencies (``tenant``: the tenant's id)."""
        t = result.timings
        labels = (self._names(tenant), slo_class)
        model = self._model()
        if t.first_token is not None:
            self.ttft.labels(*labels).observe(t.first_token - t.arrival)
            self.v_ttft.labels(model).observe(t.first_token - t.arrival)
        if t.queue_s is not None:
            self.queue.labels(*labels).observe(t.queue_s)
            self.v_queue.labels(model).observe(t.queue_s)
        if t.prefill_s is not None:
            self.v_prefill.labels(model).observe(t.prefill_s)
        if t.finished is not None:
            self.e2e.labels(*labels).observe(t.finished - t.arrival)
            self.v_e2e.labels(model).observe(t.finished - t.arrival)
            if t.first_token is not None:
                decode = t.finished - t.first_token
                self.v_decode.labels(model).observe(decode)
                if result.completion_tokens > 1:
                    self.v_tpot.labels(model).observe(decode / (result.completion_tokens - 1))
        self.v_prompt_len.labels(model).observe(result.prompt_tokens)
        self.v_output_len.labels(model).observe(result.completion_tokens)
        itl, v_itl = self.itl.labels(*labels), self.v_itl.labels(model)
        for earlier, later in itertools.pairwise(result.token_times):
            itl.observe(later - earlier)
            v_itl.observe(later - earlier)

    def request_ended(
        self,
        tenant: str,
        slo_class: str,
        status: int,
        reason: str | None,
        tokens: tuple[int, int, int],
        finish_reason: str | None,
    ) -> None:
        """An API request ended: ``tenant`` by name, ``tokens`` its prompt, cached and output
        tokens (those that reached the client), ``finish_reason`` as its client was told."""
        self.requests.labels(tenant, slo_class, str(status)).inc()
        if reason is not None:
            self.refusals.labels(tenant, slo_class, reason).inc()
        prompt, cached, output = tokens
        if prompt or output:
            model = self._model()
            self.prompt_tokens.labels(tenant, slo_class).inc(prompt)
            self.cached_tokens.labels(tenant, slo_class).inc(cached)
            self.output_tokens.labels(tenant, slo_class).inc(output)
            self.v_prompt.labels(model).inc(prompt)
            self.v_generation.labels(model).inc(output)
        if status < 400 and finish_reason is not None:
            self.v_success.labels(self._model(), finish_reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
