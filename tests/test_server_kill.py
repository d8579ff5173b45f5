"""``kill -9`` of the server process mid-load, and of the engine under one request: the
ledger holds what the clients were sent.

Requests that ended before the kill are in the ledger exactly, flushed or not (the ledger's
journal is written ahead); a stream cut by it is charged what its client received, give or
take the one write under way when the process died, and closed as ``interrupted`` at the
next start; the quota counters rebuilt at that start equal the ledger. A request that fails
after the engine produced tokens is charged only what its client was sent.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.lab.server import child_pids
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
    """A chat stream of one token per logprob entry; ``received`` counts them as they come
    (``[tokens, the most in one event, 1 if it ended with an error event]``)."""
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
                    received[2] += "error" in chunk
                    for choice in chunk.get("choices", []):
                        n = len((choice.get("logprobs") or {}).get("content") or [])
                        received[0] += n
                        received[1] = max(received[1], n)
    except httpx.HTTPError:
        pass  # the server died: what came before it is what was received


def post_retrying(url: str, body: dict[str, Any], key: str, timeout: float) -> httpx.Response:
    """A chat request, sent again at its retry-after while admission refuses it (the
    streams beside it can make the first-token estimate miss its target)."""
    for _ in range(20):
        r = httpx.post(
            f"{url}/v1/chat/completions", json=body, headers=bearer(key), timeout=timeout
        )
        if r.status_code not in (429, 503):
            break
        time.sleep(float(r.headers.get("retry-after-ms", "1000")) / 1000)
    return r


def post_admitted(url: str, body: dict[str, Any], key: str) -> httpx.Response:
    r = post_retrying(url, body, key, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_a_killed_server_loses_nothing_it_sent(model_path: Path) -> None:
    db = fresh_db()
    server = start_server(db=db)
    server.wait_ready()
    model = httpx.get(f"{server.url}/v1/models", headers=server.auth).json()["data"][0]["id"]
    done_key = db.create_key("finished")
    stream_keys = [db.create_key(f"streaming-{i}") for i in range(3)]
    received = [[0, 0, 0] for _ in stream_keys]
    threads = [
        threading.Thread(target=stream, args=(server.url, model, k, got), daemon=True)
        for k, got in zip(stream_keys, received, strict=True)
    ]
    for t in threads:
        t.start()
    done_id = key_of(server, done_key)["id"]
    stream_ids = [key_of(server, k)["id"] for k in stream_keys]
    wait_for(lambda: all(got[0] > 0 for got in received))
    finished = 0
    for i in range(4):
        body = {"model": model, "messages": [{"role": "user", "content": f"Say {i}."}]}
        r = post_admitted(server.url, {**body, "max_tokens": 8}, done_key)
        finished += r.json()["usage"]["completion_tokens"]
    # No waiting for the ledger's flush: what was sent is in its journal already.
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(30)
    for t in threads:
        t.join(60)
    db_path = db.root / "quanta.db"

    again = start_server(db=db)
    try:
        again.wait_ready()
        rows = ledger(db_path)
        mine = [r for r in rows if r[0] == done_id]
        assert sum(r[2] for r in mine) == finished
        assert [r[1] for r in mine].count("completed") == 4
        assert {r[1] for r in mine} <= {"partial", "completed", "rejected"}  # retried 503s
        assert all(r[3] == 0 for r in mine if r[1] == "rejected")
        for key_id, (got, most_in_one_write, _) in zip(stream_ids, received, strict=True):
            cut = [r for r in rows if r[0] == key_id]
            assert [r[1] for r in cut].count("interrupted") == 1
            assert {r[1] for r in cut} == {"partial", "interrupted"}
            charged = sum(r[2] for r in cut)
            # All it received, and at most the one write the kill came in the middle of.
            assert got <= charged <= got + max(most_in_one_write, 1)
        # The counters rebuilt at start are the ledger's, exactly.
        tenant_ids = {r[4] for r in rows}
        for tenant_id in tenant_ids:
            t = httpx.get(f"{again.url}/admin/v1/tenants/{tenant_id}", headers=ADMIN).json()
            in_ledger = sum(r[3] for r in rows if r[4] == tenant_id)
            assert t["counters"]["tokens_today"] == in_ledger
            assert t["counters"]["concurrent_requests"] == 0
    finally:
        again.stop()


def kill_engine(server: ServerProcess) -> None:
    for pid in child_pids(server.process.pid):
        os.kill(pid, signal.SIGKILL)


def whole_json(url: str, model: str, key: str, out: list[httpx.Response]) -> None:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 2000, "ignore_eos": True}
    out.append(post_retrying(url, body, key, timeout=300))


def test_a_request_failed_after_tokens_is_charged_what_it_was_sent(model_path: Path) -> None:
    """The engine killed twice under the same requests fails them (500 for the JSON one, an
    error event for the stream) after the engine produced tokens for both."""
    db = fresh_db()
    server = start_server(db=db)
    try:
        server.wait_ready()
        model = httpx.get(f"{server.url}/v1/models", headers=server.auth).json()["data"][0]["id"]
        stream_key, json_key = db.create_key("stream"), db.create_key("json")
        got = [0, 0, 0]
        answers: list[httpx.Response] = []
        threads = [
            threading.Thread(target=stream, args=(server.url, model, stream_key, got)),
            threading.Thread(target=whole_json, args=(server.url, model, json_key, answers)),
        ]
        for t in threads:
            t.start()
        for _ in range(2):  # each death after tokens came since the last (the engine is back)
            before = got[0]
            wait_for(lambda before=before: got[0] >= before + 5)  # type: ignore[misc]
            kill_engine(server)
        for t in threads:
            t.join(120)
        assert got[2] == 1  # the stream ended with an error event
        assert answers[0].status_code == 500, answers[0].text
        stream_id, json_id = key_of(server, stream_key)["id"], key_of(server, json_key)["id"]
    finally:
        server.stop()
    rows = ledger(db.root / "quanta.db")
    streamed = [r for r in rows if r[0] == stream_id]
    assert sum(r[2] for r in streamed) == got[0] > 0
    assert streamed[-1][1] == "error"
    whole = [r for r in rows if r[0] == json_id]
    assert [(r[1], r[2], r[3]) for r in whole] == [("error", 0, 0)]
