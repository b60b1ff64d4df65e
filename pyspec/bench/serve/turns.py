"""Conversations in turn (`pyspec bench serve --turns N`): the one local user
with several chats open (two editors, an agent and its helper), each with a
long system prompt of its own, who sends them one request at a time in turn:
A1, B1, A2, B2, ... Each request carries the whole conversation so far (the
answers received included), as a chat client does, and no ``user`` field.
With ``resend`` every round sends each conversation's first request again
(A, B, A, B, ...: a retry, a regenerated answer), the case where a server
that kept the conversation has nothing new to prefill.

Backends, on the same model file, threads and context: ``pyspec serve`` (with
the draft model), ``pyspec serve --no-draft``, and with ``--llama-server``
llama.cpp's llama-server plainly (``-np`` slots as given; it keeps each slot's
cache and its host-memory "extra slots"). Per repetition each backend runs the
whole sequence on a fresh server (the order rotates: ``paired.run_order``).

Figures: the time to first token of every request (sending to first text,
streamed, greedy, ``max_tokens`` tokens); a conversation's first turn is
cold (its system prompt is new to the server), every later one could be
answered from a cache. Per backend: the median TTFT of the cold turns and of
the later ones, and where the server reports them the prompt tokens it found
cached. Ratios of later-turn TTFT between backends are paired by
(repetition, turn): the geometric mean with a 95 % bootstrap interval over
turns (each repetition's turns resampled, two-stage).
"""

from __future__ import annotations

import statistics
from typing import Callable, List, Optional, Sequence

from ..stats import paired_ratio, run_order
from ..suite import prompts as suite_prompts
from .llama_server import backend_names
from .process import Backend, stream_completion

QUESTIONS = ("What does the first piece of code do, in one sentence?", "Name one bug you can see.",
             "Which function would you test first, and why?", "Suggest a better name for one of the functions.",
             "What is the second request about?", "Give one short tip on style.")


def system_prompts(n: int, tokens: int, count: Callable[[str], int]) -> List[str]:
    """``n`` system prompts of at least ``tokens`` tokens each, all different
    from their first words on: a document made of the suite's prompts, in
    another order for each conversation."""
    out = []
    for i in range(n):
        parts = [p.text for p in suite_prompts()]
        parts = parts[i % len(parts):] + parts[:i % len(parts)]
        doc, k = [], 0
        while count("\n\n".join(doc)) < tokens:
            doc.append(f"Request {k + 1}:\n{parts[k % len(parts)]}")
            k += 1
        out.append(f"You are assistant {i + 1}. Answer questions about these requests, briefly.\n\n" +
                   "\n\n".join(doc))
    return out


def run_turns(backends_: Sequence[Backend], systems: Sequence[str], turns: int, *, max_tokens: int, reps: int,
              resend: bool = False, progress: Callable[[str], None] = lambda _: None,
              done: Callable[[], None] = lambda: None) -> List[dict]:
    """Every (repetition, backend): the conversations in turn, ``turns`` rounds.
    One row per request: rep, backend, round, conversation, ttft_s, cached."""
    rows: List[dict] = []
    for rep in range(reps):
        for b in run_order(list(backends_), rep):
            progress(f"rep {rep + 1}/{reps}: {b.name}")
            server = b.start()
            try:
                chats = [[{"role": "system", "content": s}] for s in systems]
                for r in range(turns):
                    for c, messages in enumerate(chats):
                        if resend and r > 0:
                            messages.pop()  # the answer: the same request again
                        else:
                            messages.append({"role": "user", "content": QUESTIONS[(r + c) % len(QUESTIONS)]})
                        a = stream_completion(server.port, {"messages": messages, "max_tokens": max_tokens,
                                                            "temperature": 0,
                                                            "stream_options": {"include_usage": True}},
                                              path="/v1/chat/completions")
                        messages.append({"role": "assistant", "content": a["text"]})
                        usage = a.get("usage") or {}
                        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                        if cached is None and a.get("timings"):
                            cached = a["timings"].get("cache_n")
                        rows.append({"rep": rep, "backend": b.name, "round": r, "conversation": c,
                                     "ttft_s": (a["t_first"] or a["t_end"]) - a["t_send"], "cached": cached,
                                     "prompt_tokens": usage.get("prompt_tokens")})
            finally:
                server.stop()
            done()
    return rows


