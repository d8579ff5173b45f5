"""The simulator's events and their queue: a heap ordered by (time, insertion number).

    push(0.0, Arrival r0)   push(0.0, Arrival r1)   push(0.0, StepStart)
    pop → (0.0, Arrival r0) → (0.0, Arrival r1) → (0.0, StepStart)

Equal times come out in the order they were pushed, so a run is a pure function of its
inputs (the heap never compares two events, whose order would be arbitrary).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from quanta_core.engine.types import StepPlan, StepResult
from quanta_core.requests import GenerationRequest


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request reaches the server: it is submitted to the scheduler at this time."""

    request: GenerationRequest


@dataclass(frozen=True, slots=True)
class StepStart:
    """The engine is free: the scheduler plans the next step."""


@dataclass(frozen=True, slots=True)
class StepDone:
    """The engine finished ``plan``: the scheduler updates and hands the events out."""

    plan: StepPlan
    result: StepResult


@dataclass(frozen=True, slots=True)
class Wake:
    """Something on the client's side: a closed-loop user's next request, a freed slot."""

    action: Callable[[float], None]


Event = Arrival | StepStart | StepDone | Wake


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Event]] = []
        self._pushed = 0

    def push(self, time: float, event: Event) -> None:
        self._pushed += 1
        heapq.heappush(self._heap, (time, self._pushed, event))

    def pop(self) -> tuple[float, Event]:
        time, _, event = heapq.heappop(self._heap)
        return time, event

    def next_time(self) -> float:
        """When the next event is due; infinity when there is none."""
        return self._heap[0][0] if self._heap else math.inf

    def __len__(self) -> int:
        return len(self._heap)
