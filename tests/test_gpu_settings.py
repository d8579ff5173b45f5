"""GPU offload and KV layout settings reach the engine's config (no GPU needed: the model
file and the machine are described, as the probes would read them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.server import engine_fit
from app.server.scheduling import scheduler_config
from app.server.settings import Settings
from quanta_core.engine import SeqSlice, StepPlan
from quanta_core.engine.fit import Device, FitError, GiB, MiB, ModelShape
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor

MODEL = "model.gguf"
SMOL = ModelShape(MODEL, 8192, 30, 23040, 94 * MiB, 49152, 576)
CPU = Device(cpu_cores=2, ram_bytes=24 * GiB, ram_available_bytes=20 * GiB)
GPU = Device(
    cpu_cores=16,
    ram_bytes=128 * GiB,
    ram_available_bytes=120 * GiB,
    gpu_offload=True,
    vram_free_bytes=140 * GiB,
    gpu_name="NVIDIA H200",
)


@pytest.fixture
def model(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    path = tmp_path_factory.mktemp("m") / MODEL
    path.write_bytes(b"GGUF")
    monkeypatch.setattr(engine_fit, "probe_model", lambda _: SMOL)
    monkeypatch.setattr(engine_fit, "probe_device", lambda: CPU)
    return str(path)


@pytest.fixture
def gpu(model: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The same model on a machine whose llama.cpp has a CUDA backend."""
    monkeypatch.setattr(engine_fit, "probe_device", lambda: GPU)
    return model


def test_defaults_keep_the_cpu_engine(model: str) -> None:
    config = Settings(model_path=model).engine_config()
    assert (config.n_gpu_layers, config.flash_attn, config.n_batch, config.n_ubatch) == (
        0,
        "auto",
        512,
        512,
    )
    # a stream of 5120 cells (a 4k prompt and its answer) for each of 24 slots (3 GiB of KV
    # budget: 1/8 of the RAM)
    assert (config.kv_unified, config.n_ctx, config.n_seq_max) == (False, 24 * 5120, 24)


