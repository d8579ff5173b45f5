"""uvicorn's HTTP protocol with the bounds it lacks: on slow requests, slow readers, big heads.

uvicorn closes an idle keep-alive connection, but it has no timeout for a request that
trickles in (slowloris: headers or body a byte at a time) nor for a client that stops
reading its response: its send then waits for the socket to drain, forever, and a stream
keeps its running slot, its concurrency slot and its KV. As nginx's client header/body
timeouts and its ``send_timeout``:

    read   a request's headers and body must arrive within ``request_read_timeout_s`` of
           its first byte (a new connection's first byte within as long), else the
           connection is closed; a request already handed to the app then sees a disconnect
    write  once the transport's buffer is over its high-water mark (64 KiB: the socket's
           send buffer is full, the client reads nothing), it must drain to its low-water
           mark (16 KiB) within ``stream_write_timeout_s``, else the connection is aborted:
           the app sees a disconnect, so a stream is cancelled and its KV freed, exactly as
           when the client leaves. (At the default 30 s, a client reading 2 KB/s keeps up.)
    size   a request's head (request line and headers) is at most ``MAX_HEAD_BYTES``,
           else 431 and the connection is closed (uvicorn bounds it only with h11; with
           httptools, one endless header would grow in memory until the read timeout)

The app's own disconnect handling does the rest; nothing here knows about streams. What
the app may ask of the connection (``connection_closing``): whether it is closing, i.e.
whether a write now can still reach the client (uvicorn drops a write to a lost connection
without a word).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.server.settings import Settings

# scope["extensions"][CONNECTION]["closing"]: the connection's transport's is_closing
CONNECTION = "quanta.connection"

MAX_HEAD_BYTES = 64 * 1024  # nginx allows 32 KiB (4 x 8k buffers), h11 in uvicorn 16 KiB
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-length: 0\r\nconnection: close\r\n\r\n"
)


class GuardedHttpProtocol(HttpToolsProtocol):
    read_timeout_s = 30.0
    write_timeout_s = 30.0

    _read_timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None
    _in_head = True  # between a request's first byte (or the connection's) and its headers' end
    _head_bytes = 0
    _boundaries = 0  # heads and messages completed on this connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_read()
        self._disarm_write()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        boundaries = self._boundaries
        super().data_received(data)
        if not self._in_head or self._boundaries != boundaries or self.transport.is_closing():
            return
        # Counted after parsing, and only for a chunk in which no head nor message ended (it
        # may hold a body, or another request's start). One chunk past the bound may be parsed.
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self.transport.write(_TOO_LARGE)
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._boundaries += 1
        # Before uvicorn hands the scope to the app (it does in the call below).
        self.scope.setdefault("extensions", {})[CONNECTION] = {  # type: ignore[typeddict-item]
            "closing": self.transport.is_closing
        }
        super().on_headers_complete()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._read_timer is None:
            self._arm_read()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm_read()
        self._in_head, self._head_bytes = True, 0
        self._boundaries += 1

    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm_write()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_write()

    # ---- the timers ----

    def _arm_read(self) -> None:
        self._disarm_read()
        self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm_read(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            self.logger.info("closing a connection whose request did not arrive in time")
            self.transport.close()

    def _arm_write(self) -> None:
        self._disarm_write()
        self._write_timer = self.loop.call_later(self.write_timeout_s, self._write_timed_out)

    def _disarm_write(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_timed_out(self) -> None:
        self._write_timer = None
        if self.transport.is_closing():
            return
        self.logger.info("aborting a connection whose client read nothing in time")
        # abort, not close: close would wait for the buffer to drain, which it never does.
        self.transport.abort()


def guarded_protocol(settings: Settings) -> type[GuardedHttpProtocol]:
    """The protocol class for uvicorn's ``http=``, with ``settings``' timeouts."""
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {
            "read_timeout_s": settings.request_read_timeout_s,
            "write_timeout_s": settings.stream_write_timeout_s,
        },
    )


def _never() -> bool:
    return False


def connection_closing(scope: Any) -> Callable[[], bool]:
    """Whether the request's connection is closing (always ``False`` under a server that
    does not say, such as the test client)."""
    extensions = scope.get("extensions") or {}
    closing: Callable[[], bool] = extensions.get(CONNECTION, {}).get("closing", _never)
    return closing
