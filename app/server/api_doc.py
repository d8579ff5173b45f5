"""The OpenAPI document, finished: what litestar cannot infer from the handlers.

litestar documents its own error body (``status_code``, ``detail``) for a 400 and nothing for
the statuses raised from services. The server sends OpenAI's body for every error, so every
operation gets, for each status it can answer, ``ErrorResponse``:

    status  when                                         which operations
    400     a parameter out of its bounds (named)        any with parameters or a body
    401     no key, a wrong, revoked or expired key      every /v1 and /admin/v1 one
    403     the key's tenant is suspended                every /v1 one
    404     no such tenant, key, quota or model          any with a path parameter
    409     a name taken, a revoked key rotated          the admin writes that can clash
    413     the body is over ``max_body_bytes``          any with a body
    429     a quota or rate limit (Retry-After)          the completions
            too many unknown keys from one address       every /v1 one
    503     not ready, overloaded, database unavailable  every /v1 and /admin/v1 one

A request body rejects unknown fields (``additionalProperties: false``); an update needs
at least one field (``minProperties: 1``). Rules that span fields are stated in the body's
description.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Router
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin
from litestar.static_files import create_static_files_router

from app.admin import schemas as admin_schemas
from app.openai import responses_schemas
from app.openai import schemas as openai_schemas

ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds after which trying again may work",
        "schema": {"type": "string"},
    }
}
_WHY = {
    400: "Invalid request: a parameter out of its bounds, named in `error.param`",
    401: "No API key, or a wrong, revoked, expired or rotated-out one",
    403: "The key's tenant is suspended",
    404: "No such resource (tenant, key, quota or model)",
    409: "Conflict: the name is taken, or the key is revoked",
    413: "The request body is too large",
    429: "A rate limit or quota of the key or its tenant, or too many unknown keys from one "
    "address; see Retry-After",
    500: "The generation failed in the engine",
    503: "Not ready, overloaded, or the database is unavailable; see Retry-After",
}
_CONFLICTS = {
    ("post", "/admin/v1/tenants"),
    ("patch", "/admin/v1/tenants/{tenant_id}"),
    ("post", "/admin/v1/keys/{key_id}/rotate"),
}
_COMPLETIONS = {"/v1/chat/completions", "/v1/completions", "/v1/responses"}
_TOKENIZER = {"/tokenize", "/detokenize"}  # vLLM's extension, at the root, with a key
_UPDATES = ("TenantUpdate", "KeyUpdate")
_RULES = {
    "ChatCompletionRequest": (
        "Rules across fields: `stream_options` only with `stream: true`; `top_logprobs` only "
        "with `logprobs: true`; `logit_bias` keys and `stop_token_ids` are token ids below "
        "the model's vocabulary size; the prompt plus `max_completion_tokens` (or "
        "`max_tokens`) must fit the model's context (else `context_length_exceeded`); "
        "`tool_choice` other than `none` needs `tools` and may name only one of them; a "
        "`tool` message needs `tool_call_id`; tool `parameters` use only the JSON-schema "
        "keywords the grammar enforces (else a 400 naming the others); "
        "`continue_final_message` needs a final assistant message."
    ),
    "CompletionRequest": (
        "Rules across fields: `stream_options` only with `stream: true`; token ids in "
        "`prompt` and the keys of `logit_bias` are below the model's vocabulary size; one "
        "prompt per request; the prompt plus `max_tokens` must fit the model's context (else "
        "`context_length_exceeded`)."
    ),
    "ResponseRequest": (
        "Rules across fields: `input` items are messages (`role`, `content` as text or text "
        "parts), `function_call` and `function_call_output` items; `previous_response_id` "
        "is a response stored for the key's tenant (else 404); `tool_choice` names one of "
        "`tools`; tool `parameters` use only the JSON-schema keywords the grammar enforces "
        "(else a 400 naming the others); the conversation plus `max_output_tokens` must "
        "fit the model's context."
    ),
    "TokenizeRequest": "Exactly one of `prompt`, `content` or `messages`.",
    "KeyCreate": "`expires_at` must be in the future.",
    "KeyUpdate": "At least one field; `expires_at` must be in the future.",
    "TenantUpdate": "At least one field.",
}


# /docs renders offline: Swagger UI's files come from the swagger-ui-py package (located, not
# imported: its __init__ pulls in its web-framework handlers), served under ASSETS.
ASSETS = "/docs/assets"
SWAGGER_UI_PACKAGE = "swagger_ui"


def swagger_ui_files() -> Path:
    spec = importlib.util.find_spec(SWAGGER_UI_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("/docs needs the swagger-ui-py package (pip install swagger-ui-py)")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def swagger_plugin() -> SwaggerRenderPlugin:
    """Swagger UI with its script, style and icon from this server, never a CDN."""
    return SwaggerRenderPlugin(
        js_url=f"{ASSETS}/swagger-ui-bundle.js",
        css_url=f"{ASSETS}/swagger-ui.css",
        standalone_preset_js_url=f"{ASSETS}/swagger-ui-standalone-preset.js",
        favicon=f"<link rel='icon' type='image/png' href='{ASSETS}/favicon-32x32.png'>",
    )


def docs_assets() -> Router:
    return create_static_files_router(
        path=ASSETS,
        directories=[swagger_ui_files()],
        include_in_schema=False,
        name="docs_assets",
    )


class FinishedJsonPlugin(JsonRenderPlugin):
    """``/docs/openapi.json``, finished once (litestar caches the dict it is handed)."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        if "securitySchemes" not in openapi_schema.get("components", {}):
            finish(openapi_schema)
        return super().render(request, openapi_schema)


