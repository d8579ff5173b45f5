"""A stub OpenAI-compatible streaming server that plays a script on a stepped clock.

The stub and the bench client share one ``SteppedClock`` in one event loop. The stub waits
until every scripted request has arrived, then plays the script's events in time order: it
sets the clock to the event's time, writes one SSE line, and waits until the client has read
it (the client reads the clock once per line). So every timestamp the client records is
exactly the scripted one, and every figure can be computed by hand.

Lines are written without the blank separator line SSE normally has, so that one write is one
line is one clock reading; the bench client reads ``data:`` lines either way.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SteppedClock:
    now: float = 0.0
    reads: int = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


@dataclass(frozen=True)
class Script:
    """One request's answer: tokens at these times, the stream ends at ``done``."""

    token_times: tuple[float, ...] = ()
    done: float = 0.0
    quanta: dict[str, Any] | None = None  # the server-side split, as Quanta sends it
    status: int = 200  # not 200: answer at once with this status and an error body
    retry_after_s: float | None = None  # with a status: sent as ``retry-after-ms``


@dataclass
class StubServer:
    """Stepped (the default): plays ``scripts`` on ``clock`` once all have arrived. Live
    (``live=True``): answers each request as it comes, its script's times taken as real
    seconds after its arrival, and counts the requests in flight."""

    scripts: dict[str, Script]  # by x-request-id
    clock: SteppedClock = field(default_factory=SteppedClock)
    live: bool = False
    default: Script | None = None  # for request ids without a script of their own
    max_in_flight: int = 0
    port: int = 0
    _in_flight: int = 0
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)
    _writers: dict[str, asyncio.StreamWriter] = field(default_factory=dict)
    _server: asyncio.Server | None = None
    _player: asyncio.Task[None] | None = None
    _all_in: asyncio.Event = field(default_factory=asyncio.Event)
    _done: dict[str, asyncio.Event] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> StubServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._done = {rid: asyncio.Event() for rid, s in self.scripts.items() if s.status == 200}
        self._player = asyncio.create_task(asyncio.sleep(0) if self.live else self._play())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None and self._player is not None
        self._player.cancel()
        for done in self._done.values():
            done.set()  # the client may have left before the player saw its last read
        await asyncio.sleep(0)
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        request_line, *lines = head.strip().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if request_line.startswith("GET /v1/models"):
            await self._respond(writer, 200, {"data": [{"id": "stub-model"}]})
            return
        if request_line.startswith("GET "):
            await self._respond(writer, 404, {"error": {"message": "not found"}})
            return
        rid = headers["x-request-id"]
        self.bodies[rid] = json.loads(body)
        self.headers[rid] = headers
        script = self.scripts.get(rid, self.default)
        assert script is not None, f"no script for {rid}"
        if script.status != 200:
            ms = script.retry_after_s
            headers = {} if ms is None else {"retry-after-ms": ms}
            await self._respond(writer, script.status, {"error": {"message": "scripted"}}, headers)
            return
        if self.live:
            await self._live(writer, script)
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        )
        await writer.drain()
        self._writers[rid] = writer
        if set(self._writers) == set(self._done):
            self._all_in.set()
        await self._done[rid].wait()
        writer.close()

    async def _respond(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        payload: object,
        headers: dict[str, float] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        extra = "".join(f"{k}: {v * 1000:.0f}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}"
            f"content-length: {len(data)}\r\nconnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        writer.close()

    async def _live(self, writer: asyncio.StreamWriter, script: Script) -> None:
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            )
            elapsed = 0.0
            for t in script.token_times:
                await asyncio.sleep(t - elapsed)
                elapsed = t
                writer.write(_line({"choices": [{"index": 0, "text": "x"}]}))
                await writer.drain()
            await asyncio.sleep(max(0.0, script.done - elapsed))
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
        finally:
            self._in_flight -= 1
            writer.close()

    def _events(self) -> list[tuple[float, int, str, bytes]]:
        events: list[tuple[float, int, str, bytes]] = []
        seq = 0
        for rid, s in self.scripts.items():
            if s.status != 200:
                continue
            for t in s.token_times:
                chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
                events.append((t, seq, rid, _line(chunk)))
                seq += 1
            final: dict[str, Any] = {"index": 0, "text": "", "finish_reason": "length"}
            if s.quanta is not None:
                final["quanta"] = s.quanta
            n = len(s.token_times)
            usage = {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}
            for line in (
                _line({"choices": [final]}),
                _line({"choices": [], "usage": usage}),
                b"data: [DONE]\n",
            ):
                events.append((s.done, seq, rid, line))
                seq += 1
        return sorted(events)

    async def _play(self) -> None:
        try:
            await self._play_events()
        finally:  # done or failed: never leave a client waiting for the rest of its stream
            for done in self._done.values():
                done.set()

    async def _play_events(self) -> None:
        await self._all_in.wait()
        for t, _, rid, line in self._events():
            self.clock.now = t
            before = self.clock.reads
            writer = self._writers[rid]
            writer.write(line)
            await writer.drain()
            async with asyncio.timeout(10):
                while self.clock.reads == before:
                    await asyncio.sleep(0.001)
            if line == b"data: [DONE]\n":
                self._done[rid].set()


def _line(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n"
