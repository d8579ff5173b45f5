"""API key values, their HMAC and the server secret behind it.

    value     qk-<43 url-safe chars>       shown once, never stored
    prefix    qk-AbCd1234                  stored, shown as redacted_value "qk-AbCd1234…"
    hashed    HMAC-SHA256(secret, value)   stored; what a request's key is looked up by

A leaked database gives neither the keys nor a way to test guesses offline without the secret,
which lives outside the database (QUANTA_SECRET_KEY, or data_dir/secret_key, mode 0600, in a
0700 folder). The database keeps HMAC(secret, CHECK_MESSAGE): a server or CLI whose secret is
missing or another while keys exist stops with the reason, instead of refusing every key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import ApiKey, SecretCheck
from app.server.settings import MIN_SECRET_CHARS, Settings

KEY_PREFIX = "qk-"
PREFIX_CHARS = len(KEY_PREFIX) + 8
SECRET_FILE = "secret_key"
CHECK_MESSAGE = b"quanta: the API-key secret's check value"


def new_key_value() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def prefix_of(value: str) -> str:
    return value[:PREFIX_CHARS]


def redacted(prefix: str) -> str:
    return f"{prefix}…"


def new_id(kind: str) -> str:
    """``ten_0193ab…``: milliseconds first, so ids sort by creation (cursor pagination)."""
    return f"{kind}_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(6)}"


class KeyHasher:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def hash(self, value: str) -> str:
        return hmac.new(self._secret, value.encode(), hashlib.sha256).hexdigest()


class SecretError(RuntimeError):
    """No secret, or another one than the database's keys were made with: serving would
    refuse every key, so nothing starts."""


def prepare_data_dir(folder: Path) -> Path:
    """The data directory, made (0700: it holds the secret) if it does not exist."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def secret_path(settings: Settings) -> Path:
    return Path(settings.data_dir) / SECRET_FILE


def read_secret(settings: Settings) -> bytes | None:
    """The configured secret, else the one in ``data_dir``, else None."""
    if settings.secret_key is not None:
        return settings.secret_key.get_secret_value().encode()
    path = secret_path(settings)
    if not path.is_file():
        return None
    secret = path.read_text().strip()
    if len(secret) < MIN_SECRET_CHARS:
        raise SecretError(f"{path} holds a secret shorter than {MIN_SECRET_CHARS} characters")
    return secret.encode()


def write_secret(settings: Settings) -> bytes:
    """A new secret in ``data_dir/secret_key``, readable by its owner alone."""
    path = secret_path(settings)
    prepare_data_dir(path.parent)
    secret = secrets.token_urlsafe(48)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret.encode()


def secret_check(secret: bytes) -> str:
    return hmac.new(secret, CHECK_MESSAGE, hashlib.sha256).hexdigest()


async def resolve_secret(settings: Settings, session: AsyncSession) -> bytes:
    """The secret the database's keys are hashed with: the configured one, or a new one where
    the database has no keys yet; ``SecretError`` where keys exist and the secret is missing
    or is not theirs."""
    secret = read_secret(settings)
    keys = await session.scalar(select(func.count()).select_from(ApiKey)) or 0
    where = "QUANTA_SECRET_KEY" if settings.secret_key is not None else str(secret_path(settings))
    if secret is None:
        if keys:
            raise SecretError(
                f"the database holds {keys} API keys but {where} does not exist: restore it, "
                "or point QUANTA_DATA_DIR at the folder that has it, or set QUANTA_SECRET_KEY "
                "(a new secret would make every key invalid)"
            )
        secret = write_secret(settings)
    check = secret_check(secret)
    row = await session.scalar(select(SecretCheck).limit(1))
    if row is not None and same_digest(row.check, check):
        return secret
    if row is not None and keys:
        raise SecretError(
            f"the {keys} API keys in the database were made with another secret than "
            f"{where}: set QUANTA_DATA_DIR or QUANTA_SECRET_KEY to the one they were made with"
        )
    if row is None:
        session.add(SecretCheck(id=1, check=check, created_at=time.time()))
    else:
        row.check, row.created_at = check, time.time()
    try:
        await session.commit()
    except IntegrityError:
        # Another replica of a fleet recorded its check first: theirs must be this secret.
        await session.rollback()
        row = await session.scalar(select(SecretCheck).limit(1))
        if row is None or not same_digest(row.check, check):
            raise SecretError(
                f"another server on this database started with another secret than {where}: "
                "give every replica the same QUANTA_SECRET_KEY (or secret_key file)"
            ) from None
    return secret


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def same_digest(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
