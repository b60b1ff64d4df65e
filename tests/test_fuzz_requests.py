"""Fuzzed requests against one live `pyspec serve` (issue 26; docs/promises.md).

Hypothesis generates request bodies for every route: valid shapes with extreme
values, wrong types, out-of-range and huge numbers, NaN and infinities (Python's
json writes them), control characters, special-token text, lone surrogates
(escaped, or as raw bytes that are not UTF-8), deep nesting and bodies that are
not JSON at all. Half the bodies are strict (every field valid, at its limits),
half loose (any field may be wrong). The properties, per example:

- never a 5xx (a full queue's 503 with Retry-After only where requests overlap);
- the process lives and /health answers "ok" after every example;
- every 4xx is OpenAI's error object; a strict body gets 200, and every 200 is
  the documented answer (whole or streamed), with no more tokens than asked for;

and after the run: no slot busy, nothing queued, no cache cell held by a running
sequence, no 5xx counted by /metrics, no traceback and no prompt in the log.
Chats go to two servers: the small model's own (no template: llama.cpp's
built-in ChatML) and one with a Jinja template that prints every field.

Valid requests stay short (the run fits its budget): mostly up to 4 new tokens,
16 where `max_tokens` is left to the completions' default; a larger or (chat)
missing `max_tokens` comes with a prompt that nearly fills the context, so the
server must end the answer at the room left (huge values included).
Examples per test: MAX_EXAMPLES below (derandomized: CI runs the same ones).

One file of about 680 lines on purpose: the strategies, the two live servers
(module fixtures) and the properties every route's test checks belong together;
split, each file would start its own servers, and the end-of-run checks would
see only part of the traffic.
"""

from __future__ import annotations

import json
import math
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pyspec.chat import RESERVED
from server_helpers import ServerProcess

N_CTX = 256  # llama.cpp rounds a context up to a multiple of 256: the smallest there is
PARALLEL = 4
#: Tokens a "short" valid request asks for at most; a longer one gets a prompt that leaves ROOM.
SHORT = 16
#: Room a long prompt leaves in the context (its answers end there, whatever max_tokens says).
ROOM = 3
MAX_EXAMPLES = {"completions": 120, "chat": 50, "jinja": 50, "raw": 40, "routes": 30, "concurrent": 4, "doors": 60}
DRAFTERS = ["ngram", "consensus", "suffix"]  # those that need no draft model (--model alone)
POLICIES = ["fixed", "heuristic", "confidence", "svip", "auto"]


def fuzz_settings(name: str):
    # The server's answer time varies with the machine's load: no deadline.
    return settings(max_examples=MAX_EXAMPLES[name], deadline=None, derandomize=True, database=None)


# ------------------------------------------------------------------ the server
class Live:
    """The server under test, a keep-alive client, and what the fuzz needs to
    know of the model: its vocabulary size and prompts that nearly fill the context."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.http = httpx.Client(base_url=server.url(), timeout=60)
        meta = self.http.get("/v1/models").json()["data"][0]["meta"]
        assert meta["n_ctx"] == N_CTX, meta
        self.n_vocab = meta["n_vocab"]
        # Token ids of plain text (ids near 0 are control tokens that some vocabularies refuse to print).
        self.long_ids = [1000 + i % 500 for i in range(N_CTX - ROOM)]
        self.long_text = self._chat_text_of_length(N_CTX - ROOM)

    def _chat_text_of_length(self, n: int) -> str:
        """A user message whose chat prompt (under the server's template) is ``n`` tokens."""
        words = n // 2  # a word a token, near enough: corrected from the server's count
        for _ in range(4):
            text = "hello " * words
            r = self.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": text}],
                                                             "max_tokens": 0})
            got = r.json()["usage"]["prompt_tokens"]
            if got == n:
                return text
            words += n - got
        raise AssertionError(f"no chat text of {n} tokens (last: {got})")

    def alive(self) -> None:
        assert self.server.proc.poll() is None, f"the server died:\n{self.server.output()[-4000:]}"
        h = self.http.get("/health")
        assert h.status_code == 200 and h.json()["status"] == "ok", h.text


def serve(gemma_path: str, *args: str):
    # One thread: on a busy 2-core machine, two threads that wait for each other
    # at every barrier make the small model's steps up to 10x slower.
    s = ServerProcess("--model", gemma_path, "--parallel", str(PARALLEL), "--n-ctx", str(N_CTX),
                      "--queue-size", "4", "--model-alias", "gemma", "--threads", "1", *args)
    lv = Live(s)
    yield lv
    lv.http.close()
    assert s.stop() == 0


@pytest.fixture(scope="module")
def live(gemma_path):
    """The small model, whose file has no chat template: chats get llama.cpp's built-in ChatML."""
    yield from serve(gemma_path)


#: A template that prints every field a chat may give it, as tool-use templates do
#: (tools and tool calls through tojson), so that the fuzz reaches the Jinja renderer.
TEMPLATE = """{% if tools %}<start_of_turn>system
{{ tools | tojson }}<end_of_turn>
{% endif %}{% for m in messages %}<start_of_turn>{{ m.role }}
{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}
{%- if m.name %} ({{ m.name }}){% endif %}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}
{%- if m.tool_call_id %} [{{ m.tool_call_id }}]{% endif %}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}"""


