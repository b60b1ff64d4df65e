"""Serving against llama.cpp's own server (`pyspec bench serve --llama-server
PATH`).

Backends, all on the same model file, threads, slots (-np / --parallel: the
most clients asked for), GPU offload and flash attention (bench serve's
--n-gpu-layers, --flash-attn: -ngl, -fa):

* ``pyspec serve`` as users start it (with --draft, the draft model and its
  default drafter; without one, suffix lookup) and ``pyspec serve --no-draft``
  (plain decoding: the batching engine alone);
* ``llama-server`` plainly and with each ``--llama-spec`` (``--spec-type``:
  its n-gram drafters), with ``--llama-args`` appended.

Context: each slot needs room for the longest prompt (chat template and
tag included) and the answer: ``slot_ctx``. Both servers get that times the
slots: pyspec's cache is shared by its slots, llama-server splits -c among
them (its default with an explicit -np: no --kv-unified, each slot attends
to its own cells, as users run it with -np N; pass --llama-args -kvu to
measure the unified cache). The same cells in all, and no slot can run out.

Per repetition and number of clients c, each backend in turn (the order
rotates and reverses from one (repetition, c) to the next: ``run_order``)
on a freshly started server (so nothing it saw in another wave is kept:
prefix caches, llama-server's ngram-mod pool, pyspec's memories), after one
short warm-up request:

* the first wave: c clients at once, each streaming one greedy answer to a
  different prompt of the suite (c <= 25; beyond, prompts repeat), whose
  message starts with a tag of its own, ``(request REP.C.I)``: the same
  messages for every backend (answers comparable), never seen by the
  server before;
* the cached wave: exactly the same messages again, at once: both servers
  find the prompts in their prefix caches.

Every request carries a ``user`` of its own: by default a different one in
the cached wave, so that pyspec's per-user memory (which drafts from a
user's earlier prompts and answers) never holds the answer being asked
for again: the cached wave measures the prefix cache. ``local_user`` sends
no ``user`` at all, as one local user's tools do: the resent wave then finds
the first wave's answers in the one shared memory. ``same_user`` sends
the first wave's users again (the memory then holds those answers, as
llama-server's ngram-mod pool does either way: its slots share one pool,
kept across requests).

Requests go to /v1/chat/completions with ``messages`` (a user message only:
each server renders its own chat template, as clients use them); with
``raw``, a plain transcript to /v1/completions (models without a template).

Per wave: aggregate tok/s (every answer's tokens over the wave's wall time),
the slowest TTFT (sending to first text, the wave's maximum) and every
request's TTFT. Tokens: every answer is tokenized with the model's own
vocabulary (``token_counter``), one rule for every backend whatever it
reports (the servers' own ``usage.completion_tokens`` are kept beside, as
``reported_tokens``, for a cross-check; servers differ on counting the end
token). Per (backend, c, wave) over repetitions: the median aggregate tok/s,
the median slowest TTFT, TTFT p50 over all requests. Ratios pyspec backend /
llama-server backend are paired by (repetition, c, wave): the geometric mean
over repetitions with a 95 % bootstrap interval over repetitions
(``paired.bootstrap_interval``, each repetition one group; with few
repetitions a rough interval, with one none).

Identical answers (greedy, the same messages): every backend's answer
against llama-server's (plain) for the same (repetition, c, wave, client),
by text equality, and pyspec serve's against pyspec serve --no-draft's
(lossless: they must agree; a near tie decided differently in another batch
is the only excuse). A difference records the position where the texts part
(characters, and tokens of the common prefix: approximately the first
differing token).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence

from ..stats import bootstrap_interval, run_order
from .concurrent import PYSPEC, percentile, wave_figures
from .process import LLAMA_SERVER, Backend, chat_request, llama_server_backends, pyspec_serve_command

PYSPEC_PLAIN = "pyspec serve --no-draft"
WAVES = ("first", "cached")
#: Context cells per slot beyond the longest prompt's text and the answer: the
#: chat template (a default system prompt included) and the tag.
SLOT_MARGIN = 128
#: The warm-up request of every fresh server (first-request costs stay out of the waves).
WARM_UP = "Name three colours."


def slot_ctx(longest_prompt_tokens: int, max_tokens: int) -> int:
    """Context cells one slot needs, rounded up to 256 (at least 512)."""
    need = longest_prompt_tokens + max_tokens + SLOT_MARGIN
    return max(512, -(-need // 256) * 256)


def comparison_backends(model_path: str, draft: str, *, parallel: int, n_ctx: int, threads: int, llama_server: str,
                        llama_specs: Sequence[str] = ("none", "ngram-mod"),
                        llama_args: Sequence[str] = (), device: Optional[dict] = None) -> List[Backend]:
    """pyspec serve (``draft``: a draft model's path, '' for its lookup
    default), pyspec serve --no-draft, then llama-server per spec; all with
    ``device``'s offload and flash attention (process.pyspec_device_args)."""
    ours = pyspec_serve_command(model_path, parallel=parallel, n_ctx=n_ctx, threads=threads, device=device)
    return [Backend(PYSPEC, ours + (["--draft", draft] if draft else [])), Backend(PYSPEC_PLAIN, ours + ["--no-draft"]),
            *llama_server_backends(llama_server, model_path, parallel=parallel, n_ctx=n_ctx, threads=threads,
                                   specs=llama_specs, args=llama_args, draft=draft, device=device)]


