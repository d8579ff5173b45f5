"""The CLI is the admin API: every operation through both, the same validation errors, the
CLI's changes in force on a running server, and the data directory fixed per installation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from typer.testing import CliRunner, Result

from app.cli import cli
from app.server.app import create_app
from app.server.settings import Settings
from app.tenancy.cli import hand_over_admin_key
from app.tenancy.service import CHANGES_EVERY_S
from tests.fakes import MODEL, FakeDriver, fake_core
from tests.server_process import free_port
from tests.tenancy_setup import ADMIN, TenancyDb, bearer, fake_app, fresh_db, in_own_loop

Client = AsyncTestClient[Litestar]


def quanta(env: dict[str, str], *args: str) -> Result:
    """The real CLI in this process, off the test's event loop (it runs its own)."""
    return in_own_loop(
        lambda: CliRunner().invoke(cli, list(args), env={"QUANTA_CONFIG": "", **env})
    )


def new_key_of(r: Result) -> str:
    assert r.exit_code == 0, r.output
    return str(json.loads(r.stdout)["value"])


async def ready(c: Client) -> None:
    for _ in range(200):
        if (await c.get("/readyz")).status_code == 200:
            return
        await asyncio.sleep(0.01)


@pytest.fixture
def db(tmp_path: Path) -> TenancyDb:
    return fresh_db(tmp_path)


@pytest.fixture
async def client(db: TenancyDb) -> AsyncIterator[Client]:
    async with AsyncTestClient(fake_app(db, FakeDriver())) as c:
        await ready(c)
        yield c


async def chat(c: Client, key: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = await c.post("/v1/chat/completions", json=body, headers=bearer(key))
    return r.status_code


async def eventually(c: Client, key: str, status: int) -> None:
    """The CLI's change is in force on the running server within a few polls."""
    for _ in range(int(5 / CHANGES_EVERY_S) * 10):
        if await chat(c, key) == status:
            return
        await asyncio.sleep(CHANGES_EVERY_S / 5)
    assert await chat(c, key) == status


# (CLI arguments, the API's method, path and body) that the two must refuse alike; "{t}" is
# the tenant "acme"'s id, "{k}" one of its keys.
SAME_ERRORS: list[tuple[list[str], str, str, Any]] = [
    (["tenants", "create", "bad name"], "POST", "/tenants", {"name": "bad name"}),
    (["tenants", "create", ""], "POST", "/tenants", {"name": ""}),
    (["tenants", "create", "x" * 300], "POST", "/tenants", {"name": "x" * 300}),
    (["tenants", "create", "w", "--weight", "0"], "POST", "/tenants", {"name": "w", "weight": 0}),
    (["tenants", "create", "w", "--weight", "-5"], "POST", "/tenants", {"name": "w", "weight": -5}),
    (["tenants", "create", "acme"], "POST", "/tenants", {"name": "acme"}),
    (["tenants", "update", "acme", "--weight", "0"], "PATCH", "/tenants/{t}", {"weight": 0}),
    (["tenants", "update", "acme", "--name", "a b"], "PATCH", "/tenants/{t}", {"name": "a b"}),
    (["tenants", "update", "acme"], "PATCH", "/tenants/{t}", {}),
    (["tenants", "show", "ten_nope"], "GET", "/tenants/ten_nope", None),
    (["keys", "create", "acme", "--slo-class", "gold"], "POST", "/tenants/{t}/keys",
     {"slo_class": "gold"}),
    (["keys", "create", "acme", "--expires-at", "1"], "POST", "/tenants/{t}/keys",
     {"expires_at": 1}),
    (["keys", "create", "acme", "--name", ""], "POST", "/tenants/{t}/keys", {"name": ""}),
    (["keys", "show", "key_nope"], "GET", "/keys/key_nope", None),
    (["keys", "update", "{k}", "--slo-class", "gold"], "PATCH", "/keys/{k}", {"slo_class": "gold"}),
    (["keys", "rotate", "{k}", "--grace", "-1"], "POST", "/keys/{k}/rotate",
     {"grace_period_s": -1}),
    (["keys", "rotate", "{k}", "--grace", "9999999"], "POST", "/keys/{k}/rotate",
     {"grace_period_s": 9999999}),
    (["keys", "revoke", "key_nope"], "POST", "/keys/key_nope/revoke", None),
    (["quotas", "set", "acme", "--tokens-per-minute", "-1"], "PUT", "/tenants/{t}/quota",
     {"max_tokens_per_1_minute": -1}),
    (["quotas", "set", "{k}", "--concurrent", "-3"], "PUT", "/keys/{k}/quota",
     {"max_concurrent_requests": -3}),
    (["quotas", "show", "acme"], "GET", "/tenants/{t}/quota", None),
    (["quotas", "delete", "{k}"], "DELETE", "/keys/{k}/quota", None),
    (["usage", "--bucket-width", "2h"], "GET", "/usage?bucket_width=2h", None),
    (["usage", "--group-by", "model"], "GET", "/usage?group_by=model", None),
]  # fmt: skip


async def test_the_cli_refuses_what_the_api_refuses_with_the_same_message(
    db: TenancyDb, client: Client
) -> None:
    tenant = (await client.post("/admin/v1/tenants", json={"name": "acme"}, headers=ADMIN)).json()
    key = (
        await client.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={}, headers=ADMIN)
    ).json()
    for args, method, path, body in SAME_ERRORS:
        fill = {"t": tenant["id"], "k": key["id"]}
        api = await client.request(
            method,
            "/admin/v1" + path.format(**fill),
            headers=ADMIN,
            **({} if body is None else {"json": body}),
        )
        assert api.status_code in (400, 404, 409), (args, api.text)
        r = quanta(db.env(), *(a.format(**fill) for a in args))
        assert r.exit_code == 1, (args, r.output)
        assert r.output.strip() == f"error: {api.json()['error']['message']}", args
    # and nothing was changed by either
    listed = (await client.get("/admin/v1/tenants", headers=ADMIN)).json()["data"]
    assert [(t["name"], t["weight"]) for t in listed] == [("acme", 1.0)]