@pytest.fixture(scope="module")
def live_jinja(gemma_path, tmp_path_factory):
    """The small model with TEMPLATE as its chat template (--chat-template)."""
    path = tmp_path_factory.mktemp("template") / "tools.jinja"
    path.write_text(TEMPLATE)
    yield from serve(gemma_path, "--chat-template", str(path))


# ------------------------------------------------------------------ strategies
SPECIAL = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>", "<pad>", "\x00",
           "\ufeff", "\u202e", "\r\n", "\t", "{{ x }}", "{% for %}", "\\u0000", "😀", "語"]
clean_text = st.one_of(
    st.text(max_size=10),
    st.sampled_from(SPECIAL),
    st.lists(st.sampled_from(SPECIAL) | st.text(max_size=3), max_size=4).map("".join),
)
#: Any text at all: lone surrogates included (not Unicode text: the server must refuse them).
any_text = st.one_of(clean_text, st.text(st.characters(exclude_categories=()), max_size=6),
                     st.tuples(clean_text, st.characters(categories=["Cs"])).map("".join))
EXTREME_INTS = [0, -1, 1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, -2**63, 10**30]
any_int = st.sampled_from(EXTREME_INTS) | st.integers()
EXTREME_FLOATS = [0.0, -0.0, 5e-324, 1e-300, 1e300, math.nan, math.inf, -math.inf, 2.0000001, -1e-9, 1.0]
any_float = st.sampled_from(EXTREME_FLOATS) | st.floats()


def json_values(text, floats=any_float):
    """Any JSON value (nested a little) whose strings are drawn from ``text``
    and numbers from ``floats``."""
    scalars = st.none() | st.booleans() | any_int | floats | text
    return st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3),
                        max_leaves=6)


junk = json_values(any_text)
#: Values a valid request may hold where the API takes anything (tools, template variables): JSON,
#: so no NaN or Infinity (Python's JSON writes them; RFC 8259 has none, and the server refuses them).
clean_junk = json_values(clean_text, st.floats(allow_nan=False, allow_infinity=False))


