"""Serving under concurrent clients (`pyspec bench serve`).

Two comparisons. Without ``--llama-server`` (this module), two servers run side
by side on the same model, prompts and threads: ``pyspec serve`` (continuous
batching, speculation) and llama-cpp-python's ``python -m llama_cpp.server``
(one request at a time behind its lock; run with
``--interrupt_requests False``, without which a new request cancels the stream
in progress). For each number of clients c, interleaved over repetitions (the
order of the two servers alternates), c clients each stream one completion of a
different prompt of the mix, all sent at once. Per wave:

* aggregate tok/s: every client's tokens over the wave's wall time;
* TTFT: from sending to the first text, p50 and p95 over the wave's clients;
* continuation tok/s per request: tokens after the first over the time after it.

Tokens are counted by tokenizing each answer with the model's own vocabulary,
the same rule for both servers. At c = 1 the same prompts also run through
``pyspec generate``'s code in this process (the server's overhead).

With ``--llama-server PATH``: llama.cpp's own server (``llama_server.py``, whose
docstring states that method); both count tokens and time first tokens by
:func:`wave_figures`.
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence

from ...sampling import Sampling
from .process import ServerProcess, free_port, pyspec_device_args, stream_completion

PYSPEC, LLAMA, GENERATE = "pyspec serve", "llama-cpp-python server", "pyspec generate"


def start_pyspec(model: str, draft: str, *, parallel: int, n_ctx: int, threads: int,
                 device: Optional[dict] = None) -> ServerProcess:
    """``device``: bench serve's --n-gpu-layers, --flash-attn and --strict (process.pyspec_device_args)."""
    port = free_port()
    cmd = [sys.executable, "-m", "pyspec.cli", "serve", "--port", str(port), "--model", model,
           "--parallel", str(parallel), "--n-ctx", str(n_ctx), "--threads", str(threads),
           *pyspec_device_args(device)]
    cmd += ["--draft", draft] if draft else ["--drafter", "ngram"]
    return ServerProcess(cmd, port)


def start_llama(model_path: str, *, n_ctx: int, threads: int, n_gpu_layers: int = 0,
                flash_attn: Optional[bool] = None) -> ServerProcess:
    """llama-cpp-python's server with pyspec's offload (``n_gpu_layers``, -1 = all)
    and, as `pyspec bench` gives its runners, the flash attention pyspec's
    context runs (``flash_attn``, a bool; None: its own default, off)."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model_path, "--port", str(port),
           "--n_ctx", str(n_ctx), "--n_threads", str(threads), "--n_threads_batch", str(threads),
           "--n_gpu_layers", str(n_gpu_layers), "--interrupt_requests", "False"]
    cmd += [] if flash_attn is None else ["--flash_attn", str(flash_attn)]
    return ServerProcess(cmd, port, health="/v1/models")


def wave(server: ServerProcess, prompts: Sequence[str], max_tokens: int, count: Callable[[str], int]) -> dict:
    """Every prompt streamed by its own client, all at once."""
    body = {"max_tokens": max_tokens, "temperature": 0}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: stream_completion(server.port, {**body, "prompt": p}), prompts))
    wall = time.perf_counter() - t0
    return _figures(answers, wall, count)


def wave_figures(answers: Sequence[dict], wall: float, count: Callable[[str], int]) -> dict:
    """One wave's figures from its streamed answers (``stream_completion``'s)."""
    tokens = [count(a["text"]) for a in answers]
    ttft = [(a["t_first"] or a["t_end"]) - a["t_send"] for a in answers]
    return {"wall_s": wall, "tokens": sum(tokens), "aggregate_tok_s": sum(tokens) / wall if wall > 0 else float("nan"),
            "ttft_max_s": max(ttft) if ttft else float("nan"), "ttft_s": ttft, "answer_tokens": tokens,
            "reported_tokens": [(a.get("usage") or {}).get("completion_tokens") for a in answers],
            "answers": [a["text"] for a in answers]}


def _figures(answers: List[dict], wall: float, count: Callable[[str], int]) -> dict:
    """:func:`wave_figures`' tokens and TTFTs (this mode's rows keep only these)
    and the median continuation speed: tokens after the first over the time
    after it."""
    w = wave_figures(answers, wall, count)
    cont = [(n - 1) / (a["t_end"] - a["t_first"]) for n, a in zip(w["answer_tokens"], answers)
            if a["t_first"] and n > 1 and a["t_end"] > a["t_first"]]
    return {**{k: w[k] for k in ("tokens", "wall_s", "aggregate_tok_s", "ttft_s")},
            "continuation_tok_s": statistics.median(cont) if cont else 0.0}


def generate_in_process(decoder, prompts: Sequence[str], max_tokens: int, count: Callable[[str], int]) -> dict:
    """The c = 1 reference: ``pyspec generate``'s code, one prompt after another."""
    answers = []
    t0 = time.perf_counter()
    for p in prompts:
        ids = decoder.target.tokenize(p, add_special=True, parse_special=True)
        t = time.perf_counter()
        first: List[float] = []
        out = decoder.generate(ids, max_tokens=max_tokens, sampling=Sampling.GREEDY,
                               on_token=lambda text, d: first.append(time.perf_counter()) if not first else None)
        answers.append({"text": out.text, "t_send": t, "t_first": first[0] if first else None,
                        "t_end": time.perf_counter()})
    return _figures(answers, time.perf_counter() - t0, count)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): the smallest value with at least
    q % of the values at or below it."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q / 100 * len(v) - 1e-9) - 1))] if v else float("nan")


