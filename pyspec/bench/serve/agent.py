"""`pyspec bench agent`: a coding agent's traffic, replayed through the routes
agents use, against servers.

A *session* is one agent task on one file, shaped like Claude Code's and
Codex's: a system prompt and four tools (:data:`TOOLS`: read_file, write_file,
edit_file, run_tests); the user's task (rename ``old`` to ``new``, the edits
workload's rename: editor_edits.py picks the windows of standard-library files
and the identifiers); the agent's read_file call; the file back as its result.
From that conversation the session asks, one request each, re-sending the whole
conversation as an agent does (:data:`KINDS`, in this order):

* ``prose``: two sentences on what the file does (tool choice auto). The first
  request of a session: its time to first byte is a new conversation's.
* ``code``: the file with the rename, in one code block.
* ``write``: the file with the rename, as a write_file call (forced): a copy
  inside a JSON string, so the read file's text comes back escaped.
* ``edit``: the rename of the first function that uses the name, as an
  edit_file call (forced): a search/replace edit.
* ``tests``: a run_tests call and its failing output are added, and the agent
  says what failed (prose after test output).

Each session goes through one route, in turn: ``chat`` (/v1/chat/completions),
``messages`` (Anthropic's /v1/messages), ``responses`` (OpenAI's
/v1/responses); every request is streamed, greedy (temperature 0), and each
server gets exactly the same requests. A request's *first byte* is its first
text or tool-argument delta; *decode tok/s* is its output (text and tool
arguments, counted by the model's own tokenizer: one rule for every server)
less one token over the time from first byte to the end (none where the server
sent the answer in one burst); *wall* is sending to the end. For a forced call,
*1st arg* is the time from the event that names the call to its first argument
byte (the goal: arguments stream as they are decoded, not when the call is
whole).

Backends, on the same model file, threads, one slot and context: ``pyspec
serve`` (its draft model or lookup default), ``pyspec serve --no-draft``, and
llama.cpp's llama-server per variant (plain, ``--spec-type ngram-mod``, the
draft model). Per repetition each backend starts fresh and runs every session;
the order rotates (``stats.run_order``). Ratios of decode tok/s (and of the new
conversations' first-byte time) between backends pair the same (repetition,
session, kind): the geometric mean with a 95 % two-stage bootstrap interval
over sessions and their repetitions.
"""

from __future__ import annotations

import http.client
import json
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from ..stats import paired_ratio, run_order
from .editor_edits import Edit, max_tokens as copy_tokens
from .process import Backend

KINDS = ("prose", "code", "write", "edit", "tests")
ROUTES = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
PROSE_TOKENS = 96

SYSTEM = """You are a coding agent working in the user's repository. You read and change files only through
your tools:
- read_file(path): the file's text.
- write_file(path, content): replace the whole file.
- edit_file(path, old_string, new_string): replace one exact, unique occurrence of old_string.
- run_tests(): run the test suite and see its output.
Rules: read a file before you change it. Keep every line you do not need to change exactly as it is,
indentation and comments included. Prefer edit_file for small changes and write_file for whole files.
When you answer in prose, be brief and concrete: no preamble, no summary of what you are about to do."""

_PATH = {"path": {"type": "string", "description": "Path of the file, relative to the repository root."}}
TOOLS = [
    {"name": "read_file", "description": "Read a file of the repository.",
     "parameters": {"type": "object", "properties": _PATH, "required": ["path"]}},
    {"name": "write_file", "description": "Write a file of the repository, replacing all of its text.",
     "parameters": {"type": "object", "required": ["path", "content"],
                    "properties": {**_PATH, "content": {"type": "string", "description": "The whole new text."}}}},
    {"name": "edit_file", "description": "Replace one exact, unique occurrence of old_string in a file.",
     "parameters": {"type": "object", "required": ["path", "old_string", "new_string"],
                    "properties": {**_PATH, "old_string": {"type": "string"}, "new_string": {"type": "string"}}}},
    {"name": "run_tests", "description": "Run the repository's test suite.",
     "parameters": {"type": "object", "properties": {}}},
]


@dataclass(frozen=True)
class Session:
    """One agent task on ``edit``'s window (the file ``path``), through ``route``."""

    edit: Edit
    route: str

    @property
    def path(self) -> str:
        return f"src/{self.edit.file}"


