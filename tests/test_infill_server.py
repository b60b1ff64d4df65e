"""`POST /infill` as llama.vim and llama.vscode call it, `/v1/completions`
with a `suffix`, and Predicted Outputs on the server (issue 50), on a real
`pyspec serve` of the catalog's Qwen2.5-Coder-0.5B (it has FIM tokens).

The request bodies are the plugins' own (their source: llama.vim's
`llama#fim`, its warm-up, llama.vscode's `n_cmpl` 3 request).
"""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import pytest

from pyspec import _core

from chisquare import ALPHA, independence
from server_helpers import ServerProcess

PREFIX = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(12))
LINE = "    total = sum(values) / len(values)"
SUFFIX = "\n    return total\n\n\ndef g(y):\n    return y\n"
FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
          "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
          "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]


def vim_body(typed: str, **over) -> dict:
    """llama.vim's FIM request (autoload/llama.vim, llama#fim), greedy for a fixed answer."""
    body = {"id_slot": 0, "input_prefix": PREFIX + "def mean(values):\n", "input_suffix": SUFFIX,
            "input_extra": [{"text": "import math\n", "time": [1, 2], "filename": "util.py"}], "prompt": typed,
            "n_predict": 16, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 250, "response_fields": FIELDS, "model": "",
            "temperature": 0}
    body.update(over)
    return body


@pytest.fixture(scope="module")
def server(draft_path):
    s = ServerProcess("-m", draft_path, "--n-ctx", "4096", "--parallel", "3")
    yield s
    s.stop()


def test_llama_vim_reads_the_answer(server):
    r = server.post("/infill", vim_body("    total = "))
    assert r.status_code == 200, r.text
    raw = r.text
    # llama.vim's check: the body starts with "{" and has "content": with no space after the colon, on one line.
    assert raw.startswith("{") and '"content":"' in raw and "\n" not in raw
    body = r.json()
    assert set(body) == set(FIELDS), "response_fields must pick flat 'a/b' keys"
    assert body["timings/predicted_n"] >= 1 and body["tokens_cached"] > body["timings/prompt_n"] > 0


def test_a_keystroke_processes_only_its_new_tokens(server, draft_path, load_model):
    model = load_model(draft_path, n_ctx=512)
    processed, control = [], []
    for cut in (10, 16, 22, 30, len(LINE)):
        processed.append(server.post("/infill", vim_body(LINE[:cut])).json()["timings/prompt_n"])
    new_chars = [LINE[a:b] for a, b in zip((10, 16, 22, 30), (16, 22, 30, len(LINE)))]
    for n, text in zip(processed[1:], new_chars):
        # the new characters' tokens, and the healed last token again
        assert n <= len(model.tokenize(text, add_special=False)) + 2, (processed, new_chars)
    # Control: llama-server's layout puts the typed text before the suffix, which is processed again.
    for cut in (10, 16):
        control.append(server.post("/infill", vim_body(LINE[:cut], layout="llama-server")).json()["timings/prompt_n"])
    n_suffix = len(model.tokenize(SUFFIX, add_special=False))
    assert control[1] > n_suffix, control


def test_n_cmpl_answers_an_array_and_a_warm_up_an_empty_object(server):
    r = server.post("/infill", {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "def ",
                                "n_predict": 8, "n_cmpl": 3, "top_k": 40, "top_p": 0.99, "stream": False,
                                "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
                                "t_max_prompt_ms": 500, "t_max_predict_ms": 500})
    assert r.status_code == 200, r.text
    answers = r.json()
    assert isinstance(answers, list) and [a["index"] for a in answers] == [0, 1, 2]
    for a in answers:  # what llama.vscode's status bar reads
        assert isinstance(a["content"], str) and a["generation_settings"]["n_ctx"] == 4096
        assert a["generation_settings"]["samplers"] == ["top_k", "top_p", "infill"]  # all three applied
        assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms"} <= set(a["timings"])
    warm = server.post("/infill", {"id_slot": 0, "input_prefix": "", "input_suffix": "",
                                   "input_extra": [{"text": "x = 1\n", "filename": "a.py"}], "prompt": "",
                                   "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False,
                                   "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
                                   "response_fields": [""]})
    assert warm.status_code == 200 and warm.json() == {}


