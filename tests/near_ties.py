"""Greedy outputs compared across batch shapes: a difference is accepted only at a near tie.

A round with S sequences evaluates S rows at once, and this build's CPU kernels
take another path for several rows than for one (the weights are repacked for
multi-row products), so a row's probabilities differ from a lone decode's, by
up to ~0.05 on the small test model (measured; up to 0.10 on an AMD EPYC Zen 4).
A greedy sequence may then flip
where its two most likely tokens are close: a divergence from the lone output
is accepted only where the lone run's top two are within NEAR_TIE (in
probability at T = 1), and such flips are counted (at most one per sequence).
"""

from __future__ import annotations

import numpy as np

import pyspec

NEAR_TIE = 0.1


def top2_gap(model: pyspec.Model, tokens) -> float:
    """p(top 1) - p(top 2) after `tokens` (T = 1, no truncation)."""
    core = model.native
    core.truncate(0)
    core.decode(list(tokens), 0, 1)
    logits = core.logits(0)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    a, b = np.sort(p)[-2:]
    return float(b - a)


def near_tie_flips(lone_model, prompt_tokens, got, want) -> int:
    """0 if equal; 1 if they part at a near tie of the lone run; fails otherwise."""
    if got == want:
        return 0
    t = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b) if any(
        a != b for a, b in zip(got, want)) else min(len(got), len(want))
    gap = top2_gap(lone_model, list(prompt_tokens) + list(want[:t]))
    assert gap < NEAR_TIE, f"the batched output left the lone one at token {t}, not a near tie (gap {gap:.3f})"
    return 1
