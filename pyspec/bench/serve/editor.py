"""Code-editor completion traffic against servers' ``/infill`` (`pyspec bench
editor`): what a FIM plugin (llama.vim, llama.vscode) asks while its user types.

Why a replay: an editor's requests are not chat turns. Each keystroke pause
resends nearly the same long prompt (the file around the cursor) with a few
more typed characters, under a time limit; what matters is the latency of
every suggestion and how little of the prompt a server processes again.

Workload (deterministic for a seed, on code this project did not write:
editor_sites.py): lines of the interpreter's standard library, each typed
again in ``steps`` steps (fresh lines: from their bare indentation), one
request per step, shaped as llama.vim sends it: ``input_prefix`` the
``prefix_lines`` lines before the site, each with its "\\n"; ``prompt`` the
line up to the cursor; ``input_suffix`` "" (the rest of the line: typing at
its end) + "\\n" + the next ``suffix_lines`` lines + "\\n"; ``n_indent`` the
typed part's leading whitespace; top_k 40, top_p 0.90, samplers top_k, top_p,
infill; slot 0, cache_prompt; no extra context; ``t_max_predict_ms`` 250.
After the last step, the prefetch (llama.vim asks for the state after its
suggestion is accepted, before the user wants it): the whole site line
appended to the prefix, an empty prompt, 1000 ms.

Sampling: plugins sample at random, which would make the "right" share a
coin. By default (greedy) requests also carry ``temperature`` 0, and since
llama.cpp applies a temperature only where ``samplers`` names it, "temperature"
is appended to the plugin's chain: the most likely token among those the
infill sampler keeps (both servers apply it).

Right: a typed step's suggestion is right when its first line (up to the first
"\\n") is a non-empty prefix of what the user goes on to type on that line, or
equals it (at the line's end: nothing more on it); whole: when all of it is
that rest of the line and nothing more; empty: blank where more follows.

Backends run at once (each its own process, its own prompt cache), sites
interleaved: site i runs on every backend in ``stats.run_order`` (AB, BA, BA,
AB ...), so drift is shared; every server first answers one warm-up request.
Figures per backend, typed steps and prefetches apart: latency (request wall
time) p50 and p90, nearest rank, with 95 % bootstrap intervals over sites (a
site's requests are resampled together: they share a cache); mean prompt
tokens processed (``timings.prompt_n``); suggestion tokens within 250 ms and
1 s of generation, approximated from ``predicted_n`` and ``predicted_ms`` as
if tokens came at an even pace (:func:`within`); the typed steps' right,
whole and empty counts.
Ratios of p50 latency (the first backend over each other), same requests.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..stats import run_order
from .concurrent import percentile
from .editor_sites import Site, is_right, is_whole, site_requests
from .process import Backend, request

BUDGETS_MS = (250, 1000)
KINDS = ("typed", "prefetch")
WARM_UP = {"input_prefix": "def add(a, b):\n", "input_suffix": "\n", "prompt": "    return", "n_predict": 4}

@dataclass(frozen=True)
class EditorBackend:
    """A server to start (``server``) and the fields its requests add (``fields``: pyspec's layout)."""

    name: str
    server: Backend
    fields: Dict[str, object] = field(default_factory=dict)


def within(predicted_n: int, predicted_ms: float, budget_ms: float) -> float:
    """Suggestion tokens produced within ``budget_ms`` of generation: all of them
    if generation took no longer, else a pro-rata share (an even pace: approximate)."""
    if predicted_ms <= budget_ms:
        return float(predicted_n)
    return predicted_n * budget_ms / predicted_ms


def _get(resp: dict, key: str, default=None):
    """A response field, nested (``timings.prompt_n``) or flat as llama-server
    writes ``response_fields`` (``"timings/prompt_n"``)."""
    if key in resp:
        return resp[key]
    head, _, tail = key.partition("/")
    if tail and isinstance(resp.get(head), dict):
        return resp[head].get(tail, default)
    return default


def infill(port: int, body: dict) -> Tuple[float, dict]:
    """POST /infill: (wall seconds, the response); RuntimeError unless 200."""
    t0 = time.perf_counter()
    status, resp = request(port, "POST", "/infill", body)
    wall = time.perf_counter() - t0
    if status != 200 or not isinstance(resp, dict):
        hint = " (this server has no /infill route)" if status == 404 else ""
        raise RuntimeError(f"POST /infill answered HTTP {status}{hint}: {str(resp)[:300]}")
    return wall, resp


def record(site_index: int, backend: str, req: dict, wall: float, resp: dict) -> dict:
    content = _get(resp, "content", "") or ""
    rec = {"site": site_index, "backend": backend, "kind": req["kind"], "step": req["step"], "cut": req["cut"],
           "latency_s": wall, "content": content, "rest": req["rest"],
           "right": is_right(content, req["rest"]) if req["rest"] is not None else None,
           "whole": is_whole(content, req["rest"]) if req["rest"] is not None else None}
    for key in ("tokens_predicted", "tokens_cached", "stop_type", "truncated"):
        rec[key] = _get(resp, key)
    for key in ("prompt_n", "prompt_ms", "cache_n", "predicted_n", "predicted_ms", "draft_n", "draft_n_accepted"):
        rec[key] = _get(resp, f"timings/{key}")
    n, ms = rec["predicted_n"] or 0, rec["predicted_ms"] or 0.0
    for b in BUDGETS_MS:
        rec[f"tokens_{b}ms"] = within(n, ms, b)
    return rec


def run(backends: Sequence[EditorBackend], sites_: Sequence[Site], *, steps: int, n_predict: int = 32,
        temperature: Optional[float] = 0.0, progress: Callable[[str], None] = lambda _: None,
        send: Callable[[int, dict], Tuple[float, dict]] = infill) -> List[dict]:
    """Start every backend (one warm-up request each), then every site on every
    backend in the site's order; one record per request."""
    servers: Dict[str, object] = {}
    records: List[dict] = []
    try:
        for b in backends:
            progress(f"starting {b.name}")
            servers[b.name] = b.server.start()
            try:
                send(servers[b.name].port, {**WARM_UP, **b.fields})
            except RuntimeError as e:
                raise RuntimeError(f"{b.name}: {e}") from None
        for i, site in enumerate(sites_):
            reqs = site_requests(site, steps, n_predict=n_predict, temperature=temperature)
            walls = {}
            for b in run_order(list(backends), i):
                for req in reqs:
                    try:
                        wall, resp = send(servers[b.name].port, {**req["body"], **b.fields})
                    except RuntimeError as e:
                        raise RuntimeError(f"{b.name}: {e}") from None
                    records.append(record(i, b.name, req, wall, resp))
                typed = [r["latency_s"] for r in records if r["site"] == i and r["backend"] == b.name]
                walls[b.name] = f"{sum(typed) / len(typed):.2f}s"
            progress(f"site {i + 1}/{len(sites_)} {site.file}:{site.line_no}: mean latency "
                     + ", ".join(f"{k} {v}" for k, v in walls.items()))
    finally:
        for s in servers.values():
            s.stop()
    return records


def bootstrap(groups: Sequence[Sequence], stat: Callable[[list], float], n_boot: int = 2000, seed: int = 0,
              level: float = 0.95) -> Tuple[float, float]:
    """Percentile interval of ``stat`` of the pooled items, groups (sites) resampled whole."""
    groups = [list(g) for g in groups if g]
    if not groups:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    vals = sorted(stat([x for _ in groups for x in rng.choice(groups)]) for _ in range(n_boot))
    return vals[int(math.floor((1 - level) / 2 * (n_boot - 1)))], vals[int(math.ceil((1 + level) / 2 * (n_boot - 1)))]


def paired_p50_ratio(groups: Sequence[Sequence[Tuple[float, float]]], seed: int = 0) -> dict:
    """p50 of the first of each pair over p50 of the second, pooled over
    ``groups`` (pairs of the same request on two backends, grouped by what is
    resampled whole), with its bootstrap interval."""
    def stat(pairs: list) -> float:
        return percentile([x for x, _ in pairs], 50) / percentile([y for _, y in pairs], 50)

    pooled = [p for g in groups for p in g]
    return {"pairs": len(pooled), "ratio": stat(pooled) if pooled else float("nan"),
            "interval": bootstrap(groups, stat, seed=seed)}


def _by_site(records: Sequence[dict], backend: str, kind: str) -> Dict[int, List[dict]]:
    out: Dict[int, List[dict]] = {}
    for r in records:
        if r["backend"] == backend and r["kind"] == kind:
            out.setdefault(r["site"], []).append(r)
    return out


def _mean(xs: Sequence[Optional[float]]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def figures(records: Sequence[dict], backend: str, kind: str, seed: int = 0) -> dict:
    sites_ = _by_site(records, backend, kind)
    rs = [r for g in sites_.values() for r in g]
    groups = [[r["latency_s"] for r in g] for g in sites_.values()]
    out = {"backend": backend, "kind": kind, "n": len(rs), "sites": len(sites_)}
    for q in (50, 90):
        out[f"latency_p{q}_s"] = percentile([r["latency_s"] for r in rs], q)
        out[f"latency_p{q}_interval"] = bootstrap(groups, lambda xs, q=q: percentile(xs, q), seed=seed)
    out["prompt_n_mean"] = _mean([r["prompt_n"] for r in rs])
    for b in BUDGETS_MS:
        out[f"tokens_{b}ms_mean"] = _mean([r[f"tokens_{b}ms"] for r in rs])
    if kind == "typed":
        out["right"] = sum(bool(r["right"]) for r in rs)
        out["right_share"] = out["right"] / len(rs) if rs else float("nan")
        out["whole"] = sum(bool(r.get("whole")) for r in rs)
        out["empty"] = sum(not r["content"].strip() and bool(r["rest"].strip()) for r in rs)
    return out


def p50_ratio(records: Sequence[dict], numerator: str, denominator: str, kind: str, seed: int = 0) -> dict:
    """p50 latency of ``numerator`` over ``denominator``'s on the same requests
    (site and step), interval by resampling sites."""
    a, b = _by_site(records, numerator, kind), _by_site(records, denominator, kind)
    groups = []
    for s in sorted(set(a) & set(b)):
        theirs = {r["step"]: r["latency_s"] for r in b[s]}
        groups.append([(r["latency_s"], theirs[r["step"]]) for r in a[s] if r["step"] in theirs])
    return {"numerator": numerator, "denominator": denominator, "kind": kind, "sites": len(groups),
            **paired_p50_ratio(groups, seed)}


def summarize(records: Sequence[dict], seed: int = 0) -> dict:
    names = list(dict.fromkeys(r["backend"] for r in records))
    return {"backends": names,
            "figures": [figures(records, n, k, seed) for n in names for k in KINDS],
            "ratios": [p50_ratio(records, names[0], n, k, seed) for n in names[1:] for k in KINDS]}


def _num(x: Optional[float], fmt: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _p(f: dict, q: int) -> str:
    lo, hi = f[f"latency_p{q}_interval"]
    return f"{_num(f[f'latency_p{q}_s'], '.3f')} [{_num(lo, '.3f')}, {_num(hi, '.3f')}]"


def format_summary(summary: dict) -> str:
    lines = ["latency: request wall time, nearest-rank percentiles [95 % bootstrap interval over sites], seconds; "
             "prompt: tokens processed (timings.prompt_n), mean; tok@250ms, tok@1s: suggestion tokens within that "
             "much generation time (an even pace assumed), mean; right: typed suggestions whose first line is what "
             "the user goes on to type; whole: whose whole text is (nothing more); empty: blank where more follows",
             f"  {'backend':<28} {'kind':<8} {'n':>4} {'p50 latency':>24} {'p90 latency':>24} {'prompt':>7} "
             f"{'tok@250ms':>9} {'tok@1s':>7} {'right':>12} {'whole':>5} {'empty':>5}"]
    for f in summary["figures"]:
        typed = f["kind"] == "typed" and f["n"]
        right = f"{f['right']}/{f['n']} ({f['right_share']:.0%})" if typed else ""
        lines.append(f"  {f['backend']:<28} {f['kind']:<8} {f['n']:>4} {_p(f, 50):>24} {_p(f, 90):>24} "
                     f"{_num(f['prompt_n_mean']):>7} {_num(f['tokens_250ms_mean']):>9} "
                     f"{_num(f['tokens_1000ms_mean']):>7} {right:>12} {f['whole'] if typed else '':>5} "
                     f"{f['empty'] if typed else '':>5}")
    if summary["ratios"]:
        lines.append("p50 latency ratios on the same requests [95 % bootstrap interval over sites]; < 1: the first "
                     "backend answers sooner")
        for r in summary["ratios"]:
            lo, hi = r["interval"]
            lines.append(f"  {r['numerator'] + ' / ' + r['denominator']:<58} {r['kind']:<8} "
                         f"{_num(r['ratio'], '.2f')}x [{_num(lo, '.2f')}, {_num(hi, '.2f')}] ({r['pairs']} pairs)")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """The latency distribution (empirical CDF) per backend: typed steps solid, prefetches dashed."""
    from ..plot import palette, pyplot

    plt = pyplot()
    names = result["summary"]["backends"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for colour, n in zip(palette(len(names)), names):
        for kind, style in zip(KINDS, ("-", "--")):
            xs = sorted(r["latency_s"] for r in result["requests"] if r["backend"] == n and r["kind"] == kind)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], style, where="post", color=colour,
                        label=f"{n}, {kind}")
    ax.set_xscale("log")
    ax.set(xlabel="suggestion latency (s, log scale)", ylabel="share of requests at or below",
           title=f"/infill, {len(result['sites'])} sites, {result['steps']} steps per line")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
