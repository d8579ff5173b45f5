"""Slow clients cannot hold a slot forever: a reader that never reads its stream, and
slowloris (a request trickled in), over real sockets against ``quanta run``'s HTTP protocol.

The core is the scripted fake (no model): its stream of 400,000 tokens would run for hours,
so a running count back at 0 means the server cancelled it.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.server.app import create_app
from app.server.http_protocol import guarded_protocol
from tests.fakes import MODEL, FakeDriver, fake_core
from tests.tenancy_setup import TenancyDb, bearer, fresh_db, over_http

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3}


def wait_for(what: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, TenancyDb, str, FakeDriver]]:
    db = fresh_db(tmp_path)
    key = db.create_key("reader")
    driver = FakeDriver(delay_s=0.001)
    settings = db.settings(stream_write_timeout_s=1.0, request_read_timeout_s=1.0)
    app = create_app(settings, core_factory=lambda _: fake_core(driver, n_ctx=1_000_000))
    with over_http(app, http=guarded_protocol(settings)) as url:
        yield url, db, key, driver


def raw_request(port: int, body: bytes, key: str, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect
    sock.connect(("127.0.0.1", port))
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {key}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def closed_by_server(sock: socket.socket, timeout_s: float = 60.0) -> bool:
    """Read (and drop) until the server closes or resets the connection."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def test_a_stream_nobody_reads_is_cancelled_and_its_slot_freed(
    server: tuple[str, TenancyDb, str, FakeDriver],
) -> None:
    url, _, key, driver = server
    port = int(url.rsplit(":", 1)[1])
    body: dict[str, Any] = {
        **BODY,
        "max_tokens": 400_000,
        "ignore_eos": True,
        "stream": True,
        "n": 16,
        "logprobs": True,
        "top_logprobs": 2,
    }
    sock = raw_request(port, json.dumps(body).encode(), key, rcvbuf=4096)
    try:
        wait_for(lambda: metric(url, "quanta:num_requests_running") == 1)
        own = httpx.get(f"{url}/v1/key", headers=bearer(key)).json()
        assert own["key_usage"]["concurrent_requests"] == 1
        # Other requests go on while the reader stalls...
        ok = httpx.post(f"{url}/v1/chat/completions", json=BODY, headers=bearer(key))
        assert ok.status_code == 200, ok.text
        # ...and the stalled stream is cancelled: its running slot, KV and quota slot freed.
        wait_for(lambda: metric(url, "quanta:num_requests_running") == 0)
        assert metric(url, "quanta:kv_cache_usage_perc") == 0.0
        assert len(driver.cancelled) == 1
        own = httpx.get(f"{url}/v1/key", headers=bearer(key)).json()
        assert own["key_usage"]["concurrent_requests"] == 0
        assert closed_by_server(sock)
    finally:
        sock.close()


def test_a_stream_read_slowly_is_not_cut(server: tuple[str, TenancyDb, str, FakeDriver]) -> None:
    """Read 1 KiB each 10 ms, slower than the stream is made: the server's buffer fills and
    drains, each time within the write timeout."""
    url, _, key, driver = server
    port = int(url.rsplit(":", 1)[1])
    body = {**BODY, "max_tokens": 200, "ignore_eos": True, "stream": True, "n": 4}
    sock = raw_request(port, json.dumps(body).encode(), key, rcvbuf=4096)
    received = b""
    try:
        sock.settimeout(30)
        while not received.endswith(b"\r\n0\r\n\r\n"):  # the last chunk of the body
            data = sock.recv(1024)
            assert data, "the server cut a stream that was being read"
            received += data
            time.sleep(0.01)
    finally:
        sock.close()
    assert b"data: [DONE]" in received
    assert received.count(b'"finish_reason":"length"') == 4
    assert driver.cancelled == set()


def trickled(sock: socket.socket, data: bytes) -> bool:
    """Send ``data`` one byte each 0.2 s (a minute's worth, repeated); whether the server
    closed the connection meanwhile."""
    sock.settimeout(0.2)
    for i in range(300):
        try:
            sock.sendall(data[i % len(data) : i % len(data) + 1])
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return True
    return False


