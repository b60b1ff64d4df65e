"""The edits workload of `pyspec bench editor` (``--workload edits``): a small
change asked of a 60-150-line file, the original as the prediction (OpenAI's
Predicted Outputs), as an editor's "apply this edit" command asks it.

Workload (deterministic for a seed, on the standard-library files the typing
workload reads: editor_sites.py's FILES). A window starts at a top-level ``def`` or
``class`` (at its first decorator) and ends with the last top-level statement
that keeps it within ``max_lines`` lines, if that makes ``min_lines`` or more;
else at the last line within ``max_lines`` that ends any statement (it may cut
a class). The change renames one identifier of the window to ``old +
"_renamed"``: an argument or local variable (:data:`MIN_NAME` characters or
more) of a function that lies entirely within the window, occurring
:data:`MIN_USES` times or more, where every occurrence of its word in the
window is that variable (an ``ast`` Name or argument inside a function whose
local it is: no string, comment, attribute or keyword argument spells it), so
the expected answer is the window with the word replaced. Files go in a
seeded order, round robin, one seeded window of each at a time; a file's
windows do not overlap; the identifier is a seeded choice among those that fit.

Request (/v1/chat/completions, not streamed, temperature 0): the system message
:data:`SYSTEM`, the user's "Rename `old` to `new` in this file:" and the window
in a python fence; max_tokens :func:`max_tokens` (1.3 times the window's tokens,
estimated as characters / 3, + 32; at most ``cap``).

Variants: pyspec serve's ``plain`` (``draft_max`` 0: no drafting), ``default``
(its default drafting) and ``prediction`` (``prediction``: the original
window); each llama-server variant sends the plain request (it has no Predicted
Outputs; ``--spec-type ngram-mod`` finds the file in the prompt). Each pyspec
variant is a ``user`` of its own (:data:`USER`), since pyspec serve keeps a
draft memory and length policy per user: a variant drafts from its own
earlier answers, never from another variant's answer to the same edit. Before
an edit's variants every server answers the edit's prompt once with max_tokens
1 (pyspec: as a user of its own), so the prompt is in each server's cache and a
variant's request time is mostly its decode, whichever variant runs first; the
variants of edit i then run in ``stats.run_order`` (rotated, reversed on odd
edits), so drift is shared.

Figures per variant: request time (wall) summed over edits; decode tokens/s
(sum of ``timings.predicted_n`` over the sum of ``predicted_ms``); the
geometric mean over edits of each edit's decode time (``predicted_ms``) and
request time over the first variant's (pyspec plain) on the same edit, with a
95 % bootstrap interval over edits; accepted and rejected prediction tokens
(``usage.completion_tokens_details``); drafted and accepted draft tokens;
answers equal to the expected file (:func:`matches`), and answers cut at
max_tokens (finish_reason "length").
"""

from __future__ import annotations

import ast
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..stats import bootstrap_interval, geo_mean, run_order
from .editor_sites import FILES, stdlib_dir, stdlib_texts
from .process import Backend, request

SYSTEM = "You are a code editor. Reply with the whole file after the change, and nothing else."
MIN_NAME, MIN_USES = 3, 3
LINES = (60, 150)
SUFFIX = "_renamed"
USER = "bench-editor {}"  # a pyspec variant's user (its name in the braces)
PRIME_USER = USER.format("prime")
CHAT = "/v1/chat/completions"
WARM_UP = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0, "stream": False}
TIMINGS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "draft_n", "draft_n_accepted", "draft_memory_n")
PREDICTION = ("accepted_prediction_tokens", "rejected_prediction_tokens")
_FENCE = re.compile(r"\A\s*```[\w+-]*[ \t]*\n(.*?)\n?[ \t]*```\s*\Z", re.S)


@dataclass(frozen=True)
class Edit:
    """Rename ``old`` to ``new`` in ``original``: lines ``start``.. of ``file`` (each with its "\\n")."""

    file: str
    start: int
    original: str
    old: str
    new: str
    uses: int

    @property
    def n_lines(self) -> int:
        return self.original.count("\n")

    @property
    def expected(self) -> str:
        return rename(self.original, self.old, self.new)


@dataclass(frozen=True)
class Variant:
    """A request shape: on server ``server``, with ``fields`` added, the original as prediction if ``predicted``."""

    name: str
    server: str
    fields: Dict[str, object] = field(default_factory=dict)
    predicted: bool = False


