"""Logits -> distribution: the C++ core against a NumPy reference, plus properties.

The reference below is written from the rule documented at the cpp/core/sampling.h
(llama.cpp's chain): order by (logit desc, id asc); top-k; top-p on the T=1 softmax of
the top-k survivors (smallest prefix with cumulative mass >= top_p); min-p keeps
exp(l - l_max) >= min_p; temperature on the survivors; renormalise. Greedy (T=0) is
one-hot on the lowest-id argmax. These tests are exact comparisons, not statistical.
"""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspec import sampling
from pyspec._core import sampling as core

NEG_INF = np.float32(-np.inf)


def ref_distribution(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    l = np.asarray(logits, dtype=np.float32).astype(np.float64)
    v = len(l)
    out = np.zeros(v)
    finite = np.flatnonzero(l > -np.inf)
    mx = l[finite].max()
    if temperature == 0:
        out[np.flatnonzero(l == mx)[0]] = 1.0
        return out
    cand = finite[np.lexsort((finite, -l[finite]))]  # logit desc, then id asc
    if 0 < top_k < len(cand):
        cand = cand[:top_k]
    if top_p < 1.0:
        e = np.exp(l[cand] - mx)
        c = np.cumsum(e) / e.sum()
        hit = np.flatnonzero(c >= top_p)
        cand = cand[: hit[0] + 1] if len(hit) else cand
    if min_p > 0.0:
        cand = cand[np.exp(l[cand] - mx) >= min_p]
    w = np.exp((l[cand] - mx) / temperature)
    out[cand] = w / w.sum()
    return out


def assert_matches_reference(logits, **kw):
    got = sampling.distribution(logits, **kw)
    want = ref_distribution(logits, **kw)
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_array_equal(got > 0, want > 0, err_msg=f"support differs for {kw}")
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-300, err_msg=str(kw))
    assert abs(got.sum() - 1.0) < 1e-12


