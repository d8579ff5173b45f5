"""A stream whose connection breaks is charged exactly what its client received.

Over real HTTP (uvicorn with ``quanta run``'s protocol, the scripted fake core, one token per
event): clients that drop their connection after a few tokens, and a connection whose send
fails in the middle of a stream (as an ASGI server that raises on a broken connection does):
the write under way is charged ahead of it (the journal), and taken back when it did not
reach the client.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.server.app import create_app
from app.server.http_protocol import guarded_protocol
from tests.fakes import MODEL, FakeDriver, fake_core
from tests.tenancy_setup import TenancyDb, bearer, fresh_db, over_http

BREAK_AFTER = "x-test-break-after"  # the body write (counted from 1) whose send fails
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hi"}],
    "max_tokens": 40,
    "ignore_eos": True,
    "stream": True,
    "logprobs": True,
}


def breaking_sends(app: ASGIApp) -> ASGIApp:
    """``app`` behind a connection that breaks at the body write named by ``BREAK_AFTER``."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        at = int(dict(scope["headers"]).get(BREAK_AFTER.encode(), b"0"))
        writes = 0

        async def send_or_break(message: Message) -> None:
            nonlocal writes
            if message["type"] == "http.response.body" and at:
                writes += 1
                if writes == at:
                    raise ConnectionResetError("the connection broke")
            await send(message)

        await app(scope, receive, send_or_break)

    return wrapped


def read_tokens(url: str, key: str, stop_after: int | None = None, **headers: str) -> int:
    """Stream ``BODY``, counting one token per logprob entry, until the stream ends, breaks,
    or ``stop_after`` tokens came (then the client leaves: it closes the connection)."""
    got = 0
    try:
        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json=BODY,
            headers={**bearer(key), **headers},
            timeout=30,
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                for choice in json.loads(line[6:]).get("choices", []):
                    got += len((choice.get("logprobs") or {}).get("content") or [])
                if stop_after is not None and got >= stop_after:
                    return got
    except httpx.RemoteProtocolError:
        pass  # the connection broke: what came before is what was received
    return got


def ledger(db: TenancyDb) -> dict[str, int]:
    with sqlite3.connect(db.root / "quanta.db") as con:
        rows = con.execute(
            "SELECT key_id, SUM(completion_tokens) FROM usage_ledger GROUP BY key_id"
        ).fetchall()
    return {k: int(n) for k, n in rows}


def serve_and_run(
    tmp_path: Path, wrap: Callable[[ASGIApp], ASGIApp], clients: int, run: Any
) -> tuple[dict[str, int], dict[str, int]]:
    """Serve the app (``wrap``-ped) over HTTP; ``run(url, key, i)`` for each of ``clients``
    keys returns the tokens it received. Received and the ledger (after a clean stop) per
    key id."""
    db = fresh_db(tmp_path)
    keys = [db.create_key(f"client-{i}") for i in range(clients)]
    # A token every 200 ms: a client that leaves does so long before the next one is written,
    # even when a pause of the test process (GC, a busy core) holds its close back a while.
    driver = FakeDriver(script=["x" * 64], delay_s=0.2)
    settings = db.settings()
    app = create_app(settings, core_factory=lambda _: fake_core(driver))
    received: dict[str, int] = {}
    with over_http(wrap(app), http=guarded_protocol(settings)) as url:
        for i, key in enumerate(keys):
            key_id = httpx.get(f"{url}/v1/key", headers=bearer(key)).json()["id"]
            received[key_id] = run(url, key, i)
    return received, ledger(db)


@pytest.mark.parametrize("stop_after", [1, 3, 7])
def test_a_client_that_leaves_mid_stream_is_charged_what_it_received(
    tmp_path: Path, stop_after: int
) -> None:
    received, charged = serve_and_run(
        tmp_path, lambda app: app, 2, lambda url, key, i: read_tokens(url, key, stop_after + i)
    )
    assert sorted(received.values()) == [stop_after, stop_after + 1]
    assert charged == received


@pytest.mark.parametrize("break_at", [2, 5, 9])
def test_a_write_that_fails_is_not_charged(tmp_path: Path, break_at: int) -> None:
    """Body write 1 is the opening (no token), each later one a token: the client gets the
    tokens before the failed write, and so does the ledger (the failed one was charged ahead
    of its send)."""
    received, charged = serve_and_run(
        tmp_path,
        breaking_sends,
        1,
        lambda url, key, i: read_tokens(url, key, **{BREAK_AFTER: str(break_at)}),
    )
    assert list(received.values()) == [break_at - 2]
    assert charged == received
