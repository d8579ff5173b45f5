"""Every failure becomes OpenAI's error shape here, and only here.

{"error": {"message": "...", "type": "invalid_request_error", "param": "n", "code": "..."}}
"""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import (
    HTTP_400_BAD_REQUEST,
    HTTP_404_NOT_FOUND,
    HTTP_500_INTERNAL_SERVER_ERROR,
    HTTP_503_SERVICE_UNAVAILABLE,
)
from litestar.types import ExceptionHandlersMap
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.openai.schemas import ErrorBody, ErrorResponse
from app.server.request_id import HEADER, shown_request_id

log = logging.getLogger("quanta.errors")
ERROR_CODE = "quanta_error_code"  # in the scope's state: the code of the error answered

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"


class ApiError(Exception):
    """An error the client is told about, in OpenAI's shape."""

    status_code: int = HTTP_400_BAD_REQUEST
    type: str = INVALID_REQUEST

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        return ErrorResponse(ErrorBody(self.message, self.type, self.param, self.code))


class InvalidParameter(ApiError):
    def __init__(self, param: str, message: str, code: str = "invalid_parameter") -> None:
        super().__init__(message, param=param, code=code)


class UnsupportedParameter(InvalidParameter):
    def __init__(self, param: str, why: str = "") -> None:
        message = f"'{param}' is not supported by this server" + (f": {why}" if why else "")
        super().__init__(param, message, code="unsupported_parameter")


class ContextLengthExceeded(ApiError):
    def __init__(self, n_ctx: int, prompt_tokens: int, max_tokens: int, param: str) -> None:
        super().__init__(
            f"This model's maximum context length is {n_ctx} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} "
            "in the completion). Please reduce the length of the prompt or completion.",
            param=param,
            code="context_length_exceeded",
        )


class ModelNotFound(ApiError):
    status_code = HTTP_404_NOT_FOUND
    type = INVALID_REQUEST

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model '{model}' does not exist", param="model", code="model_not_found"
        )


class NotReady(ApiError):
    status_code = HTTP_503_SERVICE_UNAVAILABLE
    type = UNAVAILABLE

    def __init__(self, why: str) -> None:
        super().__init__(why, code="not_ready", headers={"retry-after": "1"})


class Overloaded(ApiError):
    status_code = HTTP_503_SERVICE_UNAVAILABLE
    type = UNAVAILABLE

    def __init__(self, why: str) -> None:
        super().__init__(why, code="overloaded", headers={"retry-after": "1"})


class DatabaseUnavailable(ApiError):
    """The database cannot be reached, is locked past its busy timeout, or is full."""

    status_code = HTTP_503_SERVICE_UNAVAILABLE
    type = UNAVAILABLE

    def __init__(self, why: str = "the database is unavailable; try again shortly") -> None:
        super().__init__(why, code="database_unavailable", headers={"retry-after": "5"})


class GenerationFailed(ApiError):
    status_code = HTTP_500_INTERNAL_SERVER_ERROR
    type = SERVER_ERROR

    def __init__(self, why: str) -> None:
        super().__init__(why, code="generation_failed")


class ClientDisconnected(ApiError):
    """The client left before the answer was ready (nginx's 499; nobody reads this)."""

    status_code = 499

    def __init__(self) -> None:
        super().__init__("the client closed the request", code="client_closed_request")


class InvalidApiKey(ApiError):
    status_code = 401

    def __init__(self, message: str, code: str = "invalid_api_key") -> None:
        super().__init__(message, code=code)


class TenantSuspended(ApiError):
    status_code = 403

    def __init__(self, tenant: str) -> None:
        super().__init__(f"tenant '{tenant}' is suspended", code="tenant_suspended")


class RateLimited(ApiError):
    """OpenAI's 429: ``type`` is ``requests``/``tokens`` for a rate limit, else a quota."""

    status_code = 429

    def __init__(self, message: str, *, kind: str, code: str, headers: dict[str, str]) -> None:
        super().__init__(message, code=code, headers=headers)
        self.type = kind