def logit_sets(v, rng):
    normal = (rng.standard_normal(v) * 2).astype(np.float32)
    ties = rng.integers(-3, 2, size=v).astype(np.float32)  # many exact ties
    with_inf = normal.copy()
    with_inf[rng.choice(v, size=v // 3, replace=False)] = NEG_INF
    wide = (rng.standard_normal(v) * 40).astype(np.float32)  # far tails underflow
    return {"normal": normal, "ties": ties, "with -inf": with_inf, "wide": wide}


TEMPERATURES = [0.0, 1e-6, 0.3, 1.0, 1.7, 1e6]
TOP_PS = [1.0, 0.9, 0.5, "above-first", "below-first"]
MIN_PS = [0.0, 0.05, 0.5, 1.0]


@pytest.mark.parametrize("v", [7, 60])
def test_every_combination_matches_reference(v):
    rng = np.random.default_rng(v)
    for name, logits in logit_sets(v, rng).items():
        n_finite = int(np.isfinite(logits).sum())
        p1 = np.sort(ref_distribution(logits))[::-1]  # T=1 probabilities, sorted
        top_ks = sorted({0, 1, 3, max(n_finite - 1, 1), n_finite, v, v + 5})
        for t, k, tp, mp in itertools.product(TEMPERATURES, top_ks, TOP_PS, MIN_PS):
            if tp == "above-first":
                tp = min(1.0, p1[0] + 1e-6)  # just above the top token's mass: keeps 2
            elif tp == "below-first":
                tp = p1[0] - 1e-6 if p1[0] > 1e-5 else 0.5
            assert_matches_reference(logits, temperature=t, top_k=k, top_p=tp, min_p=mp)


def test_top_p_just_above_one_token_keeps_two():
    logits = np.array([2.0, 1.0, 0.5, -1.0], dtype=np.float32)
    p = ref_distribution(logits)
    got = sampling.distribution(logits, top_p=p[0] + 1e-9)
    assert np.count_nonzero(got) == 2
    got = sampling.distribution(logits, top_p=p[0] - 1e-9)
    assert np.count_nonzero(got) == 1


def test_ties_broken_by_lower_id():
    logits = np.array([0.0, 1.0, 1.0, 1.0, 0.5], dtype=np.float32)
    np.testing.assert_array_equal(sampling.distribution(logits, temperature=0), [0, 1, 0, 0, 0])
    d = sampling.distribution(logits, top_k=2)
    np.testing.assert_allclose(d, [0, 0.5, 0.5, 0, 0])
    # Two equal tokens, top_p = 0.5 exactly: the first (lowest id) suffices ("mass >=
    # top_p"), with or without top-k in front (two code paths).
    d = sampling.distribution(np.array([NEG_INF, 3.0, 3.0], dtype=np.float32), top_p=0.5)
    np.testing.assert_array_equal(d, [0, 1, 0])
    d = sampling.distribution(np.array([NEG_INF, 3.0, 3.0, 1.0], dtype=np.float32), top_k=2,
                              top_p=0.5)
    np.testing.assert_array_equal(d, [0, 1, 0, 0])


def test_order_is_topk_then_topp_on_renormalised_survivors():
    # T=1 probs ~ (0.42, 0.26, 0.16, 0.16); top-k 2 renormalises to (0.62, 0.38):
    # top_p 0.6 then keeps only the first token. Without top-k it keeps two.
    logits = np.log(np.array([0.42, 0.26, 0.16, 0.16])).astype(np.float32)
    assert np.count_nonzero(sampling.distribution(logits, top_k=2, top_p=0.6)) == 1
    assert np.count_nonzero(sampling.distribution(logits, top_p=0.6)) == 2


def test_temperature_applies_after_truncation():
    logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    # min_p 0.3 on T=1: keep exp(l - 2) >= 0.3 -> tokens 0, 1. A huge temperature then
    # flattens the survivors only.
    d = sampling.distribution(logits, temperature=1e6, min_p=0.3)
    np.testing.assert_allclose(d, [0.5, 0.5, 0, 0], rtol=1e-5)


def test_extreme_temperatures():
    logits = np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32)
    tiny = sampling.distribution(logits, temperature=1e-6)
    np.testing.assert_array_equal(tiny, [0, 0.5, 0.5, 0])  # ties keep equal mass
    huge = sampling.distribution(logits, temperature=1e6)
    np.testing.assert_allclose(huge, 0.25, rtol=1e-5)


def test_neg_inf_logits_are_forbidden():
    logits = np.array([NEG_INF, 0.0, NEG_INF, 1.0], dtype=np.float32)
    for t in (1e-6, 1.0, 1e6):
        d = sampling.distribution(logits, temperature=t)
        assert d[0] == 0 and d[2] == 0
        assert_matches_reference(logits, temperature=t)


@pytest.mark.parametrize("kw", [
    dict(), dict(top_k=40), dict(top_k=40, top_p=0.95, min_p=0.05, temperature=0.8),
    dict(top_p=0.9), dict(top_p=0.5, temperature=0.7), dict(top_p=0.999), dict(min_p=0.02),
    dict(top_p=0.9, min_p=0.001), dict(temperature=0), dict(top_k=1000, top_p=0.8),
])
def test_large_vocabulary_matches_reference(kw):
    rng = np.random.default_rng(151936)
    logits = (rng.standard_normal(151936) * 3).astype(np.float32)
    logits[rng.choice(151936, 5000, replace=False)] = NEG_INF
    assert_matches_reference(logits, **kw)


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.99])
def test_top_p_on_flat_and_tied_logits(top_p):
    # Flat logits put most of the vocabulary into one selection bucket, and heavy ties
    # test that the cut follows token ids exactly.
    rng = np.random.default_rng(3)
    flat = (rng.standard_normal(20000) * 1e-3).astype(np.float32)
    assert_matches_reference(flat, top_p=top_p)
    tied = rng.integers(0, 3, size=20000).astype(np.float32)
    assert_matches_reference(tied, top_p=top_p)
    assert_matches_reference(tied, top_p=top_p, min_p=0.5)


def test_sparse_storage_for_small_supports():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(10000).astype(np.float32)
    assert not core.Distribution.from_logits(logits, top_k=40).dense
    assert not core.Distribution.from_logits(logits, temperature=0).dense
    assert core.Distribution.from_logits(logits).dense
    d = core.Distribution.from_logits(logits, top_k=40)
    assert d.support_size == 40 and d.n_vocab == 10000


