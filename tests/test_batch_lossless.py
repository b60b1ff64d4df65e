"""Batched speculative decoding keeps every sample's law, and samples are
independent: for n = 2 samples of one prompt at T = 1, the joint law of
(first token of sample 1, first token of sample 2) is the product of the
target's marginals p0 x p0 (9 cells under top-k 3).

Drafting fires at the first token: the n-gram drafter on a prompt that repeats
proposes "three" there (one-hot q), so both samples' first tokens go through
the batched verification (one decode with both sequences' rows).

Negative controls the same test must reject, each N from a power calculation
(power > 0.99 at alpha = 0.001) against its stated wrong law:
  * the broken residual (residual = p) in the batched path: each first token
    then follows P(y) = p0(x)[y = x] + (1 - p0(x)) p0(y);
  * the two samples on one random stream (correlated): both draw the same
    token, a law on the diagonal (its own, smaller N).
"""

from __future__ import annotations

import numpy as np
import pytest

import pyspec

from test_speculative_lossless import ALPHA, TARGET, pooled_chisquare, power, required_n, target_rows

PROMPT = "one two three one two three one two"
MIN_N = 200


@pytest.fixture(scope="module")
def case(gemma_path):
    target = pyspec.Model(gemma_path, n_ctx=256, n_seq_max=2, seed=0)
    tokens = target.tokenize(PROMPT)
    p0, _ = target_rows(pyspec.Model(gemma_path, n_ctx=256, flash_attn="off"), tokens)  # as the batch runs
    support = [int(t) for t in np.flatnonzero(p0)]
    exact = {(a, b): float(p0[a] * p0[b]) for a in support for b in support}
    spec = pyspec.SpeculativeDecoder(target, drafter="ngram", policy="fixed", draft_max=1)
    x = spec._core_drafter.propose(tokens, 1)[0]
    broken = {y: (1 - p0[x]) * p0[y] + (p0[x] if y == x else 0.0) for y in support}
    wrong_residual = {(a, b): float(broken[a] * broken[b]) for a in support for b in support}
    wrong_shared = {(a, a): float(p0[a]) for a in support}
    n = max(MIN_N, required_n(exact, wrong_residual, len(exact) - 1))
    return spec, tokens, exact, wrong_residual, wrong_shared, n


@pytest.fixture(scope="module")
def n_shared(case):
    """The shared-stream law sits on the diagonal: far fewer samples show it."""
    _, _, exact, _, wrong_shared, _ = case
    return max(30, required_n(exact, wrong_shared, len(exact) - 1))


def joint(spec, tokens, n, **kw):
    counts: dict = {}
    drafted = 0
    for i in range(n):
        out = spec.generate(tokens, n=2, max_tokens=2, seed=90_000 + i, **TARGET, **kw)
        key = (out.choices[0].tokens[0], out.choices[1].tokens[0])
        counts[key] = counts.get(key, 0) + 1
        drafted += sum(c.stats.drafted > 0 for c in out.choices)
    return counts, drafted


def test_two_batched_samples_are_independent_draws_of_the_target(case):
    spec, tokens, exact, wrong, _, n = case
    assert power(exact, wrong, n, len(exact) - 1) > 0.99
    counts, drafted = joint(spec, tokens, n)
    stat, df, pv = pooled_chisquare(counts, exact, n)
    print(f"batch n=2 ngram: N={n} chi2={stat:.2f} df={df} p={pv:.3g} drafted={drafted}/{2 * n}")
    assert drafted > n, "the batched verification path did not run"
    assert pv > ALPHA


def test_negative_control_broken_residual_in_the_batched_path(case):
    spec, tokens, exact, _, _, n = case
    counts, _ = joint(spec, tokens, n, _variant="residual_is_p")
    stat, df, pv = pooled_chisquare(counts, exact, n)
    print(f"NEGATIVE CONTROL batch residual=p: N={n} chi2={stat:.2f} p={pv:.3g}")
    assert pv < ALPHA


def test_negative_control_samples_on_one_stream(case, n_shared):
    spec, tokens, exact, _, wrong_shared, _ = case
    n = n_shared
    assert power(exact, wrong_shared, n, len(exact) - 1) > 0.99
    counts, _ = joint(spec, tokens, n, _shared_stream=True)
    stat, df, pv = pooled_chisquare(counts, exact, n)
    print(f"NEGATIVE CONTROL shared stream: N={n} chi2={stat:.2f} p={pv:.3g}")
    assert pv < ALPHA
