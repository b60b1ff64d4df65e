"""The chi-square test of every statistical test in this suite, and its power.

One Pearson goodness-of-fit test, `pooled_chisquare`, with the two pooling
rules the suite uses (a parameter), and the sample-size rule of the end-to-end
tests: N must give the test power > 0.99 at ALPHA against a stated wrong law
(`power`, `required_n`, `simulated_power`, `assert_power`).

p-values come from pyspec.tools.check (chi2_sf, and chi2_gof for the filled pool:
the library's self-check and these tests run one implementation); the power
calculation needs the noncentral chi-square, from SciPy.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from pyspec.tools import check

#: Significance level of each end-to-end chi-square test (a correct
#: configuration fails one by chance with probability 0.001).
ALPHA = 1e-3


def pooled_chisquare(counts, probs, n=None, *, fill_pool=False, min_expected=5.0):
    """Pearson chi-square of observed ``counts`` against the law ``probs``:
    ``(statistic, df, p_value)``.

    ``counts`` and ``probs`` are dicts (outcome -> count, outcome -> probability;
    an outcome missing from ``counts`` was not seen) or arrays indexed by
    outcome. An outcome of probability 0 that occurs fails outright (p = 0).

    Pooling of the cells whose expected count is below ``min_expected``:

    * ``fill_pool=False`` (the end-to-end tests): they form one pool, whatever
      its size; expected counts are ``n * probs`` (``n`` defaults to the total
      count), the cells taken most likely first;
    * ``fill_pool=True`` (the verification rule's tests): the pool then takes
      further cells, smallest expected first, until it reaches ``min_expected``;
      expected counts are the total count times ``probs`` renormalised on its
      support. This is :func:`pyspec.tools.check.chi2_gof`, the self-check's test;
      with one cell left there is nothing to test (p = 1).
    """
    if isinstance(probs, dict):
        keys = list(probs) + [k for k in counts if k not in probs]
        obs = [counts.get(k, 0) for k in keys]
        exp_p = [probs.get(k, 0.0) for k in keys]
    else:
        keys = None
        obs, exp_p = np.asarray(counts, dtype=np.float64), np.asarray(probs, dtype=np.float64)
    if fill_pool:
        return check.chi2_gof(obs, exp_p, min_expected)
    if any(c > 0 and p == 0.0 for c, p in zip(obs, exp_p)):
        return float("inf"), 0, 0.0
    n = float(np.sum(obs)) if n is None else n
    order = sorted(range(len(exp_p)), key=lambda i: -exp_p[i])
    cells_o, cells_e, pool_o, pool_e = [], [], 0.0, 0.0
    for i in order:
        e = exp_p[i] * n
        if e >= min_expected:
            cells_o.append(obs[i])
            cells_e.append(e)
        else:
            pool_o += obs[i]
            pool_e += e
    if pool_e > 0:
        cells_o.append(pool_o)
        cells_e.append(pool_e)
    o, e = np.array(cells_o, float), np.array(cells_e, float)
    stat = float(((o - e) ** 2 / e).sum())
    df = len(o) - 1
    return stat, df, (check.chi2_sf(stat, df) if df > 0 else math.nan)


def pooled_cells(probs: dict, n: int):
    """The cells of pooled_chisquare (fill_pool=False) at sample size n: a list
    of key groups (every outcome with expected count >= 5 alone, the rest in one pool)."""
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
    """The sample-size rule of the end-to-end chi-square tests: N must give power
    > 0.99 at ALPHA against the test's stated wrong law (noncentral chi2 on the
    pooled cells, and a Monte Carlo check of the same). Prints N, the power and
    the N the power calculation asks for."""
    pw = power(exact, wrong, n)
    need = required_n(exact, wrong)
    sim = simulated_power(exact, wrong, n)
    print(f"{what}: N={n} power={pw:.5f} (simulated {sim:.4f}) required N(power>0.99)={need}")
    assert pw > 0.99 and sim > 0.99, f"{what}: N={n} is too small (power {pw:.4f}, simulated {sim:.4f}; need {need})"
    return pw


def independence(pairs, min_expected: float = 5.0):
    """Pearson's chi-square test that the two coordinates of ``pairs`` (outcome
    pairs of two samples drawn together) are independent: ``(statistic, df,
    p_value)``. The categories are the outcomes of both coordinates (the two
    samples follow one law), the rarest pooled into the next rarest until every
    cell's expected count (each coordinate's own marginal, estimated from the
    pairs) reaches ``min_expected``, or two categories are left (then, short of
    it, Fisher's exact test gives the p-value)."""
    pairs = [tuple(p) for p in pairs]
    n = len(pairs)
    seen: dict = {}
    for pair in pairs:
        for x in pair:
            seen[x] = seen.get(x, 0) + 1
    groups = [[x] for x in sorted(seen, key=lambda x: -seen[x])]

    def table(groups):
        where = {x: g for g, members in enumerate(groups) for x in members}
        cells = np.zeros((len(groups), len(groups)))
        for a, b in pairs:
            cells[where[a], where[b]] += 1
        return cells, np.outer(cells.sum(1), cells.sum(0)) / n

    cells, expected = table(groups)
    while len(groups) > 2 and expected.min() < min_expected:
        rarest = groups.pop()
        groups[-1] = groups[-1] + rarest
        cells, expected = table(groups)
    used = expected > 0
    stat = float(((cells[used] - expected[used]) ** 2 / expected[used]).sum())
    df = (int((cells.sum(1) > 0).sum()) - 1) * (int((cells.sum(0) > 0).sum()) - 1)
    if df == 1 and expected.min() < min_expected:  # too few for the chi-square law: Fisher's exact test
        from scipy import stats

        return stat, df, float(stats.fisher_exact(cells).pvalue)
    return stat, df, (check.chi2_sf(stat, df) if df > 0 else math.nan)


def assert_law(counts, exact: dict, n: int, label: str, *, control: bool = False, note: str = "",
               wrong: Optional[dict] = None) -> float:
    """The verdict of an end-to-end test: ``counts`` of n samples against the exact
    law at ALPHA. A proof must not be rejected; a negative control (``control``:
    a deliberately wrong sampler) must be, and where the test states the bug's
    law (``wrong``), the control must also fit it (not be rejected against it
    at ALPHA): the path the samples took is the one the test describes. Prints
    the statistics with ``note`` (what fired) and returns the p-value."""
    stat, df, pv = pooled_chisquare(counts, exact, n)
    fit = ""
    if wrong is not None:
        assert control, f"{label}: the bug's law is the control's to fit"
        fit_stat, _, fit_p = pooled_chisquare(counts, wrong, n)
        fit = f"; against the bug's law: chi2={fit_stat:.2f} p={fit_p:.3g}"
    print(f"{'NEGATIVE CONTROL ' if control else ''}{label}: N={n} chi2={stat:.2f} df={df} p={pv:.3g}{fit} {note}")
    if control:
        assert pv < ALPHA, f"{label}: the wrong sampler was not detected (p={pv:.3g})"
        if wrong is not None:
            assert fit_p > ALPHA, (f"{label}: the control does not follow the bug's law (p={fit_p:.3g}): the path "
                                   "tested is not the one described")
    else:
        assert pv > ALPHA, f"{label}: samples differ from the target distribution (p={pv:.3g})"
    return pv
