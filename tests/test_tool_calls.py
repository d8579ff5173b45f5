"""Tool calls without a model: formats read from templates, calls parsed out of text however
it is split, the histories rendered for each format, and the grammar's refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.openai.schemas import ChatMessageIn, ToolCallFunctionIn, ToolCallIn
from app.openai.tool_parser import CallExtractor, parse_calls
from app.openai.tools import ToolFormat, ToolSetup, chat_messages, tool_format
from quanta_core.engine.llama_cpp.grammar import (
    SchemaError,
    check_schema,
    json_object_grammar,
    tool_call_grammar,
)
from quanta_core.engine.tool_grammar import ToolCallGrammar

ADD = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
NAMES = frozenset({"add", "get_weather"})


def setup(fmt: ToolFormat, choice: str = "auto") -> ToolSetup:
    return ToolSetup(fmt, choice, (("add", ADD), ("get_weather", ADD)), True)


def extract(fmt: ToolFormat, text: str, step: int) -> tuple[str, list[tuple[str, str]], bool]:
    """``text`` fed ``step`` characters at a time: (content, calls, cut)."""
    extractor = CallExtractor(setup(fmt))
    content, calls = [], []
    for i in range(0, len(text), step):
        piece, made = extractor.push(text[i : i + step])
        content.append(piece)
        calls.extend(made)
    piece, made = extractor.finish()
    content.append(piece)
    calls.extend(made)
    assert [c.index for c in calls] == list(range(len(calls)))
    return "".join(content), [(c.name, c.arguments) for c in calls], extractor.cut


HERMES = (
    'Let me see. <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"a": 2}}\n</tool_call>\n'
)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_hermes_calls_are_read_however_the_text_is_split(step: int) -> None:
    content, calls, cut = extract(ToolFormat.HERMES, HERMES, step)
    assert content == "Let me see. "
    assert calls == [("add", '{"a": 1}'), ("get_weather", '{"a": 2}')]
    assert not cut


def test_a_cut_call_is_dropped_and_text_like_a_tag_is_released() -> None:
    content, calls, cut = extract(ToolFormat.GENERIC, 'Hi <tool_ca <tool_call>\n{"name": "a', 1)
    assert (content, calls, cut) == ("Hi <tool_ca ", [], True)
    content, calls, cut = extract(ToolFormat.GENERIC, "a < b <tool", 2)
    assert (content, calls, cut) == ("a < b <tool", [], False)


def test_a_malformed_or_unknown_call_is_never_shown_as_text() -> None:
    bad = (
        "<tool_call>\n{nope}\n</tool_call><tool_call>\n"
        + json.dumps({"name": "rm", "arguments": {}})
        + "\n</tool_call>ok"
    )
    assert extract(ToolFormat.HERMES, bad, 4) == ("ok", [], False)


def test_a_list_of_calls_in_one_block_and_parameters_as_a_json_string() -> None:
    text = '<tool_call>[{"name": "add", "arguments": "{\\"a\\": 3}"}, {"name": "add"}]</tool_call>'
    _, calls, _ = extract(ToolFormat.HERMES, text, 5)
    assert calls == [("add", '{"a": 3}'), ("add", "{}")]


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_llama3_and_mistral_answers(step: int) -> None:
    call = '{"name": "add", "parameters": {"a": 5}}'
    assert extract(ToolFormat.LLAMA3, call, step)[:2] == ("", [("add", '{"a": 5}')])
    assert extract(ToolFormat.LLAMA3, " Hello {x}", step)[:2] == (" Hello {x}", [])
    assert extract(ToolFormat.LLAMA3, "{not json", step)[:2] == ("{not json", [])
    mistral = '[TOOL_CALLS][{"name": "add", "arguments": {"a": 6}}]'
    assert extract(ToolFormat.MISTRAL, mistral, step)[:2] == ("", [("add", '{"a": 6}')])


def test_parse_calls_refuses_what_is_not_a_call() -> None:
    for text in ('{"name": "add", "arguments": [1]}', "[]x", '{"arguments": {}}'):
        with pytest.raises(ValueError):
            parse_calls(text, NAMES, ("arguments",))


def test_formats_are_read_from_templates() -> None:
    assert tool_format(None) is ToolFormat.GENERIC
    assert tool_format("{{ messages }}") is ToolFormat.GENERIC
    assert tool_format("{% if tools %}<tool_call>{% endif %}") is ToolFormat.HERMES
    assert tool_format("{% if tools %}[TOOL_CALLS]{% endif %}") is ToolFormat.MISTRAL
    assert tool_format("{% if tools %}<|python_tag|>{% endif %}") is ToolFormat.LLAMA3


def history() -> list[ChatMessageIn]:
    call = ToolCallIn(id="call_1", function=ToolCallFunctionIn(name="add", arguments='{"a": 1}'))
    return [
        ChatMessageIn(role="developer", content="Be brief."),
        ChatMessageIn(role="user", content="Add."),
        ChatMessageIn(role="assistant", content=None, tool_calls=[call]),
        ChatMessageIn(role="tool", content="1", tool_call_id="call_1"),
        ChatMessageIn(role="tool", content="2", tool_call_id="call_1"),
    ]


def test_the_generic_format_renders_calls_and_results_as_text() -> None:
    out = chat_messages(history(), setup(ToolFormat.GENERIC))
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\nYou can call functions.")
    assert '"name": "add"' in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    assert out[3]["content"] == (
        "<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>"
    )


def test_a_native_format_hands_the_template_its_own_terms() -> None:
    out: list[dict[str, Any]] = chat_messages(history(), setup(ToolFormat.HERMES))
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "tool"]
    assert out[2]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 1}}
    assert out[3] == {"role": "tool", "content": "1", "tool_call_id": "call_1", "name": "add"}


def test_unenforceable_schema_keywords_are_named() -> None:
    check_schema({"type": "object", "properties": {"x": {"type": "string", "title": "X"}}})
    with pytest.raises(SchemaError) as exc:
        check_schema(
            {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 1}, "s": {"format": "email"}},
                "patternProperties": {},
            }
        )
    message = str(exc.value)
    assert "minimum (at #/properties/n)" in message
    assert "format 'email'" in message and "patternProperties (at #)" in message
    spec = ToolCallGrammar(functions=(("f", json.dumps({"not": {}})),))
    with pytest.raises(SchemaError, match="function 'f'"):
        tool_call_grammar(spec)


def test_json_whitespace_is_bounded() -> None:
    grammar = json_object_grammar()
    assert 'space ::= " "?' in grammar
    assert "\\t" not in grammar.split("char ::=")[0]


def test_a_call_prefix_is_shared_only_where_every_function_shares_it() -> None:
    one = ToolCallGrammar(functions=(("add", ADD),), max_calls=1, prefilled=True)
    assert one.prefix() == '<tool_call>\n{"name": "add", "arguments":'
    two = ToolCallGrammar(functions=(("add", ADD), ("abs", ADD)), prefilled=True)
    assert two.prefix() == '<tool_call>\n{"name": "a'
    assert ToolCallGrammar(functions=(("add", ADD),), text=True).prefix() == ""
    grammar = tool_call_grammar(two)
    root = next(line for line in grammar.splitlines() if line.startswith("root ::="))
    assert root.startswith('root ::= ( "dd\\", \\"arguments\\":"')
