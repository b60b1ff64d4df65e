"""Tool calls without a model (pyspec/chat/tools.py): the requests' checks, the
grammar each tool_choice gets, and the parser, whose streamed events must add
up to the whole answer's for every way of cutting the text into pieces (one
round of speculation can emit many tokens, or half a tag)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspec.chat.calls import CallParser, parse_calls
from pyspec.chat.tools import ToolChoice, check_choice, check_tools, tool_constraint, tool_format
from pyspec.errors import ConstraintError

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}

HERMES = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
ANSWERS = {
    "hermes": [HERMES, "No call here, just text <tool", "<tool_call>\n{not json}\n</tool_call> after",
               '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "<tool_call>\n{\"name\": \"unfin",
               '<tool_call>\n{"name": "get_time", "arguments": {}}', HERMES + "\n<tool_c",
               '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
               '{"name": "get_time", "arguments": {}}', '```json\n{"name": "other", "arguments": {}}\n```',
               "```python\nprint(1)\n```", "{not a call"],
    "llama3": ['{"name": "get_weather", "parameters": {"city": "Oslo"}}', "The answer is 4.",
               '<|python_tag|>{"name": "get_time", "parameters": {}}', "{broken"],
    "mistral": ['[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome"}}]', "Plain text.",
                '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "X"}}]'],
}


def test_whole_answers_parse_into_calls_and_content():
    content, calls = parse_calls("hermes", HERMES)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                   ("get_time", {})]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    content, calls = parse_calls("hermes", "<tool_call>\n{not json}\n</tool_call> after")
    assert calls == [] and content == "<tool_call>\n{not json}\n</tool_call> after"
    assert parse_calls("llama3", ANSWERS["llama3"][0])[1][0].name == "get_weather"
    assert [c.name for c in parse_calls("mistral", ANSWERS["mistral"][2])[1]] == ["get_time", "get_weather"]
    assert parse_calls("mistral", "Plain text.") == ("Plain text.", [])
    fenced = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'
    assert parse_calls("hermes", fenced) == (fenced, [])  # no tools named: text
    content, calls = parse_calls("hermes", fenced, ["get_weather"])
    assert content == "" and calls[0].name == "get_weather"
    assert parse_calls("hermes", fenced, ["get_time"])[1] == []  # a tool the request does not have


@settings(max_examples=300, deadline=None)
@given(fmt_and_text=st.sampled_from([(f, t) for f, ts in ANSWERS.items() for t in ts]),
       cuts=st.lists(st.integers(0, 200), max_size=12))
def test_streamed_events_add_up_to_the_whole_answer(fmt_and_text, cuts):
    fmt, text = fmt_and_text
    names = ["get_weather", "get_time"]
    content, calls = parse_calls(fmt, text, names)
    p = CallParser(fmt, names)
    events = []
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    for a, b in zip(bounds, bounds[1:]):
        events += p.feed(text[a:b])
    events += p.finish()
    assert "".join(v for k, v in events if k == "content") == content
    assert [(c.name, c.arguments) for k, c in events if k == "call"] == [(c.name, c.arguments) for c in calls]


def test_formats_come_from_the_template():
    assert tool_format("... <tool_call> ...") == "hermes" and tool_format(None) == "hermes"
    assert tool_format("{{ '<|python_tag|>' }}") == "llama3"
    assert tool_format("[TOOL_CALLS] {{ x }}") == "mistral"


@pytest.mark.parametrize("tools, error", [
    ("x", "list"), ([{"type": "function"}], "function"), ([{"function": {"name": ""}}], "name"),
    ([{"function": {"name": "a", "parameters": 3}}], "parameters"), ([TIME, TIME], "twice"),
])
def test_bad_tools_are_refused_with_the_field_named(tools, error):
    with pytest.raises(ConstraintError, match=error):
        check_tools(tools)


def test_tool_choice():
    tools = check_tools([WEATHER, TIME])
    assert check_choice(None, tools) == ToolChoice("auto")
    assert check_choice(None, None) == ToolChoice("none")
    assert check_choice({"type": "function", "function": {"name": "get_time"}}, tools) == \
        ToolChoice("required", "get_time", parallel=False)
    for bad in ({"type": "function", "function": {"name": "nope"}}, "sometimes", 3):
        with pytest.raises(ConstraintError, match="tool_choice"):
            check_choice(bad, tools)
    with pytest.raises(ConstraintError, match="needs tools"):
        check_choice("required", None)
    with pytest.raises(ConstraintError, match="parallel_tool_calls"):
        check_choice("auto", tools, "yes")


def test_grammars_per_choice():
    tools = [WEATHER, TIME]
    assert tool_constraint("hermes", tools, ToolChoice("none")) is None
    required = tool_constraint("hermes", tools, ToolChoice("required", parallel=False))
    assert required.kind == "lark" and "call*" not in required.text and '"get_weather"' in required.text
    auto = tool_constraint("hermes", tools, ToolChoice("auto"))
    assert "[lazy]" in auto.text and "call*" in auto.text
    named = tool_constraint("llama3", tools, ToolChoice("required", "get_time", parallel=False))
    assert "get_weather" not in named.text and '"parameters"' in named.text
    assert tool_constraint("mistral", tools, ToolChoice("required")) is None


# Issue 48: the hermes grammar under "required" must let the turn end after any
# complete call (after its JSON, its closing tag, or the newline after that),
# the tag written as one token or as text, and the parser must read such an end.
CALL = '<tool_call>\n{"name": "get_time", "arguments": {}}'


@pytest.mark.parametrize("parallel", [True, False])
def test_the_required_grammar_lets_the_turn_end_after_any_complete_call(draft_path, load_model, parallel):
    model = load_model(draft_path, "tools", n_ctx=512)
    grammar = model.grammars.compile(tool_constraint("hermes", [WEATHER, TIME], ToolChoice("required",
                                                                                           parallel=parallel)))
    native = model.native
    eos = native.eos

    def tokens(text, tags):  # tags: the tag as the model's own token (as its template writes it), or as text
        return native.tokenize(text, False, tags)

    for tags in (True, False):
        for end in (CALL, CALL + "\n</tool_call>", CALL + "\n</tool_call>\n"):
            prefix = tokens(end, tags)
            assert grammar.valid_prefix(prefix) == len(prefix), (end, tags)
            assert grammar.allowed(prefix)[eos], (end, tags)
        more = tokens(CALL + "\n</tool_call>\n<tool_call>", tags)
        assert (grammar.valid_prefix(more) == len(more)) == parallel
        assert not grammar.allowed(tokens(CALL[:-1], tags))[eos]  # the JSON is not complete


def test_a_call_the_answer_ends_in():
    assert [(c.name, c.arguments) for c in parse_calls("hermes", CALL)[1]] == [("get_time", "{}")]
    closed = CALL + "\n</tool_call>\n"
    for cut in ('<tool_call>\n{"name": "get_ti', closed + "<", closed + "<tool_c", closed + '<tool_call>\n{"na'):
        content, calls = parse_calls("hermes", cut, ["get_time"])
        assert content == "" and len(calls) == (1 if cut.startswith(closed) else 0), cut
    assert parse_calls("hermes", "a < b <") == ("a < b <", [])  # text that ends in "<" keeps it
