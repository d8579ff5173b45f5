"""Configuration fails clearly: one line per mistake, naming where the value came from and
what is valid, before anything starts; unknown names are warned about with the nearest one."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli
from app.server.config import load_settings
from app.server.config_file import ConfigError
from tests.server_process import free_port

# (environment, the one line said about it)
BAD_ENVIRONMENTS = [
    ({"QUANTA_N_CTX": "abc"}, "QUANTA_N_CTX=abc: expected an integer >= 64 (or unset)"),
    ({"QUANTA_N_CTX": "10"}, "QUANTA_N_CTX=10: expected an integer >= 64 (or unset)"),
    ({"QUANTA_PORT": "99999"}, "QUANTA_PORT=99999: expected an integer >= 0 and <= 65535"),
    ({"QUANTA_TOKEN_BUDGET": "0"}, "QUANTA_TOKEN_BUDGET=0: expected an integer >= 1 (or unset)"),
    ({"QUANTA_GRACE_S": "-1"}, "QUANTA_GRACE_S=-1: expected a number >= 0"),
    (
        {"QUANTA_POLICY": "fastest"},
        "QUANTA_POLICY=fastest: unknown policy; one of sequential, static, fcfs, vtc, slo, "
        "horizon, quanta",
    ),
    (
        {"QUANTA_LOG_LEVEL": "loud"},
        "QUANTA_LOG_LEVEL=loud: expected one of debug, info, warning, error, critical",
    ),
    ({"QUANTA_LOG_FORMAT": "xml"}, "QUANTA_LOG_FORMAT=xml: expected one of text, json"),
    (
        {"QUANTA_FLASH_ATTN": "maybe"},
        "QUANTA_FLASH_ATTN=maybe: expected one of auto, on, off (or unset)",
    ),
    ({"QUANTA_PREFIX_CACHE": "perhaps"}, "QUANTA_PREFIX_CACHE=perhaps: expected true or false"),
    (
        {"QUANTA_OVERLAP_STEPS": "x"},
        "QUANTA_OVERLAP_STEPS=x: expected true or false (or unset)",
    ),
    (
        {"QUANTA_MODEL_PATH": "/nowhere/m.gguf"},
        "QUANTA_MODEL_PATH=/nowhere/m.gguf: model file not found: /nowhere/m.gguf",
    ),
    (
        {"QUANTA_SERVED_MODEL_NAMES": "a,,b"},
        "QUANTA_SERVED_MODEL_NAMES=a,,b: model names must be non-empty strings",
    ),
    # a secret's value is never repeated
    ({"QUANTA_ADMIN_KEY": "short"}, "QUANTA_ADMIN_KEY: must be at least 24 characters"),
    ({"QUANTA_SECRET_KEY": "short"}, "QUANTA_SECRET_KEY: must be at least 24 characters"),
    ({"QUANTA_METRICS_TOKEN": "x"}, "QUANTA_METRICS_TOKEN: must be at least 24 characters"),
    ({"QUANTA_CONFIG": "/nowhere/quanta.toml"}, "QUANTA_CONFIG=/nowhere/quanta.toml: no such file"),
]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("QUANTA_CONFIG", "")
    return monkeypatch


@pytest.mark.parametrize(("env", "line"), BAD_ENVIRONMENTS)
def test_each_bad_variable_is_one_line_naming_it_and_what_is_valid(
    clean_env: pytest.MonkeyPatch, env: dict[str, str], line: str
) -> None:
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.lines == [line]


def test_every_mistake_is_said_at_once_with_flags_by_their_option(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("QUANTA_N_SEQ_MAX", "0")
    with pytest.raises(ConfigError) as caught:
        load_settings(
            {"n_ctx": 3, "model_path": Path("/x.gguf")}, flag_names={"model_path": "--model"}
        )
    assert sorted(caught.value.lines) == [
        "--model=/x.gguf: model file not found: /x.gguf",
        "--n-ctx=3: expected an integer >= 64 (or unset)",
        "QUANTA_N_SEQ_MAX=0: expected an integer >= 1 and <= 256 (or unset)",
    ]


def test_a_toml_file_is_named_with_its_key(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "quanta.toml"
    config.write_text('n_ctx = "big"\npolicy = "fcfs"\n')
    clean_env.setenv("QUANTA_CONFIG", str(config))
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.lines == [f"{config}: n_ctx = big: expected an integer >= 64 (or unset)"]


def test_bad_toml_is_one_line_with_the_file_name(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "quanta.toml"
    config.write_text("n_ctx = \n")
    clean_env.setenv("QUANTA_CONFIG", str(config))
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.lines == [f"{config}: invalid TOML: Invalid value (at line 1, column 9)"]


def test_unknown_names_are_warned_with_the_nearest_setting(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "quanta.toml"
    config.write_text("n_cxt = 1024\nthreads = 2\n")
    clean_env.setenv("QUANTA_CONFIG", str(config))
    clean_env.setenv("QUANTA_N_CXT", "1024")
    clean_env.setenv("QUANTA_FOO", "1")
    said: list[str] = []
    settings = load_settings(warn=said.append)
    assert settings.threads == 2  # the file's settings still apply
    assert said == [
        "warning: QUANTA_FOO is not a setting (ignored)",
        "warning: QUANTA_N_CXT is not a setting (ignored); did you mean QUANTA_N_CTX?",
        f"warning: n_cxt in {config} is not a setting (ignored); did you mean n_ctx?",
    ]


def test_quanta_run_says_it_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    env = {
        "QUANTA_CONFIG": "",
        "QUANTA_DATA_DIR": str(tmp_path / "data"),
        "QUANTA_POLICY": "fastest",
        "QUANTA_N_CXT": "1",
    }
    r = CliRunner().invoke(cli, ["run", "--port", str(free_port()), "--n-ctx", "5"], env=env)
    assert r.exit_code == 2
    assert r.output.splitlines() == [
        "warning: QUANTA_N_CXT is not a setting (ignored); did you mean QUANTA_N_CTX?",
        "invalid configuration: --n-ctx=5: expected an integer >= 64 (or unset)",
        "invalid configuration: QUANTA_POLICY=fastest: unknown policy; one of sequential, "
        "static, fcfs, vtc, slo, horizon, quanta",
    ]
    assert not (tmp_path / "data").exists()  # nothing was made


def test_the_data_directory_and_database_default_to_one_place(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.delenv("QUANTA_DATA_DIR", raising=False)
    clean_env.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    settings = load_settings()
    assert settings.data_dir == tmp_path / "xdg" / "quanta"
    assert settings.database_url == f"sqlite+aiosqlite:///{tmp_path}/xdg/quanta/quanta.db"
    clean_env.setenv("QUANTA_DATA_DIR", str(tmp_path / "elsewhere"))
    assert load_settings().database_url.endswith(f"{tmp_path}/elsewhere/quanta.db")
