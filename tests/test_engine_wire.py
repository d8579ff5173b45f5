"""The worker's socket protocol: frames across reads, large frames, a closed peer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from quanta_core.engine.llama_cpp.wire import (
    HEADER,
    HEADS_UP,
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
    yield a, b
    a.close()
    b.close()


def test_frames_split_across_reads_or_sent_back_to_back(pair: Pair) -> None:
    caller, worker = pair
    body = Channel(worker, MemoryCall)._encoder.encode(ErrorReply("input", "x" * 300))
    frame = HEADER.pack(len(body)) + body
    worker.sendall(frame[:2])
    threading.Timer(0.02, lambda: worker.sendall(frame[2:] + frame)).start()
    channel = Channel(caller, Reply, timeout_s=5.0)
    assert channel.recv() == ErrorReply("input", "x" * 300)
    assert channel.recv() == ErrorReply("input", "x" * 300)


def test_a_large_frame_arrives_whole(pair: Pair) -> None:
    caller, worker = pair
    message = ErrorReply("internal", "y" * (3 * SMALL_FRAME))
    sender = threading.Thread(target=Channel(worker, MemoryCall).send, args=(message,))
    sender.start()
    assert Channel(caller, Reply).recv() == message
    sender.join()


@pytest.mark.parametrize("spin_s", [0.0, 0.001])
def test_a_heads_up_is_skipped_whether_the_message_is_late_or_already_there(
    pair: Pair, spin_s: float
) -> None:
    caller, worker = pair
    sender = Channel(worker, MemoryCall)
    channel = Channel(caller, Reply, timeout_s=5.0)
    sender.send_heads_up()
    threading.Timer(0.02, sender.send, args=(ErrorReply("input", "late"),)).start()
    assert channel.recv(spin_s) == ErrorReply("input", "late")
    sender.send_heads_up()
    sender.send(ErrorReply("input", "there"))
    sender.send(ErrorReply("input", "next"))
    assert channel.recv(spin_s) == ErrorReply("input", "there")
    assert channel.recv(spin_s) == ErrorReply("input", "next")


def test_a_closed_peer_is_end_of_file(pair: Pair) -> None:
    caller, worker = pair
    worker.sendall(HEADER.pack(10) + b"abc")  # a frame cut short
    worker.close()
    with pytest.raises(EOFError):
        Channel(caller, Reply).recv()


def test_a_silent_peer_times_out(pair: Pair) -> None:
    caller, worker = pair
    worker.sendall(HEADS_UP)
    with pytest.raises(TimeoutError):
        Channel(caller, Reply, timeout_s=0.05).recv(spin_s=0.001)


@pytest.mark.parametrize("delay_s", [0.0, 0.005, 0.05])
def test_an_idle_spin_gets_a_call_sent_before_during_or_after_it(
    pair: Pair, delay_s: float
) -> None:
    worker, caller = pair
    channel = Channel(worker, MemoryCall, timeout_s=5.0)
    sender = Channel(caller, Reply)
    threading.Timer(delay_s, sender.send, args=(MemoryCall(),)).start()
    assert channel.recv(idle_spin_s=0.02) == MemoryCall()


def test_an_idle_spin_still_sees_a_closed_peer_and_a_silent_one(pair: Pair) -> None:
    worker, caller = pair
    with pytest.raises(TimeoutError):
        Channel(worker, MemoryCall, timeout_s=0.05).recv(idle_spin_s=0.01)
    caller.close()
    with pytest.raises(EOFError):
        Channel(worker, MemoryCall, timeout_s=5.0).recv(idle_spin_s=0.01)


def test_recv_nowait_returns_a_message_only_once_it_is_whole(pair: Pair) -> None:
    caller, worker = pair
    channel = Channel(caller, Reply, timeout_s=5.0)
    assert channel.recv_nowait() is None  # nothing yet
    body = Channel(worker, MemoryCall)._encoder.encode(ErrorReply("input", "whole"))
    frame = HEADER.pack(len(body)) + body
    worker.sendall(HEADS_UP + frame[:3])
    assert channel.recv_nowait() is None  # the heads-up, and a header cut short
    worker.sendall(frame[3:10])
    assert channel.recv_nowait() is None  # a body cut short
    worker.sendall(frame[10:] + HEADS_UP)
    assert channel.recv_nowait() == ErrorReply("input", "whole")
    threading.Timer(0.005, worker.sendall, args=(frame,)).start()
    assert channel.recv_nowait(spin_s=1.0) == ErrorReply("input", "whole")  # behind a heads-up
    worker.close()
    with pytest.raises(EOFError):
        channel.recv_nowait()
