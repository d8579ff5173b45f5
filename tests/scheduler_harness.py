"""A synchronous cycle loop for scheduler tests (what the driver does, without asyncio)."""

from __future__ import annotations

from dataclasses import dataclass, field

from quanta_core.clock import VirtualClock
from quanta_core.engine.errors import EngineDied, EngineInputError
from quanta_core.engine.fake import FakeExecutor, fake_next_token
from quanta_core.engine.types import StepPlan
from quanta_core.requests import ChoiceFinished, ChoiceResult, GenerationRequest, TokenEvent
from quanta_core.scheduler import Scheduler, SchedulerConfig


def expected_tokens(prompt: list[int] | tuple[int, ...], n: int, n_vocab: int = 1000) -> list[int]:
    """What the fake engine generates for ``prompt`` when nothing goes wrong."""
    seq = list(prompt)
    out: list[int] = []
    for _ in range(n):
        out.append(fake_next_token(seq, n_vocab))
        seq.append(out[-1])
    return out


def prompt(n: int, base: int = 100) -> tuple[int, ...]:
    return tuple(range(base, base + n))


@dataclass
class Harness:
    executor: FakeExecutor
    sched: Scheduler
    clock: VirtualClock
    events: list[TokenEvent | ChoiceFinished] = field(default_factory=list)
    plans: list[StepPlan] = field(default_factory=list)  # every plan tried, failed ones too

    @classmethod
    def make(cls, executor: FakeExecutor | None = None, **config: object) -> Harness:
        executor = executor or FakeExecutor()
        clock = VirtualClock()
        cfg = SchedulerConfig(**config)  # type: ignore[arg-type]
        return cls(executor, Scheduler(cfg, executor.info, clock), clock)

    def submit(
        self, request_id: str, tokens: tuple[int, ...], max_tokens: int, **kw: object
    ) -> None:
        req = GenerationRequest(request_id, tokens, max_tokens, **kw)  # type: ignore[arg-type]
        self.sched.submit(req)
        self.events.extend(self.sched.drain_events())

    def cycle(self) -> StepPlan:
        plan = self.sched.schedule()
        self.events.extend(self.sched.drain_events())
        self.plans.append(plan)
        self.clock.advance(0.01)
        try:
            result = self.executor.step(plan)
        except EngineDied:
            self.events.extend(self.sched.on_engine_died(plan))
            self.executor.restart()
        except EngineInputError as exc:
            self.events.extend(self.sched.on_plan_rejected(plan, str(exc)))
        else:
            self.events.extend(self.sched.update(plan, result))
        self.sched.check_integrity()
        return plan

    def run(self, max_cycles: int = 10_000) -> None:
        for _ in range(max_cycles):
            if not self.sched.has_work:
                return
            self.cycle()
        raise AssertionError("the scheduler did not finish its work")

    def results(self) -> dict[tuple[str, int], ChoiceResult]:
        return {
            (e.result.request_id, e.result.index): e.result
            for e in self.events
            if isinstance(e, ChoiceFinished)
        }

    def streamed(self, request_id: str, index: int = 0) -> list[int]:
        return [
            e.token
            for e in self.events
            if isinstance(e, TokenEvent) and e.request_id == request_id and e.index == index
        ]

    def seqs_per_plan(self) -> list[list[int]]:
        return [[s.seq for s in p.slices] for p in self.plans]
