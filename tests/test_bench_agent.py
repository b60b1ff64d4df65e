"""`pyspec bench agent`: the three dialects carry the same conversation (the
same prompt on a real `pyspec serve`; control: one without the file's tool
result), the ratios on made-up rows, option checks, and one end-to-end run of
the CLI on the small coder model (a chat template with tools), and the
first-argument timing against a stub SSE server (control: a call sent whole)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pyspec.bench.serve import agent
from pyspec.bench.serve.editor_edits import edits
from pyspec.bench.serve.process import request
from cli_helpers import pyspec_cmd
from server_helpers import ServerProcess


@pytest.fixture(scope="module")
def session() -> agent.Session:
    (e,) = edits(1, seed=0, lines=(10, 16))
    return agent.Session(e, "chat")


def _prompt_tokens(server, route: str, conversation, tool) -> int:
    body = {**agent.body(route, conversation, tool, 1), "temperature": 0, "stream": False}
    status, resp = request(server.port, "POST", agent.ROUTES[route], body)
    assert status == 200, resp
    usage = resp["usage"]
    if route == "chat":
        return usage["prompt_tokens"]
    # Anthropic counts cached input apart; Responses counts it inside input_tokens
    return usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0) + (
        usage.get("cache_creation_input_tokens") or 0) if route == "messages" else usage["input_tokens"]


def test_the_three_dialects_carry_the_same_conversation(draft_path, session):
    """Each kind's request renders the same prompt through every route; the
    control, the conversation without the file's tool result, does not."""
    server = ServerProcess("--model", draft_path, "--no-draft", "--parallel", "1", "--n-ctx", "4096")
    try:
        for kind in ("prose", "write", "tests"):
            conversation, tool, _ = agent.turns(session, kind)
            counts = {route: _prompt_tokens(server, route, conversation, tool) for route in agent.ROUTES}
            assert len(set(counts.values())) == 1, (kind, counts)
            without_file = [t for t in conversation if t != ("result", "call_1", session.edit.original)]
            assert len(without_file) == len(conversation) - 1
            control = _prompt_tokens(server, "messages", without_file, tool)
            assert control < counts["messages"] - session.edit.original.count("\n"), (kind, control, counts)
    finally:
        assert server.stop() == 0


def _row(backend, rep, session_, kind, tok_s, first=1.0, step=0):
    return {"backend": backend, "rep": rep, "session": session_, "kind": kind, "step": step, "tok_s": tok_s,
            "first_byte_s": first, "wall_s": 2.0, "tokens": 50, "forced": None, "tool": None}


def _sse_server(events):
    """A server that answers any POST with ``events``: (seconds to wait, chat chunk)."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for wait, chunk in events:
                time.sleep(wait)
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _call_chunk(name=None, arguments=""):
    function = {"arguments": arguments, **({"name": name} if name else {})}
    return {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": function}]}}]}


@pytest.mark.parametrize("streamed", [True, False])
def test_first_argument_byte_is_timed_from_the_call(streamed):
    """A call whose arguments stream reads ~0 s from its name to its first
    argument byte (the rest 0.6 s later); the control, a server that holds
    the arguments until the call is whole, reads the whole 0.6 s."""
    pieces = ['{"path": "a.py", ', '"content": "x"}']
    if streamed:
        events = [(0, _call_chunk("write_file")), (0, _call_chunk(arguments=pieces[0])),
                  (0.6, _call_chunk(arguments=pieces[1]))]
    else:
        events = [(0, _call_chunk("write_file")), (0.6, _call_chunk(arguments="".join(pieces)))]
    server = _sse_server(events)
    try:
        a = agent.stream(server.server_address[1], "chat", {"messages": []})
    finally:
        server.shutdown()
    assert a["tool"] == "write_file" and json.loads(a["text"]) == {"path": "a.py", "content": "x"}
    gap = a["t_args"] - a["t_call"]
    assert (gap < 0.3) if streamed else (gap >= 0.55), gap


def test_ratios_pair_the_same_request_and_see_a_difference():
    """A backend twice as fast on code and as fast on prose reads 2x and 1x;
    the same rows with the faster one halved (the control) read 1x."""
    rows = []
    for rep in range(2):
        for s in range(3):
            jitter = 1 + 0.02 * (s - 1)
            rows += [_row("a", rep, s, "code", 40 * jitter), _row("b", rep, s, "code", 20 * jitter),
                     _row("a", rep, s, "prose", 20, step=1), _row("b", rep, s, "prose", 20 * jitter, step=1)]
    ratios = {r["kind"]: r for r in agent.summarize(rows)["ratios"]}
    assert ratios["code"]["ratio"] == pytest.approx(2.0) and ratios["code"]["low"] > 1.5
    assert ratios["prose"]["low"] <= 1.0 <= ratios["prose"]["high"]
    assert ratios["code"]["n"] == 6
    control = [{**r, "tok_s": r["tok_s"] / 2} if r["backend"] == "a" and r["kind"] == "code" else r for r in rows]
    assert agent.summarize(control)["ratios"][0]["ratio"] == pytest.approx(1.0)


@pytest.mark.parametrize("args, message", [
    (["--routes", "chat,smoke"], "give some of chat, messages, responses"),
    (["--kinds", "prose,prose"], "each once"),
    (["--lines", "9-3"], "Invalid value for --lines"),
])
def test_bad_options_are_clear_errors(args, message):
    out = pyspec_cmd("bench", "agent", *args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_bench_agent_end_to_end(draft_path):
    """Sessions through all three routes on pyspec serve (lookup drafting and
    --no-draft): a row per request, forced calls answered as that tool with
    whole, parseable arguments, and the ratios."""
    out = pyspec_cmd("bench", "agent", "-m", draft_path, "--no-draft", "--sessions", "3", "--lines", "10-16",
                     "--reps", "1", "--kinds", "prose,write", "--json", "-")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    rows = result["requests"]
    assert len(rows) == 2 * 3 * 2
    assert {r["route"] for r in rows} == set(agent.ROUTES)
    for r in rows:
        assert r["tokens"] > 0 and 0 < r["first_byte_s"] <= r["wall_s"], r
        if r["kind"] == "write":
            assert r["tool"] == "write_file", r
            assert {"path", "content"} <= set(json.loads(r["text"])), r["text"]
            # arguments stream as decoded: the first comes long before the call is whole
            assert r["args_after_call_s"] < 0.5 * (r["wall_s"] - r["first_byte_s"]), r
    assert [r["step"] for r in rows if r["kind"] == "prose"] == [0] * 6
    calls = {(f["backend"], f["kind"]): f["calls"] for f in result["summary"]["figures"]}
    assert calls[("pyspec serve", "write")] == [3, 3] and calls[("pyspec serve", "prose")] is None
    ratios = result["summary"]["ratios"]
    assert {r["kind"] for r in ratios} == {"prose", "write", "new conversation"}
    assert all(r["low"] <= r["ratio"] <= r["high"] for r in ratios)
