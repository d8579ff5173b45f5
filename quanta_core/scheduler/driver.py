"""The async driver: runs the scheduler's cycle against an executor, off the event loop.

    driver = Driver(scheduler, executor, clock)
    await driver.start()
    handle = driver.submit(GenerationRequest(...))    # -> RequestHandle, or raises Refused
    async for event in handle: ...                     # TokenEvent | ChoiceFinished
    results = await handle.results()
    driver.cancel(request_id)                          # freed at the next cycle boundary
    driver.stats()                                     # SchedulerStats, read-only
    driver.snapshot()                                  # SchedulerSnapshot, for the live view
    await driver.stop(grace_s=5.0)

``Driver(scheduler: Scheduler, executor: Executor, clock: Clock)``. The scheduler runs in
the event loop's thread (a cycle's bookkeeping is small); ``executor.step`` and
``executor.restart`` (blocking, 10-350 ms) run in the driver's own engine thread, so the loop
stays free for HTTP while the engine works, and scheduler state is touched by one thread only.
An executor that can be stepped from the loop (``SteppedFromLoop``: the llama.cpp worker's
call is sent from the loop's thread and its reply read by the loop itself, woken by the
worker's heads-up) is stepped with ``start_step`` instead, with no hand-off between threads,
which would cost every cycle a thread switch (bench/results/ab/). Either way a step is sent
when ``_step`` returns, and the driver awaits the step's own future: a task around it would
cost every cycle more turns of the loop between the engine's reply and the next plan.
Each call of ``submit`` / ``cancel`` / ``stop`` wakes an idle loop.

Failures: ``EngineDied`` restarts the executor and hands the scheduler the dead plan
(stashed requests are restored, the others recomputed, with no token lost or repeated);
``EngineInputError`` fails the plan's requests and carries on. A bug that escapes the
scheduler fails every open request (ERROR) and the driver refuses new ones from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from quanta_core.clock import Clock
from quanta_core.engine.errors import EngineDied, EngineError, EngineInputError
from quanta_core.engine.protocol import Executor, SteppedFromLoop
from quanta_core.engine.types import StepPlan, StepResult
from quanta_core.requests import ChoiceFinished, FinishReason, GenerationRequest
from quanta_core.scheduler.admission import AdmissionDecision, Refused
from quanta_core.scheduler.handle import Event, RequestHandle
from quanta_core.scheduler.scheduler import Scheduler, SchedulerStats
from quanta_core.scheduler.snapshot import STEPS_KEPT, SchedulerSnapshot, Step

log = logging.getLogger(__name__)
T = TypeVar("T")

# A consumer that has not taken its events after this many event-loop turns is not waited for.
HAND_OVER_MAX_YIELDS = 8


class Driver:
    """``overlap``: send the next step to the engine before the streams take this step's
    tokens, so their HTTP writes run while the engine computes instead of between steps. For
    an engine that leaves the CPU free while it steps (a GPU): on a CPU engine that uses every
    core, the writes would stall its thread barriers instead (``_hand_over``)."""

    def __init__(
        self, scheduler: Scheduler, executor: Executor, clock: Clock, *, overlap: bool = False
    ) -> None:
        self.scheduler = scheduler
        self.overlap = overlap
        self.executor = executor
        self.clock = clock
        self._handles: dict[str, RequestHandle] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix="quanta-engine")
        # Asked once: a runtime protocol check costs microseconds on every call.
        self._from_loop = executor if isinstance(executor, SteppedFromLoop) else None
        self._closing = False
        self._failure: str | None = None
        # The live view's only cost per step: one bounded append, summed only when asked.
        self._steps: deque[Step] = deque(maxlen=STEPS_KEPT)

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the driver is already started")
        self._task = asyncio.create_task(self._run(), name="quanta-driver")

    def _step(self, plan: StepPlan) -> asyncio.Future[StepResult]:
        """Send ``plan`` to the engine now; its result's future."""
        if self._from_loop is not None:
            return self._from_loop.start_step(plan)
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._engine_thread, self.executor.step, plan)

    async def _in_engine_thread(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._engine_thread, call)

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue ``request`` (or start it at the next cycle) and return its handle; raise
        ``Refused`` when admission refuses it at once."""
        if self._failure is not None:
            raise Refused(f"the scheduler failed: {self._failure}")
        verdict = self.scheduler.submit(request)
        events = self.scheduler.drain_events()
        if verdict.decision is AdmissionDecision.REJECT:
            # Its choices' REJECTED results are what the exception says; nothing else moved.
            raise Refused.of(verdict)
        self._handles[request.request_id] = RequestHandle(request, self.clock.now())
        self._dispatch(events)  # queued requests shed to make room for this one
        self._wake.set()
        return self._handles[request.request_id]

    def cancel(self, request_id: str) -> bool:
        """Cancel a live request; its KV is freed at the next cycle boundary."""
        cancelled = self.scheduler.cancel(request_id)
        self._wake.set()
        return cancelled

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    def snapshot(self) -> SchedulerSnapshot:
        return self.scheduler.snapshot(self._steps)

    async def stop(self, grace_s: float) -> None:
        """Admit nothing new; give in-flight requests ``grace_s`` to finish, then fail them."""
        self.scheduler.stop_admitting()
        self._dispatch(self.scheduler.drain_events())
        self._wake.set()
        if self._task is None:
            return
        if not self._task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace_s)
        self._closing = True
        self._wake.set()
        await self._task
        self._engine_thread.shutdown(wait=False)

    # ---- the loop ----

    async def _run(self) -> None:
        sched = self.scheduler
        while not self._closing:
            self._wake.clear()
            if not sched.has_work:
                self._idle.set()
                await self._wake.wait()
                continue
            self._idle.clear()
            try:
                await self._cycle()
            except Exception as exc:
                log.exception("the scheduler cycle failed")
                self._fail_everything(f"{type(exc).__name__}: {exc}")
            if self._failure is not None:
                break  # the state is not to be trusted any more: serve nobody
        with contextlib.suppress(Exception):
            self._dispatch(sched.abort_all("the server stopped before it finished"))
            await self._flush()
        self._idle.set()

    async def _cycle(self) -> None:
        sched = self.scheduler
        plan = sched.schedule()
        self._dispatch(sched.drain_events())
        if plan.is_empty:
            # Live requests, none runnable: only a submit, cancel or stop can change that.
            await self._wake.wait()
            return
        step: Awaitable[StepResult] = self._step(plan)
        while True:
            result = await self._finish_step(plan, step)
            if result is None:
                return
            self._steps.append((self.clock.now(), plan, result))
            events = sched.update(plan, result)
            if not self.overlap or self._closing:
                await self._hand_over(self._dispatch(events))
                return
            # The next step goes out first, then the streams take this step's events while
            # the engine computes it.
            plan = sched.schedule()
            events += sched.drain_events()
            if plan.is_empty:
                await self._hand_over(self._dispatch(events))
                return
            step = self._step(plan)
            await self._hand_over(self._dispatch(events))

    async def _finish_step(self, plan: StepPlan, step: Awaitable[StepResult]) -> StepResult | None:
        """The step's result, or None when it failed (the failure already handled)."""
        sched = self.scheduler
        try:
            return await step
        except EngineDied as exc:
            log.warning("the engine died (%s); restarting it", exc)
            events = sched.on_engine_died(plan)
            self._dispatch(events)
            try:
                await self._in_engine_thread(self.executor.restart)
            except EngineError as restart_exc:
                self._fail_everything(f"the engine died and did not restart: {restart_exc}")
            return None
        except EngineInputError as exc:
            log.error("the engine refused a plan (a scheduler bug): %s", exc)
            self._dispatch(sched.on_plan_rejected(plan, str(exc)))
            return None

    async def _hand_over(self, handles: list[RequestHandle]) -> None:
        """Let the consumers (HTTP streams) take this step's events before the next step.

        Their work then runs between engine steps instead of during one: on a machine with
        as many cores as llama.cpp threads, anything that overlaps a step stalls the
        engine's thread barriers (bench/results/http_overhead.json).
        """
        for _ in range(HAND_OVER_MAX_YIELDS):
            if not any(h.pending for h in handles):
                break
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # and one more turn to write what they took

    async def _flush(self) -> None:
        """Run the frees and releases left after the last requests, so the engine is clean."""
        plan = self.scheduler.schedule()
        if not plan.is_empty:
            await self._step(plan)

    def _dispatch(self, events: list[Event]) -> list[RequestHandle]:
        """Push ``events`` to their handles; the handles that got any."""
        touched: dict[str, RequestHandle] = {}
        for event in events:
            request_id = (
                event.result.request_id if isinstance(event, ChoiceFinished) else (event.request_id)
            )
            handle = self._handles.get(request_id)
            if handle is None:
                continue
            handle.push(event)
            touched[request_id] = handle
            if handle.done:
                del self._handles[request_id]
        return list(touched.values())

    def _fail_everything(self, error: str) -> None:
        self._failure = error
        now = self.clock.now()
        for handle in self._handles.values():
            handle.fail(FinishReason.ERROR, error, now)
        self._handles.clear()
