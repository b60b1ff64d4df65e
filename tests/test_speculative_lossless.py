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

Significance: every chi-square test here is at alpha = 0.001, so a correct
configuration fails by chance with probability 0.001 (the default tier's two
proofs together < 0.002; seeds are fixed). The negative control (residual replaced by p) runs the
bug for real and must be rejected at the same level.

Sample sizes come from power calculations asserted in each test (assert_power):
the stated wrong distribution of every test is the broken-residual law of its
own configuration (wrong_residual_distribution, computed exactly), and N must
give the pooled chi-square power > 0.99 against it (noncentral chi-square on the
cells the test really uses, confirmed by a Monte Carlo run of the same test on
multinomial samples of the wrong law). required_n() gives the smallest such N.

Default tier: Gemma self-draft with a cold, wide draft, N = 680 (proof and
control; 624 needed); default Qwen pair, N = 420 (386 needed). Slow tier
(`pytest -m slow`): the former sizes, Gemma with a hot draft at N = 20,000
(control N = 6,000; 4,832 needed) and the Qwen pair at N = 6,000.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import pyspec
from pyspec import sampling
from draws import draw

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
    return draw(decoder, prompt_tokens, n, seed0=10_000, draft_max=1, _variant=variant, **TARGET,
                **draft_kwargs).counts


def pooled_cells(probs: dict, n: int):
    """The cells of pooled_chisquare at sample size n: a list of key groups (every
    outcome with expected count >= 5 alone, the rest in one pool)."""
    keys = sorted(probs, key=lambda k: -probs[k])
    big = [[k] for k in keys if probs[k] * n >= 5]
    small = [k for k in keys if probs[k] * n < 5]
    return big + ([small] if small else [])


def power(exact: dict, wrong: dict, n: int, df_hint: int = None) -> float:
    """Power of the pooled chi-square at ALPHA against `wrong` (noncentral chi2).

    Without df_hint: the cells the test really uses at this n (pooled_cells), df =
    cells - 1, noncentrality n * sum_c (w_c - e_c)^2 / e_c. With df_hint: the
    unpooled noncentrality with that df (the older estimate, kept for callers).
    Mass of `wrong` outside the support of `exact` fails the test outright; it
    only raises the power and is ignored here (conservative)."""
    from scipy import stats

    if df_hint is None:
        cells = pooled_cells(exact, n)
        df = len(cells) - 1
        if df < 1:
            return 0.0
        lam = 0.0
        for c in cells:
            e = sum(exact[k] for k in c)
            w = sum(wrong.get(k, 0.0) for k in c)
            lam += (w - e) ** 2 / e
        lam *= n
    else:
        df = df_hint
        lam = n * sum((wrong.get(k, 0.0) - v) ** 2 / v for k, v in exact.items() if v > 0)
    crit = stats.chi2.isf(ALPHA, df)
    return float(stats.ncx2.sf(crit, df, lam))


def required_n(exact: dict, wrong: dict, df: int = None, target_power: float = 0.99) -> int:
    """Smallest N (to within 1 %) at which power(exact, wrong, N, df) > target_power:
    the sample size a chi-square test needs to detect `wrong`. Pooling makes the
    power slightly non-monotone in N, so the answer is checked upwards: every N on
    a grid up to twice the answer also has the power. Raises if even 1e8 samples
    would not do."""
    def ok(m):
        return power(exact, wrong, m, df) > target_power

    hi = 16
    while not ok(hi):
        hi *= 2
        if hi > 10 ** 8:
            raise ValueError("the wrong distribution is indistinguishable from the exact one")
    lo = hi // 2
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    while not all(ok(int(hi * f)) for f in np.linspace(1.0, 2.0, 41)):
        hi = int(hi * 1.05) + 1
    return hi


def simulated_power(exact: dict, wrong: dict, n: int, reps: int = 2_000, seed: int = 0) -> float:
    """Monte Carlo check of power(): the fraction of multinomial samples of size n
    drawn from `wrong` that pooled_chisquare rejects at ALPHA."""
    rng = np.random.default_rng(seed)
    keys = sorted(set(exact) | set(wrong))
    w = np.array([wrong.get(k, 0.0) for k in keys])
    rejected = 0
    for c in rng.multinomial(n, w / w.sum(), size=reps):
        counts = {k: int(x) for k, x in zip(keys, c) if x}
        rejected += pooled_chisquare(counts, exact, n)[2] < ALPHA
    return rejected / reps


