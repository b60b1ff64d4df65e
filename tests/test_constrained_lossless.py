"""Speculation under a grammar keeps the constrained target's law at T > 0
(cpp/constraint/grammar.h, "The constrained target"): p masked with the
grammar's state after the accepted prefix, renormalised, at every position.

What is sampled: the first two output tokens, as in test_lossless_policies.py;
their exact law is enumerated from plain evaluation with each row masked by
the grammar after the tokens before it (laws.constrained_law). Each path under
a grammar gets its own test, and each must show it fired:

  * a draft model drawing from its masked q (draft_max 2: the second draft
    row is masked with the state after the first draft);
  * a lookup draft cut before its first token the grammar refuses;
  * text the grammar forces, drafted for free and verified;
  * n > 1 samples of one request in one batch, each with its own grammar state.

Sizes: N is the smallest with power > 0.99 at alpha = 0.001 against the
broken-residual law (residual = p) of the same masked rows, at least 200; the
forced path's first token is certain under its grammar, and the batch's size
would pass 10,000 (top-k 2, see its test), so these two are sized against the
stale-mask law below. Two negative controls are run at the same N and must
be rejected (`_test=TestControls(grammar=...)`):
  * "unmasked": the target's rows are not masked (only the draft's q is), the
    "draft-only mask";
  * "stale": every row of a round is masked with the grammar's state at the
    round's start, not after the drafts before it.
"""

from __future__ import annotations

import pytest

import pyspec
from pyspec import Sampling
from pyspec.constraints import Constraint

from chisquare import assert_law, power, required_n
from draws import draw
from laws import (PROMPT, TARGET, constrained_draft_row, constrained_law, exact_distribution, lookup_proposal,
                  one_hot, residual_is_p_row)
from pyspec.testing import TestControls

# Exact laws from single-token rows: bit-exact batch rows presumed (conftest skips these on GPU builds).
pytestmark = pytest.mark.bitexact

# The draft samples colder than the target (masked q0 = 0.56/0.43/0.02 against
# p0 = 0.44/0.41/0.15): the broken residual's law is then far enough from p
# for N = 456 (at 0.7, q0 = 0.47/0.42/0.10 needed N = 3,584).
DRAFT = dict(draft_sampling=Sampling(temperature=0.3, top_k=3, top_p=1.0, min_p=0.0))
MIN_N = 200
REST = '\nREST: /[^\\n]*/'
# No text forced at the start; the model's favourite first tokens (" a", " not")
# are refused, so the mask changes the law at both positions.
CHOICE = 'start: (" sunny" | " cloudy" | " warm") REST' + REST
# Forces " sunny"; the next token ("d" 0.62, "day" 0.32, "days" 0.06) is the
# bonus row after the forced draft, masked with the state after it.
FORCED = 'start: " sunnyday" REST' + REST
# After "... three one two" the n-gram proposes " three one": " one" is refused.
NGRAM_PROMPT = "one two three one two three one two"
CUT = 'start: (" three" | " four") (" two" | " five" | " six") REST' + REST


def marginal(joint: dict) -> dict:
    out: dict = {}
    for key, v in joint.items():
        out[key[:1]] = out.get(key[:1], 0.0) + v
    return out


def size(exact: dict, wrong: dict) -> int:
    return max(MIN_N, required_n(marginal(exact), marginal(wrong), max(len(exact) - 1, 1)))


@pytest.fixture(scope="module")
def gemma_models(gemma_path, load_model):
    return load_model(gemma_path, n_ctx=256, seed=0), load_model(gemma_path, "draft", n_ctx=256, seed=0)


def compiled(model, grammar: str):
    return model.grammars.compile(Constraint.grammar(grammar))


def sample(spec, tokens, n, grammar, **kw):
    """n samples of the first two tokens under `grammar` (three generated, so that
    the first round may draft two)."""
    return draw(spec, tokens, n, seed0=90_000, max_tokens=3, keep=2, grammar=grammar, **TARGET, **kw)


# ---------------------------------------------------------------- draft model

@pytest.fixture(scope="module")
def model_case(gemma_models):
    target, draft = gemma_models
    tokens = target.tokenize(PROMPT)
    grammar = compiled(target, CHOICE)
    p0, p1, exact = constrained_law(target, tokens, grammar)
    q0 = constrained_draft_row(draft, tokens, grammar, DRAFT)
    wrong = exact_distribution(target, residual_is_p_row(p0, q0), p1)
    return tokens, exact, size(exact, wrong)


def model_spec(gemma_models):
    target, draft = gemma_models
    return pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=2)


def test_model_drafter_under_grammar_is_lossless(gemma_models, model_case):
    tokens, exact, n = model_case
    d = sample(model_spec(gemma_models), tokens, n, CHOICE, **DRAFT)
    t = d.totals
    assert t["masks"] > 0 and t["length_hist"][2] > 0, f"no two-token drafts under the grammar: {t}"
    assert d.drafting >= n // 2
    assert all(key[0] in (k[0] for k in exact) for key in d.counts), "a first token outside the grammar"
    assert_law(d.counts, exact, n, "model under grammar", note=f"drafted={t['drafted']} accepted={t['accepted']}")


