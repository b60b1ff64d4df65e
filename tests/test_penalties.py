"""Logit biases and repetition penalties (cpp/core/penalties.h, issue 51).

- The formula and the window are llama.cpp's: pyspec's penalised row equals
  llama.cpp's own penalties and logit-bias samplers on the same logits and
  tokens (called through llama-cpp-python's bindings of the vendored library).
- Greedy tokens equal llama-cpp-python's with the same penalties (its window:
  the last 64 tokens it generated, not the prompt), up to a near tie
  (near_ties.py's rule, on pyspec's own penalised lone row).
- Speculation stays lossless with them: an end-to-end chi-square at T = 1 of
  the first THREE tokens, on a path where every sample drafts a prediction
  [a, b, c] whose rows 1 and 2 its drafts penalise (``drafted_at[2]`` and the
  memory counters say it fired). Two negative controls,
  ``TestControls(penalties=...)``: ``"stale"``, rows that count only the
  accepted prefix (the issue-51 bug), and ``"last_draft"``, rows that count
  only the draft just before them, which a two-token law cannot see (row 1's
  window is then right). Each must be rejected by the same test and fit its
  stated law. ALPHA = 0.001 (chisquare.py); N from a power calculation against
  both laws (power > 0.99), at least MIN_N.
- The draft model's q is penalised like its target's rows, its own drafts in
  its window: a self-draft (T = 0.3 over its top 8) is lossless, and the
  broken residual is rejected and fits the law that the draft's penalised q
  gives it. Greedy, a self-draft is always accepted, and the penalties decide a
  drafted token (an unpenalised draft would have been rejected there).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import pyspec
from pyspec import Sampling, sampling
from pyspec.testing import TestControls

from chisquare import assert_law, assert_power, required_n
from draws import draw
from laws import TARGET, residual_is_p_row, support_of
from near_ties import check_near_tie, first_difference, lone_row, lone_rows, row_law

MIN_N = 100
# A prompt whose natural continuation repeats itself, so a penalty on the token
# just drafted changes its next row a lot (the stale window's bug is large).
PROMPT = "ha ha ha ha ha ha ha ha"
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
        ours = sampling.apply_penalties(logits, history, s, n_prompt)
        theirs = llama_cpp_row(logits, history, s, n_prompt)
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{settings} trial {trial}")
    # The test can fail: the same history without the prompt's tokens differs.
    s = Sampling(repeat_penalty=2.0, penalize_prompt=True)
    logits, history = rng.normal(0, 3, size=40).astype(np.float32), [1, 2, 3, 4]
    assert not np.array_equal(sampling.apply_penalties(logits, history, s, 4),
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
def test_greedy_tokens_equal_llama_cpp_pythons_with_its_penalties(gemma_path, load_model):
    """llama-cpp-python's generate() (what create_completion runs) at T = 0 with
    penalties, against pyspec plain and speculative. Rows of other batch shapes
    round differently, so a divergence is allowed only at a near tie of
    pyspec's own penalised lone row (near_ties.check_near_tie: both tokens
    within the row law's near tie of its most likely); a penalty left out or
    misapplied moves a logit by several (17 / 1.3)."""
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
            assert i < len(ours), "pyspec's answer ended where llama-cpp-python's went on"
            row = sampling.apply_penalties(lone_row(plain, tokens, ours[:i]).astype(np.float32), list(tokens) + ours[:i],
                                     Sampling(**settings, penalize_prompt=False), len(tokens))
            check_near_tie(row, [ours[i], theirs[i]], row_law(plain).near_tie(), f"the answers part at token {i}")
    assert out.stats.drafted > 0, "the speculative run never drafted"


# ------------------------------------------------------------ lossless at T = 1
# A prediction is drafted whole in the first round of every sample, so each
# verification row follows drafts that its window must count. Two cases:
# - rows 0-1: "ha ha ...", the prediction [a, a] (draft_max 2: a the most likely
#   first token, repeated, which its own next row penalises), the first two
#   tokens' law; control "stale" (no draft in any window, the issue-51 bug);
# - rows 0-2: "A B A B ...", the prediction [a, b, c] (draft_max 3: each token
#   the most likely after the ones before it), the first three tokens' law;
#   control "last_draft" (only the draft just before the row: right for rows
#   0 and 1, so only a row >= 2 can see it; here row 2 must count the " B"
#   drafted two tokens before it).
# The law of the first tokens is P(t0, t1, ...) = prod_i row_i(t_i), each row
# penalised with its window. A drafted token's law is its row's (a one-hot
# draft is kept with probability p(d), else the residual is p without d); on
# the drafted path row i is round 1's verification row i, whose window the
# control gets wrong; off it, each token is the first row of a new round, whose
# window is right in every variant (for "stale" only where nothing drafts after
# a first token other than a: the fixture checks that premise).
# Batches of four rows do not take the single-token kernels, so the reference
# rows are decoded as the engine decodes them (engine_rows).
CASES = {
    "rows 0-1": dict(prompt=PROMPT, draft_max=2, repeat=True, control="stale"),
    "rows 0-2": dict(prompt="A B A B A B A B A", draft_max=3, repeat=False, control="last_draft"),
}


def engine_rows(model: pyspec.Model, tokens, drafts, kept: int, after=()) -> np.ndarray:
    """Logits of the row after tokens + drafts[:kept] + after, as the engine
    computes it here: round 1 verifies [last prompt token] + drafts in one
    batch; after a rejection, the tokens that follow are one a decode."""
    core, n = model.native, len(tokens)
    core.truncate(0)
    core.decode(tokens[:-1], 0, 0)
    core.decode_rows([(0, n - 1 + i, t, True) for i, t in enumerate([tokens[-1]] + list(drafts))])
    row = np.array(core.logits(kept))
    if after:
        core.truncate(n + kept)
        for i, t in enumerate(after):
            core.decode([t], n + kept + i, 1)
        row = np.array(core.logits(0))
    core.truncate(0)
    return row


def penalty_laws(model: pyspec.Model, tokens, settings: Sampling, drafts) -> dict:
    """The law of the first len(drafts) tokens (comment above) under the right
    window ("exact") and under each wrong one (TestControls.penalties)."""
    n, keep, logits = len(tokens), len(drafts), {}

    def row(prefix, name):
        kept = next(k for k in range(len(prefix), -1, -1) if list(prefix[:k]) == list(drafts[:k]))
        if tuple(prefix) not in logits:
            logits[tuple(prefix)] = engine_rows(model, tokens, drafts, kept, prefix[kept:])
        window = list(prefix)
        if kept == len(prefix) and name != "exact":  # round 1's row len(prefix)
            window = [] if name == "stale" else window[-1:]
        return sampling.distribution(sampling.apply_penalties(logits[tuple(prefix)], tokens + window, settings, n),
                                     **TARGET)

    def walk(name, prefix, prob, law):
        if len(prefix) == keep or (prefix and model.native.is_eog(prefix[-1])):
            law[tuple(prefix)] = law.get(tuple(prefix), 0.0) + prob
            return
        r = row(prefix, name)
        for x in support_of(r):
            walk(name, prefix + [x], prob * float(r[x]), law)

    laws: dict = {}
    for name in ("exact", "stale", "last_draft"):
        walk(name, [], 1.0, laws.setdefault(name, {}))
    return laws


@pytest.fixture(scope="module", params=list(CASES))
def case(request, gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, seed=0)
    settings = Sampling(**TARGET, **PENALTIES)
    c = CASES[request.param]
    tokens = target.tokenize(c["prompt"])
    n = len(tokens)
    # The prediction (CASES), from the penalised rows the engine computes.
    drafts: list = []
    for i in range(c["draft_max"]):
        row = sampling.apply_penalties(engine_rows(target, tokens, drafts, i), tokens + drafts, settings, n)
        drafts.append(drafts[0] if drafts and c["repeat"] else int(np.argmax(row)))
    laws = penalty_laws(target, tokens, settings, drafts)
    p0 = sampling.distribution(sampling.apply_penalties(engine_rows(target, tokens, drafts, 0), tokens, settings, n),
                               **TARGET)
    assert not any(target.native.is_eog(x) for x in support_of(p0))
    if c["control"] == "stale":  # its law's premise: nothing drafts after a first token other than a
        assert not (set(support_of(p0)) - {drafts[0]}) & set(tokens + drafts), \
            "a first token other than a occurs in the prompt or the prediction"
    wrong = laws[c["control"]]
    for law in (laws["exact"], wrong):
        assert abs(sum(law.values()) - 1.0) < 1e-9
    n_samples = max(MIN_N, required_n(laws["exact"], wrong))
    assert_power(laws["exact"], wrong, n_samples, f"penalties {request.param}, window {c['control']}")
    spec = pyspec.SpeculativeDecoder(target, policy="fixed", draft_max=c["draft_max"], memory=False)
    return spec, tokens, settings, laws["exact"], wrong, c["control"], n_samples, drafts


def run(case, **kw):
    spec, tokens, settings, _, _, _, n, drafts = case
    k = len(drafts)
    d = draw(spec, tokens, n, seed0=51_000, max_tokens=k + 1, keep=k, prediction=drafts, sampling=settings, **kw)
    t = d.totals
    assert t["memory_drafted"] >= k * n and t["drafted_at"][k - 1] >= n, f"not every sample drafted the prediction {t}"
    assert t["accepted_at"][k - 2] > 0, f"the last drafted row never judged a draft after accepted ones {t}"
    return d


def test_penalties_under_speculation_are_lossless(case):
    _, _, _, exact, _, _, n, drafts = case
    d = run(case)
    assert_law(d.counts, exact, n, f"penalties, rows 0-{len(drafts) - 1}",
               note=f"drafted={d.totals['memory_drafted']} accepted at rows={d.totals['accepted_at'][:len(drafts)]}")


def test_negative_control_penalties_with_a_wrong_window(case):
    """Its own window bug per case (CASES): rejected, and fitting its stated law."""
    _, _, _, exact, wrong, control, n, drafts = case
    d = run(case, _test=TestControls(penalties=control))
    assert_law(d.counts, exact, n, f"penalty window {control}, rows 0-{len(drafts) - 1}", control=True, wrong=wrong)


# ------------------------------------------------------------- the draft model
# A self-draft whose q is the draft model's penalised row (its window holds
# its own drafts), sampled at T = 0.3 over its top 8 against the target's T = 1
# over 3: q != p, so drafts are rejected too, and the broken residual's law is
# far from p (~105 samples give power 0.99; at T = 0.5, 258; at T = 1, ~23,000).
# Two-token drafts: the rows are three-row batches, whose kernels are the
# single-token ones (laws.py).
DRAFT_SAMPLING = Sampling(temperature=0.3, top_k=8, top_p=1.0, min_p=0.0)


@pytest.fixture(scope="module")
def draft_case(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, seed=0)
    draft = load_model(gemma_path, instance="draft", n_ctx=256)
    settings = Sampling(**TARGET, **PENALTIES)
    tokens = target.tokenize(PROMPT)
    n = len(tokens)

    def row(model, window, how, batched):
        """The row after the prompt and `window`, penalised with `window`: the
        target verifies from the prompt's last token on, the draft catches up
        on the whole prompt at once; later tokens are one a decode."""
        logits = lone_row(model, tokens, window, batched=batched).astype(np.float32)
        return sampling.distribution(sampling.apply_penalties(logits, tokens + window, settings, n), **how)

    draft_how = DRAFT_SAMPLING.truncation()
    p0, q0 = row(target, [], TARGET, n - 1), row(draft, [], draft_how, n)
    exact, wrong = {}, {}
    r0 = residual_is_p_row(p0, q0)
    for a in support_of(p0):
        p1, q1 = row(target, [a], TARGET, n - 1), row(draft, [a], draft_how, n)
        r1 = residual_is_p_row(p1, q1)  # the second token: after a drafted a, or after the residual's a
        for b in support_of(p1):
            exact[(a, b)] = float(p0[a] * p1[b])
            wrong[(a, b)] = float(r0[a] * r1[b])
    assert not any(target.native.is_eog(a) for a in support_of(p0))
    n_samples = max(MIN_N, required_n(exact, wrong))
    assert_power(exact, wrong, n_samples, "penalised draft model, residual = p")
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=2, memory=False)
    return spec, tokens, settings, exact, wrong, n_samples


def draft_run(case, **kw):
    spec, tokens, settings, exact, wrong, n = case
    d = draw(spec, tokens, n, seed0=57_000, max_tokens=3, keep=2, sampling=settings,
             draft_sampling=DRAFT_SAMPLING, **kw)
    t = d.totals
    assert t["drafted_at"][1] >= n and 0 < t["accepted_at"][1] and t["accepted"] < t["drafted"], \
        f"every sample drafts two tokens from the draft model, some accepted, some not {t}"
    return d


@pytest.mark.bitexact
def test_a_penalised_draft_model_is_lossless(draft_case):
    *_, exact, _, n = draft_case
    d = draft_run(draft_case)
    assert_law(d.counts, exact, n, "penalised draft model",
               note=f"drafted={d.totals['drafted']} accepted={d.totals['accepted']}")


@pytest.mark.bitexact
def test_negative_control_penalised_draft_model_with_the_broken_residual(draft_case):
    """Its law uses the draft's penalised q at both positions: a q computed
    without the draft before it in its window would not fit it."""
    *_, exact, wrong, n = draft_case
    d = draft_run(draft_case, _test=TestControls(variant="residual_is_p"))
    assert_law(d.counts, exact, n, "penalised draft model, residual = p", control=True, wrong=wrong)


@pytest.mark.bitexact
def test_a_self_draft_is_penalised_like_its_target(gemma_path, load_model):
    """Greedy, a self-draft with the target's penalties: every draft is
    accepted, and the penalties decide a token inside the drafted span (an
    unpenalised draft would have proposed another token there)."""
    target = load_model(gemma_path, n_ctx=256)
    draft = load_model(gemma_path, instance="draft", n_ctx=256)
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=4, memory=False)
    prompt = "List the days of the week, then list them again, and again:"
    settings = dict(temperature=0.0, repeat_penalty=1.5, presence_penalty=0.5, penalize_prompt=False)
    drafted = []
    out = spec.generate(prompt, chat=False, max_tokens=40, on_token=lambda text, d: drafted.append(d), **settings)
    assert len(drafted) == len(out.tokens)
    assert out.tokens == target.generate(prompt, chat=False, max_tokens=40, **settings).tokens
    st = out.stats
    assert st.drafted >= 20 and st.accepted == st.drafted, \
        f"a greedy self-draft under the same penalties must always be accepted ({st.accepted}/{st.drafted})"
    # Where the unpenalised model would have chosen another token, a kept draft
    # must have come from the penalised draft (the lone rows along the output).
    _, rows = lone_rows(target, target.tokenize(prompt), out.tokens[:-1])
    acted = [i for i, row in enumerate(rows) if drafted[i] and int(np.argmax(row)) != out.tokens[i]]
    print(f"drafted tokens the penalties decided: {acted}")
    assert acted, "no drafted token differs from the unpenalised choice: the draft's penalties went untested"
