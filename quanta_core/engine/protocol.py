"""The executor contract: one call, one engine pass. An executor applies no policy."""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from quanta_core.engine.types import EngineInfo, MemoryStats, StepPlan, StepResult


class Executor(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    def step(self, plan: StepPlan) -> StepResult:
        """Apply ``plan.kv_ops`` in order, then run ``plan.slices`` as one batch.

        Raises ``EngineInputError`` for an invalid plan (nothing changed) and ``EngineDied``
        when the engine is gone.
        """
        ...

    def memory_stats(self) -> MemoryStats: ...

    def restart(self) -> None:
        """Replace a dead engine by a fresh, empty one. Stashes are kept."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class SteppedFromLoop(Protocol):
    """An executor that can also be stepped from an event loop (the real engine: it sends
    the call from the loop's thread and the loop reads the reply). ``start_step`` sends the
    plan before it returns, so a caller can send the next step first and do the rest of its
    work while the engine computes; the future is the result, or the exception that
    ``Executor.step`` would raise (the same contract). The next step waits for it: a caller
    does not cancel it (the driver stops by finishing its cycle, never by cancelling it)."""

    def start_step(self, plan: StepPlan) -> asyncio.Future[StepResult]: ...