def test_float64_and_int_logits_are_converted():
    l64 = np.array([0.1, 0.2, 0.3])
    np.testing.assert_array_equal(sampling.distribution(l64),
                                  sampling.distribution(l64.astype(np.float32)))
    np.testing.assert_allclose(sampling.distribution([1, 2, 3]),
                               ref_distribution(np.array([1, 2, 3], dtype=np.float32)))


# ------------------------------------------------------------------ Distribution methods

@pytest.mark.parametrize("storage", ["dense", "sparse", "auto"])
def test_distribution_methods(storage):
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.full(30, 0.5))
    p[[3, 7, 11]] = 0.0
    p[[5, 9]] = p.max() + 0.01  # a tie for the argmax
    p /= p.sum()
    d = core.Distribution.from_probs(p, storage)
    assert d.dense == (storage != "sparse")  # auto: 27 of 30 tokens is dense
    assert d.n_vocab == 30 and d.support_size == 27
    np.testing.assert_array_equal(d.to_numpy(), p)
    assert d.argmax() == 5
    assert [d.prob(i) for i in range(30)] == list(p)
    assert d.prob(-1) == 0 and d.prob(30) == 0
    nz = p[p > 0]
    assert d.entropy() == pytest.approx(-(nz * np.log(nz)).sum(), rel=1e-12)
    cum = np.cumsum(nz)
    ids = np.flatnonzero(p)
    # Inverse CDF convention: token j iff cum[j-1] <= u * total < cum[j].
    q = core.Distribution.from_probs(np.full(4, 0.25), storage)
    assert [q.sample(u) for u in (0.0, 0.25, 0.5, 0.75, 0.2499)] == [0, 1, 2, 3, 0]
    for u in np.concatenate([rng.random(200), [0.0, 1 - 2**-53]]):
        j = np.searchsorted(cum, u * cum[-1], side="right")
        assert d.sample(u) == ids[min(j, len(ids) - 1)]
        assert p[d.sample(u)] > 0


def test_one_hot_and_bad_builders():
    d = core.Distribution.one_hot(4, 10)
    assert d.argmax() == 4 and d.support_size == 1 and d.entropy() == 0
    with pytest.raises(ValueError):
        core.Distribution.one_hot(10, 10)
    with pytest.raises(ValueError, match="sum"):
        core.Distribution.from_probs(np.array([0.5, 0.4]))
    with pytest.raises(ValueError):
        core.Distribution.from_probs(np.array([1.5, -0.5]))
    with pytest.raises(ValueError):
        core.Distribution.from_probs(np.array([np.nan, 1.0]))
    with pytest.raises(ValueError):
        core.Distribution.from_probs(np.array([1.0]), "bogus")
    with pytest.raises(ValueError):
        core.Distribution.one_hot(0, 1).sample(1.0)


# ------------------------------------------------------------------ properties (hypothesis)

logit_values = st.one_of(
    st.floats(-1e4, 1e4, allow_nan=False, width=32),
    st.just(float("-inf")),
)


