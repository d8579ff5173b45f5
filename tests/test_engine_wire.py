"""The worker's socket protocol: frames across reads, large frames, a closed peer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from quanta_core.engine.llama_cpp.wire import (
    HEADER,
    SMALL_FRAME,
    Channel,
    ErrorReply,
    MemoryCall,
    Reply,
)

Pair = tuple[socket.socket, socket.socket]


@pytest.fixture
def pair() -> Iterator[Pair]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.settimeout(5.0)  # the caller's end runs in timeout mode, as the executor's does
    yield a, b
    a.close()
    b.close()


def test_frames_split_across_reads_or_sent_back_to_back(pair: Pair) -> None:
    caller, worker = pair
    body = Channel(worker, MemoryCall)._encoder.encode(ErrorReply("input", "x" * 300))
    frame = HEADER.pack(len(body)) + body
    worker.sendall(frame[:2])
    threading.Timer(0.02, lambda: worker.sendall(frame[2:] + frame)).start()
    channel = Channel(caller, Reply)
    assert channel.recv() == ErrorReply("input", "x" * 300)
    assert channel.recv() == ErrorReply("input", "x" * 300)


def test_a_large_frame_arrives_whole(pair: Pair) -> None:
    caller, worker = pair
    message = ErrorReply("internal", "y" * (3 * SMALL_FRAME))
    sender = threading.Thread(target=Channel(worker, MemoryCall).send, args=(message,))
    sender.start()
    assert Channel(caller, Reply).recv() == message
    sender.join()


def test_a_closed_peer_is_end_of_file(pair: Pair) -> None:
    caller, worker = pair
    worker.sendall(HEADER.pack(10) + b"abc")  # a frame cut short
    worker.close()
    with pytest.raises(EOFError):
        Channel(caller, Reply).recv()
