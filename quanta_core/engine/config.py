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
    # GPU offload (a llama.cpp built with a GPU backend). 0 keeps every layer on the CPU,
    # -1 offloads all of them; the KV cache follows its layer onto the GPU.
    n_gpu_layers: int = 0
    # Flash attention: "auto" (llama.cpp's default: on where the backend supports it), "on",
    # "off". On a GPU it keeps attention over the one unified KV buffer from growing with
    # every sequence's padding.
    flash_attn: str = "auto"
    # One unified KV buffer: required for llama_memory_seq_cp of a partial prefix. Every
    # sequence then attends over the shared buffer, which costs attention time at long contexts.
    kv_unified: bool = True
    # How long llama.cpp's idle OpenMP threads spin before they sleep (GOMP_SPINCOUNT, in
    # spin iterations). libgomp's default spins for milliseconds after every step, keeping
    # nearly two cores busy through the pauses between steps and taking the core the server
    # needs for its own work. 3,000 covers the barriers inside a step and sleeps soon after
    # it. None: libgomp's default. An OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment
    # wins over this.
    omp_spincount: int | None = 3000
    # After the worker's heads-up (it is sampling the last sequence), how long the caller
    # polls for the step's reply before it sleeps on the socket. The reply follows in ~0.25 ms
    # (one greedy sequence here); spinning saves a second wake-up of an idle CPU (~0.15 ms).
    reply_spin_s: float = 0.001
    # After each reply, how long the worker polls for the next call (yielding its CPU between
    # polls) before it sleeps on the socket: waking a sleeping worker costs about a tenth of a
    # millisecond of every step, and a polling one keeps the engine's steps faster too
    # (bench/results/ab/, quanta bench settings-ab).
    call_spin_s: float = 0.002
    # After each step's reply, decode the tokens it sampled at once, before the next plan
    # comes (worker.py): that plan's decodes are then ready. For a GPU engine, whose decode
    # leaves the CPU free; on a CPU it would take the cores the server needs meanwhile.
    decode_ahead: bool = False
    step_timeout_s: float = 60.0  # a step that takes longer is treated as a hung worker
    start_timeout_s: float = 120.0  # loading the model in a fresh worker