def test_slowloris_headers_are_closed(server: tuple[str, TenancyDb, str, FakeDriver]) -> None:
    url, _, _, _ = server
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        assert trickled(sock, b"x-trickle: 1\r\n"), "the server kept a trickling request open"
    assert httpx.get(f"{url}/readyz").status_code == 200


def test_a_connection_that_sends_nothing_is_closed(
    server: tuple[str, TenancyDb, str, FakeDriver],
) -> None:
    url, _, _, _ = server
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert closed_by_server(sock)


def test_slowloris_body_is_closed(server: tuple[str, TenancyDb, str, FakeDriver]) -> None:
    url, _, key, driver = server
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps(BODY).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {key}\r\ncontent-length: {len(body) + 10_000}\r\n\r\n"
        )
        sock.sendall(head.encode() + body[:5])
        assert trickled(sock, b" "), "the server kept a trickling body open"
    assert driver.submitted == []  # nothing of it reached the core
    own = httpx.get(f"{url}/v1/key", headers=bearer(key)).json()
    assert own["key_usage"]["concurrent_requests"] == 0


@pytest.mark.model
def test_the_real_engine_frees_a_stalled_streams_kv(model_path: Path) -> None:
    """The same stalled reader against ``quanta run`` and the real engine: its stream is
    cancelled (the ledger says so) long before it could have ended, and its KV freed.

    The loopback socket's send buffer takes ~3 MB before a write blocks: 16 choices with 20
    top logprobs each make ~18 KB a step, so the stall comes after ~170 of the 2,000 steps.
    """
    from tests.server_process import start_server

    # 16 slots, each holding a choice's prompt (the template's ~40 tokens) and 2,000 tokens:
    # all 16 run at once
    env = {"QUANTA_STREAM_WRITE_TIMEOUT_S": "1", "QUANTA_N_CTX": "2560", "QUANTA_N_SEQ_MAX": "16"}
    server = start_server(env=env)
    try:
        server.wait_ready()
        model = httpx.get(f"{server.url}/v1/models", headers=server.auth).json()["data"][0]["id"]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
            "n": 16,
            "logprobs": True,
            "top_logprobs": 20,
        }
        sock = raw_request(server.port, json.dumps(body).encode(), server.api_key, rcvbuf=4096)
        try:
            wait_for(lambda: metric(server.url, "quanta:num_requests_running") == 1)
            assert metric(server.url, "quanta:kv_cache_usage_perc") > 0
            wait_for(lambda: metric(server.url, "quanta:num_requests_running") == 0, 200)
            assert metric(server.url, "quanta:kv_cache_usage_perc") == 0.0
            assert closed_by_server(sock)
            short = {**body, "max_tokens": 4, "stream": False, "n": 1}
            r = httpx.post(
                f"{server.url}/v1/chat/completions", json=short, headers=server.auth, timeout=120
            )
            assert r.status_code == 200, r.text
        finally:
            sock.close()
    finally:
        assert server.stop() == 0
    with contextlib.closing(sqlite3.connect(server.db.root / "quanta.db")) as con:
        rows = con.execute(
            "SELECT MAX(CASE WHEN status != 'partial' THEN status END), SUM(completion_tokens) "
            "FROM usage_ledger GROUP BY request_id ORDER BY MIN(started_at)"
        ).fetchall()
    assert len(rows) == 2
    status, tokens = rows[0]  # the stalled stream's final row, and all it was charged
    assert status == "cancelled", rows
    assert 0 < tokens < 16 * 2000


def test_an_endless_header_is_a_431(server: tuple[str, TenancyDb, str, FakeDriver]) -> None:
    url, _, key, _ = server
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-endless: ")
        answer = b""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(1024):  # up to 1 MiB of one header's value
                sock.sendall(b"a" * 1024)
        sock.settimeout(30)
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(65536):
                answer += data
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    # A large body is no head: it reaches the app.
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 1_000_000}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=big, headers=bearer(key), timeout=60)
    assert r.status_code in (200, 400), r.text
