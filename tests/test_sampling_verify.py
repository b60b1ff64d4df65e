"""Statistical tests of the speculative verification rule (C++ verify, via verify_many).

What is tested, for fixed per-position rows p[0..n] (target) and q[0..n-1] (draft), with
drafts drawn from q inside C++:

* losslessness: the token emitted at position i, in the rounds that reach position i,
  follows p[i] (Pearson chi-square; cells with expected count < 5 pooled; a single count
  in a cell with p = 0 is an outright failure);
* optimal acceptance: mean number of accepted drafts == sum_i prod_{j<=i} beta_j with
  beta_j = sum_x min(p_j(x), q_j(x)) (two-sided z-test with the empirical variance; exact
  equality when every round gives the same count);
* the worked example of SPEC.md: acceptance 0.4 (exact binomial test), rejected rounds
  give A:C = 2:1, the output follows p.

Significance: the family is every p-value computed in this module (N_TESTS below,
counted from the case list). Family-wise alpha = 0.001 with a Bonferroni correction:
each correct-rule test fails if p < 0.001 / N_TESTS, so a correct implementation fails
this module with probability < 0.001 (and never for a given seed once it has passed:
all seeds are fixed). Negative controls must be rejected at the same per-test level.

Sample sizes: 1e5 rounds per case (2e5 for the worked example), n = 1..5 drafts,
vocabularies 3..50 plus V = 151936 with sparse (top-k) supports.
"""

import numpy as np
import pytest
from scipy import stats

from pyspec import sampling
from pyspec.tools import check
from pyspec._core import sampling as core

from chisquare import pooled_chisquare

ROUNDS = 100_000
FAMILY_ALPHA = 1e-3


# ------------------------------------------------------------------ helpers

def chi_p(counts, probs) -> float:
    """p-value of the chi-square test of this module (pyspec.tools.check's pooling:
    small cells pooled until the pool reaches 5; p = 0 cells must be empty)."""
    return pooled_chisquare(counts, probs, fill_pool=True)[2]


def mean_test(n_accepted, expected):
    sd = n_accepted.std(ddof=1)
    if sd == 0:
        return 1.0 if abs(n_accepted.mean() - expected) < 1e-9 else 0.0
    return check.normal_two_sided_p((n_accepted.mean() - expected) / (sd / np.sqrt(len(n_accepted))))


def tokens_at(n_acc, nxt, drafts, pos):
    reach = n_acc >= pos
    if pos < drafts.shape[1]:
        return np.where(n_acc[reach] > pos, drafts[reach, pos], nxt[reach])
    return nxt[reach]


def case_pvalues(p, q, seed, variant="correct", storage="auto", rounds=ROUNDS):
    """p-values of the position-wise chi-square tests and of the mean test."""
    n, v = q.shape
    n_acc, nxt, drafts = sampling.verify_many(p, q, None, rounds, seed, variant,
                                              storage=storage, return_drafts=True)
    chi = []
    for pos in range(n + 1):
        tok = tokens_at(n_acc, nxt, drafts, pos)
        if len(tok) >= 200:
            chi.append(chi_p(np.bincount(tok, minlength=v), p[pos]))
    return chi, mean_test(n_acc, check.expected_accepted(p, q))


def norm(x):
    return x / x.sum(axis=-1, keepdims=True)


def dirichlet_rows(rng, rows, v, support=None, alpha=None):
    a = rng.uniform(0.2, 2.0) if alpha is None else alpha
    out = np.zeros((rows, v))
    for r in range(rows):
        s = v if support is None else support
        ids = rng.choice(v, size=s, replace=False)
        out[r, ids] = rng.dirichlet(np.full(s, a))
    return norm(out)


def truncated_rows(rng, rows, v, **kw):
    logits = (rng.standard_normal((rows, v)) * 2).astype(np.float32)
    return np.stack([sampling.distribution(l, **kw) for l in logits])


