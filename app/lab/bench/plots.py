"""PNG plots of a results file (matplotlib, Agg backend: no display needed).

<stem>.cdf.png         latency CDFs per class: TTFT, TPOT, ITL, end-to-end
<stem>.ttft.png        each request's TTFT split: queue wait, prefill, the rest (transport
                       and streaming); TTFT alone where the server reports no split
<stem>.service.png     weighted service received over time, per tenant (VTC's counter)
<stem>.tokens.png      output tokens/s over time
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from quanta_core.metrics import RequestRecord
from quanta_core.requests import SloClass


def _cdf(ax: Any, values: list[float], label: str) -> None:
    if not values:
        return
    xs = sorted(values)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step([xs[0], *xs], [0.0, *ys], where="post", label=label)


def latency_cdfs(records: list[RequestRecord], title: str, path: Path) -> Path:
    fig, axes = plt.subplots(1, 4, figsize=(16, 4), constrained_layout=True)
    done = [r for r in records if r.ok]
    for cls in SloClass:
        mine = [r for r in done if r.slo_class is cls]
        if not mine:
            continue
        series = {
            "TTFT (s)": [t for r in mine if (t := r.ttft) is not None],
            "TPOT (s)": [t for r in mine if (t := r.tpot) is not None],
            "inter-token gap (s)": [g for r in mine for g in r.itls],
            "end-to-end (s)": [t for r in mine if (t := r.e2e) is not None],
        }
        for ax, (name, values) in zip(axes, series.items(), strict=True):
            _cdf(ax, values, cls.value)
            ax.set_xlabel(name)
    for ax in axes:
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    axes[2].set_ylabel("fraction of gaps")
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ttft_split(records: list[RequestRecord], title: str, path: Path) -> Path:
    rows = sorted((r for r in records if r.ttft is not None), key=lambda r: r.sent)
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(rows) + 2), 4), constrained_layout=True)
    xs = list(range(1, len(rows) + 1))
    ttft = [r.ttft or 0.0 for r in rows]
    queue = [r.server_queue_s or 0.0 for r in rows]
    prefill = [r.server_prefill_s or 0.0 for r in rows]
    rest = [max(0.0, t - q - p) for t, q, p in zip(ttft, queue, prefill, strict=True)]
    if any(queue) or any(prefill):
        ax.bar(xs, queue, label="queue wait (server)")
        ax.bar(xs, prefill, bottom=queue, label="prefill (server)")
        bottom = [q + p for q, p in zip(queue, prefill, strict=True)]
        ax.bar(xs, rest, bottom=bottom, label="transport and rest")
    else:
        ax.bar(xs, ttft, label="TTFT (no server split)")
    if len(xs) <= 40:
        ax.set_xticks(xs)
    ax.set_xlabel("request, in order sent")
    ax.set_ylabel("seconds to first token")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def service_over_time(result: dict[str, Any], title: str, path: Path) -> Path:
    service = result["service"]
    fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
    for tenant, series in service["cumulative"].items():
        xs = [(i + 1) * service["bin_s"] for i in range(len(series))]
        ax.plot(xs, series, label=tenant)
    ax.set_xlabel("seconds since the first request")
    ax.set_ylabel("service received (input + 2 × output tokens, / weight)")
    ax.grid(alpha=0.3)
    if service["cumulative"]:
        ax.legend()
    ax.set_title(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tokens_over_time(result: dict[str, Any], title: str, path: Path) -> Path:
    timeline = result["summary"]["timeline"]
    fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
    series = timeline["tokens_per_s"]
    xs = [i * timeline["bin_s"] for i in range(len(series))]
    ax.step(xs, series, where="post")
    ax.set_xlabel("seconds since the first request")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(result: dict[str, Any], records: list[RequestRecord], out: Path) -> list[Path]:
    """All four plots next to the results file ``out`` (``x.json`` → ``x.cdf.png``, …)."""
    stem = out.with_suffix("")
    title = str(result["label"])
    return [
        latency_cdfs(records, title, stem.with_name(stem.name + ".cdf.png")),
        ttft_split(records, title, stem.with_name(stem.name + ".ttft.png")),
        service_over_time(result, title, stem.with_name(stem.name + ".service.png")),
        tokens_over_time(result, title, stem.with_name(stem.name + ".tokens.png")),
    ]
