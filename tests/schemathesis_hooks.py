"""schemathesis hooks for ``tests/test_api_fuzz.py`` (loaded through SCHEMATHESIS_HOOKS).

A generated ``model`` is a random string, so every completion would stop at its 404: a string
is swapped for the served model's name (``QUANTA_FUZZ_MODEL``), a string for a string, so a
body that was valid stays valid and one that was invalid stays invalid.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

MODEL = os.environ.get("QUANTA_FUZZ_MODEL", "")


@schemathesis.hook
def map_body(ctx: Any, body: Any) -> Any:
    if MODEL and isinstance(body, dict) and isinstance(body.get("model"), str):
        body["model"] = MODEL
    return body
