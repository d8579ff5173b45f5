"""The TOML file of settings: ``QUANTA_CONFIG``.

A file named there that does not exist is an error; unset, ``config/quanta.toml`` is read where
it exists; set empty, no file is read. Keys that are no setting are left out here (and warned
about by ``app.server.config``): the server still starts.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

DEFAULT_CONFIG_FILE = Path("config/quanta.toml")
CONFIG_VARIABLE = "QUANTA_CONFIG"


class ConfigError(Exception):
    """Invalid configuration: one line per mistake."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def config_file(environ: Mapping[str, str] | None = None) -> Path | None:
    """The TOML file to read, or None."""
    env = os.environ if environ is None else environ
    value = env.get(CONFIG_VARIABLE)
    if value is None:
        return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None
    return Path(value) if value.strip() else None


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's table, or the one-line reason it cannot be read."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError([f"{CONFIG_VARIABLE}={path}: no such file"]) from None
    except OSError as exc:
        raise ConfigError([f"{CONFIG_VARIABLE}={path}: cannot be read ({exc.strerror})"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: invalid TOML: {exc}"]) from None


class TomlFile(PydanticBaseSettingsSource):
    """The settings of the ``QUANTA_CONFIG`` file that are settings."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        path = config_file()
        table = read_config_file(path) if path is not None else {}
        self._values = {k: v for k, v in table.items() if k in settings_cls.model_fields}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)
