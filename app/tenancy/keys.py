"""API key values, their HMAC and the server secret behind it.

    value     qk-<43 url-safe chars>       shown once, never stored
    prefix    qk-AbCd1234                  stored, shown as redacted_value "qk-AbCd1234…"
    hashed    HMAC-SHA256(secret, value)   stored; what a request's key is looked up by

A leaked database gives neither the keys nor a way to test guesses offline without the secret,
which lives outside the database (QUANTA_SECRET_KEY, or data_dir/secret_key, mode 0600).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

from app.server.settings import MIN_SECRET_CHARS, Settings

KEY_PREFIX = "qk-"
PREFIX_CHARS = len(KEY_PREFIX) + 8
SECRET_FILE = "secret_key"


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


def load_secret(settings: Settings) -> bytes:
    """The configured secret, else the one in ``data_dir`` (created on first use)."""
    if settings.secret_key is not None:
        return settings.secret_key.get_secret_value().encode()
    path = Path(settings.data_dir) / SECRET_FILE
    if path.is_file():
        secret = path.read_text().strip()
        if len(secret) < MIN_SECRET_CHARS:
            raise RuntimeError(f"{path} holds a secret shorter than {MIN_SECRET_CHARS} chars")
        return secret.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret.encode()


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def same_digest(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
