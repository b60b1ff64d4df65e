"""The statistics every paired benchmark shares, in process and through servers:
the order of the runs (ABBA, rotated) and the two-stage bootstrap interval of a
geometric-mean ratio (pyspec/bench/inprocess/paired.py states the method)."""

from __future__ import annotations

import math
import random
from typing import Callable, Dict, Hashable, Optional, Sequence


def run_order(configs: list, rep: int) -> list:
    """Repetition rep's order: rotated left by rep // 2, reversed on odd
    repetitions. Two configurations: AB BA BA AB (ABBA); three: ABC CBA BCA ACB
    CAB BAC, each at every position twice in six repetitions."""
    k = (rep // 2) % len(configs)
    order = configs[k:] + configs[:k]
    return order[::-1] if rep % 2 else order


def geo_mean(logs_by_prompt: Sequence[Sequence[float]]) -> float:
    """exp of the mean over prompts of each prompt's mean log ratio."""
    return math.exp(sum(sum(x) / len(x) for x in logs_by_prompt) / len(logs_by_prompt))


def bootstrap_interval(logs_by_prompt: Sequence[Sequence[float]], n_boot: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple:
    """Percentile interval of the geometric-mean ratio, resampling prompts and
    then each prompt's repetitions (two-stage bootstrap)."""
    rng = random.Random(seed)
    groups = [list(x) for x in logs_by_prompt if x]
    if not groups:
        return (float("nan"), float("nan"))
    stats = []
    for _ in range(n_boot):
        drawn = [rng.choice(groups) for _ in groups]
        stats.append(geo_mean([[rng.choice(g) for _ in g] for g in drawn]))
    stats.sort()
    lo = stats[int(math.floor((1 - level) / 2 * (n_boot - 1)))]
    hi = stats[int(math.ceil((1 + level) / 2 * (n_boot - 1)))]
    return (lo, hi)


def paired_ratio(a: Dict[Hashable, float], b: Dict[Hashable, float], group: Callable[[Hashable], Hashable],
                 seed: int = 0) -> Optional[dict]:
    """The geometric mean of a[k] / b[k] over the keys both hold (positive
    values), with the two-stage bootstrap interval over ``group(k)``'s groups:
    {"ratio", "low", "high", "n"}; None when no key pairs."""
    groups: Dict[Hashable, list] = {}
    for k, v in a.items():
        w = b.get(k)
        if v and w and v > 0 and w > 0:
            groups.setdefault(group(k), []).append(math.log(v / w))
    if not groups:
        return None
    logs = [x for g in groups.values() for x in g]
    lo, hi = bootstrap_interval(list(groups.values()), seed=seed)
    return {"ratio": math.exp(sum(logs) / len(logs)), "low": lo, "high": hi, "n": len(logs)}