def summarize_turns(rows: Sequence[dict], seed: int = 0) -> dict:
    """Per backend: median TTFT of first turns and of later turns, median cached
    share of later turns; ratios of later-turn TTFT, every backend over every
    other, paired by (repetition, round, conversation)."""
    names = backend_names(rows)
    figures = []
    for n in names:
        first = [r["ttft_s"] for r in rows if r["backend"] == n and r["round"] == 0]
        later = [r for r in rows if r["backend"] == n and r["round"] > 0]
        shares = [r["cached"] / r["prompt_tokens"] for r in later if r["cached"] is not None and r["prompt_tokens"]]
        figures.append({"backend": n, "first_ttft_s": statistics.median(first) if first else float("nan"),
                        "later_ttft_s": statistics.median(r["ttft_s"] for r in later) if later else float("nan"),
                        "later_ttft_max_s": max((r["ttft_s"] for r in later), default=float("nan")),
                        "later_cached_share": statistics.median(shares) if shares else None})
    ratios = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            key = lambda r: (r["round"], r["conversation"])  # noqa: E731
            by = {n: {(r["rep"],) + key(r): r["ttft_s"] for r in rows if r["backend"] == n and r["round"] > 0}
                  for n in (a, b)}
            r = paired_ratio(by[a], by[b], lambda k: k[0], seed=seed)
            if r is not None:
                ratios.append({"numerator": a, "denominator": b, **r})
    return {"backends": names, "figures": figures, "ratios": ratios}


def format_turns(summary: dict, conversations: int, turns: int, prompt_tokens: Optional[int],
                 resend: bool = False) -> str:
    lines = [f"{conversations} conversations in turn, {turns} rounds"
             + (" (each round the same requests again)" if resend else "") + ", one request at a time, no `user`"
             + (f"; system prompts of about {prompt_tokens} tokens" if prompt_tokens else ""),
             f"  {'backend':<28} {'first-turn TTFT':>16} {'later TTFT p50':>15} {'later max':>10} {'cached share':>13}"]
    for f in summary["figures"]:
        share = "-" if f["later_cached_share"] is None else f"{f['later_cached_share']:.0%}"
        lines.append(f"  {f['backend']:<28} {f['first_ttft_s']:15.2f}s {f['later_ttft_s']:14.2f}s "
                     f"{f['later_ttft_max_s']:9.2f}s {share:>13}")
    if summary["ratios"]:
        lines.append("later-turn TTFT ratios, paired by (repetition, turn): geometric mean, 95 % bootstrap interval")
        for r in summary["ratios"]:
            lines.append(f"  {r['numerator'] + ' / ' + r['denominator']:<60} {r['ratio']:.3f}x "
                         f"[{r['low']:.3f}, {r['high']:.3f}] over {r['n']} turns")
    return "\n".join(lines)


def plot_turns(result: dict, path: str) -> None:
    """Every request's TTFT in order, one line per backend (first repetition)."""
    from ..plot import palette, pyplot

    plt = pyplot()
    rows = result["rows"]
    names = backend_names(rows)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for colour, n in zip(palette(len(names)), names):
        rs = [r for r in rows if r["backend"] == n and r["rep"] == 0]
        ax.plot(range(1, len(rs) + 1), [r["ttft_s"] for r in rs], marker="o", color=colour, label=n)
    ax.set(xlabel="request (conversations in turn)", ylabel="seconds", yscale="log",
           title=f"time to first token, {result['conversations']} conversations in turn")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
