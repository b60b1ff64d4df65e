"""End to end: speculative decoding on real models samples the target's
distribution exactly.

For a fixed prompt we draw N two-token continuations with the real C++ loop
(draft_max = 1, so each sample exercises acceptance, the residual and the bonus
token) and compare their frequencies with the exact target distribution over
those continuations, enumerated by plain target evaluation:
P(a, b) = p0(a) * p1(b | a), with a small target top-k so the outcome space is
small. Pearson chi-square, cells with expected count < 5 pooled.

Bit-exactness of the reference: on this CPU build llama.cpp evaluates batches
of up to 3 tokens with the same kernels as single tokens (checked in
test_batch_kernels_match_single_token below); with draft_max = 1 the
verification batch has 2 tokens, so the engine's p and the enumeration's p are
the same numbers, and any deviation is the algorithm's.

Significance: each configuration is tested at alpha = 0.001 (three tests; the
family-wise error of the two correct configurations is < 0.002). The negative
control (residual replaced by p) must be rejected at the same level; its exact
wrong distribution is computed too, and the sample size is checked to give it
power > 0.99 before the test relies on it.

Sample sizes: N = 20,000 for the Gemma self-draft configuration (q != p via
different draft settings); N = 6,000 for the default Qwen pair, whose 1.5B
target makes each sample ~4x dearer on 2 CPU cores (power is checked the same
way against the negative control's deviation); N = 5,000 for the control.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyspec
from pyspec import sampling

ALPHA = 1e-3
PROMPT = "The weather today is"
TARGET = dict(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)


def pooled_chisquare(counts: dict, probs: dict, n: int):
    """Pearson chi-square with cells of expected count < 5 pooled; an outcome of
    probability 0 that occurs fails outright (p-value 0)."""
    from scipy import stats

    if any(probs.get(k, 0.0) == 0.0 for k in counts):
        return float("inf"), 0, 0.0
    keys = sorted(probs, key=lambda k: -probs[k])
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for k in keys:
        e = probs[k] * n
        if e >= 5:
            obs.append(counts.get(k, 0))
            exp.append(e)
        else:
            pool_o += counts.get(k, 0)
            pool_e += e
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    obs, exp = np.array(obs, float), np.array(exp, float)
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    return stat, df, float(stats.chi2.sf(stat, df))


def target_rows(model: pyspec.Model, prompt_tokens):
    """p0 and p1(.|a) by plain evaluation, split exactly like the engine:
    prompt[:-1] as one batch, then single tokens."""
    core = model._core
    core.truncate(0)
    core.decode(prompt_tokens[:-1], 0, 0)
    core.decode(prompt_tokens[-1:], len(prompt_tokens) - 1, 1)
    p0 = sampling.distribution(core.logits(0), **TARGET)
    p1 = {}
    for a in np.flatnonzero(p0):
        core.truncate(len(prompt_tokens))
        core.decode([int(a)], len(prompt_tokens), 1)
        p1[int(a)] = sampling.distribution(core.logits(0), **TARGET)
    core.truncate(0)
    return p0, p1


def exact_distribution(model, p0, p1):
    out = {}
    for a in np.flatnonzero(p0):
        a = int(a)
        if model._core.is_eog(a):
            out[(a,)] = float(p0[a])
            continue
        for b in np.flatnonzero(p1[a]):
            out[(a, int(b))] = float(p0[a] * p1[a][b])
    return out


def wrong_residual_distribution(model, p0, q0, p1):
    """What the 'residual = p' bug samples (draft_max = 1, two tokens)."""
    beta = np.minimum(p0, q0).sum()
    first = np.minimum(p0, q0) + (1.0 - beta) * p0
    return exact_distribution(model, first, p1)


def sample(decoder, prompt_tokens, n, draft_kwargs, variant="correct"):
    counts: dict = {}
    for i in range(n):
        out = decoder.generate(prompt_tokens, max_tokens=2, seed=10_000 + i, draft_max=1, _variant=variant,
                               **TARGET, **draft_kwargs)
        key = tuple(out.tokens)
        counts[key] = counts.get(key, 0) + 1
    return counts


def power(exact: dict, wrong: dict, n: int, df_hint: int) -> float:
    """Power of the pooled chi-square at ALPHA against `wrong` (noncentral chi2)."""
    from scipy import stats

    lam = n * sum((wrong.get(k, 0.0) - v) ** 2 / v for k, v in exact.items() if v > 0)
    crit = stats.chi2.isf(ALPHA, df_hint)
    return float(stats.ncx2.sf(crit, df_hint, lam))


@pytest.fixture(scope="module")
def gemma_pair(gemma_path):
    target = pyspec.Model(gemma_path, n_ctx=256, seed=0)
    draft = pyspec.Model(gemma_path, n_ctx=256, seed=0)
    return target, pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=1)


# The draft samples hotter and wider than the target: q != p, wider support.
GEMMA_DRAFT = dict(draft_temperature=2.0, draft_top_k=8, draft_top_p=1.0, draft_min_p=0.0)


def test_batch_kernels_match_single_token(gemma_pair, target_path):
    """The premise of bit-exact references: batches of <= 3 tokens give the same
    logits as single-token evaluation on this build."""
    for model in (gemma_pair[0], pyspec.Model(target_path, n_ctx=256)):
        core = model._core
        prompt = model.tokenize(PROMPT)
        cont = model.tokenize(" sunny and warm", add_special=False)[:2]
        core.truncate(0)
        core.decode(prompt, 0, 1)
        singles = []
        for i, t in enumerate(cont):
            core.decode([t], len(prompt) + i, 1)
            singles.append(np.array(core.logits(0)))
        core.truncate(len(prompt))
        core.decode(cont, len(prompt), len(cont))
        for i in range(len(cont)):
            np.testing.assert_array_equal(np.array(core.logits(i)), singles[i])
        core.truncate(0)


def test_lossless_gemma_self_draft(gemma_pair):
    target, spec = gemma_pair
    tokens = target.tokenize(PROMPT)
    p0, p1 = target_rows(target, tokens)
    exact = exact_distribution(target, p0, p1)
    n = 20_000
    counts = sample(spec, tokens, n, GEMMA_DRAFT)
    stat, df, pv = pooled_chisquare(counts, exact, n)
    print(f"gemma self-draft: N={n} chi2={stat:.2f} df={df} p={pv:.3g} outcomes={len(exact)}")
    assert pv > ALPHA, f"speculative samples differ from the target distribution (p={pv:.3g})"


def test_negative_control_broken_residual_is_caught(gemma_pair):
    target, spec = gemma_pair
    tokens = target.tokenize(PROMPT)
    p0, p1 = target_rows(target, tokens)
    exact = exact_distribution(target, p0, p1)
    core = gemma_pair[1].draft._core
    core.truncate(0)
    core.decode(tokens, 0, 1)
    q0 = sampling.distribution(core.logits(0), temperature=2.0, top_k=8)
    core.truncate(0)
    wrong = wrong_residual_distribution(target, p0, q0, p1)
    n = 5_000
    assert power(exact, wrong, n, max(len(exact) - 1, 1)) > 0.99, "control sample too small to detect the bug"
    counts = sample(spec, tokens, n, GEMMA_DRAFT, variant="residual_is_p")
    stat, df, pv = pooled_chisquare(counts, exact, n)
    print(f"NEGATIVE CONTROL residual=p: N={n} chi2={stat:.2f} df={df} p={pv:.3g}")
    assert pv < ALPHA, f"the broken residual was not detected (p={pv:.3g})"


@pytest.mark.pair
def test_lossless_default_pair(target_path, draft_path):
    target = pyspec.Model(target_path, n_ctx=256, seed=0)
    draft = pyspec.Model(draft_path, n_ctx=256, seed=0)
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=1)
    tokens = target.tokenize(PROMPT)
    p0, p1 = target_rows(target, tokens)
    exact = exact_distribution(target, p0, p1)
    # The draft samples with the target's settings; q is the 0.5B model's.
    core = draft._core
    core.truncate(0)
    core.decode(tokens, 0, 1)
    q0 = sampling.distribution(core.logits(0), **TARGET)
    core.truncate(0)
    n = 6_000
    wrong = wrong_residual_distribution(target, p0, q0, p1)
    print(f"default pair: power against residual=p at N={n}: {power(exact, wrong, n, max(len(exact) - 1, 1)):.3f}")
    counts = sample(spec, tokens, n, {})
    stat, df, pv = pooled_chisquare(counts, exact, n)
    print(f"default pair: N={n} chi2={stat:.2f} df={df} p={pv:.3g} outcomes={len(exact)}")
    assert pv > ALPHA, f"speculative samples differ from the target distribution (p={pv:.3g})"