def wave_messages(prompts: Sequence[str], rep: int, clients: int) -> List[List[dict]]:
    """The first wave's requests at (rep, clients): one user message each, a
    different prompt per client, tagged ``(request REP.C.I)``."""
    return [[{"role": "user", "content": f"(request {rep + 1}.{clients}.{i + 1}) {prompts[(rep + i) % len(prompts)]}"}]
            for i in range(clients)]


def wave_users(rep: int, clients: int, wave: str, same_user: bool, local_user: bool = False) -> List[Optional[str]]:
    """The ``user`` of each request of a wave (see the module's docstring; None: no field)."""
    if local_user:
        return [None] * clients
    suffix = "" if wave == "first" or same_user else f"/{wave}"
    return [f"bench {rep + 1}.{clients}.{i + 1}{suffix}" for i in range(clients)]



def chat_wave(port: int, messages: Sequence[Sequence[dict]], users: Sequence[str], *, max_tokens: int, raw: bool,
              count: Callable[[str], int]) -> dict:
    """Every request of a wave at once, each by its own client."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(messages)) as pool:
        answers = list(pool.map(lambda mu: chat_request(port, mu[0], max_tokens=max_tokens, user=mu[1], raw=raw,
                                                        usage=True), zip(messages, users)))
    return wave_figures(answers, time.perf_counter() - t0, count)


def run_comparison(backends_: Sequence[Backend], prompts: Sequence[str], clients: Sequence[int], *, max_tokens: int,
                   reps: int, count: Callable[[str], int], raw: bool = False, same_user: bool = False,
                   local_user: bool = False,
                   progress: Callable[[str], None] = lambda _: None, done: Callable[[], None] = lambda: None,
                   ) -> List[dict]:
    """Every (repetition, clients, backend): a fresh server, its first wave and
    its cached wave. One row per wave: repetition, clients, backend, wave,
    ``position`` (the backend's place in that round's order) and figures."""
    rows: List[dict] = []
    for rep in range(reps):
        for ci, c in enumerate(clients):
            messages = wave_messages(prompts, rep, c)
            for pos, b in enumerate(run_order(list(backends_), rep * len(clients) + ci)):
                label = f"rep {rep + 1}/{reps}, {c} client{'s' if c > 1 else ''}: {b.name}"
                progress(f"{label}, starting")
                server = b.start()
                try:
                    chat_request(server.port, [{"role": "user", "content": WARM_UP}], max_tokens=8, user="warm-up",
                                 raw=raw)
                    for wave in WAVES:
                        progress(f"{label}, {wave} wave")
                        figures = chat_wave(server.port, messages, wave_users(rep, c, wave, same_user, local_user),
                                            max_tokens=max_tokens, raw=raw, count=count)
                        rows.append({"rep": rep, "clients": c, "backend": b.name, "wave": wave, "position": pos,
                                     "messages": messages, **figures})
                finally:
                    server.stop()
                done()
    return rows


def backend_names(rows: Sequence[dict]) -> List[str]:
    """The backends of a run's rows, in the order they first appear."""
    return list(dict.fromkeys(r["backend"] for r in rows))


