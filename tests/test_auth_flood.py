"""A flood of bad API keys over real HTTP: it costs a bounded number of database lookups,
other tenants are served throughout, the flooding address is answered 429, and revocation
stays immediate.

Client addresses are real: each client binds its socket to its own loopback address
(127.0.0.x), which the server sees as the peer.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from app.tenancy import keys
from tests.fakes import MODEL, FakeDriver
from tests.tenancy_setup import ADMIN, TenancyDb, bearer, fake_app, fresh_db, over_http

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3}


def client_from(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30)


def bad_key(i: int) -> str:
    return f"qk-made-up-{i:06d}-{'x' * 32}"


class Lookups:
    """Counts the server's database lookups of API keys (statements reading api_keys)."""

    def __init__(self, app: Any) -> None:
        self.count = 0
        event.listen(app.state["tenancy"].engine.sync_engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM api_keys" in statement:
            self.count += 1


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Any, TenancyDb, str]]:
    db = fresh_db(tmp_path)
    good = db.create_key("good-tenant")
    app = fake_app(db, FakeDriver(), auth_failures_per_minute=10, unknown_key_lookups_per_s=1000)
    with over_http(app) as url:
        yield url, app, db, good


def test_a_bad_key_flood_is_bounded_and_other_tenants_are_served(
    served: tuple[str, Any, TenancyDb, str],
) -> None:
    url, app, db, good = served
    lookups = Lookups(app)
    statuses: list[int] = []
    with client_from("127.0.0.2") as flood, client_from("127.0.0.1") as tenant:
        for i in range(200):
            r = flood.post(f"{url}/v1/chat/completions", json=BODY, headers=bearer(bad_key(i)))
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "rate_limit_exceeded"
                assert int(r.headers["retry-after"]) >= 1
            if i % 10 == 0:
                ok = tenant.post(f"{url}/v1/chat/completions", json=BODY, headers=bearer(good))
                assert ok.status_code == 200, ok.text
        assert statuses[:10] == [401] * 10
        assert set(statuses[10:]) == {429}
        assert lookups.count <= 10
        # Another address is not blocked by the flood: its unknown key gets its 401.
        r = tenant.post(f"{url}/v1/chat/completions", json=BODY, headers=bearer(bad_key(999)))
        assert r.status_code == 401
        # A key made outside the server (the CLI) while it runs is still found...
        late = db.create_key("late-tenant")
        r = tenant.post(f"{url}/v1/chat/completions", json=BODY, headers=bearer(late))
        assert r.status_code == 200, r.text
        # ...but not from the blocked address, which is answered before the database.
        before = lookups.count
        other = db.create_key("other-late-tenant")
        r = flood.post(f"{url}/v1/chat/completions", json=BODY, headers=bearer(other))
        assert r.status_code == 429
        assert lookups.count == before
        # Known keys are found in memory even from the blocked address.
        assert flood.get(f"{url}/v1/key", headers=bearer(good)).status_code == 200


def test_revocation_is_immediate_during_a_flood(served: tuple[str, Any, TenancyDb, str]) -> None:
    url, _, _, good = served
    with client_from("127.0.0.3") as flood, client_from("127.0.0.1") as tenant:
        for i in range(30):
            flood.post(f"{url}/v1/chat/completions", json=BODY, headers=bearer(bad_key(i)))
        own = tenant.get(f"{url}/v1/key", headers=bearer(good)).json()
        assert tenant.post(f"{url}/v1/chat/completions", json=BODY, headers=bearer(good)).is_success
        revoked = tenant.post(f"{url}/admin/v1/keys/{own['id']}/revoke", headers=ADMIN)
        assert revoked.status_code == 200, revoked.text
        r = tenant.post(f"{url}/v1/chat/completions", json=BODY, headers=bearer(good))
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"


def test_unknown_key_lookups_are_bounded_across_addresses(tmp_path: Path) -> None:
    db = fresh_db(tmp_path)
    good = db.create_key("good-tenant")
    app = fake_app(db, FakeDriver(), auth_failures_per_minute=1000, unknown_key_lookups_per_s=5)
    with over_http(app) as url:
        lookups = Lookups(app)
        statuses: list[int] = []
        started = time.monotonic()
        for a in range(2, 42):
            with client_from(f"127.0.1.{a}") as flood:
                for i in range(5):
                    r = flood.post(
                        f"{url}/v1/chat/completions", json=BODY, headers=bearer(bad_key(a * 10 + i))
                    )
                    statuses.append(r.status_code)
        elapsed = time.monotonic() - started
        with client_from("127.0.0.1") as tenant:
            ok = tenant.post(f"{url}/v1/chat/completions", json=BODY, headers=bearer(good))
            assert ok.status_code == 200
    assert set(statuses) <= {401, 429}
    assert 429 in statuses
    # A bucket of 5 and 5 a second: at most 5 + 5 per second the flood lasted.
    assert lookups.count <= 5 + 5 * elapsed
    assert lookups.count == statuses.count(401)


def test_api_keys_are_matched_in_constant_time(
    served: tuple[str, Any, TenancyDb, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _, _, good = served
    compared: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def recording(x: bytes, y: bytes) -> bool:
        compared.append((x, y))
        return original(x, y)

    monkeypatch.setattr(keys.hmac, "compare_digest", recording)
    assert httpx.get(f"{url}/v1/key", headers=bearer(good)).status_code == 200
    assert compared, "the key was matched without a constant-time comparison"
    assert all(good.encode() not in pair for pair in compared)  # digests, not keys