# n_cmpl > 1 (llama.vscode asks for 3): the choices are sampled in one batch,
# each from its own random stream (the seed's j-th, _core.sequence_seed).
CHOICES = {"input_prefix": PREFIX + "def mean(values):\n", "input_suffix": SUFFIX, "prompt": "    ",
           "samplers": ["top_k", "temperature"], "top_k": 3, "temperature": 1.0, "cache_prompt": True,
           "healing": False}  # healed, a one-token answer would be the indentation again: "" shown
N_PAIRS = 60  # pairs of first tokens: under one shared stream every pair agrees, and chi-square says so at once


def first_token_pairs(server, n: int):
    pairs = []
    for _ in range(n):
        r = server.post("/infill", dict(CHOICES, n_predict=1, n_cmpl=2))
        assert r.status_code == 200, r.text
        pairs.append(tuple(a["content"] for a in r.json()))
    return pairs


@pytest.fixture(scope="module")
def shared_stream_server(draft_path):
    """The negative control: every choice of a request draws from one stream."""
    s = ServerProcess("-m", draft_path, "--n-ctx", "4096", "--parallel", "3",
                      "--test-controls", json.dumps({"shared_stream": True}))
    yield s
    s.stop()


def test_n_cmpl_choices_are_independent(server, shared_stream_server):
    """Two choices' first tokens: independent (Pearson's contingency test at
    ALPHA); the shared-stream control gives every pair the same token (its
    law: the diagonal) and the same test rejects it."""
    pairs = first_token_pairs(server, N_PAIRS)
    stat, df, p = independence(pairs)
    print(f"n_cmpl=2 first tokens: chi2={stat:.2f} df={df} p={p:.3g}; {sum(a == b for a, b in pairs)} pairs agree")
    assert df >= 1, f"the first token hardly varies: the test cannot tell ({pairs[:5]})"
    assert p > ALPHA, f"the choices of one request are not independent (p={p:.3g})"
    control = first_token_pairs(shared_stream_server, N_PAIRS)
    stat, df, p = independence(control)
    print(f"NEGATIVE CONTROL shared stream: chi2={stat:.2f} df={df} p={p:.3g}")
    assert p < ALPHA and all(a == b for a, b in control), "one shared stream was not detected"


def test_n_cmpl_choices_each_follow_their_seed(server):
    """Choice j of a request with seed S is what a request for one completion
    with seed sequence_seed(S, j) answers. Plain decoding (draft_max 0): drafts
    (from the user's memory, which the first request fills) decide which
    uniforms test which token, so a seed repeats only where the drafts do. Its
    rows were batched with the other choices' (near_ties.py: rounding), so one
    of three may part at T > 0."""
    seed = next(s for s in range(1, 1000) if all(_core.sequence_seed(s, j) < 2**63 for j in range(3)))
    body = dict(CHOICES, n_predict=6, top_k=40, draft_max=0)
    together = [a["content"] for a in server.post("/infill", dict(body, n_cmpl=3, seed=seed)).json()]
    alone = [server.post("/infill", dict(body, seed=_core.sequence_seed(seed, j))).json()["content"]
             for j in range(3)]
    print(f"together {together}; alone {alone}")
    assert sum(t == a for t, a in zip(together, alone)) >= 2, "the choices do not follow their own seeds"
    assert len(set(together)) > 1, "three samples at T = 1 were all the same"