@st.composite
def logits_and_settings(draw):
    values = draw(st.lists(logit_values, min_size=1, max_size=80))
    if all(x == float("-inf") for x in values):
        values[draw(st.integers(0, len(values) - 1))] = 0.0
    logits = np.array(values, dtype=np.float32)
    kw = dict(
        temperature=draw(st.sampled_from([0.0, 1e-3, 0.5, 1.0, 2.0, 100.0])),
        top_k=draw(st.integers(0, 100)),
        top_p=draw(st.sampled_from([1.0, 0.99, 0.9, 0.5, 0.1, 1e-6])),
        min_p=draw(st.sampled_from([0.0, 0.01, 0.1, 0.9, 1.0])),
    )
    return logits, kw


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logits_and_settings())
def test_properties(case):
    logits, kw = case
    d = sampling.distribution(logits, **kw)
    assert not np.isnan(d).any() and (d >= 0).all()
    assert abs(d.sum() - 1.0) < 1e-12
    assert (d[np.isneginf(logits)] == 0).all(), "mass on a forbidden token"
    support = np.flatnonzero(d)
    assert len(support) >= 1
    if kw["top_k"] > 0:
        assert len(support) <= kw["top_k"]
    if kw["temperature"] == 0:
        assert len(support) == 1
    # The lowest-id argmax always survives and has the largest probability.
    amax = int(np.argmax(logits))
    assert d[amax] == d.max() > 0
    # Everything kept is at least as likely (T=1) as anything dropped: a prefix.
    dropped = np.setdiff1d(np.flatnonzero(np.isfinite(logits)), support)
    if len(dropped) and kw["temperature"] > 1e-3:
        assert logits[support].min() >= logits[dropped].max()
    # Where the cumulative mass meets top_p within rounding (near-equal logits: hypothesis
    # finds [0, 0, 1e-16, 0] at top_p 0.5), the core's sum and numpy's may cut either side.
    refs = [ref_distribution(logits, **{**kw, "top_p": p}) for p in _top_p_either_side(kw["top_p"])]
    assert any(np.allclose(d, r, rtol=1e-9, atol=1e-300) for r in refs), (d, refs[0])


def _top_p_either_side(top_p: float, eps: float = 1e-12):
    """top_p itself, and just below and above it (a cut within eps of the boundary)."""
    return [top_p] if top_p >= 1.0 else [top_p, top_p - eps, min(top_p + eps, 1.0)]


NAN = st.just(float("nan"))
BAD_SETTINGS = st.one_of(
    st.tuples(st.just("temperature"),
              st.one_of(st.floats(max_value=0.0, exclude_max=True), NAN,
                        st.just(float("inf")))),
    st.tuples(st.just("top_p"),
              st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0, exclude_min=True),
                        NAN)),
    st.tuples(st.just("min_p"),
              st.one_of(st.floats(max_value=0.0, exclude_max=True),
                        st.floats(min_value=1.0, exclude_min=True), NAN)),
    st.tuples(st.just("top_k"), st.integers(max_value=-1)),
)


@settings(max_examples=80, deadline=None)
@given(BAD_SETTINGS)
def test_invalid_settings_raise(bad):
    name, value = bad
    with pytest.raises(ValueError, match=name):
        sampling.distribution(np.array([0.0, 1.0], dtype=np.float32), **{name: value})


@pytest.mark.parametrize("kw", [
    dict(temperature=-0.5), dict(temperature=float("nan")), dict(temperature=float("inf")),
    dict(top_p=0.0), dict(top_p=1.0000001), dict(top_p=-0.1), dict(top_p=float("nan")),
    dict(min_p=-0.01), dict(min_p=1.01), dict(top_k=-3),
])
def test_invalid_settings_messages(kw):
    name = next(iter(kw))
    with pytest.raises(ValueError, match=name):
        sampling.distribution(np.zeros(3, dtype=np.float32), **kw)
    # The C++ core validates on its own as well.
    full = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    full.update(kw)
    with pytest.raises(ValueError, match=name):
        core.distribution(np.zeros(3, dtype=np.float32), **full)


@pytest.mark.parametrize("logits, match", [
    (np.array([0.0, np.nan, 1.0], dtype=np.float32), "NaN"),
    (np.array([0.0, np.inf], dtype=np.float32), r"\+inf"),
    (np.array([-np.inf, -np.inf], dtype=np.float32), "all logits are -inf"),
    (np.zeros((2, 2), dtype=np.float32), "1-D"),
    (np.zeros(0, dtype=np.float32), "empty"),
    (np.array(["a", "b"]), "real"),
])
def test_invalid_logits_raise(logits, match):
    with pytest.raises(ValueError, match=match):
        sampling.distribution(logits)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(0, 59))
def test_nan_anywhere_is_caught(v, pos):
    logits = np.zeros(v, dtype=np.float32)
    logits[pos % v] = np.nan
    with pytest.raises(ValueError, match=f"logits\\[{pos % v}\\] is NaN"):
        sampling.distribution(logits, top_k=5)
