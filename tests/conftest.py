from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

# Tests build Settings explicitly; a developer's config/quanta.toml must not leak in.
os.environ.setdefault("QUANTA_CONFIG", "/nonexistent/quanta.toml")


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default model (SmolLM2-135M); model tests are skipped where it cannot run."""
    from app.server.settings import ModelNotFoundError, default_model_path

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    try:
        return default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
