"""uvicorn's HTTP protocol with the two timeouts it lacks: slow readers and slow writers.

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

The app's own disconnect handling does the rest; nothing here knows about streams.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.server.settings import Settings


class GuardedHttpProtocol(HttpToolsProtocol):
    read_timeout_s = 30.0
    write_timeout_s = 30.0

    _read_timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_read()
        self._disarm_write()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._read_timer is None:
            self._arm_read()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm_read()

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
