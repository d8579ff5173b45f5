"""The worker's socket protocol: frames, notices, large frames, a closed peer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from quanta_core.engine.llama_cpp.wire import (
    HEADER,
    NOTICE,
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


def test_a_notice_is_consumed_and_the_reply_after_it_returned(pair: Pair) -> None:
    caller, worker = pair
    Channel(worker, MemoryCall).send_notice()
    Channel(worker, MemoryCall).send(ErrorReply("input", "no"))
    assert Channel(caller, Reply, spin_s=0.01).recv() == ErrorReply("input", "no")


def test_a_reply_later_than_the_spin_is_still_received(pair: Pair) -> None:
    caller, worker = pair
    sender = Channel(worker, MemoryCall)
    sender.send_notice()
    late = threading.Timer(0.05, lambda: sender.send(ErrorReply("internal", "late")))
    late.start()
    assert Channel(caller, Reply, spin_s=0.001).recv() == ErrorReply("internal", "late")
    late.join()


def test_frames_split_across_reads_and_joined_in_one_read(pair: Pair) -> None:
    caller, worker = pair
    body = Channel(worker, MemoryCall)._encoder.encode(ErrorReply("input", "x" * 300))
    frame = HEADER.pack(len(body)) + body
    worker.sendall(frame[:2])
    threading.Timer(0.02, lambda: worker.sendall(frame[2:] + NOTICE + frame)).start()
    channel = Channel(caller, Reply, spin_s=0.01)
    assert channel.recv() == ErrorReply("input", "x" * 300)
    assert channel.recv() == ErrorReply("input", "x" * 300)


def test_a_large_frame_arrives_whole(pair: Pair) -> None:
    caller, worker = pair
    message = ErrorReply("internal", "y" * (3 * SMALL_FRAME))
    sender = threading.Thread(target=Channel(worker, MemoryCall).send, args=(message,))
    sender.start()
    assert Channel(caller, Reply).recv() == message
    sender.join()


def test_a_closed_peer_is_end_of_file_even_after_a_notice(pair: Pair) -> None:
    caller, worker = pair
    Channel(worker, MemoryCall).send_notice()
    worker.close()
    with pytest.raises(EOFError):
        Channel(caller, Reply, spin_s=0.01).recv()
