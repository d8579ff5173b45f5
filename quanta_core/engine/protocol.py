"""The executor contract: one call, one engine pass. An executor applies no policy."""

from __future__ import annotations

from typing import Protocol

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
