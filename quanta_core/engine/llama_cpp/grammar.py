"""GBNF grammars for JSON output and tool calls, built on llama.cpp's JSON-schema converter.

Whitespace between JSON tokens is at most one space (the converter's ``space`` rule, as
vLLM's guided decoding bounds it): with unbounded whitespace a small model can spend its
whole budget on tabs and return cut, invalid JSON. Strings exclude raw control characters,
which JSON does not allow.

A schema keyword the converter would silently ignore is refused (``SchemaError`` names it):
a grammar that enforces less than the schema says would pass answers that do not validate.
``SUPPORTED_KEYWORDS`` lists what is enforced; ``ANNOTATIONS`` are accepted and constrain
nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from llama_cpp import llama_grammar

from quanta_core.engine.tool_grammar import ToolCallGrammar

SUPPORTED_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "pattern",
        "format",
        "minLength",
        "maxLength",
    }
)
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "discriminator",
        "strict",
    }
)
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
FORMATS = frozenset({"date", "time", "date-time", "uuid", *(f"uuid{i}" for i in range(1, 6))})
# JSON forbids raw control characters in strings; the converter's own rule allows them.
STRICT_CHAR = (
    r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] '
    r"[0-9a-fA-F])"
)


class SchemaError(ValueError):
    """The JSON schema cannot be turned into a grammar (the message says which part)."""


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
    converter = _converter()
    converter.visit({"type": "object"}, "")
    return _format(converter)


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """A grammar accepting exactly the JSON documents that match ``schema``."""
    check_schema(schema)
    converter = _converter()
    try:
        converter.visit(converter.resolve_refs(schema, "schema"), "")
    except Exception as exc:  # the converter raises bare ValueError/KeyError/AssertionError
        raise SchemaError(f"unsupported JSON schema: {exc}") from exc
    return _format(converter)


def tool_call_grammar(spec: ToolCallGrammar) -> str:
    """A grammar for ``spec``'s calls (see ``ToolCallGrammar``); a function's schema that
    cannot be enforced raises ``SchemaError`` naming the function.

    Each call is written one way, ``{"name": "f", "arguments": {...}}`` (one optional space
    before the arguments): the grammar gains nothing from freedom in its frame."""
    converter = _converter()
    arguments = []
    for i, (name, parameters) in enumerate(spec.functions):
        schema = _own_defs(json.loads(parameters), f"f{i}-")
        try:
            check_schema(schema)
            arguments.append(converter.visit(converter.resolve_refs(schema, f"f{i}"), f"args{i}"))
        except SchemaError as exc:
            raise SchemaError(f"function '{name}': {exc}") from exc
        except Exception as exc:
            raise SchemaError(f"function '{name}': unsupported JSON schema: {exc}") from exc
    answer = None
    if spec.answer is not None:
        schema = json.loads(spec.answer)
        check_schema(schema)
        try:
            answer = converter.visit(converter.resolve_refs(schema, "answer"), "answer")
        except Exception as exc:
            raise SchemaError(f"unsupported JSON schema: {exc}") from exc
    rules = dict(converter._rules)
    if "char" in rules:
        rules["char"] = STRICT_CHAR
    if spec.text:
        rules.update(_free_text(spec.trigger, "tc-free"))
    if not arguments or spec.max_calls == 0:
        if answer is None and not spec.text:
            raise SchemaError("no function to call")
        rules["root"] = answer or "tc-free"
        return _rules_text(rules)
    close = f" {_literal(spec.close)}" if spec.close else ""

    def calls(skip: int) -> str:
        return " | ".join(
            f"{_literal(spec.head(name)[skip:])} " * bool(spec.head(name)[skip:])
            + f'" "? {args} "}}"'
            for (name, _), args in zip(spec.functions, arguments, strict=True)
        )

    rules["tc-block"] = f"{_literal(spec.open)} ( {calls(0)} ){close}"
    more = f"( {_literal(spec.separator)} tc-block )" if spec.separator else "tc-block"
    rules["tc-more"] = _repeat(more, spec)
    after = f" {_literal(spec.after)}" if spec.after else ""
    if spec.prefilled and (prefix := spec.prefix()):
        skip = len(prefix) - len(spec.before) - len(spec.open)
        rules["root"] = f"( {calls(skip)} ){close} tc-more{after}"
    else:
        before = f"{_literal(spec.before)} " if spec.before else ""
        body = f"{before}tc-block tc-more{after}"
        if answer is not None:
            rules["root"] = f"{answer} | {body}"
        else:
            rules["root"] = f"tc-free ( {body} )?" if spec.text else body
    return _rules_text(rules)


def _own_defs(schema: Any, prefix: str) -> Any:
    """``schema`` with its definitions renamed ``prefix + name`` (and its references with
    them): the converter names a definition's rule by its name alone, so two functions'
    same-named definitions must not meet."""
    if isinstance(schema, list):
        return [_own_defs(s, prefix) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("$defs", "definitions") and isinstance(value, dict):
            out[key] = {prefix + k: _own_defs(v, prefix) for k, v in value.items()}
        elif key == "$ref" and isinstance(value, str):
            out[key] = re.sub(r"^(#/(?:\$defs|definitions)/)", r"\g<1>" + prefix, value)
        else:
            out[key] = _own_defs(value, prefix)
    return out


def check_schema(schema: Any, path: str = "#") -> None:
    """Raise ``SchemaError`` listing every keyword of ``schema`` that the grammar cannot
    enforce (with where it is)."""
    problems = list(_problems(schema, path))
    if problems:
        supported = ", ".join(sorted(SUPPORTED_KEYWORDS))
        raise SchemaError(
            f"unsupported JSON schema features: {'; '.join(problems)} (supported: {supported})"
        )


def _problems(schema: Any, path: str) -> Iterator[str]:
    if isinstance(schema, bool):
        if schema is False:
            yield f"false (at {path})"
        return
    if not isinstance(schema, dict):
        yield f"a schema must be an object (at {path})"
        return
    for key, value in schema.items():
        where = f"{path}/{key}"
        if key in ANNOTATIONS:
            continue
        if key not in SUPPORTED_KEYWORDS:
            yield f"{key} (at {path})"
            continue
        if key == "type":
            kinds = value if isinstance(value, list) else [value]
            bad = [k for k in kinds if not isinstance(k, str) or k not in TYPES]
            if bad or not kinds:
                yield f"type {value!r} (at {path})"
        elif key == "format" and value not in FORMATS:
            yield f"format {value!r} (at {path})"
        elif key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                yield f"{key} must be an object (at {path})"
                continue
            for name, sub in value.items():
                yield from _problems(sub, f"{where}/{name}")
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if not isinstance(value, list) or not value:
                yield f"{key} must be a non-empty array (at {path})"
                continue
            for i, sub in enumerate(value):
                yield from _problems(sub, f"{where}/{i}")
        elif key == "items":
            subs = value if isinstance(value, list) else [value]
            for i, sub in enumerate(subs):
                yield from _problems(sub, f"{where}/{i}" if isinstance(value, list) else where)
        elif key == "additionalProperties":
            if not isinstance(value, bool):
                yield from _problems(value, where)
        elif key == "required":
            names = schema.get("properties", {})
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                yield f"required must be an array of names (at {path})"
            elif isinstance(names, dict) and (missing := [v for v in value if v not in names]):
                yield f"required names {missing} that are not in properties (at {path})"
        elif key in ("minItems", "maxItems", "minLength", "maxLength") and not (
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
        ):
            yield f"{key} must be a non-negative integer (at {path})"
        elif key == "enum" and (not isinstance(value, list) or not value):
            yield f"enum must be a non-empty array (at {path})"
        elif key == "pattern" and not (
            isinstance(value, str) and value.startswith("^") and value.endswith("$")
        ):
            yield f"pattern must be anchored with ^ and $ (at {path})"
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            yield f"$ref {value!r}: only references inside the schema (at {path})"


def _converter() -> Any:
    return llama_grammar.SchemaConverter(  # type: ignore[no-untyped-call]
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )


def _format(converter: Any) -> str:
    rules = dict(converter._rules)
    if "char" in rules:
        rules["char"] = STRICT_CHAR
    return _rules_text(rules)


def _rules_text(rules: dict[str, str]) -> str:
    return "\n".join(f"{name} ::= {rule}" for name, rule in sorted(rules.items()))


def _literal(text: str) -> str:
    return json.dumps(text) if text else '""'


def _repeat(item: str, spec: ToolCallGrammar) -> str:
    """``item`` for the calls after the first: between min_calls - 1 and max_calls - 1."""
    low = max(spec.min_calls - 1, 0)
    if spec.max_calls is None:
        return f"{item}*" if low == 0 else f"{item}{{{low},}}"
    high = max(spec.max_calls - 1, low)
    return '""' if high == 0 else f"{item}{{{low},{high}}}"


def _free_text(word: str, name: str) -> dict[str, str]:
    """Rules for any text that does not contain ``word`` (a KMP automaton: rule ``name-k``
    is "the text so far ends with ``word[:k]``"). Every state may end the text."""
    n = len(word)
    fail = [0] * (n + 1)
    for i in range(1, n):
        k = fail[i]
        while k and word[i] != word[k]:
            k = fail[k]
        fail[i + 1] = k + 1 if word[i] == word[k] else 0
    chars = sorted(set(word))
    rules: dict[str, str] = {}
    for state in range(n):
        alternatives = [""]
        for c in chars:
            k = state
            while k and word[k] != c:
                k = fail[k]
            nxt = k + 1 if word[k] == c else 0
            if nxt == n:
                continue  # the word itself: not free text
            alternatives.append(f"{json.dumps(c)} {name}-{nxt}")
        others = "".join(_class_char(c) for c in chars)
        alternatives.append(f"[^{others}] {name}-0")
        rules[f"{name}-{state}"] = " | ".join(alternatives)
    rules[name] = f"{name}-0"
    return rules


def _class_char(c: str) -> str:
    if c in "\\]^-[":
        return "\\" + c
    if c == "\n":
        return "\\n"
    if c == "\r":
        return "\\r"
    if c == "\t":
        return "\\t"
    return c
