"""``pyspec.Llama(chat_format=NAME)``: llama-cpp-python's named chat formats
(pyspec/llama/chat_formats.py, functions.py).

* Golden: each format's prompt, stop strings and BOS rule equal those of
  llama-cpp-python's own formatter of that name (imported here only) on the
  same message lists, as text and as the tokens llama-cpp-python's tokenizer
  makes of them; ``chatml-function-calling``'s prompt is captured from its
  handler run against a stand-in ``Llama``. A negative control shows the
  comparison catches an altered template and every other format's rendering.
* The README's examples with ``from pyspec import Llama``: JSON mode, JSON
  schema mode, a forced function call (whole and streamed), "auto", and a
  named-format chat whose prompt tokens are the golden prompt's.
* Slow tier: tests/fixtures/lcp_scripts/chat_formats.py (the README's
  examples as one script) runs with its import swapped and as written, and
  the two agree in shape and prompt tokens (llama-cpp-python's grammar
  sampling takes a minute there; the tests above run the same calls).

One module-scoped pyspec.Llama on the test model; answers are short (at most 24 tokens).
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from lcp_shapes import same_shape
from pyspec import Llama
from pyspec.llama import chat_formats, functions
from pyspec.llama.chat import prepare

lcf = pytest.importorskip("llama_cpp.llama_chat_format")

#: Phi-3-mini-4k-instruct's chat template (the model's data, as its files
#: carry it): llama-cpp-python renders a Phi-3 GGUF with it.
PHI3_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'system' %}"
                 "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
                 "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
                 "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

PLAIN = [n for n in chat_formats.NAMES if n != chat_formats.FUNCTION_CALLING]
#: Stops pyspec adds to llama-cpp-python's (phi-3 only: chat_formats.py says why).
EXTRA_STOP = {"phi-3": ["<|end|>"]}

MESSAGES = {
    "user": [{"role": "user", "content": "Name a colour."}],
    "system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "multi-turn": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
    "trailing assistant": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}],
    "empty system, unicode": [{"role": "system", "content": ""},
                              {"role": "user", "content": "Grüße, 日本語 ☃ — «ok»? <b>&amp;</b>"}],
    "empty turns": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""},
                    {"role": "user", "content": ""}],
    "tool message": [{"role": "user", "content": "weather?"}, {"role": "tool", "content": "sunny"},
                     {"role": "user", "content": "thanks"}],
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "e.g. <Paris> & 'Rome'"},
                                                   "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city"]}}}
USER = {"type": "function", "function": {
    "name": "UserDetail",
    "parameters": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                   "age": {"type": "integer"}},
                   "required": ["name", "age"], "additionalProperties": False}}}
FORCE_USER = {"type": "function", "function": {"name": "UserDetail"}}
EXTRACT = [{"role": "system", "content": "The assistant calls functions with appropriate input when necessary."},
           {"role": "user", "content": "Extract Jason is 25 years old"}]

FC_MESSAGES = {
    "system and user": EXTRACT,
    "no system": [{"role": "user", "content": "Weather in Paris?"}],
    "escaping": [{"role": "system", "content": "Use <tools> & 'quotes' \"wisely\""},
                 {"role": "user", "content": "Wétter in «Zürich»? a<b && c>d"}],
    "a call and its result": [
        {"role": "system", "content": "S"}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}, {"role": "user", "content": "And Rome?"}],
    "assistant text": [{"role": "system", "content": ""}, {"role": "user", "content": "日本"},
                       {"role": "assistant", "content": "ok"}],
}
FC_CHOICES = {"none given": None, "none": "none", "auto": "auto",
              "named": {"type": "function", "function": {"name": "get_weather"}}}


def lcp_formatter(name):
    if name == "phi-3":
        return lcf.Jinja2ChatFormatter(PHI3_TEMPLATE, eos_token="<|endoftext|>", bos_token="<s>")
    return {"chatml": lcf.format_chatml, "qwen": lcf.format_qwen, "llama-2": lcf.format_llama2,
            "llama-3": lcf.format_llama3, "mistral-instruct": lcf.format_mistral_instruct,
            "gemma": lcf.format_gemma}[name]


def golden(name, messages):
    """llama-cpp-python's (prompt, stop list, add_bos) of ``messages`` in ``name``."""
    r = lcp_formatter(name)(messages=messages)
    stop = [] if r.stop is None else [r.stop] if isinstance(r.stop, str) else list(r.stop)
    return r.prompt, stop, not r.added_special


