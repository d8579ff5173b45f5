"""Executors: the real llama.cpp worker (``llama_cpp``) and a fake for tests; the simulator's
is ``quanta_core.sim.executor``."""

from quanta_core.engine.errors import (
    EngineDied,
    EngineError,
    EngineHung,
    EngineInputError,
    EngineStartError,
)
from quanta_core.engine.protocol import Executor
from quanta_core.engine.types import (
    GREEDY,
    CopyPrefix,
    DropStash,
    EngineInfo,
    KvOp,
    MemoryStats,
    Restore,
    SamplingParams,
    SeqOutput,
    SeqSlice,
    Stash,
    StepPlan,
    StepResult,
    StepTimings,
    Truncate,
)

__all__ = [
    "GREEDY",
    "CopyPrefix",
    "DropStash",
    "EngineDied",
    "EngineError",
    "EngineHung",
    "EngineInfo",
    "EngineInputError",
    "EngineStartError",
    "Executor",
    "KvOp",
    "MemoryStats",
    "Restore",
    "SamplingParams",
    "SeqOutput",
    "SeqSlice",
    "Stash",
    "StepPlan",
    "StepResult",
    "StepTimings",
    "Truncate",
]
