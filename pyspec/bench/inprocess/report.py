"""Aggregate benchmark samples into ratios and print them."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Sequence

from ...results import GenerationStats
from .backends import Sample


def decode_rate(samples: Sequence[Sample]) -> float:
    """Tokens after the first per second after the first, pooled over samples."""
    toks = sum(s.decode_tokens for s in samples)
    secs = sum(s.decode_s for s in samples)
    return toks / secs if secs > 0 else 0.0


PLAIN = "pyspec plain"


def summarize(samples: List[Sample], baseline: str) -> Dict[str, Dict[str, dict]]:
    """{category|"all": {runner: figures}} with ratios to ``baseline`` and to
    pyspec's own plain decoding (``vs_plain``)."""
    groups: Dict[str, Dict[str, List[Sample]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        groups[s.category][s.runner].append(s)
        groups["all"][s.runner].append(s)
    table: Dict[str, Dict[str, dict]] = {}
    for cat, by_runner in groups.items():
        base = decode_rate(by_runner.get(baseline, []))
        plain = decode_rate(by_runner.get(PLAIN, []))
        rows = {}
        for runner, ss in by_runner.items():
            rate = decode_rate(ss)
            # The runner's counts pooled over its samples (rates are ratios of sums).
            pooled = GenerationStats(**{k: sum(s.extra.get(k, 0) for s in ss)
                                        for k in ("drafted", "accepted", "rounds", "policy_plain")})
            drafted, rounds, plain_rounds = pooled.drafted, pooled.rounds, pooled.policy_plain
            gen = sum(s.n_generated for s in ss)
            rows[runner] = {
                "mean_draft_len": drafted / rounds if drafted or plain_rounds else None,
                "plain_rounds": plain_rounds if drafted or plain_rounds else None,
                "decode_tok_s": rate,
                "ratio": rate / base if base > 0 else float("nan"),
                "vs_plain": rate / plain if plain > 0 else float("nan"),
                "ttft_s": sum(s.ttft_s for s in ss) / len(ss),
                "n_generated": gen,
                "acceptance": pooled.acceptance_rate if drafted else None,
                "mean_accepted_len": pooled.mean_accepted_len if drafted else None,
            }
        table[cat] = rows
    return table


def format_table(table: Dict[str, Dict[str, dict]], runners: Sequence[str], baseline: str) -> str:
    """One block per category, one line per runner: decode tok/s, ratio to the
    baseline and to pyspec plain, acceptance, tokens per target pass (L), mean
    draft length (d) and rounds where the policy chose plain decoding."""
    cats = [c for c in table if c != "all"] + ["all"]
    w = max(len(r) for r in runners)
    lines = [f"decode tok/s (tokens after the first), ratio to {baseline} and to {PLAIN}; same prompts, same run"]
    head = (f"  {'runner':<{w}}  {'tok/s':>6}  {'ratio':>6}  {'vs plain':>8}  {'accept':>6}  {'L':>5}  {'d':>5}  "
            f"{'plain':>5}")
    for cat in cats:
        lines.append(f"[{cat}]")
        lines.append(head)
        for r in runners:
            row = table[cat].get(r)
            if row is None:
                continue

            def fmt(v, spec):
                return format(v, spec) if v is not None else "-"

            lines.append(
                f"  {r:<{w}}  {row['decode_tok_s']:6.1f}  {row['ratio']:5.2f}x  {row['vs_plain']:7.2f}x  "
                f"{fmt(row['acceptance'], '6.2f'):>6}  "
                f"{fmt(row['mean_accepted_len'], '5.2f'):>5}  {fmt(row['mean_draft_len'], '5.1f'):>5}  "
                f"{fmt(row['plain_rounds'], 'd'):>5}"
            )
    return "\n".join(lines)