#: Valid tool definitions (names unique), and constraints of each kind.
tool_defs = st.lists(st.fixed_dictionaries({
    "type": st.just("function"),
    "function": st.fixed_dictionaries({
        "name": st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
        "parameters": st.sampled_from([{"type": "object", "properties": {"x": {"type": "integer"}}},
                                       {"type": "object"}]),
    }),
}), min_size=1, max_size=2, unique_by=lambda t: t["function"]["name"])
RESPONSE_FORMATS = [{"type": "text"}, {"type": "json_object"},
                    {"type": "json_schema", "json_schema": {"name": "n", "schema": {
                        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
CONSTRAINTS = {"json_schema": st.sampled_from([{"type": "integer"}, {"type": "object"}, True]),
               "grammar": st.sampled_from(['root ::= "yes" | "no"', 'start: /[a-z]{1,8}/'])}


def maybe(valid, wrong=None):
    """A field's value: valid, or (on a fuzzed body) also out of range or of another type."""
    return valid if wrong is None else st.one_of(valid, wrong, junk)


@st.composite
def sampling_fields(draw, loose: bool, kind: str, n_vocab: int) -> Dict[str, Any]:
    """The fields both endpoints share; ``loose``: any of them may be wrong."""
    w = (lambda valid, wrong: maybe(valid, wrong)) if loose else (lambda valid, wrong: valid)
    fields = {
        "model": w(st.sampled_from([None, "gemma"]), any_text),
        "temperature": w(st.sampled_from([0, 0.0, 2, 1e-300, 5e-324]) | st.floats(0, 2), any_float),
        "top_p": w(st.sampled_from([1, 1e-300]) | st.floats(0, 1, exclude_min=True), any_float),
        "top_k": w(st.sampled_from([0, 1, n_vocab, n_vocab + 1, 2**31, 2**63, 10**30]) | st.integers(0, 50),
                   any_int),
        "min_p": w(st.floats(0, 1), any_float),
        "seed": w(st.sampled_from([0, 2**63 - 1]) | st.integers(0, 2**63 - 1), any_int),
        "stop": w(st.none() | clean_text.filter(bool) | st.lists(clean_text.filter(bool), max_size=4)
                  | st.sampled_from([["x" * 500] * 100, [chr(c) for c in range(32, 800)]]),
                  st.lists(any_text, max_size=3)),
        "n": w(st.integers(1, PARALLEL), any_int),
        "user": w(st.none() | clean_text, any_text),
        "draft_max": w(st.integers(0, 63), any_int),
        "policy": w(st.sampled_from(POLICIES), any_text),
        "drafter": w(st.sampled_from(DRAFTERS), any_text | st.just("model")),
        "frequency_penalty": w(st.none() | st.floats(-2, 2), any_float),
        "presence_penalty": w(st.none() | st.floats(-2, 2), any_float),
        "repeat_penalty": w(st.none() | st.floats(0.5, 2), any_float),
        "logit_bias": w(st.none() | st.dictionaries(st.integers(0, 100).map(str), st.floats(-100, 100),
                                                    max_size=2),
                        st.dictionaries(clean_text, any_int, max_size=2)),
        # The neutral value of a field pyspec does not implement; on a fuzzed body, any value.
        "best_of" if kind == "completion" else "tool_choice":
            w(st.sampled_from([1, None] if kind == "completion" else ["none", "auto", None]), junk),
    }
    body = {}
    for name, strategy in fields.items():
        if draw(st.booleans()):
            body[name] = draw(strategy)
    # At most one constraint on a valid body (two are a 400).
    name = draw(st.sampled_from([None, *CONSTRAINTS]))
    if name is not None:
        body[name] = draw(w(CONSTRAINTS[name], junk | st.just('root ::= "unclosed')))
    if draw(st.booleans()):
        body["stream"] = draw(w(st.booleans(), junk))
    if draw(st.booleans()) and (loose or body.get("stream") is True):
        body["stream_options"] = draw(w(st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}), junk))
    if loose and draw(st.integers(0, 9)) == 0:
        body[draw(any_text)] = draw(junk)  # a field nobody implements
    return body


def token_ids(n_vocab: int, loose: bool):
    valid = st.lists(st.integers(0, n_vocab - 1), min_size=1, max_size=8)
    if not loose:
        return valid
    out_of_range = st.lists(st.sampled_from([-1, n_vocab, n_vocab + 1, 2**31, 2**63, 2**64, -2**63, 10**30])
                            | st.integers(), min_size=1, max_size=4)
    return valid | out_of_range | st.lists(st.booleans() | any_float, min_size=1, max_size=3)


def completion_prompt(n_vocab: int, loose: bool):
    ids = token_ids(n_vocab, loose)
    valid = st.one_of(clean_text, ids, st.lists(clean_text, min_size=1, max_size=3),
                      st.lists(ids, min_size=1, max_size=3))
    return maybe(valid, st.one_of(any_text, st.just([]), st.just([[]]), st.lists(st.lists(junk), max_size=2))) \
        if loose else valid


ROLES = ["system", "user", "assistant", "tool", "developer", "", "\x00", "function", "x" * 300]


def message(loose: bool):
    part = st.fixed_dictionaries({"type": st.just("text"), "text": clean_text})
    content = st.none() | clean_text | st.lists(part, max_size=3)
    anything = junk if loose else clean_junk
    # OpenAI's tool calls: arguments as a JSON string (on a fuzzed body, any string)
    arguments = any_text if loose else clean_junk.map(json.dumps)
    calls = st.lists(st.fixed_dictionaries({"function": st.fixed_dictionaries(
        {"name": clean_text, "arguments": arguments})}), max_size=2)
    extras = {"name": clean_text | anything, "tool_calls": (junk | calls) if loose else st.none() | calls,
              "tool_call_id": anything, "reasoning_content": anything}
    if loose:
        content = maybe(content, st.lists(st.fixed_dictionaries({"type": any_text, "text": junk}), max_size=2))
        extras["image"] = junk
    return st.fixed_dictionaries({"role": maybe(st.sampled_from(ROLES) | clean_text, any_text) if loose
                                  else st.sampled_from(ROLES), "content": content}, optional=extras)


@st.composite
def bodies(draw, kind: str, live: "Live", loose: Optional[bool] = None) -> Tuple[Dict[str, Any], bool]:
    """(body, loose): one request body for ``kind`` ("completion" or "chat"): a
    strict one (every field valid, values at their limits: the server must answer
    it) or, as often, a loose one (any field may be wrong)."""
    loose = draw(st.booleans()) if loose is None else loose
    n_vocab = live.n_vocab
    body = draw(sampling_fields(loose, kind, n_vocab))
    # Mostly a few; one in eight absent (chat: until the context is full) and one in
    # eight past SHORT: those get the long prompt (below), whose prefill costs.
    past_short = st.sampled_from([SHORT + 1, N_CTX, 2**31, 2**63, 10**30])
    tokens = st.integers(0, 7).flatmap(lambda i: past_short if i == 0 else st.integers(0, 4))
    if kind == "completion":
        body["prompt"] = draw(completion_prompt(n_vocab, loose))
        if not loose and "n" in body:  # within the slots: n per prompt
            body["n"] = min(body["n"], PARALLEL // _n_choices({"prompt": body["prompt"]}, kind))
        if draw(st.booleans()):
            body["logprobs"] = draw(maybe(st.integers(0, 20), any_int) if loose else st.integers(0, 20))
        budget = ["max_tokens"]
    else:
        chats = st.lists(message(loose), min_size=1, max_size=4)
        body["messages"] = draw(maybe(chats, junk) if loose else chats.filter(_continuable))
        if draw(st.booleans()):
            body["logprobs"] = draw(maybe(st.booleans(), junk) if loose else st.booleans())
            if draw(st.booleans()) and (loose or body["logprobs"]):
                body["top_logprobs"] = draw(maybe(st.integers(0, 20), any_int) if loose else st.integers(0, 20))
        extras = {"tools": tool_defs,
                  "chat_template_kwargs": st.dictionaries(clean_text.filter(lambda k: k not in RESERVED),
                                                          clean_junk, max_size=2),
                  "response_format": st.sampled_from(RESPONSE_FORMATS[:1] if any(n in body for n in CONSTRAINTS)
                                                     else RESPONSE_FORMATS),
                  "parallel_tool_calls": st.booleans()}
        for name, valid in extras.items():
            if draw(st.booleans()):
                wrong = st.just({"type": "json_schema"}) | st.lists(st.dictionaries(clean_text, clean_junk,
                                                                                      max_size=3), max_size=2)
                body[name] = draw(maybe(valid, wrong) if loose else valid)
        if (not loose and body.get("tools") and "response_format" not in body
                and not any(n in body for n in CONSTRAINTS) and draw(st.booleans())):
            body["tool_choice"] = "required"  # issue 48: the calls' grammar must let the turn end
        budget = ["max_tokens", "max_completion_tokens"]
    for name in budget:
        if draw(st.integers(0, 7)):
            body[name] = draw(maybe(tokens, any_int) if loose else tokens)
    if _may_run_long(body, kind):
        # The server must end this answer at the context: give it little room.
        if kind == "completion":
            body["prompt"] = list(live.long_ids)
        else:
            body["messages"] = [{"role": "user", "content": live.long_text}]
            body.pop("tools", None)
            if body.get("tool_choice") == "required":  # needs tools
                del body["tool_choice"]
            body.pop("chat_template_kwargs", None)
    return body, loose


def _continuable(messages: List[Dict[str, Any]]) -> bool:
    """Not a chat the renderer refuses: one that ends with two assistant
    messages, or continues an assistant message that made tool calls."""
    if messages[-1]["role"] != "assistant":
        return True
    return not messages[-1].get("tool_calls") and (len(messages) < 2 or messages[-2]["role"] != "assistant")


def _may_run_long(body: Dict[str, Any], kind: str) -> bool:
    """Could this request, if valid, ask for more than SHORT tokens?"""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    v = body.get(name, 16 if kind == "completion" else None)
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and not v <= SHORT)


def encoded(body: Any, how: str) -> bytes:
    """``body`` as JSON: escaped ASCII (NaN, Infinity, lone surrogates as \\ud800),
    raw UTF-8 (lone surrogates as bytes that are not UTF-8), or cut short."""
    text = json.dumps(body)
    if how == "utf8":
        return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if how == "cut":
        return text.encode()[: len(text) // 2]
    return text.encode()


# ------------------------------------------------------------------ checks
def check_error(status: int, obj: Any, where: str) -> None:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    assert isinstance(obj, dict) and isinstance(obj.get("error"), dict), f"{where}: {status} {obj!r}"
    err = obj["error"]
    assert isinstance(err.get("message"), str) and err["message"], (where, err)
    assert isinstance(err.get("type"), str) and err["type"], (where, err)
    assert "param" in err and (err["param"] is None or isinstance(err["param"], str)), (where, err)
    assert "code" in err and (err["code"] is None or isinstance(err["code"], str)), (where, err)


def _limit(body: Dict[str, Any], kind: str) -> int:
    """Most tokens one choice may get: max_tokens, clamped to the context."""
    v = body.get("max_completion_tokens") if kind == "chat" else None
    v = body.get("max_tokens") if v is None else v
    if v is None:
        v = 16 if kind == "completion" else N_CTX
    return min(v, N_CTX)


def _n_choices(body: Dict[str, Any], kind: str) -> int:
    n = body.get("n") or 1
    p = body.get("prompt")
    prompts = len(p) if kind == "completion" and isinstance(p, list) and isinstance(p[0], (str, list)) else 1
    return n * prompts


def _check_logprobs(lp: Any, kind: str, k: int, where: str) -> None:
    """A choice's logprobs object: finite log-probabilities, k alternatives per token."""
    assert isinstance(lp, dict), (where, lp)
    if kind == "chat":
        for e in lp["content"]:
            assert isinstance(e["token"], str) and isinstance(e["bytes"], list), (where, e)
            assert math.isfinite(e["logprob"]) and e["logprob"] <= 1e-6, (where, e)
            assert len(e["top_logprobs"]) == k, (where, e)
            assert all(math.isfinite(t["logprob"]) and t["logprob"] <= 1e-6 for t in e["top_logprobs"]), where
    else:
        toks = lp["tokens"]
        assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == len(toks), where
        assert all(math.isfinite(v) and v <= 1e-6 for v in lp["token_logprobs"]), where
        assert all(len(top) <= k for top in lp["top_logprobs"]), where  # pieces of equal text share a key
        assert lp["text_offset"] == sorted(lp["text_offset"]), where


def _logprobs_k(body: Dict[str, Any], kind: str) -> Optional[int]:
    if kind == "chat":
        return (body.get("top_logprobs") or 0) if body.get("logprobs") else None
    return body.get("logprobs")


def _calls_are_constrained(body: Dict[str, Any]) -> bool:
    """The calls' grammar shapes this chat (tools, no other constraint)."""
    return (isinstance(body.get("tools"), list) and bool(body["tools"]) and body.get("tool_choice") != "none"
            and "response_format" not in body and not any(n in body for n in CONSTRAINTS))


def check_calls(body: Dict[str, Any], content: str, n_calls: int, finish: str, where: str) -> None:
    """Under the calls' grammar no call markup is content, even of a call cut
    short; an answer with calls ends "tool_calls" unless cut; under "required",
    an answer that ended on its own made a call (issue 48)."""
    if not _calls_are_constrained(body):
        return
    assert "<tool_call>" not in content and "</tool_call>" not in content, (where, content)
    if n_calls:
        assert finish in ("tool_calls", "length"), (where, finish)
    if body.get("tool_choice") == "required" and not body.get("stop") and finish != "length":
        assert n_calls and finish == "tool_calls", (where, finish, content)


def check_whole(body: Dict[str, Any], kind: str, answer: Dict[str, Any], where: str) -> None:
    """A 200 answer's documented shape: one choice per prompt and n, each with its
    text and finish reason, usage adding up, no choice past max_tokens."""
    assert answer["object"] == ("chat.completion" if kind == "chat" else "text_completion"), where
    assert answer["id"].startswith("chatcmpl-" if kind == "chat" else "cmpl-") and answer["model"] == "gemma", where
    assert isinstance(answer["created"], int), where
    choices = answer["choices"]
    assert [c["index"] for c in choices] == list(range(_n_choices(body, kind))), where
    k = _logprobs_k(body, kind)
    for c in choices:
        if kind == "chat":
            m = c["message"]
            assert m["role"] == "assistant", where
            if m.get("tool_calls"):  # content null with calls; each call's arguments a JSON object's text
                assert m["content"] is None or isinstance(m["content"], str), where
                for call in m["tool_calls"]:
                    assert call["type"] == "function" and call["id"].startswith("call_"), where
                    assert isinstance(json.loads(call["function"]["arguments"]), dict), where
            else:
                assert isinstance(m["content"], str), where
            check_calls(body, m["content"] or "", len(m.get("tool_calls") or []), c["finish_reason"], where)
        else:
            assert isinstance(c["text"], str), where
        assert c["finish_reason"] in ("stop", "length", "tool_calls"), where
        if k is None:
            assert c["logprobs"] is None, where
        else:
            _check_logprobs(c["logprobs"], kind, k, where)
            n_tok = len(c["logprobs"]["content" if kind == "chat" else "tokens"])
            assert n_tok <= _limit(body, kind), (where, n_tok)
    u = answer["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["prompt_tokens"] > 0, where
    assert 0 <= u["completion_tokens"] <= len(choices) * _limit(body, kind), (where, u)
    if _limit(body, kind) == 0:
        assert u["completion_tokens"] == 0 and all(c["finish_reason"] == "length" for c in choices), where
    assert isinstance(answer["timings"], dict), where


def check_stream(body: Dict[str, Any], kind: str, lines: List[str], where: str, valid: bool = False) -> None:
    """A 200 stream: `data: {chunk}` lines, each choice finishing once, then [DONE];
    or (not ``valid``) an error object in OpenAI's shape, which ends it."""
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert data, (where, lines[:5])
    chunks = [json.loads(d) for d in data if d != "[DONE]"]
    if chunks and "error" in chunks[-1]:  # refused after the answer began: the error ends the stream
        assert not valid, (where, chunks[-1])
        check_error(200, chunks[-1], where)
        return
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1, (where, data[-3:])
    n_choices = _n_choices(body, kind)
    finished = [0] * n_choices
    k = _logprobs_k(body, kind)
    tokens = [0] * n_choices
    contents, calls, finishes = [""] * n_choices, [set() for _ in range(n_choices)], [""] * n_choices
    usage = None
    for ch in chunks:
        assert ch["object"] == ("chat.completion.chunk" if kind == "chat" else "text_completion"), where
        usage = ch.get("usage") or usage
        for c in ch["choices"]:
            i = c["index"]
            assert finished[i] == 0, (where, "a chunk after the choice's finish", ch)
            delta = c.get("delta") or {}
            contents[i] += delta.get("content") or ""
            calls[i].update(t["index"] for t in delta.get("tool_calls") or [])
            finishes[i] = c["finish_reason"] or finishes[i]
            if c["finish_reason"] is not None:
                assert c["finish_reason"] in ("stop", "length", "tool_calls"), where
                finished[i] += 1
            elif c["logprobs"] is not None:
                assert k is not None, where
                _check_logprobs(c["logprobs"], kind, k, where)
                tokens[i] += len(c["logprobs"]["content" if kind == "chat" else "tokens"])
    assert finished == [1] * n_choices, (where, finished)
    if kind == "chat":
        for i in range(n_choices):
            check_calls(body, contents[i], len(calls[i]), finishes[i], where)
    assert all(t <= _limit(body, kind) for t in tokens), (where, tokens)
    assert usage is not None and usage["completion_tokens"] <= n_choices * _limit(body, kind), (where, usage)
    if (body.get("stream_options") or {}).get("include_usage"):
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"], where


def exchange(live: Live, method: str, path: str, raw: bytes, *, headers=None, leave_early=False):
    """Send one request; (status, headers, JSON body or None, SSE lines)."""
    with live.http.stream(method, path, content=raw, headers=headers) as r:
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                if leave_early and len(lines) >= 2:
                    return r.status_code, r.headers, None, None  # the client left mid-answer
            return r.status_code, r.headers, None, lines
        data = r.read()
    try:
        return r.status_code, r.headers, json.loads(data) if data else None, None
    except ValueError:
        return r.status_code, r.headers, data, None


def check_answer(live: Live, kind: str, body: Any, raw: bytes, *, leave_early: bool = False,
                 busy_ok: bool = False, valid: bool = False) -> int:
    """POST ``raw`` (``body`` encoded, or not) and check what comes back; the
    status. ``valid``: a request the server must answer (200, no error chunk)."""
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    status, headers, obj, lines = exchange(live, "POST", path, raw, leave_early=leave_early)
    where = f"{path} {raw[:600]!r}"
    if busy_ok and status == 503:
        assert headers.get("retry-after"), where
    else:
        assert status < 500, f"{where}: {status} {obj!r}\n{live.server.output()[-3000:]}"
    # A valid chat whose fields the printing template writes out in full may not
    # fit the small test context: the server's refusal then names the context.
    too_long = status == 400 and isinstance(obj, dict) and obj["error"].get("code") == "context_length_exceeded"
    if valid and not (busy_ok and status == 503) and not too_long:
        assert status == 200, f"{where}: a valid request got {status} {obj!r}"
    if status >= 400:
        check_error(status, obj, where)
    elif lines is not None:
        check_stream(body, kind, lines, where, valid=valid)
    elif body is not None and not (leave_early and obj is None):
        assert status == 200, where
        check_whole(body, kind, obj, where)
    return status


# ------------------------------------------------------------------ the tests
@st.composite
def requests(draw, kind: str, live: Live):
    """(body, its bytes, whether the client leaves mid-stream, whether the server must answer 200)."""
    body, loose = draw(bodies(kind, live))
    how = draw(st.sampled_from(["ascii"] * 6 + ["utf8", "cut"]))
    leave = bool(body.get("stream") is True and draw(st.integers(0, 4)) == 0)
    return body, encoded(body, how), leave, not loose and how != "cut"


@pytest.fixture(scope="module")
def statuses():
    """Every status the fuzz met, by test (printed at the end: how much was valid)."""
    seen: Dict[str, Dict[int, int]] = {}
    yield seen
    for name, counts in seen.items():
        print(f"{name}: {sorted(counts.items())}")


def regressions(kind: str, live: Live) -> List[tuple]:
    """The bodies that found the bugs fixed with this file (docs/promises.md),
    run first on every run, as ``requests`` draws them."""
    def req(body, valid):
        return body, encoded(body, "ascii"), False, valid

    if kind == "jinja":  # JSON that decodes to what the tokenizer cannot take, or past the parser's depth
        call = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": a}}]}
                for a in ('{"a": "\\ud800"}', "[" * 100000 + "]" * 100000)]
        return [req({"messages": [{"role": "user", "content": "hi"}, c, {"role": "tool", "content": "x"}],
                     "max_tokens": 1}, False) for c in call]
    if kind == "chat":
        # NaN where a chat takes anything: not JSON, a 400 (Python's JSON reader took it, and an answer
        # that echoed it could not be written)
        return [req({"messages": [{"role": "system", "content": None, "tool_call_id": [math.nan]}],
                     "max_completion_tokens": 0}, False),
                req({"messages": [{"role": "\ud800", "content": "hi"}], "max_tokens": 1}, False),
                req({"messages": [{"role": "user", "content": live.long_text}]}, True),
                req({"messages": [{"role": "user", "content": live.long_text}], "max_completion_tokens": 2**31,
                     "stream": True}, True)]
    return [req({"prompt": "x", "model": "\ud800"}, False),
            req({"prompt": "x", "\ud800": 1}, False),
            req({"prompt": "\ud800", "max_tokens": 1}, False),
            req({"prompt": "x", "max_tokens": 1, "stop": ["\ud800"]}, False),
            req({"prompt": live.long_ids, "max_tokens": 2**31}, True),
            req({"prompt": live.long_ids, "max_tokens": 2**63 - 1, "n": 2, "stream": True}, True),
            req({"prompt": "x", "max_tokens": 1, "top_k": 2**40}, True)]


def fuzz(name: str, kind: str, live: Live, seen: Dict[int, int]):
    """The property test of one endpoint: its regressions (those of ``name``
    too), then MAX_EXAMPLES[name] drawn requests."""
    def run(req):
        body, raw, leave, valid = req
        status = check_answer(live, kind, body, raw, leave_early=leave, valid=valid)
        seen[status] = seen.get(status, 0) + 1
        live.alive()

    test = fuzz_settings(name)(given(requests(kind, live))(run))
    for req in regressions(kind, live) + (regressions(name, live) if name != kind else []):
        test = example(req)(test)
    return test


def test_fuzzed_completions(live, statuses):
    seen = statuses.setdefault("completions", {})
    fuzz("completions", "completion", live, seen)()
    assert seen.get(200, 0) >= MAX_EXAMPLES["completions"] // 5, seen  # the fuzz reached the engine


def test_fuzzed_chats(live, statuses):
    seen = statuses.setdefault("chat", {})
    fuzz("chat", "chat", live, seen)()
    assert seen.get(200, 0) >= MAX_EXAMPLES["chat"] // 5, seen


# On the release core even in CI's sanitizer step (.ci/run's RELEASE_ALSO): what
# it adds to test_fuzzed_chats is the Jinja rendering (Python); the core sees the
# same kinds of token sequences, and under ASan it took 77 s of CI's time.
@pytest.mark.skipif(bool(os.environ.get("PYSPEC_SANITIZE")), reason="run on the release core (.ci/run)")
def test_fuzzed_chats_through_a_jinja_template(live_jinja, statuses):
    seen = statuses.setdefault("jinja", {})
    fuzz("jinja", "chat", live_jinja, seen)()
    assert seen.get(200, 0) >= MAX_EXAMPLES["jinja"] // 5, seen


def _nested(depth: int, brackets: bytes) -> bytes:
    opener, closer = (b"[", b"]") if brackets == b"[]" else (b'{"a":', b"}")
    return b'{"prompt": ' + opener * depth + b"1" + closer * depth + b"}"


raw_bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"null", b"[]", b'"x"', b"1e999", b"NaN", b"\xef\xbb\xbf{}", b'{"prompt": "\xff"}',
                     b'{"prompt": "x", "prompt": [1], "max_tokens": 1}', b'{"prompt": "\xed\xa0\x80"}',
                     b'{"prompt": "x", "max_tokens": 1' + b"9" * 5000 + b"}"]),
    st.builds(_nested, st.sampled_from([10, 900, 5000, 200000]), st.sampled_from([b"[]", b"{}"])),
)


