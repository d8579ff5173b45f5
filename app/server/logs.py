"""One log format for the whole process: Quanta's, uvicorn's and every library's lines.

    text   2026-12-05T09:00:00.123Z INFO quanta.request POST /v1/chat/completions 200 tenant=acme …
    json   {"time": "2026-12-05T09:00:00.123Z", "level": "INFO", "logger": "quanta.request",
            "message": "POST /v1/chat/completions 200", "tenant": "acme", …}

A record's structured fields travel in ``extra={"fields": {...}}``: text renders them as
``key=value``, JSON as keys of the object. Nothing here ever sees a request's headers: keys
are never logged.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal

FIELDS = "fields"  # the name of ``extra``'s key that holds a record's structured fields

LogFormat = Literal["text", "json"]


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> Mapping[str, Any]:
    fields = getattr(record, FIELDS, None)
    return fields if isinstance(fields, Mapping) else {}


def _text_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname, record.name, record.getMessage()]
        parts += [f"{k}={_text_value(v)}" for k, v in _fields(record).items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _fields(record).items():
            body.setdefault(key, value)
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def configure_logging(level: str, log_format: LogFormat) -> None:
    """Every logger to stderr in ``log_format``; uvicorn's own handlers and its access log
    off (the server writes one line per request when it ends: ``app.server.request_log``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.getLogger("uvicorn.access").disabled = True