def comparison_figures(rows: Sequence[dict]) -> List[dict]:
    """Per (backend, clients, wave): medians over repetitions of aggregate tok/s
    and of the slowest TTFT, TTFT p50 over every request."""
    out = []
    for b in backend_names(rows):
        for c in sorted({r["clients"] for r in rows}):
            for wave in WAVES:
                rs = [r for r in rows if r["backend"] == b and r["clients"] == c and r["wave"] == wave]
                if rs:
                    out.append({"backend": b, "clients": c, "wave": wave, "runs": len(rs),
                                "aggregate_tok_s": statistics.median(r["aggregate_tok_s"] for r in rs),
                                "ttft_max_s": statistics.median(r["ttft_max_s"] for r in rs),
                                "ttft_p50_s": percentile([t for r in rs for t in r["ttft_s"]], 50)})
    return out


def paired_ratio(rows: Sequence[dict], numerator: str, denominator: str, clients: int, wave: str,
                 metric: str = "aggregate_tok_s", seed: int = 0) -> dict:
    """``metric`` of ``numerator`` over ``denominator``, paired by repetition at
    the same clients and wave: geometric mean over repetitions, 95 % bootstrap
    interval over repetitions."""
    def by_rep(name: str) -> Dict[int, float]:
        return {r["rep"]: r[metric] for r in rows if r["backend"] == name and r["clients"] == clients
                and r["wave"] == wave}

    a, b = by_rep(numerator), by_rep(denominator)
    logs = [math.log(a[k] / b[k]) for k in sorted(a) if k in b and a[k] > 0 and b[k] > 0]
    lo, hi = bootstrap_interval([[x] for x in logs], seed=seed)
    return {"numerator": numerator, "denominator": denominator, "clients": clients, "wave": wave, "metric": metric,
            "ratio": math.exp(sum(logs) / len(logs)) if logs else float("nan"), "low": lo, "high": hi,
            "n_reps": len(logs), "per_rep": [math.exp(x) for x in logs]}


def compare_answers(rows: Sequence[dict], name: str, reference: str,
                    count: Optional[Callable[[str], int]] = None,
                    explain: Optional[Callable[[Sequence[dict], str, str], dict]] = None) -> dict:
    """How many of ``name``'s answers equal ``reference``'s for the same
    (repetition, clients, wave, client); where they differ, where the texts
    part (``char``) and the tokens of their common prefix (``token``, with
    ``count``), and with ``explain`` (:func:`tie_explainer`) the target's own
    probabilities of the two tokens where they part (``tie``)."""
    refs = {(r["rep"], r["clients"], r["wave"]): r["answers"] for r in rows if r["backend"] == reference}
    same = compared = 0
    differences = []
    for r in rows:
        other = refs.get((r["rep"], r["clients"], r["wave"])) if r["backend"] == name else None
        for i, (a, b) in enumerate(zip(r["answers"], other or ())):
            compared += 1
            if a == b:
                same += 1
                continue
            k = len(os.path.commonprefix([a, b]))
            differences.append({"rep": r["rep"], "clients": r["clients"], "wave": r["wave"], "client": i, "char": k,
                                "token": count(a[:k]) if count else None,
                                "tie": explain(r["messages"][i], a, b) if explain and "messages" in r else None})
    return {"backend": name, "reference": reference, "same": same, "compared": compared, "differences": differences}


def is_llama(name: str) -> bool:
    return name == LLAMA_SERVER or name.startswith(LLAMA_SERVER + " ")


#: Two tokens whose probabilities (a lone pass of the target) lie this close are
#: a near tie: batching moved the default target's probabilities by up to 0.074
#: on a 2-core Zen 4 (docs/testing.md, "The row law"), so two servers batching
#: differently may pick either where the lone pass puts them twice that apart.
NEAR_TIE = 0.15