def test_fuzzed_raw_bodies(live, statuses):
    """Bodies that are not JSON, not UTF-8, nested past any parser's depth."""
    seen = statuses.setdefault("raw", {})

    @fuzz_settings("raw")
    @given(st.sampled_from(["completion", "chat"]), raw_bodies)
    def run(kind, raw):
        status = check_answer(live, kind, None, raw)  # None: no answer's shape to check
        assert status != 200 or raw.startswith(b'{"prompt": "x", "prompt"'), (raw[:100], status)
        seen[status] = seen.get(status, 0) + 1
        live.alive()

    run()


ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/v1", "/",
          "/v1/tokenize", "/v1/embeddings", "/v1/models/gemma", "/../etc/passwd", "/v1/completions/"]


def test_fuzzed_routes_methods_and_headers(live, statuses):
    """Every route with every method, odd paths, query strings and headers."""
    seen = statuses.setdefault("routes", {})

    @fuzz_settings("routes")
    @given(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
           st.sampled_from(ROUTES) | st.text("/abc%?=&.", min_size=1, max_size=12).map(lambda p: "/" + p),
           st.dictionaries(st.sampled_from(["content-type", "authorization", "content-encoding", "accept"]),
                           st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20), max_size=2),
           st.binary(max_size=16))
    def run(method, path, headers, raw):
        status, _, obj, lines = exchange(live, method, path, raw, headers=headers)
        where = f"{method} {path} {headers}"
        assert status < 500, (where, status, obj)
        if status >= 400:
            check_error(status, obj, where)
        elif path == "/health":
            assert obj["status"] == "ok" and obj["slots_total"] == PARALLEL, where
        elif path == "/v1/models" and method == "GET":
            assert [m["id"] for m in obj["data"]] == ["gemma"], where
        elif path == "/metrics":
            assert isinstance(obj, bytes) and b"pyspec:kv_cache_usage_perc" in obj, where
        seen[status] = seen.get(status, 0) + 1
        live.alive()

    run()