def problems(name, messages, rendered, *, as_name=None):
    """How ``rendered`` differs from llama-cpp-python's ``name`` on ``messages`` (empty: not at all)."""
    prompt, stop, add_bos = golden(name, messages)
    out = []
    if rendered.prompt != prompt:
        out.append(f"prompt {rendered.prompt!r} != {prompt!r}")
    if rendered.stop != EXTRA_STOP.get(as_name or name, []) + stop:
        out.append(f"stop {rendered.stop} != {stop}")
    if rendered.add_bos != add_bos:
        out.append(f"add_bos {rendered.add_bos} != {add_bos}")
    return out


class StandIn:
    """What llama-cpp-python's chatml-function-calling handler calls: records
    each prompt and its stop strings; the first answer is ``first``."""

    verbose = False

    def __init__(self, first: str) -> None:
        self.first, self.calls = first, []

    def create_completion(self, prompt, stop=None, **_):
        self.calls.append((prompt, stop))
        text = self.first if len(self.calls) == 1 else "<|im_end|>"
        return {"id": "cmpl-x", "created": 0, "model": "m", "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                                      "total_tokens": 2},
                "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}]}


def lcp_function_calling(messages, tool_choice, stop):
    """llama-cpp-python's chatml-function-calling prompt (and stops) for ``messages``."""
    llm = StandIn("functions.get_weather")
    lcf.chatml_function_calling(llama=llm, messages=messages, tools=[WEATHER, USER], tool_choice=tool_choice,
                                stop=stop)
    return llm.calls[0]


@pytest.fixture(scope="module")
def llm(gemma_path):
    with Llama(gemma_path, n_ctx=512, n_threads=2, seed=1, verbose=False, chat_format="chatml") as llm:
        yield llm


@pytest.fixture(scope="module")
def lcp_vocab(gemma_path):
    """llama-cpp-python's tokenizer of the same file (no weights)."""
    import llama_cpp

    return llama_cpp.Llama(gemma_path, vocab_only=True, verbose=False)


def using(llm, name):
    llm.chat_format = name
    return llm


def chat_request(llm, name, messages, **kw):
    kw = {"functions": None, "function_call": None, "tools": None, "tool_choice": None, "response_format": None,
          "grammar": None, **kw}
    return prepare(using(llm, name), messages, **kw)


# ------------------------------------------------------------------ golden

@pytest.mark.parametrize("case", list(MESSAGES))
@pytest.mark.parametrize("name", PLAIN)
def test_each_format_renders_as_llama_cpp_python(name, case):
    assert problems(name, MESSAGES[case], chat_formats.render(name, MESSAGES[case])) == []


@pytest.mark.parametrize("name", PLAIN)
def test_prompt_tokens_and_stops_are_llama_cpp_pythons(llm, lcp_vocab, name):
    """Through create_chat_completion's own preparation: the tokens llama-cpp-python's
    handler makes of its prompt (its tokenizer, its BOS rule) and its stop list."""
    for case, messages in MESSAGES.items():
        prompt, stop, add_bos = golden(name, messages)
        request = chat_request(llm, name, messages)
        assert request.prompt == prompt, case
        assert request.tokens == lcp_vocab.tokenize(prompt.encode(), add_bos=add_bos, special=True), case
        assert request.stops(["\n\n"]) == ["\n\n"] + EXTRA_STOP.get(name, []) + stop
        assert request.stops("Q:") == ["Q:"] + EXTRA_STOP.get(name, []) + stop


@pytest.mark.parametrize("choice", list(FC_CHOICES))
def test_function_calling_renders_as_llama_cpp_python(llm, lcp_vocab, choice):
    for case, messages in FC_MESSAGES.items():
        prompt, stop = lcp_function_calling(messages, FC_CHOICES[choice], ["Q:"])
        request = chat_request(llm, chat_formats.FUNCTION_CALLING, messages, tools=[WEATHER, USER],
                               tool_choice=FC_CHOICES[choice])
        assert request.prompt == prompt, case
        assert request.tokens == lcp_vocab.tokenize(prompt.encode(), add_bos=True, special=True), case
        assert request.stops(["Q:"]) == ["Q:", "<|im_end|>"]
        if choice != "auto":  # llama-cpp-python's first step of "auto" stops at ":"
            assert stop == ["Q:", "<|im_end|>"]


def test_the_golden_check_catches_a_wrong_rendering(monkeypatch):
    """Negative control: every other format's rendering, and each format with
    its template changed by one character (its last one dropped, or a space
    after the first value it prints), fail the comparison above; so does
    chatml-function-calling without its HTML escaping."""
    for name in PLAIN:
        for other in PLAIN:
            if other != name:
                assert any(problems(name, m, chat_formats.render(other, m), as_name=name)
                           for m in MESSAGES.values()), (name, other)
    for name in PLAIN:
        fmt = chat_formats.FORMATS[name]
        for template in (fmt.template[:-1], fmt.template.replace("}}", "}} ", 1)):
            monkeypatch.setitem(chat_formats.FORMATS, name, dataclasses.replace(fmt, template=template))
            monkeypatch.setattr(chat_formats, "_compiled", {})
            assert any(problems(name, m, chat_formats.render(name, m)) for m in MESSAGES.values()), template
    monkeypatch.undo()
    unescaped = chat_formats.FORMATS[chat_formats.FUNCTION_CALLING].template.replace("{{ m.content | e }}",
                                                                                        "{{ m.content }}")
    monkeypatch.setitem(chat_formats.FORMATS, chat_formats.FUNCTION_CALLING,
                        chat_formats.ChatFormat(unescaped, ("<|im_end|>",)))
    monkeypatch.setattr(chat_formats, "_compiled", {})
    prompt, _ = lcp_function_calling(FC_MESSAGES["escaping"], None, [])
    assert chat_formats.render(chat_formats.FUNCTION_CALLING, FC_MESSAGES["escaping"]).prompt != prompt


@pytest.mark.filterwarnings("ignore:.*has no chat template")
def test_unknown_names_and_the_gguf_template(gemma_path, llm):
    with pytest.raises(ValueError, match="chatml-function-calling.*llama-2.*phi-3"):
        Llama(gemma_path, n_ctx=64, verbose=False, chat_format="vicuna-ish")
    with pytest.raises(ValueError, match="chatml-function-calling"):
        chat_request(llm, "vicuna-ish", MESSAGES["user"])  # a name set on the instance, as llama-cpp-python allows
    request = chat_request(llm, "chat_template.default", MESSAGES["user"])
    assert request.prompt is None and request.tokens == llm.model.prompt_tokens(MESSAGES["user"])
    assert request.stops([]) == []


def test_tools_under_a_plain_format_are_as_llama_cpp_pythons(llm):
    """Not shown to the model: "auto" answers in text, a named function is its
    arguments, "required" is refused; a forced call beside a response format too."""
    auto = chat_request(llm, "chatml", EXTRACT, tools=[USER], tool_choice="auto")
    assert auto.prompt == golden("chatml", EXTRACT)[0] and auto.constraint is None and auto.tool_format is None
    named = chat_request(llm, "chatml", EXTRACT, tools=[USER], tool_choice=FORCE_USER)
    assert named.prompt == auto.prompt and named.arguments_of == "UserDetail"
    with pytest.raises(ValueError, match="required"):
        chat_request(llm, "chatml", EXTRACT, tools=[USER], tool_choice="required")
    with pytest.raises(ValueError, match="tool_choice"):
        chat_request(llm, "chatml", EXTRACT, tools=[USER], tool_choice=FORCE_USER,
                     response_format={"type": "json_object"})


# ------------------------------------------------------------------ the answers' parser

def test_function_calling_answers_parse_whole_and_streamed():
    answers = {
        "message:\nHello there": ("Hello there", []),
        'functions.get_weather:\n{"city": "Paris"}': ("", [("get_weather", '{"city": "Paris"}')]),
        'functions.get_weather:\n{"city": "Paris"}\nfunctions.UserDetail:\n{"name": "J", "age": 2}\n':
            ("", [("get_weather", '{"city": "Paris"}'), ("UserDetail", '{"name": "J", "age": 2}')]),
        'functions.get_weather:\n{"city": "Paris"}\nfunctions.get_weather:\n{"ci': ("", [("get_weather",
                                                                                          '{"city": "Paris"}')]),
        '{"a": 1}': ('{"a": 1}', []),
        "mess": ("", []),
    }
    for text, (content, calls) in answers.items():
        got_content, got = functions.parse(text, ["get_weather", "UserDetail"], "cmpl-1")
        assert (got_content, [(c.name, c.arguments) for c in got]) == (content, calls), text
        assert [c.id for c in got] == [f"call__{i}_{c.name}_cmpl-1" for i, c in enumerate(got)]
        p = functions.FunctionsParser(["get_weather", "UserDetail"], "cmpl-1")
        events = [e for ch in text for e in p.feed(ch)] + p.finish()
        assert "".join(v for k, v in events if k == "content") == content, text
        assert [(v.name, v.arguments) for k, v in events if k == "call"] == calls, text


# ------------------------------------------------------------------ answers (the README's examples)

def test_a_named_format_chat_prompts_with_the_golden_tokens(llm, lcp_vocab):
    for name in PLAIN:
        prompt, _, add_bos = golden(name, MESSAGES["system"])
        want = lcp_vocab.tokenize(prompt.encode(), add_bos=add_bos, special=True)
        r = using(llm, name).create_chat_completion(MESSAGES["system"], temperature=0, max_tokens=2)
        assert r["usage"]["prompt_tokens"] == len(want), name
        assert llm.model.native.cached(0)[:len(want)] == want, name  # what the engine was given
        assert r["choices"][0]["finish_reason"] in ("stop", "length")


def test_json_mode(llm):
    r = using(llm, "chatml").create_chat_completion(MESSAGES["user"], response_format={"type": "json_object"},
                                                    temperature=0, max_tokens=24)
    assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)
    assert r["choices"][0]["finish_reason"] == "stop"