def _word(name: str) -> "re.Pattern[str]":
    return re.compile(rf"(?<!\w){re.escape(name)}(?!\w)")


def rename(text: str, old: str, new: str) -> str:
    """``text`` with every occurrence of the word ``old`` replaced by ``new``."""
    return _word(old).sub(new, text)


def _first_line(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


@dataclass
class _Source:
    """A file's lines and what the windows need of its syntax tree."""

    file: str
    lines: List[str]
    tops: List[Tuple[int, int, bool]]          # top-level statements: (first line, last line, a def or class)
    ends: Set[int]                             # lines that end a statement
    uses: Dict[str, Set[Tuple[int, int]]]      # name -> (line, column) of its Name and arg nodes
    functions: List[Tuple[int, int, Set[str]]]  # (first line, last line, local names)


def _source(file: str, text: str) -> _Source:
    tree = ast.parse(text)
    uses: Dict[str, Set[Tuple[int, int]]] = {}
    functions = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            uses.setdefault(node.id, set()).add((node.lineno, node.col_offset))
        elif isinstance(node, ast.arg):
            uses.setdefault(node.arg, set()).add((node.lineno, node.col_offset))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            local = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
            declared = set()
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    local.add(n.id)
                elif isinstance(n, (ast.Global, ast.Nonlocal)):
                    declared.update(n.names)
            functions.append((_first_line(node), node.end_lineno, local - declared))
    tops = [(_first_line(n), n.end_lineno, isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
            for n in tree.body]
    ends = {n.end_lineno for n in ast.walk(tree) if isinstance(n, ast.stmt)}
    return _Source(file, text.split("\n"), tops, ends, uses, functions)


def window_end(src: _Source, start: int, min_lines: int, max_lines: int) -> Optional[int]:
    """The last line of the window from line ``start`` (module docstring); None: no window fits."""
    fits = [e for s, e, _ in src.tops if s >= start and min_lines <= e - start + 1 <= max_lines]
    if fits:
        return max(fits)
    inner = [e for e in src.ends if min_lines <= e - start + 1 <= max_lines and e <= len(src.lines)]
    return max(inner) if inner else None


def identifiers(src: _Source, start: int, end: int) -> List[Tuple[str, int]]:
    """``(name, occurrences)`` of the names lines ``start``..``end`` may rename (module docstring), sorted."""
    fns = [(a, b, local) for a, b, local in src.functions if start <= a and b <= end]
    window = src.lines[start - 1:end]
    text = "\n".join(window)
    out = []
    for name in sorted(set().union(*(local for _, _, local in fns)) if fns else ()):
        if len(name) < MIN_NAME or name in ("self", "cls") or _word(name + SUFFIX).search(text):
            continue
        pattern = _word(name)
        at = [(start + i, m.start()) for i, line in enumerate(window) for m in pattern.finditer(line)]
        if len(at) >= MIN_USES and all(p in src.uses.get(name, ()) for p in at) and all(
                any(a <= ln <= b and name in local for a, b, local in fns) for ln, _ in at):
            out.append((name, len(at)))
    return out


def edits(n: int, seed: int = 0, *, lines: Tuple[int, int] = LINES, root: Optional[str] = None,
          files: Sequence[str] = FILES) -> List[Edit]:
    """``n`` edits (fewer where the files hold fewer), the same for the same seed (and interpreter)."""
    min_lines, max_lines = lines
    sources = {f: _source(f, t) for f, t in stdlib_texts(root or stdlib_dir(), files).items()}
    rng = random.Random(seed)
    order = sorted(sources)
    rng.shuffle(order)
    pools = {f: [s for s, _, is_def in sources[f].tops if is_def] for f in order}
    taken: Dict[str, List[Tuple[int, int]]] = {f: [] for f in order}
    out: List[Edit] = []
    while len(out) < n and any(pools.values()):
        for f in order:
            while len(out) < n and pools[f]:
                src, start = sources[f], pools[f].pop(rng.randrange(len(pools[f])))
                end = window_end(src, start, min_lines, max_lines)
                if end is None or any(start <= e and s <= end for s, e in taken[f]):
                    continue
                names = identifiers(src, start, end)
                if not names:
                    continue
                old, uses = names[rng.randrange(len(names))]
                taken[f].append((start, end))
                out.append(Edit(f, start, "".join(x + "\n" for x in src.lines[start - 1:end]), old, old + SUFFIX,
                                uses))
                break
    return out


def variants(pyspec: Optional[str], others: Sequence[str] = ()) -> List[Variant]:
    """pyspec serve's three variants (on server ``pyspec``, each its own user;
    None: none), then one per other server."""
    out = []
    if pyspec is not None:
        for kind, fields in (("plain", {"draft_max": 0}), ("default", {}), ("prediction", {})):
            name = f"{pyspec} {kind}"
            out.append(Variant(name, pyspec, {"user": USER.format(name), **fields}, predicted=kind == "prediction"))
    return out + [Variant(name, name) for name in others]


def max_tokens(edit: Edit, cap: Optional[int] = None) -> int:
    """1.3 times the window's tokens (estimated as characters / 3) + 32, at most ``cap``."""
    n = int(len(edit.original) // 3 * 1.3) + 32
    return min(n, cap) if cap else n


def messages(edit: Edit) -> List[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Rename `{edit.old}` to `{edit.new}` in this file:\n```python\n"
                                        f"{edit.original}```"}]


def body(edit: Edit, variant: Optional[Variant] = None, *, cap: Optional[int] = None) -> dict:
    """The request of ``edit`` in ``variant`` (None: the bare request)."""
    out = {"messages": messages(edit), "temperature": 0, "max_tokens": max_tokens(edit, cap), "stream": False}
    if variant is not None:
        out.update(variant.fields)
        if variant.predicted:
            out["prediction"] = {"type": "content", "content": edit.original}
    return out


def unfenced(text: str) -> str:
    """``text`` without one code fence around all of it."""
    m = _FENCE.match(text)
    return m.group(1) if m else text


def matches(answer: str, expected: str) -> bool:
    """The answer is the expected file: one surrounding code fence and the whitespace at either end left out."""
    return unfenced(answer).strip() == expected.strip()


def chat(port: int, body_: dict) -> Tuple[float, dict]:
    """POST /v1/chat/completions: (wall seconds, the response); RuntimeError unless 200."""
    t0 = time.perf_counter()
    status, resp = request(port, "POST", CHAT, body_)
    wall = time.perf_counter() - t0
    if status != 200 or not isinstance(resp, dict):
        raise RuntimeError(f"POST {CHAT} answered HTTP {status}: {str(resp)[:300]}")
    return wall, resp


def record(index: int, variant: Variant, edit: Edit, wall: float, resp: dict) -> dict:
    choice = (resp.get("choices") or [{}])[0]
    content = (choice.get("message") or {}).get("content") or ""
    usage = resp.get("usage") or {}
    details, timings = usage.get("completion_tokens_details") or {}, resp.get("timings") or {}
    rec = {"edit": index, "variant": variant.name, "server": variant.server, "latency_s": wall,
           "finish_reason": choice.get("finish_reason"), "match": matches(content, edit.expected),
           "completion_tokens": usage.get("completion_tokens"), "content": content}
    rec.update({k: details.get(k) for k in PREDICTION})
    rec.update({k: timings.get(k) for k in TIMINGS})
    return rec


def run(servers: Sequence[Tuple[str, Backend]], variants_: Sequence[Variant], edits_: Sequence[Edit], *,
        cap: Optional[int] = None, progress: Callable[[str], None] = lambda _: None,
        send: Callable[[int, dict], Tuple[float, dict]] = chat) -> List[dict]:
    """Start every server (one warm-up request each), then per edit prime every
    server's cache with its prompt and run every variant in the edit's order;
    one record per variant and edit."""
    started: Dict[str, object] = {}
    records: List[dict] = []

    def ask(server: str, body_: dict) -> Tuple[float, dict]:
        try:
            return send(started[server].port, body_)
        except RuntimeError as e:
            raise RuntimeError(f"{server}: {e}") from None

    try:
        for name, backend in servers:
            progress(f"starting {name}")
            started[name] = backend.start()
            ask(name, dict(WARM_UP))
        prime = {name: {"user": PRIME_USER} if any("user" in v.fields for v in variants_ if v.server == name) else {}
                 for name in started}
        for i, edit in enumerate(edits_):
            for name in started:
                ask(name, {**body(edit), "max_tokens": 1, **prime[name]})
            for v in run_order(list(variants_), i):
                wall, resp = ask(v.server, body(edit, v, cap=cap))
                records.append(record(i, v, edit, wall, resp))
            done = {r["variant"]: r for r in records if r["edit"] == i}
            progress(f"edit {i + 1}/{len(edits_)} {edit.file}:{edit.start} ({edit.n_lines} lines, {edit.old}): "
                     + ", ".join(f"{v.name} {done[v.name]['latency_s']:.2f}s" for v in variants_))
    finally:
        for s in started.values():
            s.stop()
    return records


def _sum(xs) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return sum(xs) if xs else None


def ratio(records: Sequence[dict], numerator: str, denominator: str, key: str, seed: int = 0) -> dict:
    """Geometric mean over edits of ``key`` of ``numerator`` over ``denominator``'s on the
    same edit (edits where either is missing or not positive left out), interval over edits."""
    a = {r["edit"]: r[key] for r in records if r["variant"] == numerator}
    b = {r["edit"]: r[key] for r in records if r["variant"] == denominator}
    logs = [[math.log(a[e] / b[e])] for e in sorted(set(a) & set(b)) if (a[e] or 0) > 0 and (b[e] or 0) > 0]
    if not logs:
        return {"ratio": float("nan"), "interval": (float("nan"), float("nan")), "pairs": 0}
    return {"ratio": geo_mean(logs), "interval": bootstrap_interval(logs, seed=seed), "pairs": len(logs)}


def figures(records: Sequence[dict], variant: str, baseline: str, seed: int = 0) -> dict:
    rs = [r for r in records if r["variant"] == variant]
    n, ms = sum(r["predicted_n"] or 0 for r in rs), sum(r["predicted_ms"] or 0.0 for r in rs)
    out = {"variant": variant, "edits": len(rs), "request_s": sum(r["latency_s"] for r in rs),
           "decode_s": ms / 1000, "predicted_n": n, "decode_tok_s": 1000 * n / ms if ms > 0 else float("nan"),
           "matches": sum(bool(r["match"]) for r in rs),
           "truncated": sum(r["finish_reason"] == "length" for r in rs)}
    for k in PREDICTION + ("draft_n", "draft_n_accepted", "draft_memory_n"):
        out[k] = _sum(r[k] for r in rs)
    out["decode_ratio"] = ratio(records, variant, baseline, "predicted_ms", seed)
    out["request_ratio"] = ratio(records, variant, baseline, "latency_s", seed)
    return out


def summarize(records: Sequence[dict], names: Optional[Sequence[str]] = None, seed: int = 0) -> dict:
    """Figures per variant (``names``: their order, the first the baseline; default: as first recorded)."""
    names = list(names or dict.fromkeys(r["variant"] for r in records))
    base = names[0] if names else None
    return {"variants": names, "baseline": base, "figures": [figures(records, n, base, seed) for n in names]}


def _num(x: Optional[float], fmt: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _ratio(r: dict) -> str:
    lo, hi = r["interval"]
    return f"{_num(r['ratio'], '.2f')}x [{_num(lo, '.2f')}, {_num(hi, '.2f')}]"


def format_summary(summary: dict) -> str:
    lines = [f"edits: time: request wall time summed over edits, s; tok/s: decode tokens per second "
             f"(timings.predicted_n / predicted_ms); decode ratio, request ratio: each edit's decode time and request "
             f"time over {summary['baseline']}'s, geometric mean [95 % bootstrap interval over edits]; prediction: "
             f"accepted/rejected prediction tokens; draft: accepted/drafted tokens; right: answers equal to the "
             f"expected file; cut: answers stopped by max_tokens",
             f"  {'variant':<28} {'edits':>5} {'time':>8} {'tok/s':>7} {'decode ratio':>21} {'request ratio':>21} "
             f"{'prediction':>11} {'draft':>11} {'right':>5} {'cut':>4}"]
    for f in summary["figures"]:
        pred = (f"{f['accepted_prediction_tokens']}/{f['rejected_prediction_tokens']}"
                if f["accepted_prediction_tokens"] is not None else "-")
        draft = f"{f['draft_n_accepted']}/{f['draft_n']}" if f["draft_n"] is not None else "-"
        lines.append(f"  {f['variant']:<28} {f['edits']:>5} {_num(f['request_s'], '.2f'):>8} "
                     f"{_num(f['decode_tok_s']):>7} {_ratio(f['decode_ratio']):>21} {_ratio(f['request_ratio']):>21} "
                     f"{pred:>11} {draft:>11} {f['matches']:>5} {f['truncated']:>4}")
    return "\n".join(lines)