#: The other dialects' routes (server/doors/), each with the field that caps its answer's length
#: (set after the fuzz, so that no valid body runs to the end of the context) and its error's shape.
DOORS = {"/v1/messages": ("max_tokens", "anthropic"), "/v1/messages/count_tokens": (None, "anthropic"),
         "/v1/responses": ("max_output_tokens", "openai"), "/v1/responses/input_tokens": (None, "openai"),
         "/api/chat": ("options", "ollama"), "/api/generate": ("options", "ollama"), "/api/show": (None, "ollama"),
         "/completion": ("n_predict", "openai"), "/tokenize": (None, "openai"), "/detokenize": (None, "openai"),
         "/apply-template": (None, "openai"), "/v1/embeddings": (None, "openai"), "/api/embed": (None, "ollama"),
         "/api/embeddings": (None, "ollama")}
_door_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["role", "content", "type", "text", "name", "input", "id", "tool_use_id", "call_id", "output", "arguments",
         "function", "tool_calls", "images", "schema", "format", "temperature", "num_predict", "stop"]), inner,
        max_size=3), max_leaves=8)
_door_fields = ["model", "messages", "system", "input", "instructions", "tools", "tool_choice", "stream", "prompt",
                "encoding_format", "dimensions", "truncate",
                "suffix", "raw", "format", "options", "stop_sequences", "temperature", "top_p", "top_k", "text",
                "previous_response_id", "content", "tokens", "with_pieces", "n_probs", "output_config", "thinking"]
