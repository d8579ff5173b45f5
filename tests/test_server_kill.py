"""``kill -9`` of the server process mid-load: the ledger holds what the clients were served.

Requests that ended before the kill are in the ledger exactly; streams cut by it are there up
to the last flush (partial rows), closed as ``interrupted`` at the next start; the quota
counters rebuilt at that start equal the ledger.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess, start_server
from tests.tenancy_setup import ADMIN, bearer, fresh_db

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


def ledger(db_path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db_path) as con:
        return con.execute(
            "SELECT k.id, u.status, u.completion_tokens, u.charged_tokens, u.tenant_id "
            "FROM usage_ledger u JOIN api_keys k ON k.id = u.key_id"
        ).fetchall()


def key_of(server: ServerProcess, value: str) -> dict[str, Any]:
    own: dict[str, Any] = httpx.get(f"{server.url}/v1/key", headers=bearer(value)).json()
    return own


def wait_for(what: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def stream(url: str, model: str, key: str, received: list[int]) -> None:
    """A chat stream of one token per logprob entry; ``received`` counts them as they come."""
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
        "logprobs": True,
    }
    try:
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=bearer(key), timeout=120
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = httpx.Response(200, content=line[6:]).json()
                    for choice in chunk.get("choices", []):
                        received[0] += len((choice.get("logprobs") or {}).get("content") or [])
    except httpx.HTTPError:
        pass  # the server died: what came before it is what was received


def test_a_killed_server_loses_nothing_it_had_flushed(model_path: Path) -> None:
    db = fresh_db()
    server = start_server(db=db)
    server.wait_ready()
    model = httpx.get(f"{server.url}/v1/models", headers=server.auth).json()["data"][0]["id"]
    done_key = db.create_key("finished")
    stream_keys = [db.create_key(f"streaming-{i}") for i in range(3)]
    received = [[0] for _ in stream_keys]
    threads = [
        threading.Thread(target=stream, args=(server.url, model, k, got), daemon=True)
        for k, got in zip(stream_keys, received, strict=True)
    ]
    for t in threads:
        t.start()
    finished = 0
    for i in range(4):
        body = {"model": model, "messages": [{"role": "user", "content": f"Say {i}."}]}
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={**body, "max_tokens": 8},
            headers=bearer(done_key),
            timeout=120,
        )
        assert r.status_code == 200, r.text
        finished += r.json()["usage"]["completion_tokens"]
    done_id = key_of(server, done_key)["id"]
    stream_ids = [key_of(server, k)["id"] for k in stream_keys]
    db_path = db.root / "quanta.db"

    # The sync points: the finished requests' rows and every stream's partial rows written.
    def flushed() -> bool:
        rows = ledger(db_path)
        done = [r for r in rows if r[0] == done_id and r[1] == "completed"]
        partial = {r[0] for r in rows if r[1] == "partial" and r[2] > 0}
        return len(done) == 4 and partial >= set(stream_ids)

    wait_for(flushed)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(30)
    for t in threads:
        t.join(60)

    again = start_server(db=db)
    try:
        again.wait_ready()
        rows = ledger(db_path)
        mine = [r for r in rows if r[0] == done_id]
        assert sum(r[2] for r in mine) == finished
        assert [r[1] for r in mine].count("completed") == 4
        assert {r[1] for r in mine} <= {"partial", "completed"}
        for key_id, got in zip(stream_ids, received, strict=True):
            cut = [r for r in rows if r[0] == key_id]
            assert [r[1] for r in cut].count("interrupted") == 1
            assert {r[1] for r in cut} == {"partial", "interrupted"}
            charged = sum(r[2] for r in cut)
            assert 0 < charged <= got[0]  # never more than the client received
        # The counters rebuilt at start are the ledger's, exactly.
        tenant_ids = {r[4] for r in rows}
        for tenant_id in tenant_ids:
            t = httpx.get(f"{again.url}/admin/v1/tenants/{tenant_id}", headers=ADMIN).json()
            in_ledger = sum(r[3] for r in rows if r[4] == tenant_id)
            assert t["counters"]["tokens_today"] == in_ledger
            assert t["counters"]["concurrent_requests"] == 0
    finally:
        again.stop()
