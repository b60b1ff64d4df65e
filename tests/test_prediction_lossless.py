"""Predicted Outputs are lossless (issue 50): a ``prediction=`` is a draft
source, so at T > 0 the answer follows the target's law whatever is predicted.

What is sampled, as in test_suffix_lossless.py (whose account of the bug's law
this test shares): the joint law of the first TWO output tokens (draft_max 2,
three tokens generated, top-k 3; the exact law from plain evaluation, laws.py).
The prediction is [a, b]: a the target's most likely first token, b its most
likely successor. pyspec/prediction.py puts it behind the prompt's tail, so the
suffix drafter matches the prompt there and drafts [a, b] in the first round of
every sample, from the prediction alone: the decoder has no memory (the
prediction's memory is the only store), which the test asserts by the memory
counters (``memory_drafted`` >= 2 per sample).

Two decoders (issue 57): one without a draft model (its suffix drafter reads
the prediction), and one whose drafter is the draft model (a self-draft at
T = 0.3 over its top 8, so that q != p): a prediction switches it to
``hybrid`` for the call, through the batch path, so lookups in the prediction
draft first and the model drafts where they have nothing, after a first token
y != a; both must have fired. There the bug's second token follows the broken
residual of the model's draft, min(p1, q1) + (1 - beta) p1 at y
(model_drafted_law), instead of p1.

The negative control (residual = p, TestControls) must be rejected on the same
path and fit the bug's stated law (test_suffix_lossless.broken_residual_law).
ALPHA = 0.001, N from a power calculation against that law (power > 0.99,
chisquare.assert_power), at least MIN_N.
"""

from __future__ import annotations

import pytest

import pyspec
from pyspec import Sampling, prediction

from chisquare import assert_law, assert_power, required_n
from draws import draw
from laws import PROMPT, TARGET, exact_law, next_row, residual_is_p_row, support_of
from pyspec.testing import TestControls
from test_suffix_lossless import broken_residual_law, memory_draft

pytestmark = pytest.mark.bitexact

MIN_N = 100
DRAFT_SAMPLING = Sampling(temperature=0.3, top_k=8, top_p=1.0, min_p=0.0)


def model_drafted_law(law: dict, draft: pyspec.Model, tokens, p0, p1, a) -> dict:
    """The bug's law where the draft model drafts after a first token y != a:
    its second token from the broken residual of p1(. | y) and q1(. | y)."""
    out = {k: v for k, v in law.items() if k[0] == a}
    for y in support_of(p0):
        if y != a:
            r1 = residual_is_p_row(p1[y], next_row(draft, tokens + [y], **DRAFT_SAMPLING.truncation()))
            for z in support_of(r1):
                out[(y, z)] = float((1.0 - p0[a]) * p0[y] * r1[z])
    return out


@pytest.fixture(scope="module", params=["suffix", "draft model"])
def case(request, gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, seed=0)
    tokens, p0, p1, exact = exact_law(target, PROMPT)
    a, b = memory_draft(p0, p1)
    for y in support_of(p0):  # the premises of the bug's law
        assert y == a or y not in tokens + [a, b], "a first token other than a occurs in the prompt or prediction"
    wrong = broken_residual_law(p0, p1, a, b)
    if request.param == "suffix":
        spec = pyspec.SpeculativeDecoder(target, policy="fixed", draft_max=2, memory=False)
        assert spec.drafter == "suffix" and spec.memory is None
        kw = {}
    else:
        draft = load_model(gemma_path, "draft", n_ctx=256, seed=0)
        spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=2, memory=False)
        wrong, kw = model_drafted_law(wrong, draft, tokens, p0, p1, a), dict(draft_sampling=DRAFT_SAMPLING)
    assert abs(sum(wrong.values()) - 1.0) < 1e-9
    n = max(MIN_N, required_n(exact, wrong))
    assert_power(exact, wrong, n, f"prediction, {request.param}")
    return spec, tokens, exact, wrong, n, [a, b], kw


def run(case, **kw):
    spec, tokens, exact, wrong, n, predicted, settings = case
    d = draw(spec, tokens, n, seed0=91_000, max_tokens=3, keep=2, prediction=predicted, **TARGET, **settings, **kw)
    t = d.totals
    assert t["memory_rounds"] >= n and t["memory_drafted"] >= 2 * n, f"not every sample drafted the prediction {t}"
    assert 0 < t["memory_accepted"] < t["memory_drafted"] and t["drafted_at"][1] > 0, t
    if spec.draft is not None:  # the hybrid's model drafted too, where the prediction had nothing
        assert t["drafted"] > t["memory_drafted"], f"the draft model never drafted beside the prediction {t}"
    return d


def test_drafting_from_a_prediction_is_lossless(case):
    _, _, exact, _, n, _, _ = case
    d = run(case)
    assert_law(d.counts, exact, n, "prediction",
               note=f"drafted={d.totals['memory_drafted']} accepted={d.totals['memory_accepted']}")


def test_negative_control_prediction_with_the_broken_residual(case):
    _, _, exact, wrong, n, _, _ = case
    d = run(case, _test=TestControls(variant="residual_is_p"))
    assert_law(d.counts, exact, n, "prediction residual=p", control=True, wrong=wrong)


def test_counts_follow_openais_definition(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, seed=0)
    spec = pyspec.SpeculativeDecoder(target, policy="fixed", draft_max=2, memory=False)
    tokens = target.tokenize(PROMPT)
    out = spec.generate(tokens, max_tokens=6, temperature=0, prediction=None)
    same = spec.generate(tokens, max_tokens=6, temperature=0, prediction=list(out.tokens))
    assert same.tokens == out.tokens
    assert (same.accepted_prediction_tokens, same.rejected_prediction_tokens) == (len(out.tokens), 0)
    assert same.stats.memory_accepted > 0, "the prediction was not drafted from"
    # Two wrong tokens in the middle: they did not appear, the rest did.
    wrong = list(out.tokens[:2]) + [out.tokens[0], out.tokens[0]] + list(out.tokens[2:])
    other = spec.generate(tokens, max_tokens=6, temperature=0, prediction=wrong)
    assert other.tokens == out.tokens
    assert (other.accepted_prediction_tokens, other.rejected_prediction_tokens) == (len(out.tokens), 2)
    assert out.accepted_prediction_tokens is None


def test_generate_batch_takes_a_prediction(gemma_path, load_model):
    """generate_batch(prediction=) drafts each prompt from the prediction behind
    its own anchor and counts it per choice (it used to reach the core as a
    Drafting field and fail there)."""
    target = load_model(gemma_path, n_ctx=512, n_seq_max=2, seed=0)
    spec = pyspec.SpeculativeDecoder(target, policy="fixed", draft_max=2, memory=False)
    prompts = [target.tokenize(PROMPT), target.tokenize(PROMPT + " and")]
    lone = spec.generate(prompts[0], max_tokens=6, temperature=0)
    out = spec.generate_batch(prompts, max_tokens=6, temperature=0, prediction=list(lone.tokens))
    assert out.choices[0].stats.memory_accepted > 0, "the prediction was not drafted from"
    for c in out.choices:
        assert (c.accepted_prediction_tokens, c.rejected_prediction_tokens) == prediction.counts(lone.tokens,
                                                                                                 c.tokens)
    plain = spec.generate_batch(prompts, max_tokens=6, temperature=0)
    assert plain.choices[0].accepted_prediction_tokens is None and plain.choices[0].stats.memory_accepted == 0
