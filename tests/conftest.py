from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Tests build Settings explicitly; a developer's config/quanta.toml must not leak in.
os.environ.setdefault("QUANTA_CONFIG", "")  # empty: no file
# ... and the data directory is a temporary one, never the user's.
if "QUANTA_DATA_DIR" not in os.environ:
    os.environ["QUANTA_DATA_DIR"] = tempfile.mkdtemp(prefix="quanta-tests-data-")
    atexit.register(shutil.rmtree, os.environ["QUANTA_DATA_DIR"], True)


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
