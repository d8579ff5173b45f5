"""The worker's socket protocol: length-prefixed msgpack frames of typed messages.

    ┌──────────────┬────────────────────────────┐
    │ u32 length BE│ msgpack(message)           │
    └──────────────┴────────────────────────────┘

The caller sends one ``Call`` and reads one ``Reply``; there is never more than one in flight.
Before a step's reply the worker may send a heads-up, an empty frame (length 0), just before
it samples the batch's last sequence: the caller's wake-up (slow on an idle virtual CPU, ~0.15
ms here) then overlaps that sampling (~0.25 ms), and the caller spins briefly for the reply
instead of sleeping again. The worker, likewise, polls briefly for the next call after each
reply (the caller's next step usually follows within a millisecond) instead of sleeping.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from typing import Any

import msgspec

from quanta_core.engine.config import EngineConfig
from quanta_core.engine.types import EngineInfo, SeqMemory, StepPlan, StepResult

HEADER = struct.Struct(">I")
HEADS_UP = HEADER.pack(0)  # an empty frame: "nearly done; the reply follows"
SMALL_FRAME = 1 << 16
MAX_FRAME = 1 << 31  # a stash of a full 64k context is ~1.5 GB; frames stay below 2 GiB


# ---- calls (caller -> worker) ----


class StartCall(msgspec.Struct, tag=True):
    config: EngineConfig


class StepCall(msgspec.Struct, tag=True):
    plan: StepPlan
    blobs: dict[str, bytes] = {}  # the stashed bytes that this plan's Restore ops write back


class MemoryCall(msgspec.Struct, tag=True):
    pass


class ShutdownCall(msgspec.Struct, tag=True):
    pass


Call = StartCall | StepCall | MemoryCall | ShutdownCall


# ---- replies (worker -> caller) ----


class StartReply(msgspec.Struct, tag=True):
    info: EngineInfo


class StepReply(msgspec.Struct, tag=True):
    result: StepResult
    blobs: dict[str, bytes] = {}  # bytes of this plan's Stash ops
    # The batch failed inside llama_decode (e.g. no KV slot). The KV ops *were* applied; the
    # batch's tokens were not kept.
    decode_error: str | None = None


class MemoryReply(msgspec.Struct, tag=True):
    sequences: tuple[SeqMemory, ...]


class ErrorReply(msgspec.Struct, tag=True):
    """The call was refused before anything changed (``input``) or the worker failed."""

    kind: str  # "input" | "start" | "internal"
    message: str


Reply = StartReply | StepReply | MemoryReply | ErrorReply


class Channel:
    """One end of the socket, with reusable encoder and decoder.

    Reads are buffered: one ``recv`` syscall usually brings a whole small frame (header and
    body, which are sent together), or a heads-up and the reply behind it. A frame larger than
    the buffer (stash bytes) is read straight into its own buffer.

    The socket stays in blocking mode and the channel keeps its own timeout: in Python's
    timeout mode every send and receive is a ``poll`` then the call, two system calls where the
    hot path needs one (a step's send, and the read that a spin after the heads-up makes).
    """

    def __init__(self, sock: socket.socket, decodes: Any, timeout_s: float | None = None) -> None:
        sock.settimeout(None)
        self.sock = sock
        self.timeout_s = timeout_s  # for a reply (and a large send); None: wait for ever
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[object] = msgspec.msgpack.Decoder(decodes)
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._buf = bytearray(SMALL_FRAME)
        self._view = memoryview(self._buf)
        self._start = 0  # the unread bytes are _buf[_start:_end]
        self._end = 0

    def send(self, message: object) -> None:
        body = self._encoder.encode(message)
        header = HEADER.pack(len(body))
        if len(body) < SMALL_FRAME:  # the hot path (decode steps): one syscall
            self.sock.sendall(header + body)
        else:  # stash bytes: no copy of a large body, and a peer that stops reading times out
            self.sock.settimeout(self.timeout_s)
            try:
                self.sock.sendall(header)
                self.sock.sendall(body)
            finally:
                self.sock.settimeout(None)

    def send_heads_up(self) -> None:
        self.sock.sendall(HEADS_UP)

    def recv(self, spin_s: float = 0.0, idle_spin_s: float = 0.0) -> object:
        """The next message; ``EOFError`` when the peer closed the socket.

        After a heads-up, spin up to ``spin_s`` for the message before blocking on it. With
        ``idle_spin_s``, first poll that long for a frame to begin, giving the CPU to anything
        else that wants it between polls."""
        if idle_spin_s > 0 and self._start == self._end:
            self._spin_read(idle_spin_s, yield_cpu=True)
        (length,) = HEADER.unpack(self._take(HEADER.size))
        while length == 0:
            if self._start == self._end and spin_s > 0:
                self._spin_read(spin_s)
            (length,) = HEADER.unpack(self._take(HEADER.size))
        if length > MAX_FRAME:
            raise ValueError(f"frame of {length} bytes is over the limit")
        return self._decoder.decode(self._take(length))

    def recv_nowait(self, spin_s: float = 0.0) -> object | None:
        """The next message if it has come whole, read without blocking (for a caller that
        waits on an event loop and saw the socket readable); after a heads-up, poll up to
        ``spin_s`` for the message behind it. None: not whole yet. ``EOFError`` when the peer
        closed the socket."""
        self._spin_read(0.0)
        while self._end - self._start >= HEADER.size and self._peek_length() == 0:
            self._start += HEADER.size  # a heads-up
            if self._start == self._end and spin_s > 0:
                self._spin_read(spin_s)
        if self._end - self._start < HEADER.size:
            return None
        length = self._peek_length()
        if HEADER.size + length > len(self._buf):
            raise ValueError(f"a frame of {length} bytes cannot be read without blocking")
        if self._end - self._start < HEADER.size + length:
            return None
        self._start += HEADER.size
        return self._decoder.decode(self._take(length))

    def _peek_length(self) -> int:
        (length,) = HEADER.unpack_from(self._buf, self._start)
        return int(length)

    def _spin_read(self, spin_s: float, yield_cpu: bool = False) -> None:
        """Read without sleeping for at most ``spin_s`` (each try lets other threads run;
        with ``yield_cpu``, other processes too)."""
        self._compact()
        view = self._view[self._end :]
        deadline = time.perf_counter() + spin_s
        while True:
            try:
                self._end += self._recv_into(view, socket.MSG_DONTWAIT)
                return
            except BlockingIOError:
                if time.perf_counter() >= deadline:
                    return
                if yield_cpu:
                    os.sched_yield()

    def _take(self, n: int) -> memoryview:
        """The next ``n`` bytes, valid until the next read."""
        if self._end - self._start < n:
            if n > len(self._buf):
                return self._take_large(n)
            self._compact()
            while self._end < n:
                self._end += self._recv_into(self._view[self._end :])
        start = self._start
        self._start += n
        return self._view[start : start + n]

    def _take_large(self, n: int) -> memoryview:
        view = memoryview(bytearray(n))
        got = self._end - self._start
        view[:got] = self._view[self._start : self._end]
        self._start = self._end = 0
        while got < n:
            got += self._recv_into(view[got:])
        return view

    def _compact(self) -> None:
        held = self._end - self._start
        self._buf[:held] = self._buf[self._start : self._end]
        self._start, self._end = 0, held

    def _recv_into(self, view: memoryview, flags: int = 0) -> int:
        # A blocking read waits at most timeout_s; a MSG_DONTWAIT one (the spin) never waits.
        if not flags and self.timeout_s is not None and not self._poll.poll(1e3 * self.timeout_s):
            raise TimeoutError(f"no answer within {self.timeout_s} s")
        k = self.sock.recv_into(view, 0, flags)
        if k == 0:
            raise EOFError("peer closed the socket")
        return k
