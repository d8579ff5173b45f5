"""The worker's socket protocol: length-prefixed msgpack frames of typed messages.

    ┌──────────────┬────────────────────────────┐
    │ u32 length BE│ msgpack(message)           │
    └──────────────┴────────────────────────────┘

The caller sends one ``Call`` and reads one ``Reply``; there is never more than one in flight.
A frame of length 0 is a *notice*: the worker sends it when the batch is decoded and only the
last sample is left, so the caller, asleep through the decode, wakes while the worker still
works and then spins briefly for the reply instead of paying a second wake-up after it (on this
VM a wake-up costs 100-200 µs, the last sample ~300 µs).
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any

import msgspec

from quanta_core.engine.config import EngineConfig
from quanta_core.engine.types import EngineInfo, SeqMemory, StepPlan, StepResult

HEADER = struct.Struct(">I")
SMALL_FRAME = 1 << 16
MAX_FRAME = 1 << 31  # a stash of a full 64k context is ~1.5 GB; frames stay below 2 GiB
NOTICE = HEADER.pack(0)
NOTICE_SPIN_S = 0.002  # how long a caller woken by a notice polls before it blocks again


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
    """One end of the socket, with reusable encoder, decoder and receive buffer.

    ``spin_s`` > 0 (the caller's end): after a notice, poll the socket for that long before
    blocking. Polling needs the socket in timeout mode (non-blocking underneath); on a
    blocking socket the poll simply blocks.
    """

    def __init__(self, sock: socket.socket, decodes: Any, spin_s: float = 0.0) -> None:
        self.sock = sock
        self.spin_s = spin_s
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[object] = msgspec.msgpack.Decoder(decodes)
        self._chunk = bytearray(SMALL_FRAME)
        self._inbox = bytearray()  # bytes received but not yet taken

    def send(self, message: object) -> None:
        body = self._encoder.encode(message)
        header = HEADER.pack(len(body))
        if len(body) < SMALL_FRAME:  # the hot path (decode steps): one syscall
            self.sock.sendall(header + body)
        else:  # stash bytes: no copy of a large body
            self.sock.sendall(header)
            self.sock.sendall(body)

    def send_notice(self) -> None:
        self.sock.sendall(NOTICE)

    def recv(self) -> object:
        """The next message (notices are consumed); ``EOFError`` when the peer closed."""
        length = self._length()
        while length == 0:
            self._spin()
            length = self._length()
        if length > MAX_FRAME:
            raise ValueError(f"frame of {length} bytes is over the limit")
        return self._decoder.decode(self._take(length))

    def _length(self) -> int:
        (length,) = HEADER.unpack(self._take(HEADER.size))
        return int(length)

    def _take(self, n: int) -> bytes | memoryview:
        inbox = self._inbox
        if n >= SMALL_FRAME:  # a stash: straight into a buffer of its own, no copies
            buf = memoryview(bytearray(n))
            have = min(len(inbox), n)
            buf[:have] = inbox[:have]
            del inbox[:have]
            self._read_into(buf[have:])
            return buf
        while len(inbox) < n:
            self._receive(self.sock.recv_into(self._chunk))
        out = bytes(inbox[:n])
        del inbox[:n]
        return out

    def _receive(self, k: int) -> None:
        if k == 0:
            raise EOFError("peer closed the socket")
        self._inbox += memoryview(self._chunk)[:k]

    def _read_into(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            k = self.sock.recv_into(view[got:], len(view) - got)
            if k == 0:
                raise EOFError("peer closed the socket")
            got += k

    def _spin(self) -> None:
        """Poll for the reply announced by a notice, at most ``spin_s``; then let recv block."""
        if self.spin_s <= 0 or self._inbox:
            return
        fd = self.sock.fileno()
        deadline = time.perf_counter() + self.spin_s
        while time.perf_counter() < deadline:
            try:
                k = os.readv(fd, [self._chunk])
            except BlockingIOError:
                continue
            self._receive(k)
            return
