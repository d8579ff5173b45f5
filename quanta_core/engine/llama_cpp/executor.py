"""``LlamaCppExecutor``: the caller's side of the engine worker.

    server process                              worker process
    ──────────────                              ──────────────
    LlamaCppExecutor.step(plan)   (or start_step, where the event loop waits and reads)
      KvMirror.check(plan)   (bad plan: refused here, nothing sent)
      attach stashed bytes for Restore ops
      send StepCall  ───── Unix socket ───────▶  kv ops, llama_decode, sample
      (wake, spin)   ◀──── heads-up ───────────  sample the last sequence
      recv StepReply ◀─────────────────────────  tokens, timings, stashed bytes
      keep stashed bytes (they outlive the worker), advance the mirror

A worker that exits or stops answering within ``step_timeout_s`` becomes ``EngineDied`` (or
``EngineHung``) carrying the sequences it held; ``restart()`` starts a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import msgspec

from quanta_core.engine.config import EngineConfig
from quanta_core.engine.errors import (
    EngineDied,
    EngineError,
    EngineHung,
    EngineInputError,
    EngineStartError,
)
from quanta_core.engine.kv_mirror import KvMirror
from quanta_core.engine.llama_cpp.wire import (
    Channel,
    ErrorReply,
    MemoryCall,
    MemoryReply,
    Reply,
    ShutdownCall,
    StartCall,
    StartReply,
    StepCall,
    StepReply,
)
from quanta_core.engine.types import (
    DropStash,
    EngineInfo,
    MemoryStats,
    Restore,
    Stash,
    StashInfo,
    StepPlan,
    StepResult,
)

WORKER_MODULE = "quanta_core.engine.llama_cpp.worker"


def worker_environment(config: EngineConfig) -> dict[str, str]:
    """The worker's environment: ours, plus the OpenMP spin limit unless one is set."""
    env = dict(os.environ)
    omp_set = "GOMP_SPINCOUNT" in env or "OMP_WAIT_POLICY" in env
    if config.omp_spincount is not None and not omp_set:
        env["GOMP_SPINCOUNT"] = str(config.omp_spincount)
    return env


class _Worker:
    """One worker process and its connected socket."""

    def __init__(self, process: subprocess.Popen[bytes], channel: Channel, tmpdir: Path) -> None:
        self.process = process
        self.channel = channel
        self.tmpdir = tmpdir

    @classmethod
    def spawn(cls, config: EngineConfig) -> tuple[_Worker, EngineInfo]:
        tmpdir = Path(tempfile.mkdtemp(prefix="quanta-engine-"))
        path = tmpdir / "engine.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(1)
        listener.settimeout(config.start_timeout_s)
        process = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE, str(path)], env=worker_environment(config)
        )
        try:
            sock, _ = listener.accept()
        except TimeoutError as exc:
            process.kill()
            raise EngineStartError("the engine worker did not connect in time") from exc
        finally:
            listener.close()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        worker = cls(process, Channel(sock, Reply, config.start_timeout_s), tmpdir)
        try:
            worker.channel.send(StartCall(config))
            reply = worker.channel.recv()
        except (OSError, EOFError) as exc:
            worker.kill()
            raise EngineStartError(f"the engine worker died while starting: {exc}") from exc
        if isinstance(reply, ErrorReply):
            worker.kill()
            raise EngineStartError(reply.message)
        assert isinstance(reply, StartReply)
        worker.channel.timeout_s = config.step_timeout_s
        return worker, reply.info

    def kill(self) -> int | None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        code = self.process.wait()
        self.channel.sock.close()
        for p in self.tmpdir.iterdir():
            p.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.tmpdir.rmdir()
        return code

    def shutdown(self, timeout_s: float = 5.0) -> None:
        with contextlib.suppress(OSError):
            self.channel.send(ShutdownCall())
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout_s)
        self.kill()


@dataclass(slots=True)
class _Reading:
    """A step sent from the loop, whose reply the loop reads."""

    channel: Channel
    finish: Callable[[object], StepResult]
    done: asyncio.Future[StepResult]
    timer: asyncio.TimerHandle | None = None