class NotFound(ApiError):
    status_code = HTTP_404_NOT_FOUND
    type = NOT_FOUND

    def __init__(self, what: str, ident: str) -> None:
        super().__init__(f"no {what} with id '{ident}'", code=f"{what}_not_found")


class Conflict(ApiError):
    status_code = 409

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param=param, code="conflict")


_HTTP_CODES = {
    404: ("not_found", NOT_FOUND),
    405: ("method_not_allowed", INVALID_REQUEST),
    413: ("request_too_large", INVALID_REQUEST),
}
_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`")
_MISSING_FIELD = re.compile(r"missing required field `([^`]+)`")


def validation_error(exc: ValidationException) -> ApiError:
    """litestar's body validation failure, naming the offending parameter."""
    extra = exc.extra if isinstance(exc.extra, list) and exc.extra else None
    if extra is None or not isinstance(extra[0], dict):
        return ApiError(str(exc.detail), code="invalid_request")
    first: dict[str, Any] = extra[0]
    return _invalid(str(first.get("message", exc.detail)), str(first.get("key", "")) or None)


def struct_error(exc: msgspec.ValidationError) -> ApiError:
    """msgspec's failure to make a request body, as the API says it (``validation_error``):
    the admin CLI decodes its bodies with this, so its errors are the API's."""
    message, _, where = str(exc).partition(" - at `$")
    return _invalid(message, where.strip("`.").split("[")[0] or None)


def _invalid(message: str, key: str | None) -> ApiError:
    field = None
    if unknown := _UNKNOWN_FIELD.search(message):
        field = unknown.group(1)
        message = f"Unrecognized request argument supplied: {field}"
        code = "unrecognized_argument"
    elif missing := _MISSING_FIELD.search(message):
        field = missing.group(1)
        message = f"Missing required parameter: '{field}'"
        code = "missing_required_parameter"
    else:
        message = f"Invalid value for '{key}': {message}"
        code = "invalid_parameter"
    param = key if field is None else field if key in (None, "data") else f"{key}.{field}"
    return ApiError(message, param=param, code=code)


def to_response(error: ApiError, request: Request[Any, Any, Any]) -> Response[ErrorResponse]:
    # Also here: a path no route matches never passes through the request-id middleware.
    headers = {**error.headers, HEADER: shown_request_id(request.scope)}
    state: dict[str, Any] = request.scope.setdefault("state", {})  # type: ignore[assignment]
    state[ERROR_CODE] = error.code or str(error.status_code)  # the request log's reason
    return Response(
        error.body(), status_code=error.status_code, headers=headers, media_type=MediaType.JSON
    )


def _api_error(request: Request[Any, Any, Any], exc: ApiError) -> Response[ErrorResponse]:
    return to_response(exc, request)


def _validation(
    request: Request[Any, Any, Any], exc: ValidationException
) -> Response[ErrorResponse]:
    return to_response(validation_error(exc), request)


def _http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[ErrorResponse]:
    code, kind = _HTTP_CODES.get(exc.status_code, ("invalid_request", INVALID_REQUEST))
    if exc.status_code >= 500:
        kind = SERVER_ERROR
    error = ApiError(str(exc.detail), code=code, headers=dict(exc.headers or {}))
    error.status_code, error.type = exc.status_code, kind
    return to_response(error, request)


def _database(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorResponse]:
    """A database that went away (stopped, locked, disk full) is a 503, not a bug; a broken
    constraint is one."""
    if isinstance(exc, IntegrityError):
        return _unexpected(request, exc)
    log.warning("database unavailable: %s", str(exc).splitlines()[0])
    return to_response(DatabaseUnavailable(), request)


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorResponse]:
    log.exception("unhandled error", exc_info=exc)
    error = ApiError("internal server error", code="internal_error")
    error.status_code, error.type = HTTP_500_INTERNAL_SERVER_ERROR, SERVER_ERROR
    return to_response(error, request)


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    ApiError: _api_error,
    ValidationException: _validation,
    HTTPException: _http,
    DBAPIError: _database,
    PoolTimeout: _database,
    ConnectionError: _database,  # a PostgreSQL that refuses connections
    Exception: _unexpected,
}