async def test_every_admin_operation_through_the_cli_is_the_apis(
    db: TenancyDb, client: Client
) -> None:
    env = db.env()
    # tenants create: a tenant and a key that serves
    made = quanta(env, "tenants", "create", "acme", "--json")
    first = new_key_of(made)
    tenants = (await client.get("/admin/v1/tenants", headers=ADMIN)).json()["data"]
    assert [t["name"] for t in tenants] == ["acme"]
    tenant_id = tenants[0]["id"]
    assert await chat(client, first) == 200
    # tenants list / show --json: the API's objects
    listed = quanta(env, "tenants", "list", "--json")
    assert json.loads(listed.stdout) == tenants
    shown = json.loads(quanta(env, "tenants", "show", "acme", "--json").stdout)
    assert shown == tenants[0]
    # keys create, list
    second = new_key_of(quanta(env, "keys", "create", "acme", "--slo-class", "batch", "--json"))
    assert await chat(client, second) == 200
    api_keys = (await client.get(f"/admin/v1/tenants/{tenant_id}/keys", headers=ADMIN)).json()
    cli_keys = json.loads(quanta(env, "keys", "list", tenant_id, "--json").stdout)
    assert [k["id"] for k in cli_keys] == [k["id"] for k in api_keys["data"]]
    assert [k["slo_class"] for k in cli_keys] == ["interactive", "batch"]
    second_id = cli_keys[1]["id"]
    # keys update, show
    quanta(env, "keys", "update", second_id, "--name", "etl")
    assert (await client.get(f"/admin/v1/keys/{second_id}", headers=ADMIN)).json()["name"] == "etl"
    assert json.loads(quanta(env, "keys", "show", second_id, "--json").stdout)["name"] == "etl"
    # keys rotate with grace: both values serve; without: the old one stops
    rotated = new_key_of(quanta(env, "keys", "rotate", second_id, "--json"))
    assert await chat(client, rotated) == 200
    assert await chat(client, second) == 200
    again = quanta(env, "keys", "rotate", second_id, "--grace", "0", "--quiet")
    assert again.exit_code == 0 and again.stdout.strip().startswith("qk-")
    await eventually(client, rotated, 401)
    assert await chat(client, again.stdout.strip()) == 200
    # keys revoke: refused at once on the running server
    assert quanta(env, "keys", "revoke", second_id).exit_code == 0
    await eventually(client, again.stdout.strip(), 401)
    # quotas set / show / delete, on the running server
    set_ = quanta(env, "quotas", "set", "acme", "--requests-per-minute", "1", "--json")
    assert set_.exit_code == 0, set_.output
    api_quota = (await client.get(f"/admin/v1/tenants/{tenant_id}/quota", headers=ADMIN)).json()
    assert json.loads(set_.stdout) == api_quota
    assert json.loads(quanta(env, "quotas", "show", "acme", "--json").stdout) == api_quota
    await eventually(client, first, 429)
    assert quanta(env, "quotas", "delete", "acme").exit_code == 0
    assert (
        await client.get(f"/admin/v1/tenants/{tenant_id}/quota", headers=ADMIN)
    ).status_code == 404
    # tenants suspend / resume / update
    assert quanta(env, "tenants", "suspend", "acme").exit_code == 0
    await eventually(client, first, 403)
    assert quanta(env, "tenants", "resume", "acme").exit_code == 0
    assert (
        quanta(env, "tenants", "update", "acme", "--name", "acme2", "--weight", "2").exit_code == 0
    )
    t = (await client.get(f"/admin/v1/tenants/{tenant_id}", headers=ADMIN)).json()
    assert (t["name"], t["weight"], t["status"]) == ("acme2", 2.0, "active")
    # audit: the CLI's actions, as the API lists them
    audit = json.loads(quanta(env, "audit", "--limit", "100", "--json").stdout)
    api_audit = (await client.get("/admin/v1/audit_log?limit=100", headers=ADMIN)).json()
    assert audit["data"] == api_audit["data"]
    assert {a["actor"] for a in audit["data"]} == {"cli"}
    assert "key.rotate" in {a["action"] for a in audit["data"]}
    # usage: the API's buckets
    usage = json.loads(quanta(env, "usage", "--group-by", "tenant", "--json").stdout)
    api_usage = (await client.get("/admin/v1/usage?group_by=tenant", headers=ADMIN)).json()
    assert usage == api_usage
    # tenants delete
    assert quanta(env, "tenants", "delete", "acme2").exit_code == 0
    assert (await client.get(f"/admin/v1/tenants/{tenant_id}", headers=ADMIN)).status_code == 404