def tie_explainer(model_path: str, *, n_ctx: int = 4096, **device) -> Callable[[Sequence[dict], str, str], dict]:
    """``explain(messages, a, b)``: where answers ``a`` and ``b`` to ``messages``
    part (first differing token of their tokenization), the target's
    probabilities of either token after the common prefix, in a pass of its
    own; ``near_tie`` when they lie within :data:`NEAR_TIE`, ``top_two``
    when the two are the target's two most likely tokens. ``device``: Model's
    n_gpu_layers, flash_attn and strict (pyspec serve's)."""
    import numpy as np

    from ...model import Model

    device.pop("draft_rpc", None)  # the target's own settings only
    model = Model(model_path, n_ctx=n_ctx, memory_mb=0, **device)

    def explain(messages: Sequence[dict], a: str, b: str) -> dict:
        ta, tb = (model.tokenize(x, add_special=False) for x in (a, b))
        i = len(os.path.commonprefix([ta, tb]))
        if i >= min(len(ta), len(tb)):
            return {"token": i, "near_tie": None}  # one answer is the other's start: a stop, not a choice
        context = model.prompt_tokens(list(messages)) + ta[:i]
        if len(context) >= model.n_ctx:
            return {"token": i, "near_tie": None}
        native = model.native
        native.truncate(0)
        native.decode(context, 0, 1)
        z = native.logits(0).astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        pa, pb = float(p[ta[i]]), float(p[tb[i]])
        top_two = {int(t) for t in np.argsort(p)[-2:]} == {ta[i], tb[i]}
        return {"token": i, "p_a": pa, "p_b": pb, "near_tie": abs(pa - pb) < NEAR_TIE, "top_two": top_two}

    return explain


def summarize_comparison(rows: Sequence[dict], *, count: Optional[Callable[[str], int]] = None,
                         seed: int = 0, explain: Optional[Callable[[Sequence[dict], str, str], dict]] = None) -> dict:
    """Figures, ratios (every pyspec backend over every llama-server backend,
    per clients and wave, of aggregate tok/s and of the slowest TTFT) and
    identical answers (every backend against llama-server plain, and pyspec
    serve against pyspec serve --no-draft)."""
    names = backend_names(rows)
    ours, theirs = [n for n in names if not is_llama(n)], [n for n in names if is_llama(n)]
    ratios = [paired_ratio(rows, a, b, c, wave, metric, seed)
              for c in sorted({r["clients"] for r in rows}) for a in ours for b in theirs
              for wave in WAVES for metric in ("aggregate_tok_s", "ttft_max_s")]
    reference = LLAMA_SERVER if LLAMA_SERVER in names else (theirs[0] if theirs else None)
    identical = [compare_answers(rows, n, reference, count, explain) for n in names if reference and n != reference]
    if PYSPEC in names and PYSPEC_PLAIN in names:
        identical.append(compare_answers(rows, PYSPEC, PYSPEC_PLAIN, count, explain))
    return {"backends": names, "figures": comparison_figures(rows), "ratios": ratios, "identical": identical}


def _find(items: Sequence[dict], **key) -> Optional[dict]:
    return next((x for x in items if all(x[k] == v for k, v in key.items())), None)


def _interval(r: Optional[dict]) -> str:
    if r is None or not r["n_reps"]:
        return "-"
    if r["n_reps"] < 2:
        return f"{r['ratio']:.2f}x"
    return f"{r['ratio']:.2f}x [{r['low']:.2f}, {r['high']:.2f}]"