def sessions(edits: Sequence[Edit], routes: Sequence[str]) -> List[Session]:
    """One session per edit, the routes in turn."""
    return [Session(e, routes[i % len(routes)]) for i, e in enumerate(edits)]


def _tests_output(s: Session) -> str:
    """A failing pytest run after the rename (as a run_tests result)."""
    return (f"============================= test session starts ==============================\n"
            f"collected 12 items\n\ntests/test_{s.edit.file[:-3]}.py ..........F.                           [100%]\n\n"
            f"=================================== FAILURES ===================================\n"
            f"E   NameError: name '{s.edit.old}' is not defined\n\n{s.path}: NameError\n"
            f"=========================== short test summary info ============================\n"
            f"FAILED tests/test_{s.edit.file[:-3]}.py - NameError: name '{s.edit.old}' is not defined\n"
            f"========================= 1 failed, 11 passed in 0.42s =========================")


def turns(s: Session, kind: str) -> Tuple[List[tuple], Optional[str], int]:
    """The conversation of ``kind``'s request, dialect-neutral: ("user", text),
    ("call", id, tool, arguments) and ("result", id, text); the tool it forces
    (None: auto); its max_tokens."""
    e = s.edit
    out: List[tuple] = [("user", f"In {s.path}, rename `{e.old}` to `{e.new}`."),
                        ("call", "call_1", "read_file", {"path": s.path}), ("result", "call_1", e.original)]
    copy = copy_tokens(e)
    if kind == "prose":
        return out + [("user", "Before you change it: what does this file do? Two sentences.")], None, PROSE_TOKENS
    if kind == "code":
        return out + [("user", "Show me the whole file with the rename applied, in one python code block.")], None, copy
    if kind == "write":
        return out + [("user", "Apply the rename: write the whole file back with write_file.")], "write_file", copy
    if kind == "edit":
        return (out + [("user", "Apply the rename to the first function that uses it, with edit_file.")],
                "edit_file", copy // 2)
    if kind == "tests":
        return (out + [("call", "call_2", "run_tests", {}), ("result", "call_2", _tests_output(s)),
                       ("user", "What failed, and why? Two sentences.")], None, PROSE_TOKENS)
    raise ValueError(f"unknown step kind {kind!r}; known: {', '.join(KINDS)}")


def body(route: str, conversation: Sequence[tuple], tool: Optional[str], max_tokens: int) -> dict:
    """``conversation`` as ``route``'s streamed, greedy request (one adapter per dialect)."""
    if route == "chat":
        messages: List[dict] = [{"role": "system", "content": SYSTEM}]
        for t in conversation:
            if t[0] == "user":
                messages.append({"role": "user", "content": t[1]})
            elif t[0] == "call":
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": t[1], "type": "function", "function": {"name": t[2], "arguments": json.dumps(t[3])}}]})
            else:
                messages.append({"role": "tool", "tool_call_id": t[1], "content": t[2]})
        return {"messages": messages, "max_tokens": max_tokens,
                "tools": [{"type": "function", "function": t} for t in TOOLS],
                "tool_choice": {"type": "function", "function": {"name": tool}} if tool else "auto"}
    if route == "messages":
        msgs: List[dict] = []
        for t in conversation:
            if t[0] == "call":
                block = {"type": "tool_use", "id": t[1], "name": t[2], "input": t[3]}
                role = "assistant"
            else:
                block = ({"type": "text", "text": t[1]} if t[0] == "user"
                         else {"type": "tool_result", "tool_use_id": t[1], "content": t[2]})
                role = "user"
            if msgs and msgs[-1]["role"] == role:  # Anthropic's roles alternate: one message, many blocks
                msgs[-1]["content"].append(block)
            else:
                msgs.append({"role": role, "content": [block]})
        return {"model": "agent", "system": SYSTEM, "messages": msgs, "max_tokens": max_tokens,
                "tools": [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                          for t in TOOLS],
                "tool_choice": {"type": "tool", "name": tool} if tool else {"type": "auto"}}
    if route == "responses":
        items: List[dict] = []
        for t in conversation:
            if t[0] == "user":
                items.append({"role": "user", "content": t[1]})
            elif t[0] == "call":
                items.append({"type": "function_call", "call_id": t[1], "name": t[2], "arguments": json.dumps(t[3])})
            else:
                items.append({"type": "function_call_output", "call_id": t[1], "output": t[2]})
        return {"model": "agent", "instructions": SYSTEM, "input": items, "max_output_tokens": max_tokens,
                "tools": [{"type": "function", **t} for t in TOOLS],
                "tool_choice": {"type": "function", "name": tool} if tool else "auto"}
    raise ValueError(f"unknown route {route!r}; known: {', '.join(ROUTES)}")


def _delta(event: dict) -> Tuple[str, Optional[str]]:
    """(the answer's text or tool-argument delta, a tool call's name) of one
    streamed event of any of the three dialects."""
    kind = event.get("type", "")
    if kind == "content_block_start":  # Anthropic
        block = event.get("content_block") or {}
        return "", block.get("name") if block.get("type") == "tool_use" else None
    if kind == "content_block_delta":
        d = event.get("delta") or {}
        return d.get("text") or d.get("partial_json") or "", None
    if kind == "response.output_item.added":  # Responses
        item = event.get("item") or {}
        return "", item.get("name") if item.get("type") == "function_call" else None
    if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
        return event.get("delta") or "", None
    text, name = "", None  # chat completions
    for c in event.get("choices") or []:
        d = c.get("delta") or {}
        text += d.get("content") or ""
        for call in d.get("tool_calls") or []:
            f = call.get("function") or {}
            name = f.get("name") or name
            text += f.get("arguments") or ""
    return text, name


def stream(port: int, route: str, body_: dict, timeout: float = 600) -> dict:
    """POST ``body_`` to ``route`` with stream on: the answer (text and tool
    arguments, in order), the tool called (or None), and the times
    (perf_counter) of sending, of the first answer byte, of the event that
    names the call, of its first argument byte and of the end."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    first, tool, pieces = None, None, []
    t_call = t_args = None
    try:
        conn.request("POST", ROUTES[route], body=json.dumps({**body_, "temperature": 0, "stream": True}).encode(),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"POST {ROUTES[route]} answered HTTP {r.status}: {r.read()[:300]!r}")
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            text, name = _delta(json.loads(line[6:]))
            now = time.perf_counter()
            if name and tool is None:
                tool, t_call = name, now
            if text:
                first = first or now
                if tool is not None and t_args is None:
                    t_args = now
                pieces.append(text)
    finally:
        conn.close()
    return {"text": "".join(pieces), "tool": tool, "t_send": t0, "t_first": first, "t_call": t_call,
            "t_args": t_args, "t_end": time.perf_counter()}


def run(backends_: Sequence[Backend], sessions_: Sequence[Session], *, kinds: Sequence[str] = KINDS, reps: int,
        count: Callable[[str], int], cap: Optional[int] = None, progress: Callable[[str], None] = lambda _: None
        ) -> List[dict]:
    """Every (repetition, backend, session, kind): one row with its times, tokens and answer."""
    rows: List[dict] = []
    for rep in range(reps):
        for b in run_order(list(backends_), rep):
            progress(f"rep {rep + 1}/{reps}: {b.name}")
            server = b.start()
            try:
                stream(server.port, "chat", {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
                for i, s in enumerate(sessions_):
                    for step, kind in enumerate(kinds):
                        conversation, tool, n = turns(s, kind)
                        a = stream(server.port, s.route, body(s.route, conversation, tool, min(n, cap or n)))
                        tokens = count(a["text"])
                        first = a["t_first"] or a["t_end"]
                        decode = a["t_end"] - first
                        rows.append({"rep": rep, "backend": b.name, "session": i, "file": s.edit.file,
                                     "route": s.route, "kind": kind, "step": step, "forced": tool,
                                     "tool": a["tool"], "tokens": tokens, "first_byte_s": first - a["t_send"],
                                     "wall_s": a["t_end"] - a["t_send"],
                                     "tok_s": (tokens - 1) / decode if tokens > 1 and decode > 0.02 else None,
                                     "args_after_call_s": (a["t_args"] - a["t_call"]
                                                           if a["t_args"] is not None else None),
                                     "text": a["text"]})
                    progress(f"  {b.name}: session {i + 1}/{len(sessions_)} ({s.route}, {s.edit.file}) done")
            finally:
                server.stop()
    return rows


def _median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def _ratio(rows: Sequence[dict], a: str, b: str, key: str, keep: Callable[[dict], bool], seed: int) -> Optional[dict]:
    """``key``'s a / b, paired by (rep, session, kind); groups: sessions."""
    by = {n: {(r["rep"], r["session"], r["kind"]): r[key] for r in rows if r["backend"] == n and keep(r)}
          for n in (a, b)}
    r = paired_ratio(by[a], by[b], lambda k: k[1], seed=seed)
    return None if r is None else {"numerator": a, "denominator": b, **r}


def summarize(rows: Sequence[dict], seed: int = 0) -> dict:
    """Per (backend, kind): medians of first-byte time, decode tok/s, wall and
    tokens, and the share of forced calls answered as that tool; per kind the
    first backend's decode-rate ratio over each other (and over each other's
    first-byte time of a new conversation)."""
    names = list(dict.fromkeys(r["backend"] for r in rows))
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    figures = []
    for n in names:
        for k in kinds:
            rs = [r for r in rows if r["backend"] == n and r["kind"] == k]
            forced = [r for r in rs if r["forced"]]
            figures.append({"backend": n, "kind": k, "first_byte_s": _median(r["first_byte_s"] for r in rs),
                            "tok_s": _median(r["tok_s"] for r in rs), "wall_s": _median(r["wall_s"] for r in rs),
                            "tokens": _median(r["tokens"] for r in rs),
                            "args_after_call_s": _median(r.get("args_after_call_s") for r in forced),
                            "calls": (sum(r["tool"] == r["forced"] for r in forced), len(forced)) if forced else None})
    ratios = []
    for b in names[1:]:
        for k in kinds:
            r = _ratio(rows, names[0], b, "tok_s", lambda r, k=k: r["kind"] == k, seed)
            if r:
                ratios.append({"kind": k, "figure": "decode tok/s", **r})
        r = _ratio(rows, names[0], b, "first_byte_s", lambda r: r["step"] == 0, seed)
        if r:
            ratios.append({"kind": "new conversation", "figure": "first byte", **r})
    return {"backends": names, "kinds": kinds, "figures": figures, "ratios": ratios}


def format_summary(summary: dict) -> str:
    lines = [f"  {'backend':<26} {'kind':<7} {'first byte':>10} {'decode tok/s':>12} {'wall':>8} {'tokens':>7}"
             f" {'forced calls':>12} {'1st arg':>8}"]
    for f in summary["figures"]:
        calls = "-" if f["calls"] is None else f"{f['calls'][0]}/{f['calls'][1]}"
        gap = f["args_after_call_s"]
        lines.append(f"  {f['backend']:<26} {f['kind']:<7} {f['first_byte_s']:9.2f}s {f['tok_s']:12.1f} "
                     f"{f['wall_s']:7.2f}s {f['tokens']:7.0f} {calls:>12} "
                     f"{'-' if math.isnan(gap) else f'{gap:.2f}s':>8}")
    if summary["ratios"]:
        lines.append("ratios, paired by (repetition, session, kind): geometric mean, 95 % bootstrap interval "
                     "(decode tok/s: higher is faster; first byte: lower is sooner)")
        for r in summary["ratios"]:
            lines.append(f"  {r['kind']:<17} {r['figure']:<13} {r['numerator'] + ' / ' + r['denominator']:<46} "
                         f"{r['ratio']:.2f}x [{r['low']:.2f}, {r['high']:.2f}] over {r['n']}")
    return "\n".join(lines)


def plot(summary: dict, path: str) -> None:
    """Decode tok/s per step kind, one bar per backend; the new conversations' first byte beside."""
    from ..plot import palette, pyplot

    plt = pyplot()
    names, kinds = summary["backends"], summary["kinds"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(names)
    for j, (colour, n) in enumerate(zip(palette(len(names)), names)):
        fs = {f["kind"]: f for f in summary["figures"] if f["backend"] == n}
        ax.bar([i + j * width for i in range(len(kinds))], [fs[k]["tok_s"] for k in kinds], width, color=colour,
               label=n)
        ax2.bar([j], [fs[kinds[0]]["first_byte_s"]], color=colour)
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(kinds))], kinds)
    ax.set(ylabel="decode tokens/s (median)", title="agent steps: decode rate")
    ax2.set_xticks([])
    ax2.set(ylabel="seconds (median)", title="new conversation: first byte")
    ax.legend(fontsize=8)
    for a in (ax, ax2):
        a.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