TEAM = {"type": "object", "properties": {"team_name": {"type": "string", "maxLength": 8}},
        "required": ["team_name"], "additionalProperties": False}


@pytest.mark.parametrize("response_format", [{"type": "json_object", "schema": TEAM},
                                             {"type": "json_schema", "json_schema": {"name": "t", "schema": TEAM}}],
                         ids=["llama-cpp-python's", "OpenAI's"])
def test_json_schema_mode(llm, response_format):
    r = using(llm, "chatml").create_chat_completion(
        [{"role": "system", "content": "You are a helpful assistant that outputs in JSON."},
         {"role": "user", "content": "Who won the world series in 2020"}], response_format=response_format,
        temperature=0, max_tokens=24)
    answer = json.loads(r["choices"][0]["message"]["content"])
    assert list(answer) == ["team_name"] and isinstance(answer["team_name"], str) and len(answer["team_name"]) <= 8


def check_user_detail(arguments: str) -> None:
    """``arguments`` follow USER's schema."""
    args = json.loads(arguments)
    assert set(args) == {"name", "age"}, args
    assert isinstance(args["name"], str) and len(args["name"]) <= 12 and type(args["age"]) is int


@pytest.mark.parametrize("name", [chat_formats.FUNCTION_CALLING, "chatml"])
def test_a_forced_function_call(llm, name):
    r = using(llm, name).create_chat_completion(EXTRACT, tools=[USER], tool_choice=FORCE_USER, temperature=0,
                                                max_tokens=24)
    choice = r["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls" and message["content"] is None
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "UserDetail"
    assert re.fullmatch(r"call__0_UserDetail_cmpl-[0-9a-f-]+", call["id"])
    check_user_detail(call["function"]["arguments"])
    assert message["function_call"] == call["function"]
    streamed = list(llm.create_chat_completion(EXTRACT, tools=[USER], tool_choice=FORCE_USER, temperature=0,
                                               max_tokens=24, stream=True))
    assert streamed[0]["choices"][0]["delta"] == {"role": "assistant", "content": None, "function_call": None,
                                                  "tool_calls": None}
    pieces = [c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in streamed[1:-1]]
    assert "".join(pieces) == call["function"]["arguments"]
    assert streamed[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_function_calling_auto(llm):
    """Under "auto" the answer is a message or calls, whole and streamed alike."""
    using(llm, chat_formats.FUNCTION_CALLING)
    r = llm.create_chat_completion(EXTRACT, tools=[USER], tool_choice="auto", temperature=0, max_tokens=24)
    message = r["choices"][0]["message"]
    for call in message.get("tool_calls") or []:
        assert call["function"]["name"] == "UserDetail"
        check_user_detail(call["function"]["arguments"])
    if message.get("tool_calls"):
        assert r["choices"][0]["finish_reason"] in ("tool_calls", "length") and message["content"] is None
    else:
        assert isinstance(message["content"], str) and not message["content"].startswith("message:")
    chunks = list(llm.create_chat_completion(EXTRACT, tools=[USER], tool_choice="auto", temperature=0,
                                             max_tokens=24, stream=True))
    calls = [c for ch in chunks for c in ch["choices"][0]["delta"].get("tool_calls") or []]
    assert [c["function"]["arguments"] for c in calls] == [c["function"]["arguments"]
                                                          for c in message.get("tool_calls") or []]
    assert chunks[-1]["choices"][0]["finish_reason"] == r["choices"][0]["finish_reason"]


# ------------------------------------------------------------------ the README's script

def run_script(path: str, pyspec: bool) -> dict:
    from test_llama_compat_scripts import run

    return run("chat_formats.py", path, pyspec)


@pytest.mark.slow
def test_readme_script_runs_on_pyspec(gemma_path):
    out = run_script(gemma_path, True)
    for key in ("json_mode", "json_schema_mode"):
        assert out[key]["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(json.loads(out["json_schema_mode"]["choices"][0]["message"]["content"])["team_name"], str)
    choice = out["function_calling"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    check_user_detail(choice["message"]["tool_calls"][0]["function"]["arguments"])


@pytest.mark.slow
def test_readme_script_agrees_with_llama_cpp_python(gemma_path):
    mine, want = run_script(gemma_path, True), run_script(gemma_path, False)
    same_shape(mine, want)
    for key in mine:
        assert mine[key]["usage"]["prompt_tokens"] == want[key]["usage"]["prompt_tokens"], key
    for out in (mine, want):
        check_user_detail(out["function_calling"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