def small_residual_rows(rng, eps, v=20):
    """Three rows equal to a fixed base (seeded) with eps moved onto token v-1."""
    base = np.random.default_rng(77).dirichlet(np.ones(v - 1))
    row = np.append(base * (1 - eps), eps)
    return np.tile(row, (3, 1))


# ------------------------------------------------------------------ the case family

def build_cases():
    rng = np.random.default_rng(20240601)
    cases = []  # (name, p, q, storage)
    for k in range(50):
        v = int(rng.integers(3, 51))
        n = int(rng.integers(1, 6))
        storage = ("auto", "dense", "sparse")[k % 3]
        cases.append((f"random-{k}-V{v}-n{n}", dirichlet_rows(rng, n + 1, v),
                      dirichlet_rows(rng, n, v), storage))
    v = 12
    base = dirichlet_rows(rng, 6, v)
    p = np.zeros((4, v)); p[:, :6] = 1 / 6
    q = np.zeros((3, v)); q[:, 6:] = 1 / 6
    cases += [
        ("p-equals-q", base, base[:5].copy(), "auto"),
        ("p-equals-q-sparse", base, base[:5].copy(), "sparse"),
        ("disjoint-supports", p, q, "auto"),
        ("disjoint-supports-sparse", p, q, "sparse"),
        ("near-equal", base, norm(base[:5] * (1 + 1e-4 * rng.standard_normal((5, v)))), "auto"),
        ("one-hot-p", np.eye(v)[[3, 3, 8]], dirichlet_rows(rng, 2, v), "auto"),
        ("one-hot-p-dense", np.eye(v)[[3, 3, 8]], dirichlet_rows(rng, 2, v), "dense"),
        ("one-hot-q", dirichlet_rows(rng, 4, v), np.eye(v)[[0, 5, 5]], "auto"),
        ("one-hot-q-dense", dirichlet_rows(rng, 4, v), np.eye(v)[[0, 5, 5]], "dense"),
        ("q-much-wider", dirichlet_rows(rng, 3, 50, support=2), norm(np.ones((2, 50))), "auto"),
        ("p-much-wider", norm(np.ones((3, 50))), dirichlet_rows(rng, 2, 50, support=2), "auto"),
        ("p-much-wider-sparse-q", norm(np.ones((3, 50))),
         dirichlet_rows(rng, 2, 50, support=2), "sparse"),
        ("top-k-vs-top-p", truncated_rows(rng, 4, 40, top_k=5, temperature=0.7),
         truncated_rows(rng, 3, 40, top_p=0.6), "auto"),
        ("top-p-vs-top-k-dense", truncated_rows(rng, 3, 40, top_p=0.8),
         truncated_rows(rng, 2, 40, top_k=8), "dense"),
        ("min-p-both", truncated_rows(rng, 4, 30, min_p=0.1),
         truncated_rows(rng, 3, 30, min_p=0.05, temperature=1.5), "auto"),
        # p = q except a little mass on a token q never proposes: the residual is small
        # and concentrated, so sampling anything but the residual there is visible.
        ("small-residual-1e-2", small_residual_rows(rng, 1e-2), small_residual_rows(rng, 0)[:2],
         "auto"),
        ("small-residual-1e-3-sparse", small_residual_rows(rng, 1e-3),
         small_residual_rows(rng, 0)[:2], "sparse"),
        ("peaked-p-flat-q", dirichlet_rows(rng, 3, 30, alpha=0.05),
         dirichlet_rows(rng, 2, 30, alpha=50.0), "auto"),
        ("flat-p-peaked-q", dirichlet_rows(rng, 3, 30, alpha=50.0),
         dirichlet_rows(rng, 2, 30, alpha=0.05), "auto"),
    ]
    return cases


