"""Executors: the real llama.cpp worker, a fake for tests, later a simulated one."""

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