_door_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                                                 "content": st.text(max_size=12) | _door_values}), min_size=1,
                          max_size=3)


#: A valid body of each door, which the fuzz also mutates (its fields replaced by fuzzed ones), so that
#: it reaches the engine and the answers' writers, not only the readers' refusals.
_USER = [{"role": "user", "content": "Hi"}]
DOOR_BODIES = {
    "/v1/messages": {"model": "x", "messages": _USER, "stream": True},
    "/v1/messages/count_tokens": {"model": "x", "messages": _USER, "system": "Be brief."},
    "/v1/responses": {"model": "x", "input": "Hi", "instructions": "Be brief."},
    "/v1/responses/input_tokens": {"model": "x", "input": "Hi"},
    "/api/chat": {"model": "x", "messages": _USER, "stream": False},
    "/api/generate": {"model": "x", "prompt": "Hi", "system": "Be brief.", "stream": True},
    "/api/show": {"model": "x"},
    "/completion": {"prompt": "Hi", "n_probs": 2},
    "/tokenize": {"content": "Hi <bos>", "with_pieces": True},
    "/detokenize": {"tokens": [1, 2, 3]},
    "/apply-template": {"messages": _USER},
    "/v1/embeddings": {"model": "x", "input": [[1, 2], [3]], "encoding_format": "base64"},
    "/api/embed": {"model": "x", "input": "Hi"},
    "/api/embeddings": {"model": "x", "prompt": "Hi"},
}


