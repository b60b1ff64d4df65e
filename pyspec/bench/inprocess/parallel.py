"""Many sequences in one batch against one at a time (`pyspec bench parallel`).

For each batch size n, measured side by side in one process, interleaved:

* ``V(n)``: the cost of one target decode with n sequences x 1 row, in
  single-row steps (``decode_rows`` timed directly); ``n / V(n)`` is the most a
  batch of n can gain over decoding the n sequences one after another.
* ``batched``: pyspec, the n samples of the prompt in one batch (plain decoding).
* ``serial``: pyspec plain, the same n samples one after another.
* ``llama-cpp-python``: the n samples one after another (it has no batched
  sampling API).

Speeds are aggregate: tokens after each sequence's first, per second of
decoding. ``speedup`` = batched / serial; ``efficiency`` = speedup / ceiling.

The consensus part runs n samples at T > 0 on math and code prompts, plain
batched against consensus-drafted batched (the auto policy decides when to
draft), with the acceptance by draft position.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

from ... import _core
from ...model import Model
from ...results import PositionCounts
from ..plot import pyplot
from .backends import LlamaCppRunner, Settings


def decode_costs(target: Model, ns: Sequence[int], reps: int = 7, prefix: int = 32) -> Dict[int, float]:
    """Seconds of one target decode with n sequences x 1 row, for each n (the
    fastest of ``reps``: noise only adds time). Each sequence holds ``prefix``
    tokens of context, copied from the first."""
    core = target.native
    tokens = list(range(1000, 1000 + prefix))  # any tokens: the cost depends on positions, not ids
    for j in range(max(ns)):
        core.truncate(0, j)
    core.decode(tokens, 0, 1, 0)
    for j in range(1, max(ns)):
        core.copy_prefix(0, j, prefix)
    out = {}
    for n in ns:
        best = float("inf")
        for _ in range(reps):
            rows = [(j, prefix, 1000 + j, True) for j in range(n)]
            t0 = time.perf_counter()
            core.decode_rows(rows)
            best = min(best, time.perf_counter() - t0)
            for j in range(n):
                core.truncate(prefix, j)
        out[n] = best
    for j in range(max(ns)):
        core.truncate(0, j)
    return out


def _aggregate(completions) -> float:
    """Tokens after each sequence's first, per second of decoding, over sequences decoded one by one."""
    tokens = sum(max(c.n_generated_tokens - 1, 0) for c in completions)
    seconds = sum(c.stats.decode_s for c in completions)
    return tokens / seconds if seconds > 0 else 0.0


def run_parallel(target: Model, prompt: List[int], ns: Sequence[int], settings: Settings, reps: int,
                 llama: Optional[LlamaCppRunner], progress: Callable[[str], None]) -> List[dict]:
    """One row per (rep, n): V(n), and the three runners' aggregate speeds."""
    costs = decode_costs(target, ns)
    rows = []
    sampling = dict(max_tokens=settings.max_tokens, sampling=settings.sampling)
    for rep in range(reps):
        for n in ns:
            seed = settings.seed + 1000 * rep + n
            progress(f"rep {rep + 1}/{reps}, n={n}: batched")
            target.clear_cache()
            batch = target.generate_batch([prompt] * n, seed=seed, **sampling)  # Completions, even for n = 1
            progress(f"rep {rep + 1}/{reps}, n={n}: serial")
            serial = []
            for j in range(n):
                target.clear_cache()
                serial.append(target.generate(prompt, seed=_core.sequence_seed(seed, j), **sampling))
            row = {
                "rep": rep, "n": n, "V": costs[n] / costs[1], "ceiling": n / (costs[n] / costs[1]),
                "batched_tok_s": batch.stats.aggregate_tok_s, "serial_tok_s": _aggregate(serial),
                "ttft_s": list(batch.stats.ttft_s), "serial_ttft_s": [c.stats.ttft_s for c in serial],
                "rounds": batch.stats.rounds, "tokens": batch.stats.n_generated,
            }
            if llama is not None:
                progress(f"rep {rep + 1}/{reps}, n={n}: llama-cpp-python")
                samples = [llama.run(prompt, dataclasses.replace(settings, seed=seed + j)) for j in range(n)]
                secs = sum(s.decode_s for s in samples)
                row["llama_tok_s"] = sum(s.decode_tokens for s in samples) / secs if secs > 0 else 0.0
            row["speedup"] = row["batched_tok_s"] / row["serial_tok_s"] if row["serial_tok_s"] else 0.0
            row["efficiency"] = row["speedup"] / row["ceiling"]
            rows.append(row)
    return rows


