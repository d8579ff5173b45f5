"""The results file: config, environment, figures and every request's raw row.

    {"schema": "quanta.bench/1", "label": ..., "config": {...}, "environment": {...},
     "summary": {...}, "service": {...}, "requests": [{...}, ...]}

``summary`` is ``quanta_core.metrics.summarize(...).as_dict()``; the rows are
``RequestRecord.to_row()``, so a file can be re-summarised (or compared) without a server.
A committed file may keep its figures only (``bench/results``: the rows are written again by
the command that made it); ``compare`` and ``summarize`` read the figures alone.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from itertools import accumulate, chain
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from quanta_core.metrics import RequestRecord, RunSummary, cumulative_service
from quanta_core.workload import WorkloadSpec

SCHEMA = "quanta.bench/1"


def package_version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _get_json(url: str, api_key: str | None = None) -> Any:
    import httpx  # only a run against a server asks one: a simulation needs no HTTP client

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=5.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def server_info(url: str, api_key: str | None = None) -> dict[str, Any]:
    """What the server says about itself: /v1/models, and llama-server's /props."""
    props = _get_json(url + "/props")
    if isinstance(props, dict):
        # llama-server's props carry the whole chat template and more: keep the sizing.
        keep = ("total_slots", "model_path", "build_info", "default_generation_settings")
        props = {k: props[k] for k in keep if k in props}
        settings = props.get("default_generation_settings")
        if isinstance(settings, dict):
            props["default_generation_settings"] = {
                k: settings[k] for k in ("n_ctx", "model") if k in settings
            }
    return {"url": url, "models": _get_json(url + "/v1/models", api_key), "props": props}


def environment(url: str, api_key: str | None = None) -> dict[str, Any]:
    return {
        "time_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "quanta": package_version("quanta"),
        "llama_cpp_python": package_version("llama-cpp-python"),
        "httpx": package_version("httpx"),
        "git_commit": git_commit(),
        "server": server_info(url, api_key),
    }


def server_kind(records: Sequence[RequestRecord]) -> str:
    """ "quanta" when the server split its latency (the ``quanta`` extension), else "other"."""
    return "quanta" if any(r.server_queue_s is not None for r in records) else "other"


def build_result(
    *,
    label: str,
    spec: WorkloadSpec,
    flags: dict[str, Any],
    env: dict[str, Any],
    records: Sequence[RequestRecord],
    summary: RunSummary,
) -> dict[str, Any]:
    origin = min((r.sent for r in records), default=0.0)
    return {
        "schema": SCHEMA,
        "label": label,
        "server_kind": server_kind(records),
        "config": {"workload": spec.as_dict(), "flags": flags},
        "environment": env,
        "summary": summary.as_dict(),
        "service": {
            "bin_s": summary.timeline_bin_s,
            "origin": origin,
            "cumulative": cumulative_service(records, summary.timeline_bin_s, origin),
        },
        "requests": [r.to_row() for r in records],
    }


TIME_DECIMALS = 6  # token times to the microsecond: gaps here are milliseconds


def rounded(rows: Sequence[Sequence[float]], decimals: int) -> list[list[float]]:
    """Every row's values as ``round(value, decimals)`` gives them, in one numpy pass over
    all of them (a run's rows hold millions of token times).

    ``rint(v * 10**d) / 10**d`` is ``round``'s value whenever the product's rounding cannot
    move it across a half (``round`` rounds the exact decimal, half to even): both are then
    the float nearest to the same k / 10**d. The values within 0.001 of a half, and those too
    large for the product to hold a fraction, are rounded by ``round`` itself."""
    counts = [len(row) for row in rows]
    values = np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=sum(counts))
    scale = 10.0**decimals
    with np.errstate(invalid="ignore", over="ignore"):  # inf and nan: ``round``'s below
        scaled = values * scale
        out = np.rint(scaled) / scale
        near_half = np.abs(scaled - np.floor(scaled) - 0.5) < 1e-3
        unsure = np.flatnonzero(near_half | ~(np.abs(scaled) < 2.0**52))
    flat = out.tolist()
    for i in unsure.tolist():
        flat[i] = round(float(values[i]), decimals)
    ends = list(accumulate(counts))
    return [flat[end - n : end] for n, end in zip(counts, ends, strict=True)]


def write_result(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    timed = [row for row in result.get("requests", ()) if row.get("token_times")]
    for row, times in zip(
        timed, rounded([row["token_times"] for row in timed], TIME_DECIMALS), strict=True
    ):
        row["token_times"] = times
    tmp = path.with_name(path.name + ".tmp")
    # msgspec: strict JSON (a NaN would be written as null) in C; json's indenting encoder is
    # pure Python, seconds for a run's half-million token times.
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=1))
    tmp.replace(path)


def load_result(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} results file")
    return data


def records_of(result: dict[str, Any]) -> list[RequestRecord]:
    if "requests" not in result:
        raise ValueError("this results file keeps its figures only, not each request's row")
    return [RequestRecord.from_row(row) for row in result["requests"]]