@pytest.mark.parametrize("control", ["unmasked", pytest.param("stale", marks=pytest.mark.slow)])
def test_negative_control_wrong_target_mask_is_caught(gemma_models, model_case, control):
    tokens, exact, n = model_case
    d = sample(model_spec(gemma_models), tokens, n, CHOICE, _test=TestControls(grammar=control), **DRAFT)
    assert d.totals["length_hist"][2] > 0
    assert_law(d.counts, exact, n, f"model under grammar, {control} mask", control=True)


# ---------------------------------------------------------------- lookup cut

@pytest.fixture(scope="module")
def cut_case(gemma_models):
    target, _ = gemma_models
    tokens = target.tokenize(NGRAM_PROMPT)
    grammar = compiled(target, CUT)
    proposal = lookup_proposal(target, "ngram", tokens, 2)
    assert grammar.valid_prefix(proposal) == 1, "the test needs a proposal the grammar cuts after one token"
    p0, p1, exact = constrained_law(target, tokens, grammar)
    wrong = exact_distribution(target, residual_is_p_row(p0, one_hot(proposal[0], p0)), p1)
    n = size(exact, wrong)
    spec = pyspec.SpeculativeDecoder(target, drafter="ngram", policy="fixed", draft_max=2, memory=False)
    return spec, tokens, exact, n


def test_lookup_draft_cut_by_grammar_is_lossless(cut_case):
    spec, tokens, exact, n = cut_case
    d = sample(spec, tokens, n, CUT)
    assert d.totals["grammar_cuts"] > 0, f"no lookup draft was cut: {d.totals}"
    assert_law(d.counts, exact, n, "ngram cut by grammar", note=f"cuts={d.totals['grammar_cuts']}")


# The unmasked control runs in the default tier on the draft-model and forced paths.
@pytest.mark.slow
def test_negative_control_lookup_cut_unmasked_target_is_caught(cut_case):
    spec, tokens, exact, n = cut_case
    control = sample(spec, tokens, n, CUT, _test=TestControls(grammar="unmasked"))
    assert_law(control.counts, exact, n, "ngram cut by grammar, unmasked target", control=True)


# ---------------------------------------------------------------- forced text

def test_forced_drafts_are_lossless(gemma_models):
    """The first round drafts the forced " sunny" (no drafter runs: the n-gram has
    nothing here); the second token is the bonus row, masked after it."""
    target, _ = gemma_models
    tokens = target.tokenize(PROMPT)
    grammar = compiled(target, FORCED)
    forced = grammar.forced([], 8)
    assert forced, "the grammar must force text at the start"
    p0, p1, exact = constrained_law(target, tokens, grammar)
    _, _, stale = constrained_law(target, tokens, grammar, row1_prefix=lambda a: [])
    # The second token carries the difference: size on the joint laws.
    n = max(MIN_N, required_n(exact, stale, max(len(exact) - 1, 1)))
    assert power(exact, stale, n, max(len(exact) - 1, 1)) > 0.99
    spec = pyspec.SpeculativeDecoder(target, drafter="ngram", policy="fixed", draft_max=2, memory=False)
    d = sample(spec, tokens, n, FORCED)
    t = d.totals
    assert t["forced_drafted"] >= n and t["forced_rounds"] >= n, f"forced text was not drafted: {t}"
    assert_law(d.counts, exact, n, "forced drafts", note=f"forced={t['forced_drafted']}/{t['forced_accepted']}")
    for control in ("stale", "unmasked"):
        c = sample(spec, tokens, n, FORCED, _test=TestControls(grammar=control))
        assert_law(c.counts, exact, n, f"forced drafts, {control} mask", control=True)


# ---------------------------------------------------------------- n samples in one batch

def test_samples_of_one_request_each_follow_the_grammar_law(gemma_path, load_model):
    """generate(n=2): two sequences of one batch, each with its own place in the
    grammar. Both samples' first two tokens follow the constrained law. Top-k 2:
    a batch's rows take other kernels than a lone decode's (near_ties.py), and
    under top-k 3 the third allowed first token (" ", logit 20.70) is too near
    the fourth (" cloudy", 20.55) not to trade places; the second is a logit
    above the third."""
    target = load_model(gemma_path, "batch", n_ctx=512, n_seq_max=2, seed=0)
    draft = load_model(gemma_path, "batch-draft", n_ctx=512, n_seq_max=2, seed=0)
    tokens = target.tokenize(PROMPT)
    grammar = compiled(target, CHOICE)
    settings = {**TARGET, "top_k": 2}
    _, _, exact = constrained_law(target, tokens, grammar, settings=settings)
    _, _, stale = constrained_law(target, tokens, grammar, settings=settings, row1_prefix=lambda a: [])
    n = max(MIN_N, required_n(exact, stale, max(len(exact) - 1, 1)))
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=2)

    def pairs(**kw):
        counts: dict = {}
        two = 0
        for i in range((n + 1) // 2):
            out = spec.generate(tokens, n=2, max_tokens=3, seed=95_000 + i, grammar=CHOICE, **settings, **DRAFT,
                                **kw)
            for c in out.choices:
                key = tuple(c.tokens[:2])
                counts[key] = counts.get(key, 0) + 1
                two += c.stats.length_hist[2] > 0
        assert two > 0, "no sample drafted two tokens"
        return counts, sum(counts.values())

    counts, total = pairs()
    assert_law(counts, exact, total, "n=2 under grammar")
    counts, total = pairs(_test=TestControls(grammar="stale"))
    assert_law(counts, exact, total, "n=2 under grammar, stale mask", control=True)