def test_the_quickstart_runs_twice_and_both_keys_work(db: TenancyDb) -> None:
    env = db.env()
    one = quanta(env, "tenants", "create", "acme", "--exist-ok", "--quiet")
    two = quanta(env, "tenants", "create", "acme", "--exist-ok", "--quiet")
    assert one.exit_code == two.exit_code == 0, one.output + two.output
    keys = [one.stdout.strip(), two.stdout.strip()]
    assert keys[0] != keys[1] and all(k.startswith("qk-") for k in keys)

    async def serve() -> list[int]:
        async with AsyncTestClient(fake_app(db, FakeDriver())) as c:
            await ready(c)
            return [await chat(c, k) for k in keys]

    assert asyncio.run(serve()) == [200, 200]
    tenants = json.loads(quanta(env, "tenants", "list", "--json").stdout)
    assert [t["name"] for t in tenants] == ["acme"]


def test_keys_made_from_two_folders_work_against_one_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No QUANTA_DATA_DIR, QUANTA_DATABASE_URL or QUANTA_SECRET_KEY: the defaults."""
    for name in ("QUANTA_DATA_DIR", "QUANTA_DATABASE_URL", "QUANTA_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home"))
    env = {"XDG_DATA_HOME": str(tmp_path / "home")}
    keys = []
    for folder, tenant in (("one", "acme"), ("two", "beta")):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        if not keys:
            assert quanta(env, "migrate").exit_code == 0
        r = quanta(env, "tenants", "create", tenant, "--quiet")
        assert r.exit_code == 0, r.output
        keys.append(r.stdout.strip())
    data = tmp_path / "home" / "quanta"
    assert (data.stat().st_mode & 0o777, (data / "secret_key").stat().st_mode & 0o777) == (
        0o700,
        0o600,
    )
    assert not list((tmp_path / "one").iterdir()) and not list((tmp_path / "two").iterdir())
    monkeypatch.chdir(tmp_path)

    async def serve() -> list[int]:
        settings = Settings(admin_key="a" * 32)  # type: ignore[arg-type]
        app = create_app(settings, core_factory=lambda _: fake_core(FakeDriver()))
        async with AsyncTestClient(app) as c:
            await ready(c)
            return [await chat(c, k) for k in keys]

    assert asyncio.run(serve()) == [200, 200]


def test_keys_without_their_secret_stop_the_server_and_the_cli(tmp_path: Path) -> None:
    env = {"QUANTA_DATA_DIR": str(tmp_path / "data")}
    assert quanta(env, "migrate").exit_code == 0
    assert quanta(env, "tenants", "create", "acme").exit_code == 0
    secret = tmp_path / "data" / "secret_key"
    secret.rename(tmp_path / "kept")
    run = quanta(env, "run", "--port", str(free_port()))
    assert run.exit_code == 2
    assert run.output.strip() == (
        f"cannot start: the database holds 1 API keys but {secret} does not exist: restore "
        "it, or point QUANTA_DATA_DIR at the folder that has it, or set QUANTA_SECRET_KEY "
        "(a new secret would make every key invalid)"
    )
    assert not secret.exists()  # no new secret was made
    listed = quanta(env, "keys", "list", "acme")
    assert listed.exit_code == 2 and "does not exist" in listed.output
    # another secret than the keys' own is refused too
    other = quanta({**env, "QUANTA_SECRET_KEY": "another-secret-0123456789abcdef"}, "run")
    assert other.exit_code == 2
    assert "were made with another secret than QUANTA_SECRET_KEY" in other.output
    (tmp_path / "kept").rename(secret)
    assert quanta(env, "keys", "list", "acme").exit_code == 0


def test_without_a_terminal_the_admin_key_goes_to_a_file_not_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run's admin key: on a terminal it is shown once; without one (a service
    manager's log) it is left in a 0600 file and the output says where, not what."""
    hand_over_admin_key("qa-secret-value", tmp_path)
    said = capsys.readouterr()
    path = tmp_path / "admin_key"
    assert path.read_text().strip() == "qa-secret-value"
    assert path.stat().st_mode & 0o777 == 0o600
    assert str(path) in said.err and "qa-secret-value" not in said.err + said.out
