"""The engine's configuration: a frozen value built by the web layer from settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: str
    n_ctx: int = 8192  # KV cells, shared by all sequences (kv_unified)
    n_seq_max: int = 64
    n_batch: int = 512  # most tokens in one llama_decode
    n_ubatch: int = 512
    threads: int = 2
    # One unified KV buffer: required for llama_memory_seq_cp of a partial prefix. Every
    # sequence then attends over the shared buffer, which costs attention time at long contexts.
    kv_unified: bool = True
    step_timeout_s: float = 60.0  # a step that takes longer is treated as a hung worker
    start_timeout_s: float = 120.0  # loading the model in a fresh worker
