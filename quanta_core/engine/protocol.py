"""The executor contract: one call, one engine pass. An executor applies no policy."""

from __future__ import annotations

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
    the call from the loop's thread and reads the reply in its own). Same contract as
    ``Executor.step``."""

    async def step_async(self, plan: StepPlan) -> StepResult: ...