def test_t_max_predict_ms_ends_the_answer_at_a_line_end(server):
    """The time budget (1 ms: spent by the second piece) ends the answer at the
    next piece holding a newline, which is kept; control: without it the
    answer goes on."""
    body = {"input_prefix": PREFIX, "input_suffix": "", "prompt": "def f12(x):", "n_predict": 48,
            "temperature": 0, "samplers": ["temperature"]}
    free = server.post("/infill", body).json()
    cut = server.post("/infill", dict(body, t_max_predict_ms=1)).json()
    print(f"free {free['content']!r}; cut {cut['content']!r}")
    assert cut["stop_type"] == "limit" and cut["tokens_predicted"] < free["tokens_predicted"], cut
    assert free["content"].startswith(cut["content"]) and "\n" in cut["content"]
    assert cut["content"].rstrip(" \t").endswith("\n"), "the answer did not end at a line end"
    assert free["content"][len(cut["content"]):].strip(), "the control did not go on"


def test_healing_is_switched_off_by_a_field(server):
    healed = server.post("/infill", vim_body("    total = su")).json()
    plain = server.post("/infill", vim_body("    total = su", healing=False)).json()
    # Off, the typed last token stays in the prompt.
    assert plain["tokens_cached"] - plain["timings/predicted_n"] == \
        healed["tokens_cached"] - healed["timings/predicted_n"] + 1
    bad = server.post("/infill", vim_body("    total = su", healing="no"))
    assert bad.status_code == 400 and "healing" in bad.text
    both = server.post("/v1/completions", {"prompt": "def f(x):\n    ret", "suffix": "\n", "max_tokens": 2,
                                           "healing": True, "grammar": 'root ::= [a-z]+'})
    assert both.status_code == 400 and "healing" in both.text, both.text
    for path, body in (("/v1/completions", {"prompt": "def f(x):", "max_tokens": 2, "healing": False}),
                       ("/infill", vim_body("    total = su", healing=True, layout="llama-server"))):
        r = server.post(path, body)  # no FIM prompt to heal; a layout that never heals
        assert r.status_code == 400 and "healing" in r.text, r.text


def test_a_stream_ends_with_the_whole_object_and_no_done(server):
    with httpx.stream("POST", server.url("/infill"), json=vim_body("    total = ", stream=True,
                                                                   response_fields=None), timeout=120) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    chunks = [json.loads(e) for e in events]
    assert chunks[-1]["stop"] is True and chunks[-1]["stop_type"] in ("eos", "limit", "word")
    assert all(c["stop"] is False for c in chunks[:-1]) and len(chunks) >= 2
    assert sum(c["tokens_predicted"] > 0 for c in chunks[:-1]) >= 1


def test_refusals_name_the_field(server):
    cases = [({"input_prefix": "a", "input_suffix": "b", "input_extra": 3}, "input_extra"),
             ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]}, "text"),
             ({"input_suffix": "b"}, "input_prefix"),
             ({"input_prefix": "a", "input_suffix": "b", "repeat_penalty": 1.3, "samplers": "kt"}, "repeat_penalty"),
             ({"input_prefix": "a", "input_suffix": "b", "samplers": ["mirostat"]}, "mirostat"),
             ({"input_prefix": "a", "input_suffix": "b", "n_cmpl": 9}, "n_cmpl"),
             ({"input_prefix": "a", "input_suffix": "b", "samplers": ["top_k", "infill"], "top_k": 0}, "top_k"),
             ({"input_prefix": "a", "input_suffix": "b", "samplers": ["top_k", "temperature", "infill"]}, "samplers"),
             # The OpenAI routes' cap on draft lengths holds here too (issue 58: it was uncapped).
             ({"input_prefix": "a", "input_suffix": "b", "draft_max": 999}, "draft_max")]
    for body, word in cases:
        r = server.post("/infill", body)
        assert r.status_code in (400, 404) and word in r.text, (body, r.status_code, r.text)


