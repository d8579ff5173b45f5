"""One streaming request over HTTP, timed token by token from the client's side.

httpx rather than the openai SDK: every server-sent event is stamped the moment its line
arrives, with nothing between the socket and the clock but line splitting.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.lab.bench.prompts import path
from quanta_core.metrics import RequestRecord
from quanta_core.workload import Endpoint, PlannedRequest


@dataclass(frozen=True, slots=True)
class Target:
    url: str  # the server's base URL, without /v1
    model: str
    endpoint: Endpoint = Endpoint.COMPLETIONS
    seed: int = 0
    ignore_eos: bool = True
    temperature: float = 0.0


@dataclass
class _Stream:
    """What one response's events told us."""

    token_times: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    server: dict[str, Any] = field(default_factory=dict)

    def feed(self, event: dict[str, Any], now: float) -> None:
        if "error" in event:
            err = event["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)
            return
        for choice in event.get("choices") or []:
            text = choice.get("text")
            if text is None:
                text = (choice.get("delta") or {}).get("content")
            if text:
                self.token_times.append(now)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            quanta = choice.get("quanta")
            if isinstance(quanta, dict):
                self.server = quanta
        usage = event.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            self.output_tokens = int(usage["completion_tokens"])
        # llama-server reports its own prompt time in the last chunk.
        timings = event.get("timings")
        if isinstance(timings, dict) and "prompt_ms" in timings and not self.server:
            self.server = {"prefill_s": float(timings["prompt_ms"]) / 1000}


def _record(
    planned: PlannedRequest,
    sent: float,
    finished: float | None,
    stream: _Stream,
    *,
    status: int | None,
    weight: float,
    error: str | None = None,
    retry_after_s: float | None = None,
    attempt: int = 0,
) -> RequestRecord:
    s = stream.server
    error = error or stream.error
    return RequestRecord(
        request_id=f"r{planned.index}",
        tenant=planned.tenant,
        slo_class=planned.slo_class,
        sent=sent,
        prompt_tokens=planned.prompt_tokens,
        max_tokens=planned.output_tokens,
        ok=error is None,
        finished=finished,
        token_times=tuple(stream.token_times),
        output_tokens=stream.output_tokens,
        scheduled=planned.arrival,
        weight=weight,
        error=error,
        status=status,
        server_queue_s=s.get("queue_s"),
        server_prefill_s=s.get("prefill_s"),
        server_e2e_s=s.get("e2e_s"),
        server_preemptions=s.get("preemptions"),
        server_cached_tokens=s.get("cached_tokens"),
        server_ttft_estimate_s=s.get("ttft_estimate_s"),
        retry_after_s=retry_after_s,
        attempt=attempt,
    )


async def send(
    client: httpx.AsyncClient,
    target: Target,
    planned: PlannedRequest,
    body: dict[str, Any],
    *,
    api_key: str | None,
    clock: Callable[[], float],
    weight: float = 1.0,
    attempt: int = 0,
) -> RequestRecord:
    """Send one request and stream its answer; never raises for a failed request."""
    headers = {"x-request-id": f"r{planned.index}" + (f".{attempt}" if attempt else "")}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    stream = _Stream()
    sent = clock()
    status: int | None = None
    finished: float | None = None
    try:
        async with client.stream(
            "POST", target.url + path(target.endpoint), json=body, headers=headers
        ) as response:
            status = response.status_code
            if status != 200:
                text = (await response.aread()).decode(errors="replace")
                return _record(
                    planned,
                    sent,
                    clock(),
                    stream,
                    status=status,
                    weight=weight,
                    error=text[:500],
                    retry_after_s=_retry_after(response.headers),
                    attempt=attempt,
                )
            async for line in response.aiter_lines():
                now = clock()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    finished = now  # the moment the stream said it was complete
                    break
                stream.feed(json.loads(data), now)
        if finished is None and stream.error is None and stream.finish_reason is None:
            stream.error = "the stream ended before the answer did"
        return _record(
            planned,
            sent,
            clock() if finished is None else finished,
            stream,
            status=status,
            weight=weight,
            attempt=attempt,
        )
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        return _record(
            planned, sent, None, stream, status=status, weight=weight, error=why, attempt=attempt
        )


def _retry_after(headers: httpx.Headers) -> float | None:
    """Seconds from ``retry-after-ms`` (Quanta's, exact) or ``retry-after``."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return float(value) / scale
            except ValueError:
                return None
    return None


def perf_clock(origin: float) -> Callable[[], float]:
    return lambda: time.perf_counter() - origin