def format_comparison(summary: dict) -> str:
    """The issue's table per number of clients, the paired ratios and the
    identical answers."""
    names, figures, ratios = summary["backends"], summary["figures"], summary["ratios"]
    clients = sorted({f["clients"] for f in figures})
    runs = max((f["runs"] for f in figures), default=0)
    lines = [f"aggregate tok/s: every answer's tokens over the wave's wall time; slowest TTFT: the wave's latest first "
             f"token (medians over {runs} repetition{'s' if runs != 1 else ''}); TTFT p50 over every request"]
    for c in clients:
        lines.append(f"{c} client{'s' if c > 1 else ''} at once, different prompts")
        lines.append(f"  {'':<28} {'first wave':>33}   {'prompts cached':>22}")
        lines.append(f"  {'backend':<28} {'agg tok/s':>10} {'slowest TTFT':>12} {'TTFT p50':>9}   "
                     f"{'agg tok/s':>10} {'slowest TTFT':>12}")
        for n in names:
            f1, f2 = _find(figures, backend=n, clients=c, wave="first"), _find(figures, backend=n, clients=c,
                                                                                 wave="cached")
            if f1 is None or f2 is None:
                continue
            lines.append(f"  {n:<28} {f1['aggregate_tok_s']:10.1f} {f1['ttft_max_s']:11.2f}s {f1['ttft_p50_s']:8.2f}s"
                         f"   {f2['aggregate_tok_s']:10.1f} {f2['ttft_max_s']:11.2f}s")
    if ratios:
        lines.append("ratios paired within a repetition (same clients, same wave): geometric mean over repetitions, "
                     "95 % bootstrap interval (repetitions resampled); TTFT < 1: pyspec's slowest first token sooner")
        lines.append(f"  {'clients':>7} {'pair':<50} {'first wave tok/s':>20} {'slowest TTFT':>20} "
                     f"{'cached tok/s':>20}")
        for c in clients:
            for num, den in dict.fromkeys((r["numerator"], r["denominator"]) for r in ratios if r["clients"] == c):
                cells = [_interval(_find(ratios, numerator=num, denominator=den, clients=c, wave=wave, metric=metric))
                         for wave, metric in (("first", "aggregate_tok_s"), ("first", "ttft_max_s"),
                                              ("cached", "aggregate_tok_s"))]
                lines.append(f"  {c:>7} {num + ' / ' + den:<50} " + " ".join(f"{x:>20}" for x in cells))
    if summary["identical"]:
        lines.append("same greedy answer to the same messages (every repetition, number of clients and wave):")
        for d in summary["identical"]:
            line = f"  {d['backend']:<28} = {d['reference']:<28} {d['same']}/{d['compared']} identical"
            tokens = sorted(x["token"] for x in d["differences"] if x["token"] is not None)
            if tokens:
                more = ", ..." if len(tokens) > 5 else ""
                line += f" (first differing token ≈ {', '.join(map(str, tokens[:5]))}{more})"
            ties = [x["tie"] for x in d["differences"] if x.get("tie")]
            if ties:
                near = sum(t["near_tie"] is True for t in ties)
                stops = sum(t["near_tie"] is None for t in ties)
                line += f"; where they part: {near} near ties (within {NEAR_TIE})"
                if stops:
                    line += f", {stops} a prefix of the other"
                rest = [t for t in ties if t["near_tie"] is False]
                if rest:
                    top = sum(bool(t.get("top_two")) for t in rest)
                    line += f", {len(rest)} NOT ties ({top} between the two most likely tokens)"
            lines.append(line)
    return "\n".join(lines)


def plot_comparison(result: dict, path: str) -> None:
    """Aggregate tok/s and the slowest TTFT against the number of clients, per
    backend: first wave solid, cached wave dashed."""
    from ..plot import palette, pyplot

    plt = pyplot()
    summary = result["summary"]
    names = summary["backends"]
    colours = palette(len(names))
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for colour, n in zip(colours, names):
        for wave, style in zip(WAVES, ("-", "--")):
            fs = sorted((f for f in summary["figures"] if f["backend"] == n and f["wave"] == wave),
                        key=lambda f: f["clients"])
            cs = [f["clients"] for f in fs]
            label = f"{n}, {'first wave' if wave == 'first' else 'prompts cached'}"
            a.plot(cs, [f["aggregate_tok_s"] for f in fs], style, marker="o", color=colour, label=label)
            b.plot(cs, [f["ttft_max_s"] for f in fs], style, marker="o", color=colour, label=label)
    a.set(xlabel="concurrent clients", ylabel="aggregate tokens/s",
          title=f"{result['max_tokens']} greedy tokens per answer, {result['threads']} threads")
    b.set(xlabel="concurrent clients", ylabel="seconds", title="slowest time to first token")
    clients = sorted({f["clients"] for f in summary["figures"]})
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
