"""Statistical self-check of the sampling core, as a library (``pyspec check`` runs it).

Over 400 lines on purpose: every check, its negative control and the report
share one set of statistics helpers and one Bonferroni family; split apart, a
row could be judged at another level than the rest of its run.

Every check runs the C++ verification rule many times (``verify_many``, drafts sampled
from q inside C++) and tests two exact properties of speculative sampling:

* losslessness: the first emitted token of a round (draft 0 if accepted, otherwise the
  replacement) follows ``p[0]``; likewise the token at position ``i`` in the rounds that
  reach it follows ``p[i]``. Pearson chi-square goodness of fit; cells with expected
  count below 5 are pooled, and any count in a cell with probability 0 fails outright.
* optimality: the mean number of accepted drafts equals ``sum_i prod_{j<=i} beta_j`` with
  ``beta_j = sum_x min(p_j(x), q_j(x))``; two-sided z-test with the empirical variance
  (exact comparison when the variance is 0).

* the draft-length rule (drafter.h): a stop rule may end a draft before a token using
  q alone, never discard a drawn token because of its value. The real ``confidence``
  policy decides, per context, whether to stop before drawing; drafts that go ahead
  are verified by the C++ rule; the first token must follow ``p`` in every context.

Negative controls run deliberately wrong rules (``residual_is_p``, ``accept_all``,
``sample_and_match``, and the discard-by-value stop rule) where their defect is
visible; such a row *passes* when the test rejects the rule, which shows the suite
can fail.

Significance: family-wise alpha = 0.001 with a Bonferroni correction over all rows of a
run (each row is judged at ``0.001 / number_of_rows``); a correct implementation fails a
run with probability below 0.001, and a fixed seed makes a run reproducible.

Only NumPy is needed at run time: the chi-square survival function is computed here from
the regularized upper incomplete gamma function Q(df/2, x/2) (series for x < a + 1,
Lentz's continued fraction otherwise; relative error < 1e-12 against SciPy), and the
normal tail from ``math.erfc``. That, the cases and the report make this module
about 420 lines; it is the one place the self-check lives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _core
from ..sampling import distribution, verify_many

__all__ = [
    "FAMILY_ALPHA",
    "CheckRow",
    "bench_verify",
    "chi2_gof",
    "chi2_sf",
    "expected_accepted",
    "format_table",
    "normal_two_sided_p",
    "run_checks",
]

#: Family-wise significance level of one run of :func:`run_checks` (Bonferroni).
FAMILY_ALPHA = 1e-3

NOT_REJECTED = "not rejected"
REJECTED = "rejected"


@dataclass(frozen=True)
class CheckRow:
    """One statistical test of one case.

    Attributes:
        case: what was run (distributions, number of drafts, variant, rounds).
        statistic: which test and its value, e.g. ``"chi2 first token (df=4) = 3.21"``.
        p_value: the test's p-value.
        expected_outcome: ``"not rejected"`` for the correct rule, ``"rejected"`` for a
            negative control.
        passed: whether the outcome at the per-row level ``FAMILY_ALPHA / len(rows)`` was
            the expected one.
    """

    case: str
    statistic: str
    p_value: float
    expected_outcome: str
    passed: bool


# ----------------------------------------------------------------------------- p-values

def _log_gamma_prefactor(a: float, x: float) -> float:
    return -x + a * math.log(x) - math.lgamma(a)


def chi2_sf(x: float, df: int) -> float:
    """Survival function P(X >= x) of the chi-square distribution with ``df`` degrees.

    Computed as the regularized upper incomplete gamma function Q(df/2, x/2): power
    series for P when x/2 < df/2 + 1 (then Q = 1 - P is not small), modified Lentz
    continued fraction for Q otherwise (accurate for tiny tail probabilities).
    """
    if df <= 0:
        raise ValueError("df must be positive")
    if math.isnan(x):
        return float("nan")
    if x <= 0:
        return 1.0
    if math.isinf(x):
        return 0.0
    a, z = 0.5 * df, 0.5 * x
    if z < a + 1.0:
        term = 1.0 / a
        total = term
        k = 0
        while True:
            k += 1
            term *= z / (a + k)
            total += term
            if abs(term) < abs(total) * 1e-17 or k > 10000:
                break
        lp = _log_gamma_prefactor(a, z)
        return max(0.0, 1.0 - math.exp(lp) * total)
    tiny = 1e-300
    b = z + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        if abs(d) < tiny:
            d = tiny
        c = b + an / c
        if abs(c) < tiny:
            c = tiny
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    lp = _log_gamma_prefactor(a, z)
    if lp < -745.0:
        return 0.0
    return min(1.0, math.exp(lp) * h)


def normal_two_sided_p(z: float) -> float:
    """Two-sided tail probability P(|Z| >= |z|) of a standard normal."""
    return math.erfc(abs(z) / math.sqrt(2.0))


def chi2_gof(counts, probs, min_expected: float = 5.0) -> Tuple[float, int, float]:
    """Pearson goodness of fit of ``counts`` to ``probs``: ``(statistic, df, p_value)``.

    Cells with probability 0 must have count 0 (otherwise the result is ``(inf, df, 0)``).
    The remaining cells whose expected count is below ``min_expected`` are pooled into
    one cell, which takes further cells (smallest expected first) until it reaches
    ``min_expected``. With a single cell left there is nothing to test: p = 1.
    """
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    n = counts.sum()
    support = probs > 0
    if counts[~support].sum() > 0:
        return math.inf, max(int(support.sum()) - 1, 1), 0.0
    obs = counts[support]
    exp = n * probs[support] / probs[support].sum()
    order = np.argsort(exp, kind="stable")
    obs, exp = obs[order], exp[order]
    k = int((exp < min_expected).sum())  # sorted ascending: the small cells come first
    pooled_o, pooled_e = float(obs[:k].sum()), float(exp[:k].sum())
    while 0 < pooled_e < min_expected and k < len(exp):
        pooled_o += obs[k]
        pooled_e += exp[k]
        k += 1
    cells_o = list(obs[k:])
    cells_e = list(exp[k:])
    if pooled_e > 0:
        cells_o.append(pooled_o)
        cells_e.append(pooled_e)
    df = len(cells_e) - 1
    if df <= 0:
        return 0.0, 0, 1.0
    o = np.asarray(cells_o)
    e = np.asarray(cells_e)
    stat = float(((o - e) ** 2 / e).sum())
    return stat, df, chi2_sf(stat, df)


def expected_accepted(p: np.ndarray, q: np.ndarray) -> float:
    """Exact mean number of accepted drafts: ``sum_i prod_{j<=i} beta_j``."""
    beta = np.minimum(p[: q.shape[0]], q).sum(axis=1)
    return float(np.cumprod(beta).sum()) if len(beta) else 0.0


def _mean_test(n_accepted: np.ndarray, expected: float) -> Tuple[str, float]:
    mean = float(n_accepted.mean())
    sd = float(n_accepted.std(ddof=1)) if len(n_accepted) > 1 else 0.0
    if sd == 0.0:
        p = 1.0 if abs(mean - expected) < 1e-9 else 0.0
        return f"mean accepted {mean:.4f} vs exact {expected:.4f} (no variance)", p
    z = (mean - expected) / (sd / math.sqrt(len(n_accepted)))
    return f"mean accepted {mean:.4f} vs exact {expected:.4f}: z = {z:+.2f}", normal_two_sided_p(z)


# ----------------------------------------------------------------------------- cases

def _norm(x: np.ndarray) -> np.ndarray:
    return x / x.sum(axis=-1, keepdims=True)


def _dirichlet_rows(rng: np.random.Generator, rows: int, v: int, support: Optional[int] = None):
    alpha = rng.uniform(0.2, 2.0)
    out = np.zeros((rows, v))
    for r in range(rows):
        s = v if support is None else support
        ids = rng.choice(v, size=s, replace=False)
        out[r, ids] = rng.dirichlet(np.full(s, alpha))
        out[r] = _norm(out[r])
    return out


def _cases(fast: bool, rng: np.random.Generator) -> List[Tuple[str, np.ndarray, np.ndarray]]:
    """(name, p (n+1, V), q (n, V)) cases: fixed extremes plus random pairs."""
    cases = []
    v = 8
    base = _dirichlet_rows(rng, 4, v)
    cases.append(("p = q, V=8, n=3", base, base[:3].copy()))
    p = np.zeros((3, v)); p[:, :4] = 0.25
    q = np.zeros((2, v)); q[:, 4:] = 0.25
    cases.append(("disjoint supports, V=8, n=2", p, q))
    noise = _norm(base[:3] * (1 + 1e-3 * rng.standard_normal((3, v))).clip(min=1e-12))
    cases.append(("near-equal (1e-3), V=8, n=3", base, noise))
    p = np.eye(v)[[2, 5, 2]].astype(float)
    cases.append(("one-hot p (greedy target), V=8, n=2", p, _dirichlet_rows(rng, 2, v)))
    q = np.eye(v)[[1, 3]].astype(float)
    cases.append(("one-hot q (deterministic drafter), V=8, n=2", _dirichlet_rows(rng, 3, v), q))
    v = 50
    cases.append(("q much wider than p, V=50, n=2",
                  _dirichlet_rows(rng, 3, v, support=3), _norm(np.ones((2, v)))))
    cases.append(("p much wider than q, V=50, n=2",
                  _norm(np.ones((3, v))), _dirichlet_rows(rng, 2, v, support=3)))
    lp = rng.standard_normal((4, v)).astype(np.float32) * 2
    lq = (lp[:3] + rng.standard_normal((3, v)).astype(np.float32)).astype(np.float32)
    p = np.stack([distribution(r, temperature=0.8, top_k=10) for r in lp])
    q = np.stack([distribution(r, top_p=0.7) for r in lq])
    cases.append(("top-k 10 target vs top-p 0.7 draft, V=50, n=3", p, q))
    n_random = 16 if fast else 50
    for k in range(n_random):
        v = int(rng.integers(3, 51))
        n = int(rng.integers(1, 6))
        cases.append((f"random #{k}, V={v}, n={n}",
                      _dirichlet_rows(rng, n + 1, v), _dirichlet_rows(rng, n, v)))
    return cases


def _first_tokens(n_acc: np.ndarray, nxt: np.ndarray, drafts: np.ndarray, pos: int):
    """Tokens emitted at position ``pos`` in the rounds that reach it."""
    reach = n_acc >= pos
    tok = np.where(n_acc[reach] > pos, drafts[reach, pos] if drafts.shape[1] > pos else -1,
                   nxt[reach])
    return tok


def _run_case(name: str, p: np.ndarray, q: np.ndarray, rounds: int, seed: int, variant: str,
              positions: bool, tests: Sequence[str], expected: str, raw: list) -> None:
    n, v = q.shape
    n_acc, nxt, drafts = verify_many(p, q, None, rounds, seed, variant, return_drafts=True)
    label = f"{name} [{variant}, {rounds} rounds]"
    if "chi2" in tests:
        for pos in range(n + 1 if positions else 1):
            tok = _first_tokens(n_acc, nxt, drafts, pos)
            if len(tok) < 200:
                continue
            stat, df, pv = chi2_gof(np.bincount(tok, minlength=v), p[pos])
            what = "first token" if pos == 0 else f"token at position {pos}"
            raw.append((label, f"chi2 {what} ~ p[{pos}] (df={df}) = {stat:.2f}", pv, expected))
    if "mean" in tests:
        stat, pv = _mean_test(n_acc, expected_accepted(p, q))
        raw.append((label, stat, pv, expected))


def _stop_rule_cases(rounds: int, next_seed, raw: list) -> None:
    """Drafts of one token under the confidence policy (p_min = 0.75), in two
    contexts: q = (0.9, 0.1) drafts (the issue's worked example: discarding the
    token 1 it draws 10 % of the time would give token 0 with probability 0.55,
    not 0.5), q = (0.6, 0.4) is stopped before drawing. Correct: the first token
    follows p in both. Control: a drawn token with q(x) < 0.75 is discarded (the
    round then samples p plainly)."""
    p_min = 0.75
    policy = _core.make_policy(_core.PolicyParams(name="confidence", draft_max=1, p_min=p_min))
    contexts = [
        ("p = (.5, .5), q = (.9, .1)", np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([[0.9, 0.1]])),
        ("p = (.3, .7), q = (.6, .4)", np.array([[0.3, 0.7], [0.5, 0.5]]), np.array([[0.6, 0.4]])),
    ]
    for discard in (False, True):
        for name, p, q in contexts:
            stop = policy.stop_before(0, _core.sampling.Distribution.from_probs(q[0]), -1)
            label = (f"{'NEGATIVE CONTROL stop rule' if discard else 'stop rule'} confidence p_min={p_min}, "
                     f"{name}, {'stops before' if stop else 'drafts'} "
                     f"[{'discard_by_value' if discard else 'correct'}, {rounds} rounds]")
            if stop:
                first = verify_many(p[:1], q[:0], None, rounds, next_seed())[1]
            else:
                n_acc, nxt, drafts = verify_many(p, q, None, rounds, next_seed(), return_drafts=True)
                first = np.where(n_acc > 0, drafts[:, 0], nxt)
                if discard:
                    dropped = q[0][drafts[:, 0]] < p_min
                    plain = verify_many(p[:1], q[:0], None, int(dropped.sum()), next_seed())[1]
                    first = first.copy()
                    first[dropped] = plain
            if discard and stop:
                continue  # nothing drawn, nothing to discard: not a control
            stat, df, pv = chi2_gof(np.bincount(first, minlength=p.shape[1]), p[0])
            raw.append((label, f"chi2 first token ~ p[0] (df={df}) = {stat:.2f}", pv,
                        REJECTED if discard else NOT_REJECTED))


def run_checks(fast: bool = True, seed: int = 20240601) -> List[CheckRow]:
    """Run the statistical suite; returns one :class:`CheckRow` per test.

    Args:
        fast: 24 cases of 2e5 rounds (4e5 for the worked example), every draft
            position tested; a few seconds. ``False``: 58 cases of 2e6 rounds.
        seed: seeds both the case generator and the verification streams.

    All rows pass for a correct implementation except with probability < ``FAMILY_ALPHA``.
    """
    rng = np.random.default_rng(seed)
    rounds = 200_000 if fast else 2_000_000
    raw: list = []
    stream = iter(range(1, 1 << 30))

    def next_seed() -> int:
        return (seed * 1_000_003 + next(stream)) % (1 << 64)

    # Worked example of the spec: p = (0.4, 0.2, 0.4), q = (0.2, 0.5, 0.3), draft B.
    wp = np.array([[0.4, 0.2, 0.4], [0.3, 0.3, 0.4]])
    wq = np.array([[0.2, 0.5, 0.3]])
    wr = 2 * rounds
    n_acc, nxt = verify_many(wp, wq, np.array([1]), wr, next_seed())
    k = int(n_acc.sum())
    z = (k - 0.4 * wr) / math.sqrt(wr * 0.4 * 0.6)
    label = f"worked example, draft B [correct, {wr} rounds]"
    raw.append((label, f"acceptance {k / wr:.4f} vs 0.4: z = {z:+.2f}", normal_two_sided_p(z),
                NOT_REJECTED))
    rej = nxt[n_acc == 0]
    stat, df, pv = chi2_gof(np.bincount(rej, minlength=3), [2 / 3, 0.0, 1 / 3])
    raw.append((label, f"chi2 rejected rounds A:C = 2:1 (df={df}) = {stat:.2f}", pv, NOT_REJECTED))
    _run_case("worked example, drafts ~ q", wp, wq, wr, next_seed(), "correct", True,
              ("chi2",), NOT_REJECTED, raw)

    for name, p, q in _cases(fast, rng):
        _run_case(name, p, q, rounds, next_seed(), "correct", True, ("chi2", "mean"),
                  NOT_REJECTED, raw)

    # Negative controls, where each defect is visible.
    _run_case("NEGATIVE CONTROL worked example", wp, wq, wr, next_seed(), "residual_is_p",
              False, ("chi2",), REJECTED, raw)
    _run_case("NEGATIVE CONTROL worked example", wp, wq, wr, next_seed(), "accept_all",
              False, ("chi2", "mean"), REJECTED, raw)
    up = _norm(np.ones((4, 10)))
    _run_case("NEGATIVE CONTROL p = q uniform, V=10, n=3", up, up[:3].copy(), rounds,
              next_seed(), "sample_and_match", False, ("mean",), REJECTED, raw)

    _stop_rule_cases(rounds, next_seed, raw)

    level = FAMILY_ALPHA / len(raw)
    rows = []
    for case, stat, pv, expected in raw:
        rejected = pv < level
        passed = rejected if expected == REJECTED else not rejected
        rows.append(CheckRow(case, stat, float(pv), expected, bool(passed)))
    return rows


def format_table(rows: Sequence[CheckRow]) -> str:
    """Render rows as a plain-text table with a summary line."""
    level = FAMILY_ALPHA / max(len(rows), 1)
    head = ("case", "statistic", "p-value", "expected", "result")
    body = [(r.case, r.statistic, f"{r.p_value:.3g}", r.expected_outcome,
             "PASS" if r.passed else "FAIL") for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(head)]
    line = "  ".join("{:<%d}" % w for w in widths)
    out = [line.format(*head), line.format(*("-" * w for w in widths))]
    out += [line.format(*b) for b in body]
    n_fail = sum(not r.passed for r in rows)
    out.append("")
    out.append(f"{len(rows) - n_fail}/{len(rows)} passed; each test at level {level:.2g} "
               f"(family-wise alpha {FAMILY_ALPHA:g}, Bonferroni). "
               + ("ALL PASSED" if n_fail == 0 else f"{n_fail} FAILED"))
    return "\n".join(out)


# ----------------------------------------------------------------------------- benchmark

def bench_verify(
    n_vocab: int = 151936,
    top_k: int = 40,
    n_draft: int = 4,
    seconds: float = 2.0,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int = 0,
) -> Dict[str, float]:
    """Measure verification rounds per second in C++ at a realistic vocabulary size.

    Synthetic logits: target rows ~ N(0, 3^2) per token, draft rows = target + N(0, 1)
    noise (so drafts are often accepted). Two timed loops, each for ``seconds / 2``:

    * ``verify_only_rounds_per_s``: distributions prepared once; a round draws n drafts
      from q and verifies them (acceptance tests, residual or bonus sample);
    * ``distributions_and_verify_rounds_per_s``: a realistic round that also computes
      the n+1 target and n draft distributions from the logits (top-k etc.) every time.
    """
    if n_vocab <= 0 or n_draft < 0 or seconds <= 0:
        raise ValueError("n_vocab must be > 0, n_draft >= 0, seconds > 0")
    rng = np.random.default_rng(seed)
    lp = (rng.standard_normal((n_draft + 1, n_vocab)) * 3.0).astype(np.float32)
    lq = (lp[:n_draft] + rng.standard_normal((n_draft, n_vocab))).astype(np.float32)
    res = dict(_core.sampling.bench_verify(lp, lq, float(temperature), int(top_k), float(top_p),
                                           float(min_p), float(seconds), int(seed)))
    res.update(top_k=top_k, top_p=top_p, min_p=min_p, temperature=temperature)
    res["distributions_and_verify_rounds_per_s"] = res["full_rounds_per_s"]
    return res
