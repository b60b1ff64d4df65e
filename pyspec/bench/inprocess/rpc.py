"""`pyspec bench rpc`: the target on RPC workers behind a network of a given
delay, plain decoding against the default decoder, and llama-server --rpc.

For each one-way delay d (ms), each worker sits behind a DelayProxy
(bench/rpc_net.py) that delivers every byte d after it arrived, both ways: a
network of round-trip time 2d. Per delay:

* V(n): the target's seconds for an n-row batch over that network (the
  fastest of a few), and from it the *ceiling*: a perfect free draft of
  length k makes k + 1 tokens per V(k + 1), a speed-up of
  (k + 1) V(1) / V(k + 1) over plain; the best k's is the ceiling.
* plain and the default decoder (hybrid drafter, draft model here, auto
  policy), run in ABBA order per prompt and repetition (paired), greedy:
  tokens/s, round trips per token (as the proxy counts them) and the
  default's speed-up over plain, the geometric mean over prompts with a
  two-stage bootstrap interval.
* llama-server with --rpc on the same proxies, per --spec-type given: its
  tokens/s (its own timings), the same prompts as token ids.

"local" (no workers) is the row to compare delay 0 with. The workers are
`pyspec rpc-server` processes on this machine: on loopback the driver and
the workers share its cores, which a real network does not.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Optional, Sequence

from ...model import Model
from ..rpc_net import DelayProxy, WorkerProcess
from ..stats import bootstrap_interval, geo_mean, run_order
from .simulate import batch_costs

SIZES = (1, 2, 3, 5, 9, 17)  # V(n) rows: draft lengths 0, 1, 2, 4, 8, 16
CONFIGS = ("plain", "default")


def ceiling(costs: Dict[int, float]) -> Dict[str, float]:
    """Speed-up over plain of a perfect free draft of each length k (k + 1 tokens
    per V(k + 1)), and the best of them."""
    per_k = {str(n - 1): n * costs[1] / costs[n] for n in costs if n > 1}
    best = max(per_k, key=per_k.get)
    return {"per_draft_length": per_k, "best": per_k[best], "best_draft_length": int(best)}


def run_decoders(target: Model, draft: Model, prompts: List[List[int]], *, max_tokens: int, reps: int,
                 proxies: Sequence[DelayProxy], progress: Callable[[str], None], label: str) -> dict:
    """plain vs default on ``target`` (paired, ABBA): per run tokens, seconds, round trips."""
    from ...speculative import SpeculativeDecoder

    decoders = {"plain": target, "default": SpeculativeDecoder(target, draft)}
    for name, dec in decoders.items():  # warm up: calibration (auto's V(n) over this network), caches
        progress(f"{label}: warm-up {name}")
        for prompt in prompts:
            dec.generate(prompt, max_tokens=4, temperature=0)
    runs: List[dict] = []
    for p, prompt in enumerate(prompts):
        for rep in range(reps):
            for name in run_order(list(CONFIGS), rep):
                progress(f"{label}: prompt {p + 1}/{len(prompts)}, rep {rep + 1}/{reps}, {name}")
                for proxy in proxies:
                    proxy.reset_counts()
                out = decoders[name].generate(prompt, max_tokens=max_tokens, temperature=0)
                n = len(out.tokens)
                # First token to last, as llama-server's predicted_per_second: the prompt apart.
                runs.append({"prompt": p, "rep": rep, "decoder": name, "tokens": n, "seconds": out.stats.decode_s,
                             "tok_s": out.stats.decode_tok_s,
                             "round_trips": sum(x.round_trips for x in proxies),
                             "bytes_down": sum(x.bytes_down for x in proxies),
                             "accepted": out.stats.accepted if name == "default" else 0,
                             "drafted": out.stats.drafted if name == "default" else 0,
                             "rounds": out.stats.rounds})
    return summarize(runs, len(prompts))


def summarize(runs: List[dict], n_prompts: int) -> dict:
    """Per decoder: median tok/s, round trips per token; default/plain paired ratio."""
    out: dict = {"runs": runs}
    for name in CONFIGS:
        mine = [r for r in runs if r["decoder"] == name]
        speeds = sorted(r["tok_s"] for r in mine)
        tokens = sum(r["tokens"] for r in mine)
        out[name] = {"tok_s": speeds[len(speeds) // 2] if speeds else float("nan"),
                     "round_trips_per_token": sum(r["round_trips"] for r in mine) / tokens if tokens else float("nan"),
                     "bytes_down_per_token": sum(r["bytes_down"] for r in mine) / tokens if tokens else float("nan")}
    logs = []
    for p in range(n_prompts):
        pairs = {}
        for r in runs:
            if r["prompt"] == p:
                pairs.setdefault(r["rep"], {})[r["decoder"]] = r["tok_s"]
        logs.append([math.log(v["default"] / v["plain"]) for v in pairs.values() if len(v) == 2])
    lo, hi = bootstrap_interval(logs)
    out["speedup"] = {"geo_mean": geo_mean(logs), "ci95": [lo, hi]}
    mine = [r for r in runs if r["decoder"] == "default"]
    drafted = sum(r["drafted"] for r in mine)
    out["default"]["acceptance"] = sum(r["accepted"] for r in mine) / drafted if drafted else None
    rounds = sum(r["rounds"] for r in mine)
    out["default"]["drafted_per_round"] = drafted / rounds if rounds else None  # grows where a row is cheap
    return out


def run_llama_server(llama_server: str, target_path: str, draft_path: str, specs: Sequence[str],
                     prompts: List[List[int]], *, endpoints: Sequence[str], max_tokens: int, threads: int,
                     n_ctx: int, reps: int, progress: Callable[[str], None], label: str) -> Dict[str, dict]:
    """llama-server --rpc ENDPOINTS per spec type: median tok/s over prompts x reps (its own timings)."""
    from ..serve.process import llama_server_backends, request

    device = dict(n_gpu_layers=-1, flash_attn="auto", strict=False, rpc=tuple(endpoints), tensor_split=None,
                  local_output=False, draft_rpc=())
    out: Dict[str, dict] = {}
    for backend in llama_server_backends(llama_server, target_path, parallel=1, n_ctx=n_ctx, threads=threads,
                                         specs=specs, draft=draft_path, device=device):
        progress(f"{label}: {backend.name} starting")
        server = backend.start()
        try:
            speeds = []
            body = {"n_predict": 8, "temperature": 0, "cache_prompt": False}
            request(server.port, "POST", "/completion", {**body, "prompt": prompts[0]})  # warm-up
            for p, prompt in enumerate(prompts):
                for rep in range(reps):
                    progress(f"{label}: {backend.name}, prompt {p + 1}/{len(prompts)}, rep {rep + 1}/{reps}")
                    status, reply = request(server.port, "POST", "/completion",
                                            {**body, "n_predict": max_tokens, "prompt": prompt})
                    if status != 200:
                        raise RuntimeError(f"{backend.name}: HTTP {status}: {reply}")
                    speeds.append(float(reply["timings"]["predicted_per_second"]))
            speeds.sort()
            out[backend.name] = {"tok_s": speeds[len(speeds) // 2], "runs": speeds}
        finally:
            server.stop()
    return out


def bench_rpc(target_path: str, draft_path: str, prompt_texts: List[str], *, delays_ms: Sequence[float],
              n_workers: int, max_tokens: int, reps: int, threads: int, n_ctx: int,
              llama_server: Optional[str], llama_specs: Sequence[str], progress: Callable[[str], None]) -> dict:
    """The whole run (module docstring): one row per delay, and "local"."""
    draft = Model(draft_path, n_ctx=n_ctx, n_threads=threads, memory_mb=0)
    tokenize = Model(target_path, n_ctx=256, n_threads=threads, memory_mb=0)
    prompts = [tokenize.prompt_tokens([{"role": "user", "content": t}]) for t in prompt_texts]
    del tokenize
    rows = []
    # The local row: the same runs without workers.
    progress("local: loading")
    target = Model(target_path, n_ctx=n_ctx, n_threads=threads, memory_mb=0)
    costs = batch_costs(target, SIZES)
    row = {"delay_ms": None, "costs": costs, "ceiling": ceiling(costs)}
    row.update(run_decoders(target, draft, prompts, max_tokens=max_tokens, reps=reps, proxies=[],
                            progress=progress, label="local"))
    rows.append(row)
    del target
    workers = [WorkerProcess(threads=threads) for _ in range(n_workers)]
    try:
        for delay in delays_ms:
            label = f"{delay:g} ms"
            proxies = [DelayProxy(w.endpoint, delay) for w in workers]
            try:
                progress(f"{label}: loading the target onto {n_workers} worker(s)")
                t0 = time.perf_counter()
                target = Model(target_path, n_ctx=n_ctx, n_threads=threads, memory_mb=0,
                               rpc=[p.endpoint for p in proxies])
                load_s = time.perf_counter() - t0
                costs = batch_costs(target, SIZES)
                row = {"delay_ms": delay, "load_s": load_s, "costs": costs, "ceiling": ceiling(costs)}
                row.update(run_decoders(target, draft, prompts, max_tokens=max_tokens, reps=reps,
                                        proxies=proxies, progress=progress, label=label))
                del target  # the workers serve one driver at a time: free them for llama-server
                if llama_server:
                    row["llama_server"] = run_llama_server(
                        llama_server, target_path, draft_path, llama_specs, prompts,
                        endpoints=[p.endpoint for p in proxies], max_tokens=max_tokens, threads=threads,
                        n_ctx=n_ctx, reps=reps, progress=progress, label=label)
                rows.append(row)
            finally:
                for p in proxies:
                    p.close()
    finally:
        for w in workers:
            w.stop()
    return {"target": target_path, "draft": draft_path, "workers": n_workers, "threads": threads,
            "max_tokens": max_tokens, "reps": reps, "prompts": len(prompts), "rows": rows}


def report(result: dict) -> str:
    """The table: one line per delay."""
    lines = [f"target on {result['workers']} loopback RPC worker(s) behind a delay proxy; {result['prompts']} "
             f"copy-heavy prompts x {result['reps']} reps, {result['max_tokens']} greedy tokens; ceiling = best "
             f"(k+1)V(1)/V(k+1) of a perfect free draft",
             f"{'delay':>7} {'plain':>7} {'default':>8} {'speed-up [95% CI]':>22} {'ceiling':>8} {'of ceil':>8} "
             f"{'RT/tok plain':>12} {'RT/tok def':>10} {'draft/round':>11} {'llama-server best':>22}"]
    for r in result["rows"]:
        delay = "local" if r["delay_ms"] is None else f"{r['delay_ms']:g} ms"
        s = r["speedup"]
        ceil = r["ceiling"]["best"]
        llama = r.get("llama_server") or {}
        best = max(llama.items(), key=lambda kv: kv[1]["tok_s"]) if llama else None
        llama_txt = f"{best[1]['tok_s']:.1f} ({best[0].replace('llama-server', '').strip() or 'plain'})" if best else "-"
        lines.append(f"{delay:>7} {r['plain']['tok_s']:>7.1f} {r['default']['tok_s']:>8.1f} "
                     f"{s['geo_mean']:>6.2f}x [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]{'':>5} {ceil:>7.2f}x "
                     f"{s['geo_mean'] / ceil:>8.0%} {r['plain']['round_trips_per_token']:>12.1f} "
                     f"{r['default']['round_trips_per_token']:>10.2f} {r['default']['drafted_per_round'] or 0:>11.1f} "
                     f"{llama_txt:>22}")
    for r in result["rows"]:
        if r.get("llama_server") and r["delay_ms"] is not None:
            best = max(v["tok_s"] for v in r["llama_server"].values())
            lines.append(f"{r['delay_ms']:g} ms: pyspec default / llama-server's best = "
                         f"{r['default']['tok_s'] / best:.2f}x")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Speed-up over plain against the round-trip time: measured (with its
    interval), the ceiling, and llama-server's best over pyspec's plain."""
    from ..plot import pyplot

    plt = pyplot()
    rows = [r for r in result["rows"] if r["delay_ms"] is not None]
    rtt = [2 * r["delay_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    mid = [r["speedup"]["geo_mean"] for r in rows]
    err = [[m - r["speedup"]["ci95"][0] for m, r in zip(mid, rows)], [r["speedup"]["ci95"][1] - m for m, r in zip(mid, rows)]]
    ax.errorbar(rtt, mid, yerr=err, marker="o", capsize=4, label="pyspec default / plain (95 % CI)")
    ax.plot(rtt, [r["ceiling"]["best"] for r in rows], "k--", label="ceiling: perfect free draft")
    if any(r.get("llama_server") for r in rows):
        ax.plot(rtt, [max(v["tok_s"] for v in r["llama_server"].values()) / r["plain"]["tok_s"] for r in rows],
                marker="s", label="llama-server --rpc best / pyspec plain")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("round-trip time added (ms)")
    ax.set_ylabel("speed-up over plain decoding over RPC")
    ax.set_title(f"Target on {result['workers']} RPC worker(s): speculation against network delay")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
