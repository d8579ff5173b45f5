"""The worker's socket protocol: length-prefixed msgpack frames of typed messages.

    ┌──────────────┬────────────────────────────┐
    │ u32 length BE│ msgpack(message)           │
    └──────────────┴────────────────────────────┘

The caller sends one ``Call`` and reads one ``Reply``; there is never more than one in flight.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgspec

from quanta_core.engine.config import EngineConfig
from quanta_core.engine.types import EngineInfo, SeqMemory, StepPlan, StepResult

HEADER = struct.Struct(">I")
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
    """One end of the socket, with reusable encoder and decoder."""

    def __init__(self, sock: socket.socket, decodes: Any) -> None:
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[object] = msgspec.msgpack.Decoder(decodes)

    def send(self, message: object) -> None:
        body = self._encoder.encode(message)
        header = HEADER.pack(len(body))
        if len(body) < SMALL_FRAME:  # the hot path (decode steps): one syscall
            self.sock.sendall(header + body)
        else:  # stash bytes: no copy of a large body
            self.sock.sendall(header)
            self.sock.sendall(body)

    def recv(self) -> object:
        """The next message; ``EOFError`` when the peer closed the socket."""
        (length,) = HEADER.unpack(self._read_exactly(HEADER.size))
        if length > MAX_FRAME:
            raise ValueError(f"frame of {length} bytes is over the limit")
        return self._decoder.decode(self._read_exactly(length))

    def _read_exactly(self, n: int) -> memoryview:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise EOFError("peer closed the socket")
            got += k
        return view