def mixture(exact: dict, wrong: dict, f: float) -> dict:
    """The law of a sampler that follows `wrong` in a fraction f of the samples
    (those that drafted) and `exact` otherwise."""
    keys = set(exact) | set(wrong)
    return {k: f * wrong.get(k, 0.0) + (1 - f) * exact.get(k, 0.0) for k in keys}


def assert_power(exact: dict, wrong: dict, n: int, what: str) -> float:
    """The sample-size rule of every chi-square test here: N must give power > 0.99
    at ALPHA against the test's stated wrong law (noncentral chi2 on the pooled
    cells, and a Monte Carlo check of the same). Prints N, the power and the N the
    power calculation asks for."""
    pw = power(exact, wrong, n)
    need = required_n(exact, wrong)
    sim = simulated_power(exact, wrong, n)
    print(f"{what}: N={n} power={pw:.5f} (simulated {sim:.4f}) required N(power>0.99)={need}")
    assert pw > 0.99 and sim > 0.99, f"{what}: N={n} is too small (power {pw:.4f}, simulated {sim:.4f}; need {need})"
    return pw


@pytest.fixture(scope="module")
def gemma_pair(gemma_path):
    target = pyspec.Model(gemma_path, n_ctx=256, seed=0)
    draft = pyspec.Model(gemma_path, n_ctx=256, seed=0)
    return target, pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=1)


# Draft settings of the Gemma self-draft proofs. Both give q != p with a wider
# support than p (draft top-k 8 against the target's 3), so acceptances,
# rejections, residual draws and proposals outside p's support all occur.
# Default tier: colder and wider. The broken residual's law is then far from p
# (~620 samples give power 0.99), so N = 680 proves the same thing as N = 20,000
# did with the hot draft, whose bug deviates little (~4,800 samples for 0.99).
GEMMA_COLD_DRAFT = dict(draft_temperature=0.5, draft_top_k=8, draft_top_p=1.0, draft_min_p=0.0)
# Slow tier: the original hotter and wider draft.
GEMMA_DRAFT = dict(draft_temperature=2.0, draft_top_k=8, draft_top_p=1.0, draft_min_p=0.0)


def draft_row(draft: pyspec.Model, prompt_tokens, draft_kwargs: dict):
    """q0: the draft's distribution at the first draft position under its sampling
    settings (draft_temperature=... keys; absent ones follow TARGET, as in the engine)."""
    settings = dict(TARGET)
    settings.update({k[len("draft_"):]: v for k, v in draft_kwargs.items()})
    core = draft._core
    core.truncate(0)
    core.decode(prompt_tokens, 0, 1)
    q0 = sampling.distribution(core.logits(0), **settings)
    core.truncate(0)
    return q0


def exact_law(target: pyspec.Model, prompt: str):
    """prompt tokens, p0, p1 and the exact two-token law of the target after `prompt`."""
    tokens = target.tokenize(prompt)
    p0, p1 = target_rows(target, tokens)
    return tokens, p0, p1, exact_distribution(target, p0, p1)


def lossless_case(target: pyspec.Model, draft: pyspec.Model, draft_kwargs: dict):
    """prompt tokens, the exact two-token law, and the broken-residual law (the
    stated wrong distribution every test here is sized against)."""
    tokens, p0, p1, exact = exact_law(target, PROMPT)
    wrong = wrong_residual_distribution(target, p0, draft_row(draft, tokens, draft_kwargs), p1)
    return tokens, exact, wrong


@pytest.mark.parametrize("which", ["gemma", pytest.param("target", marks=pytest.mark.pair)])
def test_batch_kernels_match_single_token(gemma_pair, which, request):
    """The premise of bit-exact references: batches of <= 3 tokens give the same
    logits as single-token evaluation on this build."""
    if which == "gemma":
        model = gemma_pair[0]
    else:
        model = pyspec.Model(request.getfixturevalue("target_path"), n_ctx=256)
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