def _capped(path: str, body: Dict[str, Any]) -> Dict[str, Any]:
    cap = DOORS[path][0]
    if cap == "options":
        options = body.get("options") if isinstance(body.get("options"), dict) else {}
        return {**body, "options": {**options, "num_predict": 4}}
    return {**body, cap: 4} if cap else body


def _door_error(shape: str, status: int, obj: Any, where: str) -> None:
    if shape == "anthropic":
        assert isinstance(obj, dict) and obj.get("type") == "error" and obj["error"]["message"], (where, status, obj)
    elif shape == "ollama":
        assert isinstance(obj, dict) and isinstance(obj.get("error"), str) and obj["error"], (where, status, obj)
    else:
        check_error(status, obj, where)


def test_fuzzed_doors(live, statuses):
    """Hostile bodies for every other dialect's route: a 4xx in that dialect's
    error shape or an answer, never a 5xx; streams end; the server lives on."""
    seen = statuses.setdefault("doors", {})

    @fuzz_settings("doors")
    @given(st.sampled_from(sorted(DOORS)),
           st.dictionaries(st.sampled_from(_door_fields), _door_values, max_size=5),
           st.one_of(st.none(), _door_messages), raw_bodies | st.none(), st.booleans())
    def run(path, body, messages, raw, on_valid):
        if on_valid:  # the fuzzed fields over the route's valid body
            body = {**DOOR_BODIES[path], **body}
        if messages is not None:
            body = {**body, "messages": messages}
        data = raw if raw is not None else json.dumps(_capped(path, body)).encode()
        status, _, obj, lines = exchange(live, "POST", path, data)
        where = f"POST {path} {data[:400]!r}"
        # 501: a FIM request (a suffix) to this model, which has no FIM tokens (as llama-server answers)
        assert status < 500 or status == 501, (where, status, obj, live.server.output()[-2000:])
        if status >= 400:
            _door_error(DOORS[path][1], status, obj, where)
        seen[status] = seen.get(status, 0) + 1
        live.alive()

    for path in sorted(DOORS):  # each route's valid body, as it is, is answered
        status, _, obj, _ = exchange(live, "POST", path, json.dumps(_capped(path, DOOR_BODIES[path])).encode())
        assert status == 200, (path, status, obj)
    run()
    assert sum(v for k, v in seen.items() if 400 <= k < 500) >= 10, seen  # the fuzz reached the readers' refusals


