"""Multi-turn conversations through servers (`pyspec bench serve --multiturn`).

The backends run one at a time, on the same model file, threads, slot count
(one slot per conversation), context size, GPU offload and flash attention:

* ``pyspec serve`` as users start it (suffix drafter, auto policy, one memory
  per request ``user``); with ``--memory-off`` also ``pyspec serve --no-memory``;
* llama.cpp's own ``llama-server`` (given by path: it is not a dependency)
  plainly and with each ``--spec-type`` asked for (``ngram-mod``,
  ``ngram-simple``: its lookup drafters).

A *run* starts a fresh server (so that none carries what it saw in an earlier
run: pyspec's memories, llama-server's ``ngram-mod`` pool, which all its slots
share and keep across requests, and both prefix caches), sends one short
warm-up request, then every conversation at once, each by its own client (and
its own ``user``), turn by turn: a conversation's next request leaves when its
answer is in. The run's figure is aggregate tok/s: every answer's tokens (the
model's own tokenizer, the same rule for every backend) over the run's wall
time. Runs alternate the backends in rotating, reversing order (``run_order``
of ``../stats.py``), repetition by repetition.

Same text everywhere: the first run (pyspec serve, repetition 0) converses
with its own answers; they become the history of every later run's turns, so
every backend is sent exactly the same prompts.

Requests go to /v1/chat/completions (each server renders the GGUF's chat
template; the system message is explicit, so both render the same prompt),
streamed, greedy; with ``--raw`` to /v1/completions as a plain transcript.
The ratio pyspec serve / B is the geometric mean over repetitions of the
ratio of the two runs' aggregate tok/s in that repetition, with a 95 %
bootstrap interval over repetitions (few repetitions: a rough interval).
"""

from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..conversations import Conversation
from ..stats import bootstrap_interval, run_order
from .concurrent import percentile
from .process import (LLAMA_SERVER, PORT, Backend, ServerProcess, chat_request,  # noqa: F401 (re-exported)
                             llama_server_backends, pyspec_serve_command)

PYSPEC, PYSPEC_NO_MEMORY = "pyspec serve", "pyspec serve --no-memory"
#: Context cells per conversation when --n-ctx is not given: a conversation's
#: last prompt and answer fit (llama-server splits -c among its slots).
CTX_PER_CONVERSATION = 4096


def backends(model_path: str, *, parallel: int, n_ctx: int, threads: int, llama_server: Optional[str] = None,
             llama_specs: Sequence[str] = ("none", "ngram-mod", "ngram-simple"), llama_args: Sequence[str] = (),
             memory_off: bool = False, device: Optional[dict] = None) -> List[Backend]:
    """pyspec serve first (its first run writes the conversations' history), then
    the others; all with ``device``'s offload and flash attention."""
    ours = pyspec_serve_command(model_path, parallel=parallel, n_ctx=n_ctx, threads=threads, device=device)
    out = [Backend(PYSPEC, ours)]
    if memory_off:
        out.append(Backend(PYSPEC_NO_MEMORY, ours + ["--no-memory"]))
    if llama_server:
        out += llama_server_backends(llama_server, model_path, parallel=parallel, n_ctx=n_ctx, threads=threads,
                                     specs=llama_specs, args=llama_args, device=device)
    return out


def turn(port: int, messages: Sequence[dict], *, max_tokens: int, user: str, raw: bool) -> dict:
    """One streamed, greedy request of a conversation."""
    return chat_request(port, messages, max_tokens=max_tokens, user=user, raw=raw)


def converse(port: int, conv: Conversation, *, history: Optional[List[str]], max_tokens: int, raw: bool,
             count: Callable[[str], int]) -> dict:
    """Every turn of ``conv``, one after another; an ``edit`` conversation's
    history is ``history`` (the first run's answers) or, without one, its own."""
    answers: List[str] = []
    turns = []
    t0 = time.perf_counter()
    for i in range(len(conv.turns)):
        a = turn(port, conv.messages(i, answers if history is None else history), max_tokens=max_tokens,
                 user=conv.id, raw=raw)
        answers.append(a["text"])
        t = a.get("timings") or {}
        turns.append({"turn": i + 1, "tokens": count(a["text"]), "ttft_s": (a["t_first"] or a["t_end"]) - a["t_send"],
                      "total_s": a["t_end"] - a["t_send"],
                      **{k: t[k] for k in ("draft_n", "draft_n_accepted", "draft_memory_n") if k in t}})
    return {"conversation": conv.id, "kind": conv.kind, "wall_s": time.perf_counter() - t0,
            "tokens": sum(t["tokens"] for t in turns), "turns": turns, "answers": answers}