@pytest.mark.parametrize("draft_kwargs, n", [
    # Slow tier since the batched proofs (test_batch_lossless.py) cover the model
    # drafter and its broken-residual control in the same loop (a batch of one is this).
    pytest.param(GEMMA_COLD_DRAFT, 680, id="cold-draft-N680", marks=pytest.mark.slow),
    pytest.param(GEMMA_DRAFT, 20_000, id="hot-draft-N20000", marks=pytest.mark.slow),
])
def test_lossless_gemma_self_draft(gemma_pair, draft_kwargs, n):
    """Gemma drafting for itself (model drafter, fixed k = 1) samples the target's
    two-token law. alpha = 0.001. Sized against the broken-residual law of the same
    configuration: default tier, cold draft, N = 680 (620 needed for
    0.99); slow tier, hot draft, N = 20,000 (power ~1; 4,830 needed)."""
    target, spec = gemma_pair
    tokens, exact, wrong = lossless_case(target, spec.draft, draft_kwargs)
    assert_power(exact, wrong, n, "gemma self-draft vs residual=p")
    counts = sample(spec, tokens, n, draft_kwargs)
    stat, df, pv = pooled_chisquare(counts, exact, n)
    print(f"gemma self-draft: N={n} chi2={stat:.2f} df={df} p={pv:.3g} outcomes={len(exact)}")
    assert pv > ALPHA, f"speculative samples differ from the target distribution (p={pv:.3g})"


@pytest.mark.parametrize("draft_kwargs, n", [
    pytest.param(GEMMA_COLD_DRAFT, 680, id="cold-draft-N680", marks=pytest.mark.slow),
    pytest.param(GEMMA_DRAFT, 6_000, id="hot-draft-N6000", marks=pytest.mark.slow),
])
def test_negative_control_broken_residual_is_caught(gemma_pair, draft_kwargs, n):
    """The 'residual = p' bug, run for real, is rejected at alpha = 0.001 with the
    sample size of the proof above (cold draft, N = 680); slow tier:
    hot draft, N = 6,000 (power > 0.99; 4,830 needed)."""
    target, spec = gemma_pair
    tokens, exact, wrong = lossless_case(target, spec.draft, draft_kwargs)
    assert_power(exact, wrong, n, "control residual=p")
    counts = sample(spec, tokens, n, draft_kwargs, variant="residual_is_p")
    stat, df, pv = pooled_chisquare(counts, exact, n)
    print(f"NEGATIVE CONTROL residual=p: N={n} chi2={stat:.2f} df={df} p={pv:.3g}")
    assert pv < ALPHA, f"the broken residual was not detected (p={pv:.3g})"


@pytest.mark.pair
@pytest.mark.parametrize("n", [420, pytest.param(6_000, marks=pytest.mark.slow)])
def test_lossless_default_pair(target_path, draft_path, n):
    """The default Qwen pair (0.5B drafting for 1.5B, model drafter, fixed k = 1,
    the draft sampling with the target's settings) samples the target's two-token
    law. alpha = 0.001. Sized against the broken-residual law of this pair:
    default tier N = 420 (390 needed for 0.99 on one machine, 436 on another:
    the laws come from this machine's logits, so N grows to 1.05 x what they
    need), slow tier N = 6,000."""
    target = pyspec.Model(target_path, n_ctx=256, seed=0)
    draft = pyspec.Model(draft_path, n_ctx=256, seed=0)
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=1)
    tokens, exact, wrong = lossless_case(target, draft, {})
    n = max(n, math.ceil(1.05 * required_n(exact, wrong)))
    assert_power(exact, wrong, n, "default pair vs residual=p")
    counts = sample(spec, tokens, n, {})
    stat, df, pv = pooled_chisquare(counts, exact, n)
    print(f"default pair: N={n} chi2={stat:.2f} df={df} p={pv:.3g} outcomes={len(exact)}")
    assert pv > ALPHA, f"speculative samples differ from the target distribution (p={pv:.3g})"
