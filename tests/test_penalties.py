"""Logit biases and repetition penalties (cpp/core/penalties.h, issue 51).

- The formula and the window are llama.cpp's: pyspec's penalised row equals
  llama.cpp's own penalties and logit-bias samplers on the same logits and
  tokens (called through llama-cpp-python's bindings of the vendored library).
- Greedy tokens equal llama-cpp-python's with the same penalties (its window:
  the last 64 tokens it generated, not the prompt), up to a near tie.
- Speculation stays lossless with them: an end-to-end chi-square at T = 1 on a
  path where every sample drafts a token that its own next row penalises
  (``drafted_at[1] > 0`` and the draft counters say it fired), and the
  negative control ``TestControls(stale_penalties=True)``, whose rows count
  only the accepted prefix (the bug the issue names), must be rejected by the
  same test and fit its stated law. ALPHA = 0.001 (chisquare.py); N from a power
  calculation against that law (power > 0.99), at least MIN_N.
- A draft model is penalised like its target: with a self-draft at T = 0 every
  draft is accepted, which an unpenalised draft would not be.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import pyspec
from pyspec import Sampling, sampling
from pyspec.testing import TestControls

from chisquare import ALPHA, assert_power, pooled_chisquare, required_n
from draws import draw

MIN_N = 100
# A prompt whose natural continuation repeats itself, so a penalty on the token
# just drafted changes its next row a lot (the stale window's bug is large).
PROMPT = "ha ha ha ha ha ha ha ha"
TARGET = dict(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
PENALTIES = dict(repeat_penalty=1.3, frequency_penalty=0.4, presence_penalty=1.2, penalty_last_n=64,
                 penalize_prompt=False)


# ------------------------------------------------------------------ the formula
def llama_cpp_row(logits, history, pen: Sampling, n_prompt: int) -> np.ndarray:
    """llama.cpp's logit-bias then penalties samplers applied to `logits`, with
    the tokens its sampler accepts: the prompt's too when pen.penalize_prompt."""
    import llama_cpp as lc

    n_vocab = len(logits)
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    if pen.logit_bias:
        biases = (lc.llama_logit_bias * len(pen.logit_bias))(*[lc.llama_logit_bias(t, b) for t, b in pen.logit_bias])
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_logit_bias(n_vocab, len(pen.logit_bias), biases))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_penalties(
        n_vocab, pen.penalty_last_n, pen.repeat_penalty, pen.frequency_penalty, pen.presence_penalty))
    for t in history[0 if pen.penalize_prompt else n_prompt:]:
        lc.llama_sampler_accept(chain, int(t))
    data = (lc.llama_token_data * n_vocab)(*[lc.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)])
    arr = lc.llama_token_data_array(data=data, size=n_vocab, selected=-1, sorted=False)
    lc.llama_sampler_apply(chain, ctypes.byref(arr))
    lc.llama_sampler_free(chain)
    out = np.empty(n_vocab, dtype=np.float32)
    for i in range(n_vocab):
        out[data[i].id] = data[i].logit
    return out


@pytest.mark.parametrize("settings", [
    dict(repeat_penalty=1.3),
    dict(repeat_penalty=0.8, frequency_penalty=0.25, presence_penalty=-0.5, penalty_last_n=5),
    dict(frequency_penalty=1.0, penalty_last_n=3, penalize_prompt=False),
    dict(repeat_penalty=1.1, presence_penalty=0.7, logit_bias={3: 2.5, 7: -1.0, 11: float("-inf")}),
    dict(repeat_penalty=1.5, penalty_last_n=0, logit_bias={0: 1.0}),  # window 0: penalties off, bias on
])
def test_penalised_rows_equal_llama_cpps_samplers(settings):
    rng = np.random.default_rng(5)
    s = Sampling(**settings)
    for trial in range(20):
        logits = rng.normal(0, 3, size=40).astype(np.float32)
        history = rng.integers(0, 40, size=int(rng.integers(0, 30))).tolist()
        n_prompt = int(rng.integers(0, len(history) + 1))
        ours = sampling.penalized(logits, history, s, n_prompt)
        theirs = llama_cpp_row(logits, history, s, n_prompt)
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{settings} trial {trial}")
    # The test can fail: the same history without the prompt's tokens differs.
    s = Sampling(repeat_penalty=2.0, penalize_prompt=True)
    logits, history = rng.normal(0, 3, size=40).astype(np.float32), [1, 2, 3, 4]
    assert not np.array_equal(sampling.penalized(logits, history, s, 4),
                              llama_cpp_row(logits, history, s.replace(penalize_prompt=False), 4))


