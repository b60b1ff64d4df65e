"""One sampler for the end-to-end chi-square tests: n generations with seeds
seed0, seed0 + 1, ..., their outcomes counted and their statistics summed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence


@dataclass
class Draws:
    counts: Dict[tuple, int] = field(default_factory=dict)  # outcome (first `keep` tokens) -> count
    totals: Dict[str, object] = field(default_factory=dict)  # stats summed (lists element-wise)
    drafting: int = 0                                       # generations that drafted at all


def draw(decoder, tokens: Sequence[int], n: int, *, seed0: int, max_tokens: int = 2, keep: Optional[int] = None,
         before: Optional[Callable] = None, **kwargs) -> Draws:
    """`before(decoder)` runs ahead of every generation (to pin a policy's state)."""
    d = Draws()
    for i in range(n):
        if before is not None:
            before(decoder)
        out = decoder.generate(tokens, max_tokens=max_tokens, seed=seed0 + i, **kwargs)
        key = tuple(out.tokens[:keep])
        d.counts[key] = d.counts.get(key, 0) + 1
        d.drafting += out.stats.drafted > 0
        for name, value in out.stats.to_dict().items():
            if isinstance(value, list):
                acc = d.totals.setdefault(name, [0] * len(value))
                for j, v in enumerate(value):
                    acc[j] += v
            else:
                d.totals[name] = d.totals.get(name, 0) + value
    return d
