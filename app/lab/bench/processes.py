"""An open-loop plan sent from several processes, on one clock.

One client process spends about 1.25 ms of CPU per request it opens (httpx: the request,
its connection, the pool's bookkeeping), so a burst of 200 at once leaves its last request
~0.25 s after its first, and every latency of the burst carries the client's own queue
(bench/results/gpu/README.md). Split across N processes, each sends its share (every N-th
request of the plan) from its own event loop and HTTP client; all start on the same moment of
the machine's monotonic clock (``time.perf_counter``, shared by every process on Linux), so
the records read as one run's.

Closed loops (each user waits for its answer) and a cap on requests in flight are one shared
state: they run in one process (``processes_for``).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from app.lab.bench.client import Target, perf_clock
from app.lab.bench.runner import OnDone, RunOptions, run_plan
from quanta_core.metrics import RequestRecord
from quanta_core.workload import PlannedRequest, WorkloadSpec

# Between the go and the run's first arrival: every child has its origin by then.
START_LEAD_S = 0.2
# Auto: one process per this many cores (the server's own processes need the others), at most
# MAX_PROCESSES, and no more than one per REQUESTS_PER_PROCESS requests of the plan.
CORES_PER_PROCESS = 4
MAX_PROCESSES = 8
REQUESTS_PER_PROCESS = 32


def processes_for(spec: WorkloadSpec, n_requests: int, asked: int | None) -> int:
    """How many processes send ``spec``'s plan: ``asked`` (None: chosen from the machine's
    cores and the plan's size); 1 for a closed loop or a cap on requests in flight."""
    if spec.closed_loop or spec.concurrency:
        if asked is not None and asked > 1:
            raise ValueError(
                "--processes above 1 needs an open loop without a concurrency cap: "
                "the users and the cap are shared state"
            )
        return 1
    if asked is not None:
        if asked < 1:
            raise ValueError(f"--processes must be at least 1, not {asked}")
        return min(asked, max(n_requests, 1))
    cores = os.cpu_count() or 1
    by_size = math.ceil(n_requests / REQUESTS_PER_PROCESS)
    return max(1, min(MAX_PROCESSES, cores // CORES_PER_PROCESS, by_size))


class Senders:
    """The processes that send a plan, started (forked) on entry and waiting for ``run``:

        with Senders(spec, plan, target, options, processes) as senders, Progress(...):
            records = senders.run(on_done)

    Entered before any thread starts here (a progress bar's): fork copies only the forking
    thread, and a lock another thread held would stay held in the child."""

    def __init__(
        self,
        spec: WorkloadSpec,
        plan: Sequence[PlannedRequest],
        target: Target,
        options: RunOptions,
        processes: int,
    ) -> None:
        self.spec, self.plan, self.target, self.options = spec, plan, target, options
        self.processes = processes
        self._pipes: list[Connection] = []
        self._children: list[multiprocessing.process.BaseProcess] = []

    def __enter__(self) -> Senders:
        if self.processes <= 1:
            return self
        # fork: the children inherit the loaded modules and start in milliseconds.
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        ctx: Any = multiprocessing.get_context(method)  # its Process, by the method
        n = self.processes
        try:
            for k in range(n):
                ours, theirs = ctx.Pipe()
                share = list(self.plan[k::n])
                child = ctx.Process(
                    target=_child,
                    args=(self.spec, share, self.target, self.options, theirs),
                    name=f"quanta-bench-{k}",
                    daemon=True,
                )
                child.start()
                theirs.close()
                self._pipes.append(ours)
                self._children.append(child)
            for pipe in self._pipes:
                _expect(pipe, "ready")
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def run(self, on_done: OnDone | None = None) -> list[RequestRecord]:
        """Send the plan; every attempt goes to ``on_done`` (in this process, as it
        arrives); the records in plan order."""
        if not self._pipes:
            return asyncio.run(run_plan(self.spec, self.plan, self.target, self.options, on_done))
        origin = time.perf_counter() + START_LEAD_S
        for pipe in self._pipes:
            pipe.send(origin)
        records = _collect(self._pipes, on_done)
        return sorted(records, key=lambda r: int(r.request_id[1:]))

    def _stop(self) -> None:
        for child in self._children:
            child.join(timeout=5.0)
            if child.is_alive():
                child.kill()
        for pipe in self._pipes:
            pipe.close()
        self._children, self._pipes = [], []


def _collect(pipes: list[Connection], on_done: OnDone | None) -> list[RequestRecord]:
    """Every child's attempts as they come, then its records."""
    records: list[RequestRecord] = []
    open_pipes = list(pipes)
    while open_pipes:
        for pipe in multiprocessing.connection.wait(open_pipes):
            assert isinstance(pipe, Connection)
            kind, payload = _receive(pipe)
            if kind == "attempt":
                if on_done is not None:
                    on_done(payload)
            elif kind == "records":
                records += payload
                open_pipes.remove(pipe)
            else:
                raise RuntimeError(f"a bench process failed:\n{payload}")
    return records


def _receive(pipe: Connection) -> tuple[str, Any]:
    try:
        message: tuple[str, Any] = pipe.recv()
    except EOFError:
        return "failed", "it exited without a word (killed?)"
    return message


def _expect(pipe: Connection, what: str) -> None:
    kind, payload = _receive(pipe)
    if kind != what:
        raise RuntimeError(f"a bench process failed:\n{payload}")


def _child(
    spec: WorkloadSpec,
    share: list[PlannedRequest],
    target: Target,
    options: RunOptions,
    pipe: Connection,
) -> None:
    try:
        pipe.send(("ready", None))
        origin = pipe.recv()
        records = asyncio.run(
            run_plan(
                spec,
                share,
                target,
                options,
                on_done=lambda record: pipe.send(("attempt", record)),
                clock=perf_clock(origin),
            )
        )
        pipe.send(("records", records))
    except BaseException:  # told to the parent, whatever it was
        pipe.send(("failed", traceback.format_exc()))
    finally:
        pipe.close()
