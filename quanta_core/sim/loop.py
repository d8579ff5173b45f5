"""The discrete-event loop: the server's driver, on a virtual clock.

    Arrival(t)     clock := t; scheduler.submit; an idle engine gets a StepStart at t
                   (with an intake cost, ``ServerCost.per_request_s``, a request sent at t is
                   submitted once the server's intake, one request at a time, has taken it)
    StepStart(t)   clock := t; plan = schedule(); result = executor.step(plan)
                   → StepDone at t + result.timings.total_s (the cost model's seconds)
                     + the server's own time for the cycle (``ServerCost``, 0 by default)
    StepDone(t)    clock := t; update(plan, result) → events handed out; StepStart at t
    Wake(t)        clock := t; the client's own action (next request of a user, a free slot)

Steps that only decode are taken in bulk where the scheduler's next plans are certain
(``steady.next_run``): as many as end before the next event, with the same times, tokens and
state as one by one (``bulk=False``: always one by one; ``steady`` says when a run is
certain, ``decode_run`` why taking it in at once is the same).

As in ``Driver``: one step in flight at a time; a request that arrives during a step is
submitted at its own time (admission sees the right clock and queue) and first planned at the
next cycle; an empty plan leaves the engine idle until the next arrival. The executor never
touches the clock: the loop jumps it from event to event. A step that ends before anything
else is due is taken in at once, not queued: the queue would hand it straight back.
"""

from __future__ import annotations

from collections.abc import Callable

from quanta_core.clock import VirtualClock
from quanta_core.engine.errors import EngineInputError
from quanta_core.engine.protocol import Executor
from quanta_core.engine.types import KvOp, StepPlan, StepResult
from quanta_core.requests import ChoiceFinished, ChoiceResult, GenerationRequest
from quanta_core.scheduler.handle import Event as SchedulerEvent
from quanta_core.scheduler.scheduler import Scheduler
from quanta_core.sim.decode_run import RunGrowth, take_run
from quanta_core.sim.events import Arrival, EventQueue, StepDone, StepStart, Wake
from quanta_core.sim.executor import SimExecutor
from quanta_core.sim.server_cost import ServerCost
from quanta_core.sim.steady import next_run

OnFinished = Callable[[ChoiceResult], None]
_Step = tuple[float, StepPlan, StepResult]  # a step in flight: when it ends, what it ran
# The most steps one bulk run may take: its steps' times are computed before it is cut at
# the next event, so a bound keeps a run near an arrival from pricing steps it will not take.
MAX_RUN_STEPS = 256


class SimLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        clock: VirtualClock,
        on_finished: OnFinished,
        server: ServerCost | None = None,
        bulk: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.server = server or ServerCost()
        self.executor = executor
        self.clock = clock
        self.on_finished = on_finished
        self.queue = EventQueue()
        self.steps = 0  # engine passes that ran (plans with work)
        self.bulk_steps = 0  # of those, taken in steady decode runs
        self.bulk_evictions = 0  # of those, steps whose grows evicted cached blocks
        self.busy_s = 0.0  # virtual seconds the engine was stepping
        self._engine_busy = False  # a step is in flight or a StepStart is queued
        self._intake_free = 0.0  # when the server's intake has taken in every request sent
        self._bulk = (
            executor
            if bulk and isinstance(executor, SimExecutor) and executor.decodes_in_bulk
            else None
        )

    # ---- what the client side calls ----

    def arrive(self, time: float, request: GenerationRequest) -> None:
        """``request`` is sent at ``time``; the scheduler has it once the intake is done."""
        if not self.server.per_request_s:
            self.queue.push(time, Arrival(request))
            return
        self.queue.push(time, Wake(lambda now: self._take_in(now, request)))

    def _take_in(self, now: float, request: GenerationRequest) -> None:
        """The intake, in the order requests are sent: each after the one before it."""
        self._intake_free = max(now, self._intake_free) + self.server.per_request_s
        self.queue.push(self._intake_free, Arrival(request))

    def call_at(self, time: float, action: Callable[[float], None]) -> None:
        self.queue.push(time, Wake(action))

    # ---- the loop ----

    def run(self) -> None:
        queue, clock = self.queue, self.clock
        while queue:
            time, event = queue.pop()
            clock.advance_to(time)
            if type(event) is StepDone:
                self._run_engine(self._step_done(event.plan, event.result, time))
            elif type(event) is Arrival:
                self.scheduler.submit(event.request)
                self._hand_out(self.scheduler.drain_events())  # an immediate rejection
                self._wake_engine(time)
            elif type(event) is StepStart:
                self._run_engine(self._step_start(time))
            else:
                assert isinstance(event, Wake)
                event.action(time)

    def _run_engine(self, step: _Step | None) -> None:
        """Steps back to back for as long as each ends before anything else is due (the
        queue would hand its end straight back); the first one that does not is queued."""
        queue, clock = self.queue, self.clock
        while step is not None:
            end, plan, result = step
            if end >= queue.next_time():  # at equal times, what was queued first goes first
                queue.push(end, StepDone(plan, result))
                return
            clock.advance_to(end)
            step = self._step_done(plan, result, end)

    def _wake_engine(self, now: float) -> None:
        if not self._engine_busy:
            self._engine_busy = True
            self.queue.push(now, StepStart())

    def _step_start(self, now: float) -> _Step | None:
        """Plan and run a step: when it ends, its plan and result (None: none runs now)."""
        if self._bulk is not None:
            now = self._decode_run(self._bulk, now)
        sched = self.scheduler
        plan = sched.schedule()
        self._hand_out(sched.drain_events())
        if plan.is_empty:
            self._engine_busy = False  # nothing runnable: only an arrival changes that
            return None
        try:
            result = self.executor.step(plan)
        except EngineInputError as exc:
            # A scheduler bug, handled as the server handles it: the plan's requests fail.
            self._hand_out(sched.on_plan_rejected(plan, str(exc)))
            self.queue.push(now, StepStart())
            return None
        if plan.slices:
            self.steps += 1
        seconds = result.timings.total_s
        self.busy_s += seconds
        return now + seconds + self.server.seconds(plan), plan, result

    def _decode_run(self, executor: SimExecutor, now: float) -> float:
        """The steady decode steps that end before the next event, taken at once; the time
        the last of them ends (``now`` if none)."""
        sched = self.scheduler
        run = next_run(sched, MAX_RUN_STEPS, evict=True)
        if run is None:
            return now
        server_s = self.server.decode_seconds(len(run.owners))
        due = self.queue.next_time()
        ends: list[float] = []
        times: list[float] = []  # each step's engine seconds (a policy may learn from them)
        busy = self.busy_s
        # Steps past ``free_steps`` evict cached blocks: each step's grows are made once it
        # is taken, and their truncations run before the next step is priced (one by one,
        # a plan's ops run after the step they lead is priced, before the next).
        growth = None
        ops: list[list[KvOp]] = []  # each step's, where a step may evict
        if run.free_steps is not None and run.free_steps < run.steps:
            growth = RunGrowth(sched.kv, run)
        priced = executor.decode_seconds(run.seqs, run.chunk)
        seconds = next(priced)
        for j in range(1, run.steps + 1):
            end = now + seconds + server_s  # as a step one by one ends
            if end >= due:
                break  # that step's end is queued behind what is due: it is taken alone
            ends.append(end)
            times.append(seconds)
            busy += seconds
            now = end
            dropped = 0
            if growth is not None:
                ops.append(growth.grow(j))
                if ops[-1]:
                    self.bulk_evictions += 1
                    dropped = executor.apply_ops(ops[-1])
            if j == run.steps:
                break
            seconds = priced.send(dropped)
        if not ends:
            return now
        tokens = executor.decode(run.seqs, run.starts, run.owners, len(ends), run.chunk)
        self.steps += len(ends)
        self.bulk_steps += len(ends)
        self.busy_s = busy
        self.clock.advance_to(now)
        take_run(sched, run, len(ends), tokens, ends, growth, times, ops)
        return now

    def _step_done(self, plan: StepPlan, result: StepResult, now: float) -> _Step | None:
        """Take in a step's result; the next step, if it starts at once."""
        sched = self.scheduler
        self._hand_out(sched.update(plan, result))
        if not sched.has_work:
            self._engine_busy = False
            return None
        if self.queue.next_time() > now:
            return self._step_start(now)  # nothing else happens at `now`: no need to queue it
        self.queue.push(now, StepStart())  # after what is already due at `now`
        return None

    def _hand_out(self, events: list[SchedulerEvent]) -> None:
        # Token events are not needed one by one: a finished choice carries its token times.
        for event in events:
            if type(event) is ChoiceFinished:
                self.on_finished(event.result)