class LlamaCppExecutor:
    """Implements ``Executor`` over a llama.cpp worker process."""

    def __init__(self, config: EngineConfig, worker: _Worker, info: EngineInfo) -> None:
        self.config = config
        self._worker: _Worker | None = worker
        self._info = info
        self._mirror = KvMirror.for_engine(info)
        self._stashes: dict[str, bytes] = {}
        self._lost_seqs: frozenset[int] = frozenset()
        self.restarts = 0
        self._stash_thread = ThreadPoolExecutor(1, thread_name_prefix="quanta-engine-stash")
        self._in_flight: asyncio.Future[StepResult] | None = None
        self._reading: _Reading | None = None  # the step whose reply the loop waits for
        self._watched: Channel | None = None  # the socket the loop watches, and that loop
        self._watched_on: tuple[asyncio.AbstractEventLoop, int] | None = None

    @classmethod
    def start(cls, config: EngineConfig) -> LlamaCppExecutor:
        """Spawn a worker and wait until its model is loaded."""
        if not Path(config.model_path).is_file():
            raise EngineStartError(f"model file not found: {config.model_path}")
        worker, info = _Worker.spawn(config)
        return cls(config, worker, info)

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def pid(self) -> int | None:
        return self._worker.process.pid if self._worker else None

    def step(self, plan: StepPlan) -> StepResult:
        t0 = time.perf_counter()
        channel, after = self._send_step(plan)
        return self._finish_step(channel, plan, after, t0)

    def start_step(self, plan: StepPlan) -> asyncio.Future[StepResult]:
        """Send ``plan`` now, from the running loop's thread, so the worker starts at once;
        the future of its result, which the loop itself reads: it watches the socket, the
        worker's heads-up wakes it, and it polls for the reply behind the heads-up (up to
        ``reply_spin_s``) without blocking. No thread hands the reply over: such a thread
        would have to win the interpreter lock from a loop busy with the streams, which costs
        most at many streams (bench/results/ab/). The caller awaits that future itself, with
        no task between: each task or shield between the reply and the caller would cost the
        next step a turn of the loop. Plans that move stash bytes (large frames) are sent and
        read by a thread of this executor. The next step waits for this future: a caller must
        not cancel it (awaiting it from a task that may be cancelled cancels it too, and the
        next step would then be sent while the worker still runs this one); ``step_async``
        is the form a cancelled caller may leave."""
        previous = self._in_flight
        if previous is not None and not previous.done():
            self._in_flight = asyncio.ensure_future(self._after(previous, plan))
        else:
            self._in_flight = self._send_now(plan)
        return self._in_flight

    async def step_async(self, plan: StepPlan) -> StepResult:
        """``start_step``, awaited behind a shield: a cancelled caller does not cancel the
        step; it completes (its reply read, the mirror moved on), and the next waits for it."""
        return await asyncio.shield(self.start_step(plan))

    async def _after(self, previous: asyncio.Future[StepResult], plan: StepPlan) -> StepResult:
        await asyncio.wait([previous])
        return await self._send_now(plan)

    def _send_now(self, plan: StepPlan) -> asyncio.Future[StepResult]:
        """The step sent; a plan refused or a send failed is the future's exception, as a
        reply's failure is."""
        if any(isinstance(op, Stash | Restore) for op in plan.kv_ops):
            return asyncio.wrap_future(self._stash_thread.submit(self.step, plan))
        t0 = time.perf_counter()
        try:
            channel, after = self._send_step(plan)
        except EngineError as exc:
            failed: asyncio.Future[StepResult] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
        return self._read_on_loop(channel, lambda reply: self._step_result(plan, after, reply, t0))

    def _read_on_loop(
        self, channel: Channel, finish: Callable[[object], StepResult]
    ) -> asyncio.Future[StepResult]:
        """The step's result, once the running loop has read the reply and ``finish`` made it
        a result; a worker that has not answered within ``step_timeout_s`` is hung.

        The loop keeps watching the socket from one step to the next: the next step is
        usually sent before the loop turns again, and two ``epoll_ctl`` calls a step (one of
        them between the reply and the next plan) cost more than the check that a loop left
        with no step in flight stops watching (``_unwatch_if_idle``)."""
        loop = asyncio.get_running_loop()
        reading = _Reading(channel, finish, loop.create_future())
        reading.timer = loop.call_later(
            self.config.step_timeout_s, lambda: self._settle(reading, self._hung())
        )
        self._reading = reading
        if self._watched is not channel:
            self._unwatch()
            fd = channel.sock.fileno()
            loop.add_reader(fd, self._readable)
            self._watched, self._watched_on = channel, (loop, fd)
        return reading.done

    def _readable(self) -> None:
        reading = self._reading
        if reading is None:  # no step awaits the socket (an EOF, say): the next one reads it
            self._unwatch()
            return
        try:
            with self._worker_errors():
                reply = reading.channel.recv_nowait(self.config.reply_spin_s)
            if reply is not None:
                self._settle(reading, reading.finish(reply))
        except Exception as exc:
            self._settle(reading, exc)

    def _settle(self, reading: _Reading, outcome: StepResult | Exception) -> None:
        if self._reading is not reading:
            return  # settled already
        self._reading = None
        if reading.timer is not None:
            reading.timer.cancel()
        if isinstance(outcome, Exception):
            self._unwatch()  # the worker is likely gone, and its socket with it
        else:
            # After the waiter's wake-up, which usually sends the next step first.
            asyncio.get_running_loop().call_soon(self._unwatch_if_idle)
        if reading.done.done():
            return  # its caller was cancelled
        if isinstance(outcome, Exception):
            reading.done.set_exception(outcome)
        else:
            reading.done.set_result(outcome)

    def _unwatch_if_idle(self) -> None:
        if self._reading is None:
            self._unwatch()

    def _unwatch(self) -> None:
        if self._watched_on is not None:
            loop, fd = self._watched_on  # the number it had: a closed socket's is -1
            loop.remove_reader(fd)
        self._watched, self._watched_on = None, None

    def _finish_step(
        self, channel: Channel, plan: StepPlan, after: KvMirror, t0: float
    ) -> StepResult:
        with self._worker_errors():
            reply = channel.recv(self.config.reply_spin_s)
        return self._step_result(plan, after, reply, t0)

    def _send_step(self, plan: StepPlan) -> tuple[Channel, KvMirror]:
        """Check ``plan`` (refused: nothing sent) and send it; the mirror once it has run."""
        after = self._mirror.after(plan)
        blobs = {op.key: self._stashes[op.key] for op in plan.kv_ops if isinstance(op, Restore)}
        channel = self._channel()
        with self._worker_errors():
            channel.send(StepCall(plan, blobs))
        return channel, after

    def _step_result(self, plan: StepPlan, after: KvMirror, reply: object, t0: float) -> StepResult:
        if isinstance(reply, ErrorReply):
            raise EngineInputError(reply.message)
        assert isinstance(reply, StepReply)
        stashed = self._keep_stashes(plan, reply.blobs) if plan.kv_ops else ()
        if reply.decode_error is not None:
            self._mirror.apply(StepPlan(kv_ops=plan.kv_ops))
            raise EngineInputError(reply.decode_error)
        self._mirror.adopt(after)
        result = reply.result
        timings = msgspec.structs.replace(result.timings, total_s=time.perf_counter() - t0)
        return msgspec.structs.replace(result, stashed=stashed, timings=timings)

    def _keep_stashes(self, plan: StepPlan, blobs: dict[str, bytes]) -> tuple[StashInfo, ...]:
        for op in plan.kv_ops:
            if isinstance(op, Restore | DropStash):
                self._stashes.pop(op.key, None)
        self._stashes.update(blobs)
        return tuple(StashInfo(key, len(data)) for key, data in blobs.items())

    def memory_stats(self) -> MemoryStats:
        reply = self._call(MemoryCall())
        assert isinstance(reply, MemoryReply)
        return MemoryStats(
            sequences=reply.sequences,
            stash_bytes=sum(len(b) for b in self._stashes.values()),
            n_stashes=len(self._stashes),
        )

    def _call(self, call: object) -> object:
        channel = self._channel()
        with self._worker_errors():
            channel.send(call)
            return channel.recv()

    def _channel(self) -> Channel:
        if self._worker is None:
            raise EngineDied("the engine worker is not running", self._mirror.held_seqs(), None)
        return self._worker.channel

    @contextlib.contextmanager
    def _worker_errors(self) -> Iterator[None]:
        """A worker that stops answering or goes away: killed, and ``EngineHung`` or
        ``EngineDied`` with the sequences it held."""
        try:
            yield
        except TimeoutError:
            raise self._hung() from None
        except (OSError, EOFError):
            code = self._lose_worker()
            raise EngineDied(
                f"the engine worker died (exit code {code})", self._lost_seqs, code
            ) from None

    def _hung(self) -> EngineHung:
        """The worker stopped answering: killed, and the error that says so."""
        code = self._lose_worker()
        return EngineHung(
            f"the engine worker did not answer within {self.config.step_timeout_s} s "
            "and was killed",
            self._lost_seqs,
            code,
        )

    def _lose_worker(self) -> int | None:
        assert self._worker is not None
        self._lost_seqs = self._mirror.held_seqs()
        code = self._worker.kill()
        self._worker = None
        self._mirror.forget_engine()
        return code

    def restart(self) -> None:
        """A fresh, empty worker (the old one is killed if still there). Stashes are kept."""
        if self._worker is not None:
            self._worker.kill()
            self._worker = None
        self._mirror.forget_engine()
        self._worker, self._info = _Worker.spawn(self.config)
        self.restarts += 1

    def close(self) -> None:
        self._stash_thread.shutdown(wait=False)
        if self._worker is not None:
            self._worker.shutdown()
            self._worker = None
        self._mirror.forget_engine()

    def __enter__(self) -> LlamaCppExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
