"""GBNF grammars for JSON output, from llama.cpp's own JSON grammar and schema converter."""

from __future__ import annotations

import json
from typing import Any

from llama_cpp import llama_grammar


class SchemaError(ValueError):
    """The JSON schema cannot be turned into a grammar."""


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
    return str(llama_grammar.JSON_GBNF)  # its root rule is ``object``


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """A grammar accepting exactly the JSON documents that match ``schema``."""
    try:
        return str(llama_grammar.json_schema_to_gbnf(json.dumps(schema)))
    except Exception as exc:  # the converter raises bare ValueError/KeyError/TypeError
        raise SchemaError(f"unsupported JSON schema: {exc}") from exc
