"""Several served model names: the setting as the environment gives it (no model)."""

from __future__ import annotations

import pydantic
import pytest

from app.server.settings import Settings


def test_aliases_come_comma_separated_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QUANTA_SERVED_MODEL_NAMES", "smol, gpt-4o-mini,smol,primary")
    s = Settings(model_name="primary")
    assert s.served_model_names == ("smol", "gpt-4o-mini", "smol", "primary")
    assert s.model_aliases() == ("smol", "gpt-4o-mini")  # no repeat, not the primary name
    assert Settings(model_name="primary", served_model_names=["a"]).model_aliases() == ("a",)


def test_an_empty_alias_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="non-empty"):
        Settings(model_name="m", served_model_names="a,,b")