def finish(document: dict[str, Any]) -> dict[str, Any]:
    """The document with the server's real error responses, in place, and returned."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    _struct_schemas(schemas)
    _strict_requests(schemas)
    document["components"]["securitySchemes"] = {
        "apiKey": {"type": "http", "scheme": "bearer", "description": "A tenant's API key"},
        "adminKey": {"type": "http", "scheme": "bearer", "description": "The admin key"},
    }
    for path, item in document.get("paths", {}).items():
        for method, op in item.items():
            if method in ("get", "post", "put", "patch", "delete"):
                _finish_operation(path, method, op)
    return document


def _finish_operation(path: str, method: str, op: dict[str, Any]) -> None:
    responses: dict[str, Any] = op.setdefault("responses", {})
    params = op.get("parameters", [])
    statuses: set[int] = set()
    if params or "requestBody" in op:
        statuses.add(400)
    if "requestBody" in op:
        statuses.add(413)
    if any(p.get("in") == "path" for p in params):
        statuses.add(404)
    if path.startswith("/admin/"):
        op["security"] = [{"adminKey": []}]
        statuses |= {401, 503}
    elif path.startswith("/v1/") or path in _TOKENIZER:
        op["security"] = [{"apiKey": []}]
        statuses |= {401, 403, 429, 503}  # 429: unknown keys (app/tenancy/key_flood.py)
    if path in _COMPLETIONS:
        statuses |= {404, 429, 500}  # 404: the model
    if (method, path) in _CONFLICTS:
        statuses.add(409)
    for status in statuses | {int(s) for s in responses if s[0] in "45"}:
        old = responses.get(str(status), {})
        new = _error_response(status)
        if old.get("content", {}).get("application/json", {}).get("schema") == ERROR_REF:
            new["description"] = old.get("description", new["description"])  # said at the route
        responses[str(status)] = new


def _error_response(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _WHY.get(status, "An error, in OpenAI's shape"),
        "content": {"application/json": {"schema": ERROR_REF}},
    }
    if status in (429, 503):
        response["headers"] = RETRY_AFTER
    return response


def _struct_schemas(schemas: dict[str, Any]) -> None:
    """Each struct's schema as msgspec writes it: litestar drops bounds on optional fields
    (``weight: Weight | UnsetType`` loses its ``exclusiveMinimum``)."""
    structs = _structs()
    _, ours = msgspec.json.schema_components(structs, ref_template="#/components/schemas/{name}")
    for name, schema in ours.items():
        if name in schemas:
            schemas[name] = schema


def _strict_requests(schemas: dict[str, Any]) -> None:
    for name in _request_structs():
        schema = schemas.get(name)
        if schema is None:
            continue
        schema["additionalProperties"] = False
        if name in _UPDATES:
            schema["minProperties"] = 1
        if rule := _RULES.get(name):
            schema["description"] = f"{schema.get('description', '')} {rule}".strip()


def _structs() -> list[type[msgspec.Struct]]:
    found = []
    for module in (openai_schemas, responses_schemas, admin_schemas):
        for name, cls in inspect.getmembers(module, inspect.isclass):
            generic = getattr(cls, "__parameters__", ())
            if issubclass(cls, msgspec.Struct) and not name.startswith("_") and not generic:
                found.append(cls)
    return found


def _request_structs() -> list[str]:
    """The request bodies: the structs that refuse unknown fields."""
    return [c.__name__ for c in _structs() if c.__struct_config__.forbid_unknown_fields]
