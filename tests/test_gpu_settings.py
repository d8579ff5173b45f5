"""GPU offload and KV layout settings reach the engine's config (no GPU needed: only the
plumbing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.server.scheduling import scheduler_config
from app.server.settings import Settings
from quanta_core.engine import SeqSlice, StepPlan
from quanta_core.engine.config import EngineConfig
from quanta_core.engine.llama_cpp.executor import LlamaCppExecutor

MODEL = "model.gguf"


@pytest.fixture
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("m") / MODEL
    path.write_bytes(b"GGUF")
    return str(path)


def test_defaults_keep_the_cpu_engine(model: str) -> None:
    config = Settings(model_path=model).engine_config()
    defaults = EngineConfig(model_path=model)
    assert config.n_gpu_layers == 0 == defaults.n_gpu_layers
    assert config.flash_attn == "auto" == defaults.flash_attn
    assert config.n_ubatch == defaults.n_ubatch


def test_one_kv_stream_per_slot_is_a_setting(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(model_path=model).engine_config().kv_unified is True
    monkeypatch.setenv("QUANTA_KV_UNIFIED", "false")
    assert Settings(model_path=model).engine_config().kv_unified is False


def test_environment_sets_gpu_offload(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTA_N_GPU_LAYERS", "-1")
    monkeypatch.setenv("QUANTA_FLASH_ATTN", "on")
    monkeypatch.setenv("QUANTA_N_SEQ_MAX", "256")
    monkeypatch.setenv("QUANTA_N_BATCH", "2048")
    monkeypatch.setenv("QUANTA_N_UBATCH", "1024")
    config = Settings(model_path=model).engine_config()
    assert (config.n_gpu_layers, config.flash_attn) == (-1, "on")
    assert (config.n_seq_max, config.n_batch, config.n_ubatch) == (256, 2048, 1024)


@pytest.mark.parametrize(
    ("env", "overlaps"),
    [
        ({}, False),  # the CPU engine: the streams' writes wait for the step's end
        ({"QUANTA_N_GPU_LAYERS": "-1"}, True),
        ({"QUANTA_N_GPU_LAYERS": "-1", "QUANTA_OVERLAP_STEPS": "false"}, False),
        ({"QUANTA_OVERLAP_STEPS": "true"}, True),
    ],
)
def test_steps_overlap_the_streams_on_a_gpu_unless_told(
    model: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], overlaps: bool
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings(model_path=model).overlaps_steps() is overlaps


@pytest.mark.parametrize(
    ("env", "ahead"),
    [
        ({}, False),  # the CPU engine: a decode between steps would take the server's cores
        ({"QUANTA_N_GPU_LAYERS": "-1"}, True),
        ({"QUANTA_N_GPU_LAYERS": "-1", "QUANTA_DECODE_AHEAD": "false"}, False),
        ({"QUANTA_DECODE_AHEAD": "true"}, True),
    ],
)
def test_the_worker_decodes_ahead_on_a_gpu_unless_told(
    model: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], ahead: bool
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings(model_path=model).engine_config().decode_ahead is ahead


@pytest.mark.parametrize(
    ("env", "budget"),
    [
        ({}, 128),  # the CPU engine: running streams decode between small prefill chunks
        ({"QUANTA_N_GPU_LAYERS": "-1", "QUANTA_N_BATCH": "2048"}, 2048),
        ({"QUANTA_N_GPU_LAYERS": "-1", "QUANTA_TOKEN_BUDGET": "512"}, 512),
        ({"QUANTA_TOKEN_BUDGET": "4096"}, 512),  # never above n_batch (512 by default)
        ({"QUANTA_N_BATCH": "64"}, 64),
    ],
)
def test_step_token_budget_follows_the_engine_unless_set(
    model: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], budget: int
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
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