def test_hostile_bodies_get_a_4xx_never_a_500(server):
    rnd = random.Random(50)
    values = [None, True, -1, 0, 3, 2**70, 1.5, float("nan"), "", "x" * 3, [], [1, "a"], {}, {"text": 1},
              [{"text": "a", "filename": 3}], "\udc80"[:0] + "<|fim_prefix|>"]
    fields = ["input_prefix", "input_suffix", "prompt", "input_extra", "n_predict", "n_indent", "t_max_predict_ms",
              "samplers", "top_k", "top_p", "temperature", "stop", "n_cmpl", "stream", "response_fields", "seed",
              "layout"]
    for _ in range(60):
        body = {"input_prefix": "def f(x):\n", "input_suffix": "\n", "n_predict": 2}
        for name in rnd.sample(fields, 3):
            body[name] = rnd.choice(values)
        try:
            content = json.dumps(body, allow_nan=True)
        except ValueError:
            continue
        r = httpx.post(server.url("/infill"), content=content, headers={"content-type": "application/json"},
                       timeout=120)
        assert r.status_code in (200, 400, 404, 413), (body, r.status_code, r.text)


def test_completions_with_a_suffix_fill_in_the_middle(server):
    r = server.post("/v1/completions", {"prompt": "def add(a, b):\n    ret", "suffix": "\n\nprint(add(1, 2))\n",
                                        "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].startswith("urn"), "healed: the answer goes on from 'ret'"
    r = server.post("/v1/completions", {"prompt": [1, 2, 3], "suffix": "x", "max_tokens": 2})
    assert r.status_code == 400 and "suffix" in r.text


@pytest.mark.parametrize("stream", [False, True])
def test_predicted_outputs_on_chat(server, stream):
    messages = [{"role": "user", "content": "Rename x to y, reply with the code only:\n"
                                            "def f(x):\n    return x * 2 + x\n"}]
    base = {"messages": messages, "max_tokens": 40, "temperature": 0, "policy": "fixed", "draft_max": 4}
    plain = server.post("/v1/chat/completions", base).json()
    answer = plain["choices"][0]["message"]["content"]
    body = dict(base, prediction={"type": "content", "content": answer})
    if not stream:
        r = server.post("/v1/chat/completions", body).json()
        assert r["choices"][0]["message"]["content"] == answer
        details = r["usage"]["completion_tokens_details"]
        assert details["rejected_prediction_tokens"] == 0 and details["accepted_prediction_tokens"] > 0
        assert r["timings"]["draft_memory_n"] > 0, "the prediction was not drafted from"
        return
    with httpx.stream("POST", server.url("/v1/chat/completions"),
                      json=dict(body, stream=True, stream_options={"include_usage": True}), timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == answer
    assert chunks[-1]["usage"]["completion_tokens_details"]["rejected_prediction_tokens"] == 0
    bad = server.post("/v1/chat/completions", dict(base, prediction={"type": "text", "content": "x"}))
    assert bad.status_code == 400 and "prediction" in bad.text


def test_a_request_naming_another_model_is_answered_by_this_one(server):
    """Local tools send their own default names (issue 51): the loaded model
    answers and the answer names it, as llama-server does."""
    name = httpx.get(server.url("/v1/models")).json()["data"][0]["id"]
    for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 1, "model": "gpt-4o"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                                 "model": "m"})):
        r = server.post(path, body)
        assert r.status_code == 200 and r.json()["model"] == name, r.text


