"""Where the settings come from, and what is wrong with them, said before anything starts.

    flags (quanta run --n-ctx)  >  QUANTA_* environment  >  the TOML file  >  defaults

The TOML file is ``QUANTA_CONFIG`` (``app.server.config_file``).

Every mistake is one line that names where the value came from and what is valid:

    QUANTA_N_CTX=abc: expected an integer >= 64
    --n-ctx=5: expected an integer >= 64
    config/quanta.toml: n_ctx = big: expected an integer >= 64

Unknown ``QUANTA_*`` variables and unknown keys of the file are warnings naming the nearest
setting: the server still starts.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt
from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from app.server.config_file import (
    CONFIG_VARIABLE,
    ConfigError,
    config_file,
    read_config_file,
)
from app.server.settings import Settings

PREFIX = "QUANTA_"
# QUANTA_* variables that are not settings: read by the CLI itself (the config file, the
# bench's key), by the tests (QUANTA_TEST_*, QUANTA_FUZZ_MODEL, QUANTA_LIVE_VIEW_SCREENSHOT)
# and by the bench scripts (QUANTA_STATE).
NOT_SETTINGS = frozenset(
    {
        CONFIG_VARIABLE,
        "QUANTA_API_KEY",
        "QUANTA_FUZZ_MODEL",
        "QUANTA_LIVE_VIEW_SCREENSHOT",
        "QUANTA_STATE",
    }
)
NOT_SETTINGS_PREFIX = "QUANTA_TEST_"


def nearest(name: str) -> str | None:
    """The setting whose name is closest to ``name``, if one is close."""
    close = difflib.get_close_matches(name.lower(), list(Settings.model_fields), n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_names(
    environ: Mapping[str, str], table: Mapping[str, Any], path: Path | None
) -> list[str]:
    """A warning for each QUANTA_* variable and each key of the file that is no setting."""
    fields = Settings.model_fields
    warnings = []
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(PREFIX) or upper in NOT_SETTINGS:
            continue
        if upper.startswith(NOT_SETTINGS_PREFIX):
            continue
        name = variable[len(PREFIX) :].lower()
        if name not in fields:
            close = nearest(name)
            hint = f"; did you mean {PREFIX}{close.upper()}?" if close else ""
            warnings.append(f"{variable} is not a setting (ignored){hint}")
    for key in table:
        if key not in fields:
            close = nearest(key)
            hint = f"; did you mean {close}?" if close else ""
            warnings.append(f"{key} in {path} is not a setting (ignored){hint}")
    return warnings


def load_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    flag_names: Mapping[str, str] | None = None,
    warn: Callable[[str], None] | None = None,
) -> Settings:
    """The settings, or a ``ConfigError`` whose lines say every mistake.

    ``flags`` are the command line's (None values dropped); ``flag_names`` spells the option
    of each field where it is not ``--field-name``. The environment is the process's."""
    env = os.environ
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    path = config_file(env)
    table = read_config_file(path) if path is not None else {}
    for line in unknown_names(env, table, path):
        if warn is not None:
            warn(f"warning: {line}")
    try:
        return Settings(**given)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            where, equals = _origin(field, given, flag_names or {}, env, table, path)
            lines.append(_message(field, where, equals, error))
        raise ConfigError(lines) from None


def _origin(
    field: str,
    flags: Mapping[str, Any],
    flag_names: Mapping[str, str],
    environ: Mapping[str, str],
    table: Mapping[str, Any],
    path: Path | None,
) -> tuple[str, str]:
    """Where the field's value came from, and how its value is written there."""
    if field in flags:
        return flag_names.get(field, "--" + field.replace("_", "-")), "="
    for variable in environ:
        if variable.upper() == PREFIX + field.upper():
            return variable, "="
    if field in table:
        return f"{path}: {field}", " = "
    return PREFIX + field.upper(), "="


def _message(field: str, where: str, equals: str, error: ErrorDetails) -> str:
    info = Settings.model_fields.get(field)
    secret = info is not None and _is_secret(info.annotation)
    value = error.get("input")
    shown = "" if secret or isinstance(value, dict) else f"{equals}{value!s}"
    if error["type"] == "value_error":  # the field's own validator says what is wrong
        reason = str(error["msg"]).removeprefix("Value error, ")
    else:
        reason = valid_values(info) if info is not None else str(error["msg"])
    return f"{where}{shown}: {reason}"


def _is_secret(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def valid_values(info: FieldInfo) -> str:
    """What the field accepts, in words: ``an integer >= 64``, ``one of auto, on, off``."""
    annotation = info.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) < len(
        typing.get_args(annotation)
    )
    base = args[0] if optional and len(args) == 1 else annotation
    if typing.get_origin(base) is Literal:
        words = "one of " + ", ".join(str(a) for a in typing.get_args(base))
    elif base is bool:
        words = "true or false"
    elif base in (int, float):
        words = ("an integer" if base is int else "a number") + _bounds(info)
    elif base is Path:
        words = "a path"
    else:
        words = "a string"
    return "expected " + words + (" (or unset)" if optional else "")


def _bounds(info: FieldInfo) -> str:
    parts = []
    for m in info.metadata:
        if isinstance(m, Ge):
            parts.append(f">= {m.ge}")
        elif isinstance(m, Gt):
            parts.append(f"> {m.gt}")
        elif isinstance(m, Le):
            parts.append(f"<= {m.le}")
        elif isinstance(m, Lt):
            parts.append(f"< {m.lt}")
    return " " + " and ".join(parts) if parts else ""
