"""Aggregate benchmark samples into ratios and print them."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Sequence

from .runners import Sample


def decode_rate(samples: Sequence[Sample]) -> float:
    """Tokens after the first per second after the first, pooled over samples."""
    toks = sum(s.decode_tokens for s in samples)
    secs = sum(s.decode_s for s in samples)
    return toks / secs if secs > 0 else 0.0


def summarize(samples: List[Sample], baseline: str) -> Dict[str, Dict[str, dict]]:
    """{category|"all": {runner: figures}} with ratios to ``baseline``."""
    groups: Dict[str, Dict[str, List[Sample]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        groups[s.category][s.runner].append(s)
        groups["all"][s.runner].append(s)
    table: Dict[str, Dict[str, dict]] = {}
    for cat, by_runner in groups.items():
        base = decode_rate(by_runner.get(baseline, []))
        rows = {}
        for runner, ss in by_runner.items():
            rate = decode_rate(ss)
            drafted = sum(s.extra.get("drafted", 0) for s in ss)
            accepted = sum(s.extra.get("accepted", 0) for s in ss)
            rounds = sum(s.extra.get("rounds", 0) for s in ss)
            gen = sum(s.n_generated for s in ss)
            rows[runner] = {
                "decode_tok_s": rate,
                "ratio": rate / base if base > 0 else float("nan"),
                "ttft_s": sum(s.ttft_s for s in ss) / len(ss),
                "n_generated": gen,
                "acceptance": accepted / drafted if drafted else None,
                "mean_accepted_len": (accepted + rounds) / rounds if drafted else None,
            }
        table[cat] = rows
    return table


def format_table(table: Dict[str, Dict[str, dict]], runners: Sequence[str], baseline: str) -> str:
    cats = [c for c in table if c != "all"] + ["all"]
    width = max(len(r) for r in runners) + 2
    lines = [f"decode tok/s and ratio to {baseline} (same prompts, same run)"]
    header = f"{'category':<15}" + "".join(f"{r:>{max(width, 22)}}" for r in runners)
    lines.append(header)
    lines.append("-" * len(header))
    for cat in cats:
        cells = []
        for r in runners:
            row = table[cat].get(r)
            if row is None:
                cells.append(f"{'-':>{max(width, 22)}}")
                continue
            cell = f"{row['decode_tok_s']:6.1f} ({row['ratio']:.2f}x)"
            if row["acceptance"] is not None:
                cell += f" a={row['acceptance']:.2f} L={row['mean_accepted_len']:.2f}"
            cells.append(f"{cell:>{max(width, 22)}}")
        lines.append(f"{cat:<15}" + "".join(cells))
    return "\n".join(lines)
