"""A real server in a child process on a fresh database, tenants made through the admin API,
and clients that count every token they receive.

    Server.start()  quanta migrate + quanta run on a free port (restartable on the same DB)
    Client.one()    one request: JSON, a stream, or a stream cut after a few tokens
    Tally           per key: tokens received, requests by outcome
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import signal
import sqlite3
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.lab.server import QuantaServer

ADMIN_KEY = "reliability-admin-" + secrets.token_hex(8)
PROMPTS = (
    "Tell me about lighthouses.",
    "Write a short poem about rain.",
    "Explain what a CPU cache is.",
    "List three fruits and their colours.",
    "Describe a quiet morning in a small town.",
)


_STARTED: list[Server] = []


def kill_leftovers() -> None:
    """Kill the servers a run started and left running (it crashed before stopping them)."""
    for server in _STARTED:
        if server.process is not None and server.process.poll() is None:
            server.kill()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Server(QuantaServer):
    """The lab's server (``app.lab.server``), its output in ``root/server.log``, with the
    reliability runs' reads: tenants as ``Key``s, the ledger, the ``/metrics`` gauges."""

    @classmethod
    def fresh(
        cls,
        *flags: str,
        env: dict[str, str] | None = None,
        log: bool = True,
        prefix: str = "quanta-reliability-",
    ) -> Server:
        root = Path(tempfile.mkdtemp(prefix=prefix))
        server = cls(root, flags, dict(env or {}), admin_key=ADMIN_KEY, log=root / "server.log")
        _STARTED.append(server)
        return server

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)  # a stop that hangs is a finding: no SIGKILL

    def tenant(self, name: str, slo_class: str, quota: dict[str, int] | None = None) -> Key:
        t = self.admin("POST", "/tenants", json={"name": name})
        if quota:
            self.admin("PUT", f"/tenants/{t['id']}/quota", json=quota)
        k = self.admin("POST", f"/tenants/{t['id']}/keys", json={"slo_class": slo_class})
        return Key(t["id"], k["id"], k["value"], slo_class)

    def ledger_tokens(self) -> dict[str, int]:
        """Completion tokens per key in the ledger (after a stop or a flush)."""
        with sqlite3.connect(self.db_path) as con:
            rows = con.execute(
                "SELECT key_id, SUM(completion_tokens) FROM usage_ledger GROUP BY key_id"
            ).fetchall()
        return {k: int(n or 0) for k, n in rows}

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("quanta:") and "{" not in line:
                name, _, value = line.partition(" ")
                out[name] = float(value)
        return out


@dataclass(frozen=True)
class Key:
    tenant_id: str
    key_id: str
    value: str
    slo_class: str


@dataclass
class Tally:
    received: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    outcomes: Counter[str] = field(default_factory=Counter)
    miscounted: int = 0  # a stream whose tokens received differ from its usage chunk
    broken: int = 0  # a stream that ended without [DONE] and without an error event
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cuts: list[dict[str, Any]] = field(default_factory=list)  # what each broken stream saw

    def summary(self) -> dict[str, Any]:
        return {
            "outcomes": dict(self.outcomes),
            "tokens_received": sum(self.received.values()),
            "streams_miscounted": self.miscounted,
            "broken_streams": self.broken,
            "cuts": self.cuts,
        }


