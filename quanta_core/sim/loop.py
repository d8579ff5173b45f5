"""The discrete-event loop: the server's driver, on a virtual clock.

    Arrival(t)     clock := t; scheduler.submit; an idle engine gets a StepStart at t
    StepStart(t)   clock := t; plan = schedule(); result = executor.step(plan)
                   → StepDone at t + result.timings.total_s (the cost model's seconds)
    StepDone(t)    clock := t; update(plan, result) → events handed out; StepStart at t
    Wake(t)        clock := t; the client's own action (next request of a user, a free slot)

As in ``Driver``: one step in flight at a time; a request that arrives during a step is
submitted at its own time (admission sees the right clock and queue) and first planned at the
next cycle; an empty plan leaves the engine idle until the next arrival. The executor never
touches the clock: the loop jumps it from event to event.
"""

from __future__ import annotations

from collections.abc import Callable

from quanta_core.clock import VirtualClock
from quanta_core.engine.errors import EngineInputError
from quanta_core.engine.protocol import Executor
from quanta_core.requests import ChoiceFinished, ChoiceResult, GenerationRequest
from quanta_core.scheduler.handle import Event as SchedulerEvent
from quanta_core.scheduler.scheduler import Scheduler
from quanta_core.sim.events import Arrival, EventQueue, StepDone, StepStart, Wake

OnFinished = Callable[[ChoiceResult], None]


class SimLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        clock: VirtualClock,
        on_finished: OnFinished,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.on_finished = on_finished
        self.queue = EventQueue()
        self.steps = 0  # engine passes that ran (plans with work)
        self.busy_s = 0.0  # virtual seconds the engine was stepping
        self._engine_busy = False  # a step is in flight or a StepStart is queued

    # ---- what the client side calls ----

    def arrive(self, time: float, request: GenerationRequest) -> None:
        self.queue.push(time, Arrival(request))

    def call_at(self, time: float, action: Callable[[float], None]) -> None:
        self.queue.push(time, Wake(action))

    # ---- the loop ----

    def run(self) -> None:
        queue, clock = self.queue, self.clock
        while queue:
            time, event = queue.pop()
            clock.advance_to(time)
            if type(event) is StepDone:
                self._step_done(event, time)
            elif type(event) is Arrival:
                self.scheduler.submit(event.request)
                self._hand_out(self.scheduler.drain_events())  # an immediate rejection
                self._wake_engine(time)
            elif type(event) is StepStart:
                self._step_start(time)
            else:
                assert isinstance(event, Wake)
                event.action(time)

    def _wake_engine(self, now: float) -> None:
        if not self._engine_busy:
            self._engine_busy = True
            self.queue.push(now, StepStart())

    def _step_start(self, now: float) -> None:
        sched = self.scheduler
        plan = sched.schedule()
        self._hand_out(sched.drain_events())
        if plan.is_empty:
            self._engine_busy = False  # nothing runnable: only an arrival changes that
            return
        try:
            result = self.executor.step(plan)
        except EngineInputError as exc:
            # A scheduler bug, handled as the server handles it: the plan's requests fail.
            self._hand_out(sched.on_plan_rejected(plan, str(exc)))
            self.queue.push(now, StepStart())
            return
        if plan.slices:
            self.steps += 1
        self.busy_s += result.timings.total_s
        self.queue.push(now + result.timings.total_s, StepDone(plan, result))

    def _step_done(self, event: StepDone, now: float) -> None:
        sched = self.scheduler
        self._hand_out(sched.update(event.plan, event.result))
        if not sched.has_work:
            self._engine_busy = False
        elif self.queue.next_time() > now:
            self._step_start(now)  # nothing else happens at `now`: no need to queue it
        else:
            self.queue.push(now, StepStart())  # after what is already due at `now`

    def _hand_out(self, events: list[SchedulerEvent]) -> None:
        # Token events are not needed one by one: a finished choice carries its token times.
        for event in events:
            if type(event) is ChoiceFinished:
                self.on_finished(event.result)