def test_a_cuda_build_offloads_everything_with_flash_attention(gpu: str) -> None:
    settings = Settings(model_path=gpu)
    config = settings.engine_config()
    assert (config.n_gpu_layers, config.flash_attn, config.n_batch, config.n_ubatch) == (
        -1,
        "on",
        2048,
        512,
    )
    assert (config.n_seq_max, config.n_ctx // config.n_seq_max) == (256, 8192)
    assert (settings.step_token_budget(), settings.overlaps_steps()) == (2048, True)
    assert config.decode_ahead is True
    assert "256 slots (QUANTA_N_SEQ_MAX)" in settings.describe_layout()


def test_n_ctx_is_the_longest_request(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTA_N_CTX", "16384")
    config = Settings(model_path=model).engine_config()
    # each slot holds 16,384 tokens; the 3 GiB budget holds 8 such slots
    assert (config.n_ctx, config.n_seq_max) == (8 * 16384, 8)


def test_one_kv_buffer_is_a_setting(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(model_path=model).engine_config().kv_unified is False
    monkeypatch.setenv("QUANTA_KV_UNIFIED", "true")
    assert Settings(model_path=model).engine_config().kv_unified is True


def test_a_layout_that_cannot_fit_names_the_setting(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUANTA_N_CTX", "262144")
    monkeypatch.setenv("QUANTA_N_SEQ_MAX", "64")
    with pytest.raises(FitError, match="QUANTA_N_CTX=262144 x QUANTA_N_SEQ_MAX=64"):
        Settings(model_path=model).engine_config()


def test_environment_sets_gpu_offload(gpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTA_N_GPU_LAYERS", "12")
    monkeypatch.setenv("QUANTA_FLASH_ATTN", "off")
    monkeypatch.setenv("QUANTA_N_SEQ_MAX", "256")
    monkeypatch.setenv("QUANTA_N_BATCH", "2048")
    monkeypatch.setenv("QUANTA_N_UBATCH", "1024")
    config = Settings(model_path=gpu).engine_config()
    assert (config.n_gpu_layers, config.flash_attn) == (12, "off")
    assert (config.n_seq_max, config.n_batch, config.n_ubatch) == (256, 2048, 1024)


@pytest.mark.parametrize(
    ("env", "device", "overlaps"),
    [
        ({}, CPU, False),  # the CPU engine: the streams' writes wait for the step's end
        ({}, GPU, True),
        ({"QUANTA_N_GPU_LAYERS": "-1"}, CPU, False),  # no GPU backend: nothing offloaded
        ({"QUANTA_N_GPU_LAYERS": "0"}, GPU, False),
        ({"QUANTA_OVERLAP_STEPS": "false"}, GPU, False),
        ({"QUANTA_OVERLAP_STEPS": "true"}, CPU, True),
    ],
)
def test_steps_overlap_the_streams_on_a_gpu_unless_told(
    model: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], device: Device, overlaps: bool
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(engine_fit, "probe_device", lambda: device)
    assert Settings(model_path=model).overlaps_steps() is overlaps


@pytest.mark.parametrize(
    ("env", "device", "ahead"),
    [
        ({}, CPU, False),  # the CPU engine: a decode between steps would take the server's cores
        ({}, GPU, True),
        ({"QUANTA_DECODE_AHEAD": "false"}, GPU, False),
        ({"QUANTA_DECODE_AHEAD": "true"}, CPU, True),
    ],
)
def test_the_worker_decodes_ahead_on_a_gpu_unless_told(
    model: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], device: Device, ahead: bool
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(engine_fit, "probe_device", lambda: device)
    assert Settings(model_path=model).engine_config().decode_ahead is ahead


@pytest.mark.parametrize(
    ("env", "device", "budget"),
    [
        ({}, CPU, 128),  # the CPU engine: running streams decode between small prefill chunks
        ({}, GPU, 2048),  # whole prompts in a pass of n_batch
        ({"QUANTA_TOKEN_BUDGET": "512"}, GPU, 512),
        ({"QUANTA_TOKEN_BUDGET": "4096"}, CPU, 512),  # never above n_batch (512 on a CPU)
        ({"QUANTA_N_BATCH": "64"}, CPU, 64),
    ],
)
def test_step_token_budget_follows_the_engine_unless_set(
    model: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], device: Device, budget: int
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(engine_fit, "probe_device", lambda: device)
    config = scheduler_config(Settings(model_path=model))
    assert config.token_budget == budget


def test_ubatch_is_at_most_the_batch(model: str) -> None:
    config = Settings(model_path=model, n_batch=256, n_ubatch=1024).engine_config()
    assert config.n_ubatch == 256


@pytest.mark.parametrize(
    "bad",
    [{"n_gpu_layers": -2}, {"flash_attn": "yes"}, {"n_seq_max": 257}, {"n_ubatch": 0}],
)
def test_bad_values_are_refused(model: str, bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings(model_path=model, **bad)


@pytest.mark.model
@pytest.mark.parametrize("flash_attn", ["on", "off"])
def test_the_engine_starts_with_gpu_settings_on_a_cpu_build(
    model_path: Path, flash_attn: str
) -> None:
    """A build without a GPU backend keeps the layers on the CPU and still decodes."""
    config = Settings(
        model_path=model_path, n_gpu_layers=-1, flash_attn=flash_attn, n_ubatch=128, n_ctx=512
    ).engine_config()
    with LlamaCppExecutor.start(config) as ex:
        result = ex.step(StepPlan(slices=(SeqSlice(0, (1, 2, 3), 0, True, "gpu"),)))
        assert 0 <= result.outputs[0].token < ex.info.n_vocab


def test_free_vram_is_read_from_nvidia_smi_for_the_visible_gpus() -> None:
    out = "0, NVIDIA H200, 143000, 143771\n1, NVIDIA H200, 1000, 143771\n"
    assert engine_fit.parse_nvidia_smi(out, None) == (
        144000 * MiB,
        2 * 143771 * MiB,
        "2 x NVIDIA H200",
    )
    assert engine_fit.parse_nvidia_smi(out, "0") == (143000 * MiB, 143771 * MiB, "NVIDIA H200")
    assert engine_fit.parse_nvidia_smi("No devices were found\n", None) == (None, None, "")
