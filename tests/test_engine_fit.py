"""The engine layout fitted to a model and a machine (quanta_core/engine/fit.py): exact
layouts for a few machines, the user's settings winning, and a clear refusal of what cannot
fit. No model or GPU needed: the shapes and machines are written out."""

from __future__ import annotations

import pytest

from quanta_core.engine.fit import (
    Device,
    FitError,
    GiB,
    MiB,
    ModelShape,
    Wanted,
    describe,
    fit_engine,
)

# SmolLM2-135M-Instruct Q4_1 (the default model): 30 layers, 3 KV heads of 64 + 64, f16.
SMOL = ModelShape("SmolLM2-135M-Instruct.Q4_1.gguf", 8192, 30, 23040, 94 * MiB, 49152, 576)
# Llama-3-8B's shape with Q4_0 weights (the H200 runs' synthetic model), and Llama-3.1-8B's
# training context, and in f16.
LLAMA8B = ModelShape("llama3-8b.Q4_0.gguf", 8192, 32, 131072, 4_520_000_000, 128256, 4096)
LLAMA31_8B = ModelShape("llama3.1-8b.gguf", 131072, 32, 131072, 4_920_000_000, 128256, 4096)
LLAMA8B_F16 = ModelShape("llama3-8b.F16.gguf", 8192, 32, 131072, 16_060_000_000, 128256, 4096)

THIS_CPU = Device(cpu_cores=2, ram_bytes=24 * GiB, ram_available_bytes=20 * GiB)
H200 = Device(
    cpu_cores=16,
    ram_bytes=128 * GiB,
    ram_available_bytes=120 * GiB,
    gpu_offload=True,
    vram_free_bytes=140 * GiB,
    vram_total_bytes=141 * GiB,
    gpu_name="NVIDIA H200",
)
SMALL_GPU = Device(
    cpu_cores=8,
    ram_bytes=64 * GiB,
    ram_available_bytes=60 * GiB,
    gpu_offload=True,
    vram_free_bytes=7 * GiB + 512 * MiB,
    vram_total_bytes=8 * GiB,
    gpu_name="RTX 3070",
)


def shape(layout: object) -> tuple[object, ...]:
    return tuple(
        getattr(layout, name)
        for name in (
            "kv_unified",
            "n_ctx_seq",
            "n_seq_max",
            "n_gpu_layers",
            "flash_attn",
            "n_batch",
            "n_ubatch",
            "token_budget",
            "threads",
        )
    )


def test_this_cpu_with_smollm2_gets_a_stream_per_slot_of_5120() -> None:
    layout = fit_engine(SMOL, THIS_CPU, Wanted())
    # 1/8 of 24 GiB: 3 GiB. 20 slots of the training context (8192) would take 3.5 GiB, so
    # the context comes down to the floor, 5120 (112.5 MiB a slot: a 4,000-token prompt and
    # its answer fit), and 27 slots fit, rounded down to 24.
    assert layout.kv_budget_bytes == 3 * GiB
    assert shape(layout) == (False, 5120, 24, 0, "auto", 512, 512, 128, 2)
    assert layout.n_ctx == 122880
    assert layout.kv_bytes == 122880 * 23040  # 2.6 GiB
    assert layout.n_ctx_seq >= 4000 + 128  # the long suite's longest CPU request
    assert not layout.on_gpu


def test_an_h200_with_an_8b_model_offloads_everything_and_fills_the_vram() -> None:
    layout = fit_engine(LLAMA8B, H200, Wanted())
    # 140 GiB free - 7 GiB margin (5 %) - 283 MiB compute - 4.2 GiB weights = 128.5 GiB:
    # 128 slots of the training context, 1 GiB each.
    assert shape(layout) == (False, 8192, 128, -1, "on", 2048, 512, 2048, 16)
    assert layout.n_ctx == 1_048_576
    assert 128 * GiB <= layout.kv_budget_bytes < 129 * GiB
    assert layout.on_gpu


def test_a_long_trained_model_on_the_h200_keeps_64_slots() -> None:
    # 64 slots of 131,072 tokens would take 1 TiB: the context halves until 64 fit.
    layout = fit_engine(LLAMA31_8B, H200, Wanted())
    assert (layout.n_ctx_seq, layout.n_seq_max, layout.n_gpu_layers) == (16384, 64, -1)


def test_a_small_gpu_takes_the_layers_that_fit_and_sizes_kv_as_a_cpu() -> None:
    layout = fit_engine(LLAMA8B_F16, SMALL_GPU, Wanted())
    # 16 GB of weights cannot go on 7.5 GiB: 8 layers with their share of the 8 GiB KV
    # (1/8 of the RAM) fit; the KV holds 12 slots of 5120 tokens (640 MiB each).
    assert shape(layout) == (False, 5120, 12, 8, "on", 512, 512, 512, 8)
    assert layout.kv_budget_bytes == 8 * GiB
    assert layout.on_gpu


def test_the_users_settings_win() -> None:
    wanted = Wanted(
        n_ctx=16384,
        n_seq_max=4,
        kv_unified=True,
        n_gpu_layers=0,
        flash_attn="off",
        n_batch=256,
        n_ubatch=1024,
        token_budget=64,
        threads=1,
    )
    layout = fit_engine(SMOL, THIS_CPU, wanted)
    assert shape(layout) == (True, 16384, 4, 0, "off", 256, 256, 64, 1)
    assert layout.n_ctx == 16384  # one buffer: the longest request is the whole of it
    assert "beyond the model's training context" in layout.why["n_ctx"]
    on_h200 = fit_engine(LLAMA8B, H200, wanted)
    assert shape(on_h200) == (True, 16384, 4, 0, "off", 256, 256, 64, 1)
    assert not on_h200.on_gpu  # QUANTA_N_GPU_LAYERS=0 keeps a GPU build on the CPU
    streams = fit_engine(SMOL, THIS_CPU, Wanted(n_ctx=2048, n_seq_max=8))
    assert (streams.n_ctx_seq, streams.n_seq_max, streams.n_ctx) == (2048, 8, 16384)


