"""schemathesis, generated from the server's own OpenAPI document, against a live server.

Both surfaces, the tenant's (``/v1``, health) first and then the admin's (its stateful phase
creates, suspends and deletes tenants). Every check runs (``--checks all``, set in the config
file): no 5xx, every status and body as documented, schema-valid requests accepted, every
schema-violating request refused, ``Allow`` truthful. ``tests/schemathesis.toml`` names, with
its reasons, the few operations where a schema-valid request may still be a 400 (rules across
fields that the document states in words: a prompt that overflows the context, a token id
past the vocabulary) and the optional quota that is a 404 until it is set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server_process import ROOT, ServerProcess, start_server
from tests.tenancy_setup import ADMIN_KEY

pytestmark = pytest.mark.model

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
CONFIG = Path(__file__).parent / "schemathesis.toml"
# Examples per operation: enough for the coverage phase's boundary values and some fuzzing,
# within about a minute for both surfaces on two cores.
TENANT_EXAMPLES = 8
ADMIN_EXAMPLES = 15


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    # A small context keeps each fuzzed generation short (max_tokens is bounded by it).
    process = start_server("--n-ctx", "256")
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def fuzz(server: ServerProcess, key: str, paths: list[str], examples: int) -> None:
    models = httpx.get(f"{server.url}/v1/models", headers=server.auth).json()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
        "QUANTA_FUZZ_MODEL": models["data"][0]["id"],
    }
    command = [
        str(SCHEMATHESIS),
        "--config-file",
        str(CONFIG),
        "run",
        f"{server.url}/docs/openapi.json",
        "--header",
        f"Authorization: Bearer {key}",
        *paths,
        "--max-examples",
        str(examples),
        "--max-response-time",
        "300",
        "--request-timeout",
        "300",
        "--seed",
        "1",
        "--generation-database",
        "none",
        "--no-color",
        "--workers",
        "1",
    ]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-20_000:]
    assert server.process.poll() is None  # nothing brought the server down


def test_the_tenant_surface_matches_its_document(server: ServerProcess) -> None:
    fuzz(server, server.api_key, ["--exclude-path-regex", "^/admin/"], TENANT_EXAMPLES)
    # The fuzzed completions reached the model (not only their 400s and 404s).
    tenant = httpx.get(f"{server.url}/v1/key", headers=server.auth).json()["tenant_id"]
    usage = httpx.get(
        f"{server.url}/admin/v1/usage",
        params={"bucket_width": "1h", "tenant_id": tenant},
        headers=server.admin,
    ).json()
    assert sum(b["completion_tokens"] for b in usage["data"]) > 0


def test_the_admin_surface_matches_its_document(server: ServerProcess) -> None:
    fuzz(server, ADMIN_KEY, ["--include-path-regex", "^/admin/"], ADMIN_EXAMPLES)