@pytest.mark.parametrize("bad, word", [
    (dict(repeat_penalty=0.0), "repeat_penalty"),
    (dict(repeat_penalty=float("nan")), "repeat_penalty"),
    (dict(frequency_penalty=float("inf")), "frequency_penalty"),
    (dict(presence_penalty=float("nan")), "presence_penalty"),
    (dict(penalty_last_n=-2), "penalty_last_n"),
    (dict(logit_bias={5: float("inf")}), "logit_bias"),
    (dict(logit_bias={-1: 1.0}), "vocabulary"),
])
def test_invalid_settings_are_refused(bad, word):
    with pytest.raises(ValueError, match=word):
        Sampling(**bad).native_penalties()


def test_a_token_outside_the_vocabulary_is_refused_before_generating(gemma):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gemma.generate("Hi", max_tokens=2, logit_bias={10**7: 1.0})
    assert gemma.generate("Hi", max_tokens=2, temperature=0).tokens, "the model stays usable"


def test_logit_bias_forbids_and_forces(gemma):
    plain = gemma.generate(PROMPT, chat=False, max_tokens=4, temperature=0)
    first = plain.tokens[0]
    banned = gemma.generate(PROMPT, chat=False, max_tokens=4, temperature=0, logit_bias={first: float("-inf")})
    assert banned.tokens[0] != first and first not in banned.tokens
    forced = gemma.generate(PROMPT, chat=False, max_tokens=3, temperature=0, logit_bias={42: 100.0})
    assert forced.tokens == [42, 42, 42]


# ------------------------------------------------- same text as llama-cpp-python
def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def test_greedy_tokens_equal_llama_cpp_pythons_with_its_penalties(gemma_path, load_model):
    """llama-cpp-python's generate() (what create_completion runs) at T = 0 with
    penalties, against pyspec plain and speculative. A quantized model's logits
    move by ~0.2 between a batch and single-token decodes, so a divergence is
    allowed only at a near tie of pyspec's own penalised row (< 0.5 logit); a
    penalty left out or misapplied moves a logit by several (17 / 1.3)."""
    import llama_cpp

    prompt = "List the days of the week, then list them again, and again:"
    settings = dict(repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.3)
    lcp = llama_cpp.Llama(gemma_path, n_ctx=256, n_threads=2, verbose=False, seed=1)
    try:
        tokens = lcp.tokenize(prompt.encode())
        theirs = [t for t, _ in zip(lcp.generate(tokens, temp=0.0, **settings), range(48))]
        unpenalised = [t for t, _ in zip(lcp.generate(tokens, temp=0.0), range(48))]
    finally:
        lcp.close()
    acted = first_difference(theirs, unpenalised)
    assert acted is not None, "the penalties changed nothing: this prompt cannot tell"
    plain = load_model(gemma_path, n_ctx=256)
    assert plain.tokenize(prompt) == list(tokens)
    spec = pyspec.SpeculativeDecoder(plain, drafter="suffix", policy="fixed", draft_max=4, memory=False)
    for gen in (plain, spec):
        out = gen.generate(list(tokens), max_tokens=48, temperature=0.0, penalize_prompt=False, **settings)
        ours = out.tokens
        i = first_difference(ours, theirs)
        print(f"{type(gen).__name__}: penalties acted at token {acted}, first difference at {i}")
        assert i is None or i > acted, "pyspec's penalties differ where they first act"
        if i is not None:
            core = plain.native
            core.truncate(0)
            history = list(tokens) + ours[:i]
            core.decode(history, 0, 1)
            row = sampling.penalized(core.logits(0), history, Sampling(**settings, penalize_prompt=False), len(tokens))
            core.truncate(0)
            assert abs(row[ours[i]] - row[theirs[i]]) < 0.5, f"not a near tie at token {i}"
    assert out.stats.drafted > 0, "the speculative run never drafted"