def summarize(rows: List[dict]) -> str:
    """Per number of clients: each side's figures (medians over repetitions; TTFT
    percentiles pooled over all its requests) and the ratios to llama-cpp-python."""
    lines = [f"{'clients':>7} {'server':<24} {'agg tok/s':>9} {'ratio':>6} {'TTFT p50':>8} {'p95 s':>6} "
             f"{'per-req tok/s':>13}"]
    for c in sorted({r["clients"] for r in rows}):
        base = _median([r["aggregate_tok_s"] for r in rows if r["clients"] == c and r["side"] == LLAMA])
        for side in (PYSPEC, LLAMA, GENERATE):
            rs = [r for r in rows if r["clients"] == c and r["side"] == side]
            if not rs:
                continue
            agg = _median([r["aggregate_tok_s"] for r in rs])
            ttft = [t for r in rs for t in r["ttft_s"]]
            lines.append(f"{c:>7} {side:<24} {agg:9.1f} {agg / base if base else float('nan'):5.2f}x "
                         f"{percentile(ttft, 50):8.2f} {percentile(ttft, 95):6.2f} "
                         f"{_median([r['continuation_tok_s'] for r in rs]):13.1f}")
        ours = _median([r["aggregate_tok_s"] for r in rows if r["clients"] == c and r["side"] == PYSPEC])
        gen = _median([r["aggregate_tok_s"] for r in rows if r["clients"] == c and r["side"] == GENERATE])
        if gen == gen and gen > 0:
            lines.append(f"{'':>7} pyspec serve / pyspec generate: {ours / gen:.2f}x")
    return "\n".join(lines)


def _median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def plot(rows: List[dict], path: str) -> None:
    """Aggregate tok/s and TTFT p95 against the number of clients, per server."""
    from ..plot import pyplot

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for side in (PYSPEC, LLAMA):
        cs = sorted({r["clients"] for r in rows if r["side"] == side})
        agg = [_median([r["aggregate_tok_s"] for r in rows if r["clients"] == c and r["side"] == side]) for c in cs]
        p95 = [percentile([t for r in rows if r["clients"] == c and r["side"] == side for t in r["ttft_s"]], 95)
               for c in cs]
        a.plot(cs, agg, marker="o", label=side)
        b.plot(cs, p95, marker="o", label=side)
    a.set(xlabel="concurrent clients", ylabel="aggregate tokens/s", title="throughput")
    b.set(xlabel="concurrent clients", ylabel="seconds", title="time to first token, p95")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(model_path: str, draft: str, prompts: Sequence[str], clients: Sequence[int], *, max_tokens: int, reps: int,
        n_ctx: int, threads: int, decoder, count: Callable[[str], int], render: Callable[[str], str],
        progress: Callable[[str], None], device: Optional[dict] = None,
        flash_attn: Optional[bool] = None) -> List[dict]:
    """Both servers up at once (idle, they cost nothing), waves interleaved.
    Every request's text starts with a tag of its own (``render`` then applies
    the chat template), so that no server finds a request's prompt in its
    prefix cache from an earlier wave: each prefills what it is sent.
    ``device`` (--n-gpu-layers, --flash-attn, --strict) goes to pyspec serve,
    its offload to llama-cpp-python's server too, with ``flash_attn`` (what
    pyspec's context runs, as a bool)."""
    tags = itertools.count()

    def fresh(texts: Sequence[str]) -> List[str]:
        return [render(f"(request {next(tags)}) {t}") for t in texts]

    progress("starting pyspec serve and llama-cpp-python's server")
    ours = start_pyspec(model_path, draft, parallel=max(clients), n_ctx=n_ctx, threads=threads, device=device)
    try:
        theirs = start_llama(model_path, n_ctx=n_ctx, threads=threads,
                             n_gpu_layers=device["n_gpu_layers"] if device else 0, flash_attn=flash_attn)
    except BaseException:
        ours.stop()
        raise
    rows = []
    try:
        # A warm-up wave each (first-request costs: calibration, page faults).
        wave(ours, fresh(prompts[:1]), 8, count)
        wave(theirs, fresh(prompts[:1]), 8, count)
        if decoder is not None:
            generate_in_process(decoder, fresh(prompts[:1]), 8, count)
        for rep in range(reps):
            for c in clients:
                batch = [prompts[(rep + i) % len(prompts)] for i in range(c)]
                sides = [(PYSPEC, ours), (LLAMA, theirs)]
                for side, server in (sides if (rep + c) % 2 == 0 else sides[::-1]):
                    progress(f"rep {rep + 1}/{reps}, {c} clients: {side}")
                    rows.append({"rep": rep, "clients": c, "side": side,
                                 **wave(server, fresh(batch), max_tokens, count)})
                if c == 1 and decoder is not None:
                    progress(f"rep {rep + 1}/{reps}, 1 client: {GENERATE}")
                    rows.append({"rep": rep, "clients": 1, "side": GENERATE,
                                 **generate_in_process(decoder, fresh(batch), max_tokens, count)})
    finally:
        ours.stop()
        theirs.stop()
    return rows