class Client:
    """One kind of request at a time, counting the tokens it gets: one per logprob entry,
    and the end-of-generation token of a choice that stopped (no stop strings are sent, so
    ``stop`` means that token), which the server counts as OpenAI and vLLM do.

    No connection cap: httpx's default pool (100 connections) would hold the rest of an
    open-loop flood in this process, unsent, and time their wait as the server's."""

    def __init__(self, url: str, model: str, tally: Tally, timeout_s: float = 300.0) -> None:
        self.url = url
        self.model = model
        self.tally = tally
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=10.0, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    async def one(self, key: Key, kind: str, max_tokens: int, rng: random.Random) -> str:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": max_tokens,
            "logprobs": True,
            "seed": rng.randrange(2**31),
        }
        headers = {"authorization": f"Bearer {key.value}"}
        started = time.monotonic()
        try:
            if kind == "json":
                outcome = await self._json(key, body, headers)
            else:
                cut = rng.randint(1, 8) if kind == "cancel" else None
                outcome = await self._stream(key, body, headers, cut)
        except httpx.HTTPError as exc:
            outcome = f"transport:{type(exc).__name__}"
        self.tally.outcomes[outcome] += 1
        self.tally.latencies[outcome].append(time.monotonic() - started)
        return outcome

    async def _json(self, key: Key, body: dict[str, Any], headers: dict[str, str]) -> str:
        r = await self.http.post(f"{self.url}/v1/chat/completions", json=body, headers=headers)
        if r.status_code != 200:
            return f"http_{r.status_code}"
        data = r.json()
        choice = data["choices"][0]
        tokens = len((choice.get("logprobs") or {}).get("content") or [])
        tokens += choice["finish_reason"] == "stop"  # the end token: computed, never shown
        self.tally.received[key.key_id] += tokens
        return "completed" if tokens == data["usage"]["completion_tokens"] else "miscounted"

    async def _stream(
        self, key: Key, body: dict[str, Any], headers: dict[str, str], cut: int | None
    ) -> str:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        got = 0
        started = time.monotonic()

        def broken(why: str) -> str:
            self.tally.broken += 1
            self.tally.cuts.append(
                {
                    "why": why,
                    "request_id": r.headers.get("x-request-id"),
                    "tokens_received": got,
                    "after_s": round(time.monotonic() - started, 3),
                    "at": time.strftime("%H:%M:%S"),
                }
            )
            return "cut"

        async with self.http.stream(
            "POST", f"{self.url}/v1/chat/completions", json=body, headers=headers
        ) as r:
            if r.status_code != 200:
                await r.aread()
                return f"http_{r.status_code}"
            try:
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        return "completed"
                    if not line.startswith("data: {"):
                        continue
                    try:
                        chunk = json.loads(line[6:])
                    except ValueError:  # the server died in the middle of a line
                        return broken("a torn line")
                    if "error" in chunk:
                        return "stream_error"
                    usage = chunk.get("usage")
                    if usage is not None and usage["completion_tokens"] != got:
                        self.tally.miscounted += 1  # a token lost or sent twice
                    for choice in chunk.get("choices", []):
                        if choice.get("finish_reason") == "stop":
                            got += 1  # the end token: computed and charged, never shown
                            self.tally.received[key.key_id] += 1
                        entries = (choice.get("logprobs") or {}).get("content") or []
                        got += len(entries)
                        self.tally.received[key.key_id] += len(entries)
                    if cut is not None and got >= cut:
                        return "cancelled"
            except httpx.HTTPError as exc:
                return broken(f"{type(exc).__name__}: {exc}")
        return broken("ended without [DONE]")

    async def close(self) -> None:
        await self.http.aclose()


def model_of(url: str, key: Key) -> str:
    r = httpx.get(f"{url}/v1/models", headers={"authorization": f"Bearer {key.value}"})
    return str(r.json()["data"][0]["id"])


def write_result(name: str, result: dict[str, Any]) -> Path:
    out = Path("bench/results/reliability") / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return out


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def sleep_until(t: float) -> Any:
    return asyncio.sleep(max(0.0, t - time.monotonic()))


def run_and_report(
    name: str, run: Coroutine[Any, Any, dict[str, Any]], hidden: str | None = None
) -> None:
    """Run one command to its end (servers it left are killed whatever happens), write its
    result under ``name`` and print its figures (``hidden``: a long series left to the file)."""
    try:
        result = asyncio.run(run)
    finally:
        kill_leftovers()
    path = write_result(name, result)
    for key, value in result.items():
        if key != hidden:
            print(f"{key}: {value}")
    print(f"written: {path}")