# ------------------------------------------------------------ lossless at T = 1
def rows(model: pyspec.Model, tokens, settings: Sampling):
    """p0, and p1(.|a) for a in p0's support, each row penalised with the
    history before it, split as the engine decodes (laws.target_rows); and
    the rows the stale window gives (p1 without the token just drafted)."""
    core, n = model.native, len(tokens)
    core.truncate(0)
    core.decode(tokens[:-1], 0, 0)
    core.decode(tokens[-1:], n - 1, 1)
    p0 = sampling.distribution(sampling.penalized(core.logits(0), tokens, settings, n), **TARGET)
    p1, stale = {}, {}
    for a in np.flatnonzero(p0):
        core.truncate(n)
        core.decode([int(a)], n, 1)
        logits = core.logits(0)
        p1[int(a)] = sampling.distribution(sampling.penalized(logits, tokens + [int(a)], settings, n), **TARGET)
        stale[int(a)] = sampling.distribution(sampling.penalized(logits, tokens, settings, n), **TARGET)
    core.truncate(0)
    return p0, p1, stale


def law(p0, p1) -> dict:
    return {(int(a), int(b)): float(p0[a] * p1[int(a)][b]) for a in np.flatnonzero(p0) for b in np.flatnonzero(p1[int(a)])}


@pytest.fixture(scope="module")
def case(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, seed=0)
    settings = Sampling(**TARGET, **PENALTIES)
    tokens = target.tokenize(PROMPT)
    p0, p1, stale = rows(target, tokens, settings)
    assert not any(target.native.is_eog(int(a)) for a in np.flatnonzero(p0))
    a = int(np.argmax(p0))
    exact = law(p0, p1)
    # The stale window's law: the drafted first token a is followed by a row
    # that does not count it; any other first token came from a rejection, and
    # its next row is the first of a new round, whose window is right.
    wrong = law(p0, {x: (stale[x] if x == a else p1[x]) for x in p1})
    n = max(MIN_N, required_n(exact, wrong))
    assert_power(exact, wrong, n, "penalties")
    spec = pyspec.SpeculativeDecoder(target, policy="fixed", draft_max=2, memory=False)
    return spec, tokens, settings, exact, wrong, n, [a, a]


def run(case, **kw):
    spec, tokens, settings, exact, wrong, n, predicted = case
    d = draw(spec, tokens, n, seed0=51_000, max_tokens=3, keep=2, prediction=predicted, sampling=settings, **kw)
    t = d.totals
    assert t["memory_drafted"] >= 2 * n and t["drafted_at"][1] > 0, f"not every sample drafted the repeat {t}"
    return d


def test_penalties_under_speculation_are_lossless(case):
    *_, exact, wrong, n, _ = case
    d = run(case)
    stat, df, pv = pooled_chisquare(d.counts, exact, n)
    print(f"penalties: N={n} chi2={stat:.2f} df={df} p={pv:.3g} drafted={d.totals['memory_drafted']} "
          f"accepted={d.totals['memory_accepted']}")
    assert pv > ALPHA, f"samples differ from the penalised target's law (p={pv:.3g})"


def test_negative_control_penalties_from_the_accepted_prefix_only(case):
    *_, exact, wrong, n, _ = case
    d = run(case, _test=TestControls(stale_penalties=True))
    stat, df, pv = pooled_chisquare(d.counts, exact, n)
    fit = pooled_chisquare(d.counts, wrong, n)
    print(f"NEGATIVE CONTROL stale penalty window: N={n} chi2={stat:.2f} df={df} p={pv:.3g}; "
          f"against the bug's law: p={fit[2]:.3g}")
    assert pv < ALPHA, f"a penalty window without the drafts was not detected (p={pv:.3g})"
    assert fit[2] > ALPHA, "the control does not follow the bug's law: the path tested is not the one described"


# ------------------------------------------------------------- the draft model
@pytest.mark.bitexact
def test_a_self_draft_is_penalised_like_its_target(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256)
    draft = load_model(gemma_path, instance="draft", n_ctx=256)
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=4, memory=False)
    prompt = "List the days of the week, then list them again, and again:"
    settings = dict(temperature=0.0, repeat_penalty=1.5, presence_penalty=0.5, penalize_prompt=False)
    out = spec.generate(prompt, chat=False, max_tokens=40, **settings)
    assert out.tokens == target.generate(prompt, chat=False, max_tokens=40, **settings).tokens
    st = out.stats
    assert st.drafted >= 20 and st.accepted == st.drafted, \
        f"a greedy self-draft under the same penalties must always be accepted ({st.accepted}/{st.drafted})"