def test_one_buffer_unset_takes_the_cells_the_streams_would() -> None:
    layout = fit_engine(SMOL, THIS_CPU, Wanted(kv_unified=True))
    assert (layout.n_ctx, layout.n_seq_max, layout.kv_bytes) == (122880, 32, 122880 * 23040)
    # set, the one buffer is QUANTA_N_CTX cells whatever the slots (the layout of old)
    old = fit_engine(SMOL, THIS_CPU, Wanted(kv_unified=True, n_ctx=8192, n_seq_max=64))
    assert (old.n_ctx, old.n_ctx_seq, old.n_seq_max) == (8192, 8192, 64)


def test_a_set_context_gets_as_many_slots_as_the_budget_holds() -> None:
    assert fit_engine(SMOL, THIS_CPU, Wanted(n_ctx=2048)).n_seq_max == 32
    assert fit_engine(SMOL, THIS_CPU, Wanted(n_ctx=32768)).n_seq_max == 4  # 720 MiB each
    # one slot longer than the budget is still given, where the RAM holds it
    assert fit_engine(SMOL, THIS_CPU, Wanted(n_ctx=262144)).n_seq_max == 1
    # the H200 takes all 256 slots of 2,000-token requests
    assert fit_engine(LLAMA8B, H200, Wanted(n_ctx=2048)).n_seq_max == 256


def test_set_slots_get_the_longest_context_the_budget_holds() -> None:
    assert fit_engine(SMOL, THIS_CPU, Wanted(n_seq_max=8)).n_ctx_seq == 8192
    assert fit_engine(SMOL, THIS_CPU, Wanted(n_seq_max=256)).n_ctx_seq == 512
    assert fit_engine(LLAMA8B, H200, Wanted(n_seq_max=256)).n_ctx_seq == 4096


def test_a_set_memory_budget_sizes_the_kv() -> None:
    layout = fit_engine(SMOL, THIS_CPU, Wanted(kv_memory_bytes=1 * GiB))
    assert (layout.n_ctx_seq, layout.n_seq_max) == (5120, 9)  # 112.5 MiB a slot
    tiny = fit_engine(SMOL, THIS_CPU, Wanted(kv_memory_bytes=256 * MiB))
    assert (tiny.n_ctx_seq, tiny.n_seq_max) == (5120, 2)


@pytest.mark.parametrize(
    ("model", "device", "wanted", "names"),
    [
        (
            SMOL,
            THIS_CPU,
            Wanted(n_ctx=262144, n_seq_max=64),
            "QUANTA_N_CTX=262144 x QUANTA_N_SEQ_MAX=64",
        ),
        (SMOL, THIS_CPU, Wanted(n_ctx=1 << 20), "QUANTA_N_CTX=1048576"),
        (SMOL, THIS_CPU, Wanted(kv_memory_bytes=64 * GiB), "QUANTA_KV_MEMORY_GB"),
        (SMOL, THIS_CPU, Wanted(kv_memory_bytes=64 * MiB), "QUANTA_KV_MEMORY_GB"),
        (SMOL, THIS_CPU, Wanted(n_seq_max=256, kv_memory_bytes=256 * MiB), "QUANTA_N_SEQ_MAX=256"),
        (LLAMA8B, H200, Wanted(kv_memory_bytes=200 * GiB), "QUANTA_KV_MEMORY_GB"),
        (LLAMA8B, H200, Wanted(n_ctx=8192, n_seq_max=256), "QUANTA_N_SEQ_MAX=256"),
        (LLAMA8B_F16, SMALL_GPU, Wanted(n_gpu_layers=-1), "QUANTA_N_GPU_LAYERS"),
        (LLAMA8B_F16, SMALL_GPU, Wanted(n_gpu_layers=20), "QUANTA_N_GPU_LAYERS=20"),
    ],
)
def test_what_cannot_fit_is_refused_naming_the_setting(
    model: ModelShape, device: Device, wanted: Wanted, names: str
) -> None:
    with pytest.raises(FitError, match=names.replace("+", r"\+")):
        fit_engine(model, device, wanted)


def test_a_gpu_build_without_a_readable_vram_sizes_kv_as_a_cpu_and_says_so() -> None:
    unknown = Device(
        cpu_cores=8, ram_bytes=64 * GiB, ram_available_bytes=60 * GiB, gpu_offload=True
    )
    layout = fit_engine(LLAMA8B, unknown, Wanted())
    assert (layout.n_gpu_layers, layout.flash_attn, layout.kv_budget_bytes) == (-1, "on", 8 * GiB)
    assert "QUANTA_KV_MEMORY_GB" in layout.why["kv_budget"]


def test_the_start_block_says_what_was_chosen_and_why() -> None:
    text = describe(fit_engine(SMOL, THIS_CPU, Wanted()), SMOL, THIS_CPU)
    assert "5120 tokens a request (QUANTA_N_CTX)" in text
    assert "24 slots (QUANTA_N_SEQ_MAX)" in text
    assert "a stream per sequence, 24 x 5120 = 122880 cells, 2.6 GiB" in text
    assert "KV 22.5 KiB a token" in text
    assert "1/8 of 24.0 GiB RAM" in text