def test_a_model_without_fim_tokens_is_a_501_and_strict_names_a_404(gemma_path):
    s = ServerProcess("-m", gemma_path, "--n-ctx", "512", "--strict-model-name")
    try:
        r = s.post("/infill", {"input_prefix": "a", "input_suffix": "b"})
        assert r.status_code == 501 and "prefix token is missing" in r.text
        r = s.post("/v1/completions", {"prompt": "a", "suffix": "b", "max_tokens": 2})
        assert r.status_code == 501
        r = s.post("/v1/completions", {"prompt": "a", "max_tokens": 1, "model": "gpt-9"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
        assert s.post("/v1/completions", {"prompt": "a", "max_tokens": 1, "model": ""}).status_code == 200
    finally:
        s.stop()


def test_n_indent_ends_the_answer_where_it_leaves_the_block(server):
    """Typing a new top-level function after twelve others, greedy: the model
    writes one function and goes on at column 0, which n_indent 4 cuts (the
    line's text dropped); control: without n_indent it goes on."""
    body = {"input_prefix": PREFIX, "input_suffix": "", "prompt": "def f12(x):", "n_predict": 48,
            "temperature": 0, "samplers": ["temperature"]}
    cut = server.post("/infill", dict(body, n_indent=4)).json()
    free = server.post("/infill", body).json()
    assert "\ndef " in free["content"] and free["tokens_predicted"] > cut["tokens_predicted"], free["content"]
    assert cut["stop_type"] == "limit" and "\ndef " not in cut["content"], cut["content"]
    assert free["content"].startswith(cut["content"].rstrip(" \t"))


def test_llama_vims_instruct_requests_on_chat(server):
    """llama.vim's instruct feature (llama#inst) sends llama-server's fields to
    /v1/chat/completions: its warm-up and its streamed call both work."""
    messages = [{"role": "user", "content": "Write a Python comment that says hello."}]
    warm = server.post("/v1/chat/completions", {"id_slot": 0, "messages": messages, "samplers": [], "n_predict": 0,
                                                "stream": False, "cache_prompt": True, "response_fields": [""]})
    assert warm.status_code == 200 and warm.json() == {}, warm.text
    body = {"id_slot": 0, "messages": messages, "min_p": 0.1, "temperature": 0.1, "samplers": ["min_p", "temperature"],
            "stream": True, "cache_prompt": True, "n_predict": 8}
    with httpx.stream("POST", server.url("/v1/chat/completions"), json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 3
    picked = server.post("/v1/chat/completions", {"messages": messages, "n_predict": 2, "temperature": 0,
                                                  "response_fields": ["usage/completion_tokens", "model"]}).json()
    assert picked == {"usage/completion_tokens": 2, "model": picked["model"]}
    bad = server.post("/v1/chat/completions", {"messages": messages, "samplers": ["mirostat"]})
    assert bad.status_code == 400 and "mirostat" in bad.text


def test_a_chat_warm_up_caches_the_prompt(server):
    """issue 61: n_predict 0 on chat (llama.vim's instruct warm-up) prefills and
    caches the prompt and answers no tokens; the next request finds it cached.
    Control: a request of another conversation finds only the template's start."""
    chat = "/v1/chat/completions"
    messages = [{"role": "user", "content": "Explain what these functions do:\n" + PREFIX}]
    warm = server.post(chat, {"messages": messages, "n_predict": 0}).json()
    n = warm["usage"]["prompt_tokens"]
    assert warm["usage"]["completion_tokens"] == 0 and warm["choices"][0]["message"]["content"] == "", warm
    assert warm["choices"][0]["finish_reason"] == "length" and n > 100, warm
    after = server.post(chat, {"messages": messages, "n_predict": 1, "temperature": 0}).json()
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] >= n - 1, after["usage"]
    other = [{"role": "user", "content": "Summarize these functions:\n" + PREFIX}]
    control = server.post(chat, {"messages": other, "n_predict": 1, "temperature": 0}).json()
    assert control["usage"]["prompt_tokens_details"]["cached_tokens"] < n // 2, control["usage"]


# A long answer to cut short: counting on, greedy (the model does not stop by itself within 200 tokens).
COUNTING = {"input_prefix": "# the numbers from 1 to 1000, one per line\n" + "".join(f"{i}\n" for i in range(1, 21)),
            "input_suffix": "", "prompt": "", "n_predict": 200, "temperature": 0, "samplers": ["top_k"],
            "top_k": 1, "stream": True, "healing": False}


def _metrics(server) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for fam in text_string_to_metric_families(httpx.get(server.url("/metrics")).text)
            for s in fam.samples}


COUNT_PREFIX = COUNTING["input_prefix"]
COUNT_SUFFIX = "999\n1000\n"  # the routes below take an empty suffix as none (no fill-in-the-middle)
# Each fill-in-the-middle route (issue 61: the newest wins on every one): the
# long answer's body, its last streamed object's tokens (None before it), and
# a keystroke's body.
FIM_ROUTES = {
    "/infill": (COUNTING, lambda o: o["tokens_predicted"] if o.get("stop") else None,
                lambda: vim_body("    total = ")),
    "/v1/completions": ({"prompt": COUNT_PREFIX, "suffix": COUNT_SUFFIX, "max_tokens": 200, "temperature": 0,
                         "stream": True, "healing": False, "stream_options": {"include_usage": True}},
                        lambda o: o["usage"]["completion_tokens"] if o.get("usage") else None,
                        lambda: {"prompt": PREFIX + "def mean(values):\n    total = ", "suffix": SUFFIX,
                                 "max_tokens": 8, "temperature": 0}),
    "/api/generate": ({"model": "", "prompt": COUNT_PREFIX, "suffix": COUNT_SUFFIX, "stream": True,
                       "options": {"num_predict": 200, "temperature": 0}},
                      lambda o: o["eval_count"] if o.get("done") else None,
                      lambda: {"model": "", "prompt": PREFIX + "def mean(values):\n    total = ", "suffix": SUFFIX,
                               "stream": False, "options": {"num_predict": 8, "temperature": 0}}),
}


def _objects(lines):
    """A stream's objects: SSE ``data:`` lines, or ollama's NDJSON."""
    for line in lines:
        data = line[len("data: "):] if line.startswith("data: ") else line
        if data.startswith("{"):
            yield json.loads(data)


def _counting_then(server, send, route="/infill"):
    """Client "editor-a" streams a long answer on ``route``; once tokens flow,
    ``send()`` sends a second request. Returns (the tokens the long answer
    predicted, send's response, /metrics' change, the stream's end and the
    response's, time.monotonic())."""
    body, predicted = FIM_ROUTES[route][:2]
    before, seen, flowing, ended = _metrics(server), [], threading.Event(), []

    def listen():
        with httpx.stream("POST", server.url(route), json=body, headers={"X-Client-Id": "editor-a"},
                          timeout=120) as r:
            for obj in _objects(r.iter_lines()):
                seen.append(obj)
                if len(seen) >= 3:
                    flowing.set()
                if predicted(obj) is not None:
                    ended.append((predicted(obj), time.monotonic()))  # the answer's end
        flowing.set()

    t = threading.Thread(target=listen)
    t.start()
    assert flowing.wait(60), "the long answer never streamed"
    second = send()
    answered = time.monotonic()
    t.join(120)
    server.wait_idle()
    after = _metrics(server)
    change = {k: after[k] - before.get(k, 0) for k in after if k.startswith(("pyspec:requests_", "pyspec:abandoned"))}
    assert ended, f"the long answer on {route} never ended: {seen[-2:]}"
    return ended[0][0], second, change, ended[0][1], answered


@pytest.mark.parametrize("route", list(FIM_ROUTES))
def test_a_clients_newer_request_cancels_its_older_one(server, route):
    """issue 61: the newest fill-in-the-middle request of a client wins on each
    route; the older one ends at once, and /metrics counts what it cost.
    Control: the same traffic from two clients (X-Client-Id) leaves the first
    request running to its end."""
    keystroke = FIM_ROUTES[route][2]

    def send(client):
        return lambda: server.post(route, keystroke(), headers={"X-Client-Id": client})

    n, second, change, _, _ = _counting_then(server, send("editor-a"), route)
    assert second.status_code == 200, second.text
    assert n < 100, f"the older answer ran on to {n} tokens"
    assert change["pyspec:requests_superseded_total"] == 1 and change["pyspec:requests_abandoned_total"] == 1, change
    assert change["pyspec:abandoned_seconds_total"] > 0 and change["pyspec:abandoned_tokens_total"] > 3, change

    n, second, change, _, _ = _counting_then(server, send("editor-b"), route)
    assert second.status_code == 200, second.text
    assert n == 200, f"the control's answer ended at {n} tokens"
    assert change["pyspec:requests_superseded_total"] == 0 and change["pyspec:requests_abandoned_total"] == 0, change


def test_a_superseded_infill_ends_as_a_limit(server):
    """What llama.vim reads of the answer it was cut from: stop_type "limit"."""
    seen = []

    def listen():
        with httpx.stream("POST", server.url("/infill"), json=COUNTING, headers={"X-Client-Id": "editor-c"},
                          timeout=120) as r:
            seen.extend(_objects(r.iter_lines()))

    t = threading.Thread(target=listen)
    t.start()
    deadline = time.monotonic() + 60
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.post("/infill", vim_body("    total = "), headers={"X-Client-Id": "editor-c"})
    t.join(120)
    assert seen and seen[-1]["stop"] is True and seen[-1]["stop_type"] == "limit", seen[-1:]


def test_a_warm_up_waits_for_the_real_requests(server):
    """issue 61: a warm-up (n_predict 0, here another client's instruct warm-up
    on chat) is admitted only once no real request runs, so it never slows one.
    Control: a real request of that client is answered while the first runs."""
    messages = [{"role": "user", "content": "Read this:\n" + PREFIX}]
    chat = "/v1/chat/completions"
    n, warm, _, ended, answered = _counting_then(
        server, lambda: server.post(chat, {"messages": messages, "n_predict": 0}, headers={"X-Client-Id": "vim"}))
    assert warm.status_code == 200 and n == COUNTING["n_predict"], (warm.text, n)
    assert answered >= ended, f"the warm-up was answered {ended - answered:.2f} s before the real request ended"
    _, real, _, ended, answered = _counting_then(
        server, lambda: server.post(chat, {"messages": messages, "n_predict": 1}, headers={"X-Client-Id": "vim"}))
    assert real.status_code == 200 and answered < ended, "the control: a real request runs beside the first"



RING_FIELDS = FIELDS + ["tokens_evaluated"]


def _ring(name: str, n: int) -> list:
    """llama.vim's ring of chunks: n chunks of another file, unique to ``name``."""
    return [{"text": f"# {name} chunk {i}\nimport os\nLIMIT_{i} = {i * 7}\n", "time": [1, i], "filename": "util.py"}
            for i in range(n)]


def ring_update(ring: list) -> dict:
    """llama.vim's ring update (s:ring_update): only the chunks, one token asked."""
    return {"input_prefix": "", "input_suffix": "", "input_extra": ring, "prompt": "", "n_predict": 1,
            "temperature": 0.0, "stream": False, "samplers": ["temperature"], "cache_prompt": True,
            "t_max_prompt_ms": 1, "t_max_predict_ms": 1}


def test_a_ring_update_prepares_the_clients_next_suggestion(server, draft_path, load_model):
    """issue 61: the ring's chunks come before the prefix, so new chunks make
    the cursor's text stale. A ring update also prefills the client's last
    suggestion's text after them (server/warm_ups.py): the next keystroke
    takes the new chunks and processes only its new characters. Control: the
    same ring update sent as another client prepares nothing, and the
    keystroke keeps its cached chunks (no wait either way)."""
    model = load_model(draft_path, n_ctx=512)
    n_chunk = len(model.tokenize(_ring("ring-x", 2)[1]["text"], add_special=False))

    def keystroke_after_ring_update(client: str, ring_client: str):
        h = {"X-Client-Id": client}
        first = server.post("/infill", vim_body("    total = ", input_extra=_ring(client, 1), response_fields=RING_FIELDS), headers=h).json()
        warm = server.post("/infill", ring_update(_ring(client, 2)), headers={"X-Client-Id": ring_client})
        assert warm.status_code == 200, warm.text
        server.wait_idle()
        after = server.post("/infill", vim_body("    total = su", input_extra=_ring(client, 2), response_fields=RING_FIELDS), headers=h).json()
        return after["timings/prompt_n"], after["tokens_evaluated"] - first["tokens_evaluated"]

    processed, grown = keystroke_after_ring_update("ring-a", "ring-a")
    assert processed <= 6 and grown >= n_chunk, (processed, grown, n_chunk)  # the new chunk, found cached
    processed, grown = keystroke_after_ring_update("ring-b", "ring-c")
    assert processed <= 6 and grown <= 3, (processed, grown, n_chunk)  # the control: the old chunks


def test_new_chunks_never_make_a_keystroke_wait(server):
    """issue 61: a keystroke that brings new chunks but continues its cached
    prompt is served with the cached chunks, and the new ones are prepared
    beside it; once prepared, the next keystroke takes them, found cached.
    Control: a request elsewhere in the file takes its own chunks at once."""
    h = {"X-Client-Id": "ring-d"}

    def keystroke(typed: str, n_chunks: int, prefix: str = PREFIX, client: dict = h):
        body = vim_body(typed, input_extra=_ring("ring-d", n_chunks), input_prefix=prefix + "def mean(values):\n",
                        response_fields=RING_FIELDS)
        return server.post("/infill", body, headers=client).json()

    first = keystroke("    total = ", 1)
    kept = keystroke("    total = s", 2)
    assert kept["timings/prompt_n"] <= 6, kept  # served with the cached chunk
    assert kept["tokens_evaluated"] - first["tokens_evaluated"] <= 3, (kept, first)
    server.wait_idle()  # the new chunks are prepared
    taken = keystroke("    total = su", 2)
    assert taken["timings/prompt_n"] <= 6, taken
    assert taken["tokens_evaluated"] - kept["tokens_evaluated"] >= 10, (taken, kept)
    other = "".join(f"def h{i}(y):\n    return y * {i}\n\n\n" for i in range(9))
    elsewhere = keystroke("    total = ", 3, prefix=other)
    assert elsewhere["timings/prompt_n"] > 100, elsewhere  # the control: processed, with its own chunks,
    alone = keystroke("    total = ", 3, prefix=other, client={"X-Client-Id": "ring-e"})
    assert elsewhere["tokens_evaluated"] == alone["tokens_evaluated"], (elsewhere, alone)  # as a new client's


def test_only_an_editors_requests_on_general_routes_make_older_ones_stale():
    """/v1/completions and /api/generate: a fill-in-the-middle request streamed
    or with an X-Client-Id is an editor's; a script's parallel ones, not
    streamed, never cut each other short."""
    from types import SimpleNamespace

    from pyspec.server.newest import editor_like

    def req(**headers):
        return SimpleNamespace(headers={k.lower().replace("_", "-"): v for k, v in headers.items()})

    def parsed(suffix, stream):
        return SimpleNamespace(suffix=suffix, stream=stream)

    assert editor_like(parsed("\n", True), req())
    assert editor_like(parsed("\n", False), req(X_Client_Id="vim"))
    assert not editor_like(parsed("\n", False), req())
    assert not editor_like(parsed(None, True), req(X_Client_Id="vim"))


def test_a_warm_up_never_cancels_a_real_request():
    """A warm-up (n_predict 0) of the same client leaves its running request
    alone; a real request cancels a warm-up (the unit: server/newest.py)."""
    from pyspec.server.jobs import Job
    from pyspec.server.newest import NewestWins

    def job():
        return Job([], loop=None)

    wins, client = NewestWins(), ("127.0.0.1", "", "curl", "", "/infill")
    real, warm, warm2 = job(), job(), job()
    assert wins.claim(client, real, warm_up=False) == 0
    assert wins.claim(client, warm, warm_up=True) == 0 and not real.cancelled
    assert wins.claim(client, warm2, warm_up=True) == 1 and warm.why == "superseded" and not real.cancelled
    newest = job()
    assert wins.claim(client, newest, warm_up=False) == 2 and real.cancelled and warm2.cancelled
    assert wins.claim(("127.0.0.1", "", "curl", "other", "/infill"), job(), warm_up=False) == 0 and not newest.cancelled