def run_consensus(target: Model, prompts: Sequence, n: int, settings: Settings, reps: int,
                  progress: Callable[[str], None], chat: bool = True) -> List[dict]:
    """Per (rep, prompt): n samples batched, plain against consensus drafting (auto)."""
    from ...speculative import SpeculativeDecoder

    spec = SpeculativeDecoder(target, drafter="consensus")
    sampling = dict(max_tokens=settings.max_tokens, sampling=settings.sampling)
    rows = []
    for rep in range(reps):
        for p in prompts:
            tokens = target.prompt_tokens(p.text, chat=chat)
            seed = settings.seed + 7919 * rep + p.index
            progress(f"rep {rep + 1}/{reps}, {p.id}: plain n={n}")
            target.clear_cache()
            plain = target.generate_batch([tokens] * n, seed=seed, **sampling)
            progress(f"rep {rep + 1}/{reps}, {p.id}: consensus n={n}")
            target.clear_cache()
            cons = spec.generate_batch([tokens] * n, seed=seed, **sampling)
            at = PositionCounts()
            for c in cons.choices:
                at.add(c.stats.drafted_at, c.stats.accepted_at)
            drafted = sum(c.stats.drafted for c in cons.choices)
            rows.append({
                "rep": rep, "prompt": p.id, "category": p.category, "n": n,
                "plain_tok_s": plain.stats.aggregate_tok_s, "consensus_tok_s": cons.stats.aggregate_tok_s,
                "ratio": cons.stats.aggregate_tok_s / plain.stats.aggregate_tok_s,
                "drafted": drafted, "accepted": sum(c.stats.accepted for c in cons.choices),
                "drafted_at": at.drafted, "accepted_at": at.accepted,
                "rows_per_round": cons.stats.rows / max(cons.stats.rounds, 1),
            })
    return rows


def _median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(parallel: List[dict], consensus: List[dict]) -> str:
    """The tables: medians over repetitions."""
    lines = ["batch size n: V(n) in single-row steps, ceiling n/V(n), aggregate tok/s "
             "(median over reps), speed-up batched/serial and its share of the ceiling"]
    has_llama = any("llama_tok_s" in r for r in parallel)
    head = f"{'n':>3} {'V(n)':>6} {'ceiling':>8} {'batched':>8} {'serial':>8}"
    head += f" {'llama-cpp':>9}" if has_llama else ""
    head += f" {'speed-up':>8} {'of ceil.':>8} {'TTFT med/max s':>15}"
    lines.append(head)
    for n in sorted({r["n"] for r in parallel}):
        rs = [r for r in parallel if r["n"] == n]
        line = (f"{n:>3} {_median([r['V'] for r in rs]):6.2f} {_median([r['ceiling'] for r in rs]):7.2f}x "
                f"{_median([r['batched_tok_s'] for r in rs]):8.1f} {_median([r['serial_tok_s'] for r in rs]):8.1f}")
        if has_llama:
            line += f" {_median([r.get('llama_tok_s', float('nan')) for r in rs]):9.1f}"
        ttft = [t for r in rs for t in r["ttft_s"]]
        line += (f" {_median([r['speedup'] for r in rs]):7.2f}x {_median([r['efficiency'] for r in rs]):7.0%} "
                 f"{_median(ttft):7.2f}/{max(ttft):.2f}")
        lines.append(line)
    if consensus:
        n = consensus[0]["n"]
        lines.append("")
        lines.append(f"consensus drafting, n={n} samples: aggregate tok/s plain batched vs consensus (auto), "
                     "median over reps")
        for pid in dict.fromkeys(r["prompt"] for r in consensus):
            rs = [r for r in consensus if r["prompt"] == pid]
            d = sum(r["drafted"] for r in rs)
            a = sum(r["accepted"] for r in rs)
            lines.append(f"  {pid:<18} {_median([r['plain_tok_s'] for r in rs]):6.1f} "
                         f"{_median([r['consensus_tok_s'] for r in rs]):6.1f}  {_median([r['ratio'] for r in rs]):.2f}x"
                         f"  drafted {d}, accepted {a / d if d else 0:.0%}")
        for cat in dict.fromkeys(r["category"] for r in consensus):
            rs = [r for r in consensus if r["category"] == cat]
            lines.append(f"  [{cat}] {_median([r['ratio'] for r in rs]):.2f}x")
        pos = acceptance_by_position(consensus)
        if pos:
            lines.append("  acceptance by draft position: " + " ".join(f"{x:.2f}" for x in pos))
    return "\n".join(lines)


def acceptance_by_position(consensus: List[dict]) -> List[float]:
    at = PositionCounts()
    for r in consensus:
        at.add(r["drafted_at"], r["accepted_at"])
    return at.rates()


def plot_parallel(parallel: List[dict], consensus: List[dict], path: str) -> None:
    """Speed-up against n beside the ceiling n/V(n); acceptance by draft position."""
    plt = pyplot()
    ns = sorted({r["n"] for r in parallel})
    fig, axes = plt.subplots(1, 2 if consensus else 1, figsize=(11 if consensus else 6, 4), squeeze=False)
    ax = axes[0][0]
    ax.plot(ns, [_median([r["ceiling"] for r in parallel if r["n"] == n]) for n in ns], "k--", label="ceiling n/V(n)")
    ax.plot(ns, [_median([r["speedup"] for r in parallel if r["n"] == n]) for n in ns], "o-",
            label="pyspec batched / serial")
    if any("llama_tok_s" in r for r in parallel):
        ax.plot(ns, [_median([r["batched_tok_s"] / r["llama_tok_s"] for r in parallel if r["n"] == n and
                              r.get("llama_tok_s")]) for n in ns], "s-", label="pyspec batched / llama-cpp-python")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("sequences in the batch (n)")
    ax.set_ylabel("aggregate speed-up")
    ax.grid(alpha=0.3)
    ax.legend()
    if consensus:
        pos = acceptance_by_position(consensus)
        ax2 = axes[0][1]
        ax2.bar(range(1, len(pos) + 1), pos)
        ax2.set_xlabel("draft position")
        ax2.set_ylabel("acceptance")
        ax2.set_title(f"consensus drafting, n={consensus[0]['n']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