CASES = build_cases()
# Every p-value compared with LEVEL in this module is counted here. Positions with too few
# samples are skipped but still counted, which only makes the level stricter.
N_TESTS = (
    sum(q.shape[0] + 2 for _, _, q, _ in CASES)  # chi-square per position + mean, per case
    + 3                                          # worked example
    + 2                                          # V = 151936 sparse case
    + 3 * 2                                      # storage paths at V = 151936
    + 4 + 1                                      # sample_and_match control (chi, mean)
    + 2 + 1                                      # residual_is_p, accept_all controls
    + 2 * 10 * 5                                 # controls on random cases (upper bound)
    + 2 + 1                                      # deterministic drafter, zero drafts
)
LEVEL = FAMILY_ALPHA / N_TESTS


def test_family_size_documented():
    assert len([c for c in CASES if c[0].startswith("random")]) >= 50
    assert 1e-6 < LEVEL < 1e-5  # ~3e-6: what the module docstring promises


@pytest.mark.parametrize("name, p, q, storage", CASES, ids=[c[0] for c in CASES])
def test_lossless_and_optimal(name, p, q, storage):
    seed = int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little") + len(name)
    chi, mean_p = case_pvalues(p, q, seed, storage=storage)
    assert len(chi) >= 1
    assert min(chi) >= LEVEL, f"{name}: output does not follow p (p-values {chi})"
    assert mean_p >= LEVEL, f"{name}: mean accepted differs from the exact value (p={mean_p})"


# ------------------------------------------------------------------ worked example

WP = np.array([[0.4, 0.2, 0.4], [0.1, 0.1, 0.8]])
WQ = np.array([[0.2, 0.5, 0.3]])


def test_worked_example():
    rounds = 2 * ROUNDS
    n_acc, nxt = sampling.verify_many(WP, WQ, np.array([1]), rounds, seed=11)
    accepted = int(n_acc.sum())
    assert stats.binomtest(accepted, rounds, 0.4).pvalue >= LEVEL
    rejected = nxt[n_acc == 0]
    assert (rejected == 1).sum() == 0, "the residual gives B no mass"
    assert chi_p(np.bincount(rejected, minlength=3), [2 / 3, 0, 1 / 3]) >= LEVEL
    # Drafts drawn from q: the first emitted token follows p.
    n_acc, nxt, d = sampling.verify_many(WP, WQ, None, rounds, seed=12, return_drafts=True)
    first = tokens_at(n_acc, nxt, d, 0)
    assert chi_p(np.bincount(first, minlength=3), WP[0]) >= LEVEL


# ------------------------------------------------------------------ large vocabulary

def test_large_vocabulary_sparse_rows():
    v = 151936
    rng = np.random.default_rng(5)
    lp = (rng.standard_normal((3, v)) * 3).astype(np.float32)
    lq = (lp[:2] + rng.standard_normal((2, v))).astype(np.float32)
    p = np.stack([sampling.distribution(l, top_k=40) for l in lp])
    q = np.stack([sampling.distribution(l, top_k=40, temperature=1.3) for l in lq])
    chi, mean_p = case_pvalues(p, q, seed=99, rounds=ROUNDS)
    assert chi[0] >= LEVEL and mean_p >= LEVEL


@pytest.mark.parametrize("storage", ["dense", "sparse", "auto"])
def test_storage_paths_agree_at_large_vocabulary(storage):
    # Same distributions in both storages: results follow p whatever the representation
    # (dense/dense residual walks the vocabulary; sparse/sparse merges supports).
    v = 151936
    rng = np.random.default_rng(6)
    p = np.zeros((2, v)); q = np.zeros((1, v))
    ids = rng.choice(v, 30, replace=False)
    p[0, ids[:20]] = rng.dirichlet(np.ones(20)); p[1, ids[:5]] = 0.2
    q[0, ids[10:]] = rng.dirichlet(np.ones(20))
    # Few rounds: the dense/dense path walks all 151936 entries per draw and residual.
    chi, mean_p = case_pvalues(p, q, seed=7, storage=storage, rounds=4_000)
    assert chi[0] >= LEVEL and mean_p >= LEVEL


# ------------------------------------------------------------------ negative controls