def test_garbage_http_leaves_the_server_up(live):
    """What is not HTTP at all is the HTTP layer's to refuse; the server lives on,
    and a client that stops mid-body holds up its own connection only."""
    with socket.create_connection(("127.0.0.1", live.server.port), timeout=5) as stalled:
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt")
        r = live.http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
        assert r.status_code == 200, r.text
    for junk_request in (b"\x00\xff" * 64 + b"\r\n\r\n", b"GET /health HTTP/9.9\r\n\r\n",
                         b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                         b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro"):
        with socket.create_connection(("127.0.0.1", live.server.port), timeout=5) as sock:
            sock.sendall(junk_request)
            sock.shutdown(socket.SHUT_WR)
            try:
                answer = sock.recv(4096)
            except socket.timeout:
                answer = b""
        assert not answer.startswith(b"HTTP/1.1 5"), (junk_request[:60], answer[:200])
        live.alive()


def test_concurrent_fuzzed_requests(live, statuses):
    """Several fuzzed requests at once (slots and queue shared): never a 5xx
    but a full queue's 503 with Retry-After."""
    seen = statuses.setdefault("concurrent", {})

    @fuzz_settings("concurrent")
    @given(st.lists(st.tuples(st.sampled_from(["completion", "chat"]), st.data()), min_size=5, max_size=5))
    def run(draws):
        reqs = []
        for kind, data in draws:
            body, _ = data.draw(bodies(kind, live, loose=False))
            leave = body.get("stream") is True and data.draw(st.booleans())
            reqs.append((kind, body, encoded(body, "ascii"), leave))
        with ThreadPoolExecutor(len(reqs)) as pool:
            for status in pool.map(lambda r: check_answer(live, r[0], r[1], r[2], leave_early=r[3], busy_ok=True,
                                                          valid=True), reqs):
                seen[status] = seen.get(status, 0) + 1
        live.alive()

    run()


@pytest.mark.parametrize("which", ["live", "live_jinja"])
def test_after_the_fuzz_the_server_is_idle_and_its_cache_free(which, request):
    """Runs last (file order): every slot free, nothing queued, no cell held by a
    running sequence, /metrics counted no 5xx but full-queue 503s, and the log
    holds no traceback (an unexpected exception) and no prompt."""
    live = request.getfixturevalue(which)
    marker = "a prompt that must not reach the log"
    assert live.http.post("/v1/completions", json={"prompt": marker, "max_tokens": 1}).status_code == 200
    h = live.server.wait_idle()
    assert h["status"] == "ok" and h["slots_busy"] == 0 and h["queue_depth"] == 0, h
    assert h["kv_cells_running"] == 0, h
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for fam in text_string_to_metric_families(live.http.get("/metrics").text):
        for s in fam.samples:
            values[(s.name, s.labels.get("status"))] = s.value
    assert values[("pyspec:kv_cache_usage_perc", None)] == 0
    assert values[("pyspec:num_requests_running", None)] == 0
    assert values[("pyspec:num_requests_waiting", None)] == 0
    fives = {k[1]: v for k, v in values.items() if k[0] == "pyspec:requests_finished_total" and k[1] >= "500"}
    rejected = values[("pyspec:requests_rejected_total", None)]
    assert set(fives) <= {"503"} and fives.get("503", 0) <= rejected, (fives, rejected)
    assert values[("pyspec:requests_finished_total", "200")] > 0
    log = live.server.output()
    assert "Traceback" not in log, log[max(0, log.find("Traceback") - 300):][:5000]
    assert marker not in log
