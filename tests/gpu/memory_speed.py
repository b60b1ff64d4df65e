"""Goal 2 of issue 37: a repeated request drafted from memory against plain decoding.

usage: python tests/gpu/memory_speed.py TARGET [DRAFT] [--n-gpu-layers -1] [--tokens 256] [--reps 5]

Greedy, the same request sent again: plain decoding, the suffix drafter
(default settings: its memory holds the first answer), and the default decoder
(hybrid, with DRAFT when given), interleaved rep by rep. Prints the decode
speed of each and the paired ratios to plain with a 95 % interval (t over the
reps' log ratios).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import pyspec

PROMPT = "Write a Python function that parses an ISO 8601 date string, with docstring and tests."


T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}  # t quantiles by df


def interval(ratios):
    logs = [math.log(r) for r in ratios]
    m = statistics.mean(logs)
    df = len(logs) - 1
    half = T975.get(df, 2.0) * statistics.stdev(logs) / math.sqrt(len(logs)) if df > 0 else float("nan")
    return {"ratio": math.exp(m), "lo": math.exp(m - half), "hi": math.exp(m + half), "n": len(logs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target")
    ap.add_argument("draft", nargs="?")
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    load = dict(n_ctx=4096, n_gpu_layers=args.n_gpu_layers)
    target = pyspec.Model(args.target, **load)
    draft = pyspec.Model(args.draft, **load) if args.draft else None
    decoders = {"plain": target, "suffix": pyspec.SpeculativeDecoder(target, None, drafter="suffix"),
                "default": pyspec.SpeculativeDecoder(target, draft)}
    run = dict(max_tokens=args.tokens, temperature=0, seed=0)
    for d in decoders.values():  # the first answer: into memory, and everything warm
        d.generate(PROMPT, **run)
    speed = {name: [] for name in decoders}
    stats = {}
    for _ in range(args.reps):
        for name, d in decoders.items():
            t0 = time.perf_counter()
            out = d.generate(PROMPT, **run)
            speed[name].append(out.stats.n_generated / (time.perf_counter() - t0))
            stats[name] = {"drafted": out.stats.drafted, "accepted": out.stats.accepted,
                           "memory_accepted": out.stats.memory_accepted, "rounds": out.stats.rounds}
    result = {"tok_s": {n: statistics.median(v) for n, v in speed.items()}, "last_stats": stats,
              "vs_plain": {n: interval([a / b for a, b in zip(speed[n], speed["plain"])])
                           for n in decoders if n != "plain"}}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