def test_negative_control_residual_is_p():
    chi, _ = case_pvalues(WP, WQ, seed=21, variant="residual_is_p", rounds=2 * ROUNDS)
    assert chi[0] < LEVEL, "the chi-square test failed to reject residual_is_p"


def test_negative_control_accept_all():
    chi, mean_p = case_pvalues(WP, WQ, seed=22, variant="accept_all", rounds=2 * ROUNDS)
    assert chi[0] < LEVEL, "the chi-square test failed to reject accept_all"
    assert mean_p < LEVEL


def test_negative_control_sample_and_match():
    p = norm(np.ones((4, 10)))
    chi, mean_p = case_pvalues(p, p[:3].copy(), seed=23, variant="sample_and_match")
    assert min(chi) >= LEVEL  # it does preserve p...
    assert mean_p < LEVEL, "...but the acceptance-mean test must reject it"


@pytest.mark.parametrize("variant", ["residual_is_p", "accept_all"])
def test_negative_controls_caught_on_random_cases(variant):
    # On generic random pairs (not hand-picked) the same tests reject the wrong rules.
    caught = 0
    for name, p, q, storage in CASES[:10]:
        chi, mean_p = case_pvalues(p, q, seed=31, variant=variant)
        caught += min(chi) < LEVEL or mean_p < LEVEL
    assert caught >= 8


# ------------------------------------------------------------------ exact properties

def test_p_equal_q_never_rejects():
    rng = np.random.default_rng(8)
    for storage in ("dense", "sparse"):
        p = dirichlet_rows(rng, 6, 20)
        n_acc, _ = sampling.verify_many(p, p[:5].copy(), None, 20000, 3, storage=storage)
        assert (n_acc == 5).all()


def test_greedy_target_keeps_only_argmax():
    # One-hot p: a draft is kept iff it is the argmax; the replacement is the argmax.
    v = 10
    p = np.eye(v)[[4, 7]]
    q = norm(np.ones((1, v)))
    n_acc, nxt, d = sampling.verify_many(p, q, None, 20000, 4, return_drafts=True)
    assert ((n_acc == 1) == (d[:, 0] == 4)).all()
    assert (nxt[n_acc == 0] == 4).all() and (nxt[n_acc == 1] == 7).all()


def test_deterministic_drafter():
    # q one-hot on the proposal: accepted with probability p(x); otherwise the residual is
    # p with x removed and renormalised.
    p = np.array([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]])
    q = np.array([[0.0, 1.0, 0.0]])
    n_acc, nxt = sampling.verify_many(p, q, np.array([1]), 100_000, 5)
    assert stats.binomtest(int(n_acc.sum()), len(n_acc), 0.3).pvalue >= LEVEL
    rej = nxt[n_acc == 0]
    assert chi_p(np.bincount(rej, minlength=3), [5 / 7, 0, 2 / 7]) >= LEVEL


def test_zero_residual_falls_back_to_p():
    # p and q equal up to rounding: residual mass ~1e-17 is never normalised.
    p = core.Distribution.from_probs(np.array([0.1, 0.2, 0.7]))
    q = core.Distribution.from_probs(np.array([0.1, 0.2 + 1e-17, 0.7 - 1e-17]))
    assert core.residual_mass(p, q) < core.RESIDUAL_MIN_MASS
    for u in np.linspace(0, 0.999, 50):
        assert core.sample_residual(p, q, u) == p.sample(u)


@pytest.mark.parametrize("sp, sq", [(a, b) for a in ("dense", "sparse")
                                    for b in ("dense", "sparse")])