def run_wave(server: ServerProcess, convs: Sequence[Conversation], *, script: Optional[Dict[str, List[str]]],
             max_tokens: int, raw: bool, count: Callable[[str], int]) -> dict:
    """Every conversation at once, each by its own client and ``user``."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(convs)) as pool:
        done = list(pool.map(lambda c: converse(server.port, c, history=None if script is None else script[c.id],
                                                max_tokens=max_tokens, raw=raw, count=count), convs))
    wall = time.perf_counter() - t0
    tokens = sum(c["tokens"] for c in done)
    return {"wall_s": wall, "tokens": tokens, "aggregate_tok_s": tokens / wall if wall > 0 else float("nan"),
            "conversations": done}


def run(backends_: Sequence[Backend], convs: Sequence[Conversation], *, max_tokens: int, reps: int,
        count: Callable[[str], int], raw: bool = False, progress: Callable[[str], None] = lambda _: None,
        done: Callable[[], None] = lambda: None) -> List[dict]:
    """Runs interleaved, each on a fresh server. Returns one row per run:
    repetition, backend and figures."""
    rows: List[dict] = []
    script: Optional[Dict[str, List[str]]] = None
    for rep in range(reps):
        for b in run_order(list(backends_), rep):
            progress(f"rep {rep + 1}/{reps}: starting {b.name}")
            server = b.start()
            try:  # first-request costs (page faults, buffers) stay out of the run
                turn(server.port, convs[0].messages(0, []), max_tokens=8, user="warm-up", raw=raw)
                progress(f"rep {rep + 1}/{reps}: {b.name}")
                wave = run_wave(server, convs, script=script, max_tokens=max_tokens, raw=raw, count=count)
            finally:
                server.stop()
            if script is None:  # the first run's answers: every later run's history
                script = {c["conversation"]: c["answers"] for c in wave["conversations"]}
            rows.append({"rep": rep, "backend": b.name, **wave})
            done()
    return rows


def _same_answers(run: dict, ref: Optional[dict]) -> Tuple[int, int]:
    """(answers equal to ``ref``'s for the same turn, answers compared)."""
    if ref is None:
        return 0, 0
    pairs = [(a, b) for c, d in zip(run["conversations"], ref["conversations"])
             for a, b in zip(c["answers"], d["answers"])]
    return sum(a == b for a, b in pairs), len(pairs)


def summarize(rows: Sequence[dict], names: Sequence[str], seed: int = 0) -> dict:
    """Per backend: median aggregate tok/s, TTFT p50 / p95 over its requests,
    drafting counts, and how many answers equal pyspec serve's in the same
    repetition (the same prompts, greedy: a server that renders another prompt
    shows here; a near tie decided differently by another batch may too); per
    other backend: the paired ratio pyspec serve / it with its interval over
    repetitions."""
    out: dict = {"backends": {}, "ratios": {}}
    ref = {r["rep"]: r for r in rows if r["backend"] == names[0]}
    for n in names:
        rs = [r for r in rows if r["backend"] == n]
        turns = [t for r in rs for c in r["conversations"] for t in c["turns"]]
        same = [_same_answers(r, ref.get(r["rep"])) for r in rs] if n != names[0] else [(0, 0)]
        out["backends"][n] = {
            "aggregate_tok_s": statistics.median(r["aggregate_tok_s"] for r in rs) if rs else float("nan"),
            "ttft_p50_s": percentile([t["ttft_s"] for t in turns], 50),
            "ttft_p95_s": percentile([t["ttft_s"] for t in turns], 95),
            "draft_n": sum(t.get("draft_n", 0) for t in turns),
            "draft_n_accepted": sum(t.get("draft_n_accepted", 0) for t in turns),
            "draft_memory_n": sum(t.get("draft_memory_n", 0) for t in turns),
            "answers_equal": sum(e for e, _ in same), "answers_compared": sum(n for _, n in same),
            "runs": len(rs),
        }
    ours = {r["rep"]: r["aggregate_tok_s"] for r in rows if r["backend"] == names[0]}
    for n in names[1:]:
        logs = [math.log(ours[r["rep"]] / r["aggregate_tok_s"]) for r in rows
                if r["backend"] == n and r["rep"] in ours and r["aggregate_tok_s"] > 0 and ours[r["rep"]] > 0]
        lo, hi = bootstrap_interval([[x] for x in logs], seed=seed)
        out["ratios"][f"{names[0]} / {n}"] = {
            "ratio": math.exp(sum(logs) / len(logs)) if logs else float("nan"), "low": lo, "high": hi,
            "n_runs": len(logs), "per_rep": [math.exp(x) for x in logs]}
    return out


def format_report(summary: dict, rows: Sequence[dict]) -> str:
    convs = len(rows[0]["conversations"]) if rows else 0
    lines = [f"aggregate tok/s: every answer's tokens over the run's wall time, {convs} conversations at once "
             f"(median over runs); TTFT over all requests; drafts as the servers' timings report them"]
    lines.append(f"  {'backend':<26} {'agg tok/s':>9} {'TTFT p50':>8} {'p95 s':>6} {'drafted':>8} {'accepted':>8} "
                 f"{'memory':>7} {'same answers':>12}")
    for n, b in summary["backends"].items():
        lines.append(f"  {n:<26} {b['aggregate_tok_s']:9.1f} {b['ttft_p50_s']:8.2f} {b['ttft_p95_s']:6.2f} "
                     f"{b['draft_n']:8d} {b['draft_n_accepted']:8d} {b['draft_memory_n']:7d} "
                     f"{_fraction(b['answers_equal'], b['answers_compared']):>12}")
    first = next(iter(summary["backends"]), "")
    lines.append(f"  (memory: tokens drafted from the user's memory; same answers: as {first}'s in the same repetition)")
    lines.append("ratio of aggregate tok/s, paired within a repetition: geometric mean over repetitions, "
                 "95 % bootstrap interval (repetitions resampled)")
    for pair, r in summary["ratios"].items():
        lines.append(f"  {pair:<45} {r['ratio']:6.3f}x  [{r['low']:.3f}, {r['high']:.3f}]  {r['n_runs']} runs")
    return "\n".join(lines)


def _fraction(k: int, n: int) -> str:
    return f"{k}/{n}" if n else "-"


def plot(result: dict, path: str) -> None:
    """Each ratio with its interval, and every run's aggregate tok/s per backend."""
    from ..plot import palette, pyplot

    plt = pyplot()
    summary = result["summary"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    pairs = list(summary["ratios"].items())
    for y, (_, r) in enumerate(pairs):
        a.errorbar([r["ratio"]], [y], xerr=[[r["ratio"] - r["low"]], [r["high"] - r["ratio"]]], fmt="s", capsize=4)
        a.scatter(r["per_rep"], [y + 0.15] * len(r["per_rep"]), s=12, color="grey")
    a.axvline(1.0, color="black", linewidth=0.8)
    a.set_yticks(range(len(pairs)))
    a.set_yticklabels([p for p, _ in pairs])
    a.set_ylim(len(pairs) - 0.5, -0.5)  # the first pair on top
    a.set_xlabel("aggregate tok/s ratio (95 % interval; dots: repetitions)")
    a.set_title(f"{result['max_tokens']} tokens max, {result['reps']} repetitions")
    names = list(summary["backends"])
    colours = palette(len(names))
    for i, n in enumerate(names):
        rs = [r for r in result["runs"] if r["backend"] == n]
        b.plot([r["rep"] + 1 for r in rs], [r["aggregate_tok_s"] for r in rs], marker="o", color=colours[i], label=n)
    b.set(xlabel="repetition", ylabel="aggregate tokens/s",
          title=f"{result['parallel']} concurrent conversations, {result['threads']} threads")
    b.xaxis.get_major_locator().set_params(integer=True)
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