def test_residual_sampling_matches_numpy(sp, sq):
    rng = np.random.default_rng(9)
    for _ in range(20):
        v = int(rng.integers(2, 40))
        pv = dirichlet_rows(rng, 1, v, support=int(rng.integers(1, v + 1)))[0]
        qv = dirichlet_rows(rng, 1, v, support=int(rng.integers(1, v + 1)))[0]
        p = core.Distribution.from_probs(pv, sp)
        q = core.Distribution.from_probs(qv, sq)
        r = np.maximum(pv - qv, 0.0)
        pos = np.flatnonzero(r > 0)
        cum = np.cumsum(r[pos])
        mass = cum[-1] if len(cum) else 0.0
        assert core.residual_mass(p, q) == pytest.approx(mass, abs=1e-15)
        for u in rng.random(30):
            got = core.sample_residual(p, q, u)
            if mass < core.RESIDUAL_MIN_MASS:
                assert got == p.sample(u)
            else:
                j = min(np.searchsorted(cum, u * mass, side="right"), len(pos) - 1)
                assert got == pos[j]


def test_verify_is_round_zero_of_verify_many():
    rng = np.random.default_rng(10)
    p, q = dirichlet_rows(rng, 4, 9), dirichlet_rows(rng, 3, 9)
    draft = np.array([int(np.argmax(r)) for r in q])
    for seed in range(20):
        a, b = sampling.verify_many(p, q, draft, 1, seed)
        assert sampling.verify(p, q, draft, seed) == (int(a[0]), int(b[0]))
    assert sampling.verify(p, q, draft, 5) == sampling.verify(p, q, draft, 5)


def test_zero_drafts_gives_a_sample_of_p0():
    p = np.array([[0.25, 0.75]])
    n_acc, nxt = sampling.verify_many(p, np.zeros((0, 2)), np.zeros(0, dtype=int), 50_000, 1)
    assert (n_acc == 0).all()
    assert chi_p(np.bincount(nxt, minlength=2), p[0]) >= LEVEL


# ------------------------------------------------------------------ errors

P2 = np.array([[0.5, 0.5], [0.5, 0.5]])
Q1 = np.array([[0.5, 0.5]])


@pytest.mark.parametrize("p, q, draft, match", [
    (P2, np.array([[1.0, 0.0]]), np.array([1]), r"q\[0\]\(draft\[0\] = 1\) = 0"),
    (P2[:1], Q1, np.array([0]), "one more row"),
    (P2, Q1, np.array([0, 1]), "shape"),
    (P2, Q1, np.array([2]), r"\[0, 2\)"),
    (P2, Q1, np.array([0.0]), "integer"),
    (np.array([[0.5, np.nan], [0.5, 0.5]]), Q1, np.array([0]), r"p\[0\]"),
    (np.array([[1.5, -0.5], [0.5, 0.5]]), Q1, np.array([0]), r"p\[0\]"),
    (np.array([[0.5, 0.4], [0.5, 0.5]]), Q1, np.array([0]), "sum"),
    (P2, np.array([[0.6, 0.6]]), np.array([0]), r"q\[0\].*sum"),
    (P2[0], Q1, np.array([0]), "2-D"),
])
def test_bad_inputs_raise(p, q, draft, match):
    with pytest.raises(ValueError, match=match):
        sampling.verify(p, q, draft, seed=0)
    with pytest.raises(ValueError, match=match):
        sampling.verify_many(p, q, draft, 10, seed=0)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="variant"):
        sampling.verify_many(P2, Q1, None, 10, 0, variant="wrong")
    with pytest.raises(ValueError, match="seed"):
        sampling.verify(P2, Q1, np.array([0]), seed=-1)
    with pytest.raises(ValueError, match="seed"):
        sampling.verify(P2, Q1, np.array([0]), seed=2**64)
    with pytest.raises(ValueError, match="n_rounds"):
        sampling.verify_many(P2, Q1, None, -1, 0)
    with pytest.raises(ValueError, match="storage"):
        sampling.verify_many(P2, Q1, None, 1, 0, storage="csr")
    with pytest.raises(ValueError, match="draft"):
        sampling.verify(P2, Q1, None, seed=0)
    # The raw core checks shapes on its own, too.
    with pytest.raises(ValueError):
        core.verify_many(P2[:1], Q1, None, 1, 0, "correct", "auto", False)
