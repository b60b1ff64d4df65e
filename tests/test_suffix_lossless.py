"""The suffix drafter is lossless when it drafts from memory (issue 24): alone,
and in a batch whose samples share one memory, at T > 0.

What is sampled, as in test_lossless_policies.py: the joint law of the first
TWO output tokens (draft_max = 2, three tokens generated), so that draft
position 1 counts. The exact law P(a, b) = p0(a) p1(b | a) comes from plain
evaluation (laws.py), top-k 3.

Memory holds the prompt followed by [a, b]: a the target's most likely first
token, b its most likely successor. The suffix drafter matches the whole prompt
there (a longer match than any in the prompt itself) and copies [a, b]: a
one-hot two-token draft from memory in the first round of every sample.

(a) Alone: memory is reset to that one document before each sample (a
    generation adds its own text to memory), so each sample's draft is [a, b].
    The broken residual (residual = p) then has an exact law, which this test
    states and is sized against: with a rejected draft a, the bug draws the
    first token y from p0 instead of the residual; y = a happens, and the
    drafter, still on its copy, drafts b again in the next round:
      P(a, z) = p0(a) (2 - p0(a)) [p1(b|a) [z = b] + (1 - p1(b|a)) p1(z|a)]
      P(y, z) = (1 - p0(a)) p0(y) p1(z|y)           (y != a: nothing drafts,
    since y is neither in the prompt nor in memory; the fixture checks this).
    The control must be rejected and, as a check of this account of the
    memory path, must fit that law.
(b) In a batch of 4 samples (generate(..., n=4)): one memory shared by the four
    drafters, starting with the same document and growing with every finished
    sample (1 + 4k documents after k calls), so drafts follow what earlier
    samples wrote, and siblings' texts compete with it (consensus). Each
    sample's first two tokens must follow the exact law; the four samples of a
    call are counted as four draws (pooled: under the null they are independent
    draws, which test_batch_lossless.py proves for batches; a dependence would
    only widen the statistic's spread, i.e. make the test fail, not pass).
    Sized against the law (a)'s bug would give (the stated wrong law).

Each test runs at ALPHA = 0.001 with N from a power calculation (power > 0.99
against the stated wrong law, noncentral chi-square and a Monte Carlo check:
chisquare.assert_power), at least MIN_N. The batch uses another prompt: its
rows come from batched kernels, and with "The weather today is" the third and
fourth most likely first tokens are within 2 % of each other, so a batched row
can swap them and put a token outside the reference's top-3 support; for
"Monday, Tuesday," every top-3 boundary of the law is wider than 0.5 in logits.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyspec

from chisquare import assert_law, assert_power, required_n
from draws import draw
from laws import PROMPT, TARGET, exact_law, support_of
from pyspec.testing import TestControls

# Exact laws from single-token rows: bit-exact batch rows presumed (conftest skips these on GPU builds).
pytestmark = pytest.mark.bitexact

BATCH_PROMPT = "Monday, Tuesday,"
BATCH_N = 4
MIN_N = 100


def memory_draft(p0, p1):
    """[a, b]: the most likely first token, and its most likely successor."""
    a = int(np.argmax(p0))
    return a, int(np.argmax(p1[a]))


def broken_residual_law(p0, p1, a, b) -> dict:
    """Exact two-token law of the residual = p bug with memory drafting [a, b] (module docstring)."""
    law = {}
    pa = p0[a] * (2.0 - p0[a])
    for z in support_of(p1[a]):
        law[(a, z)] = float(pa * (p1[a][b] * (z == b) + (1.0 - p1[a][b]) * p1[a][z]))
    for y in support_of(p0):
        if y != a:
            for z in support_of(p1[y]):
                law[(y, z)] = float((1.0 - p0[a]) * p0[y] * p1[y][z])
    return law


# ------------------------------------------------------------------ (a) alone

@pytest.fixture(scope="module")
def single_case(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, seed=0)
    tokens, p0, p1, exact = exact_law(target, PROMPT)
    a, b = memory_draft(p0, p1)
    doc = tokens + [a, b]
    for y in support_of(p0):  # the premises of the bug's law
        assert y == a or y not in doc, "a first token other than a occurs in the prompt or memory"
    wrong = broken_residual_law(p0, p1, a, b)
    assert abs(sum(wrong.values()) - 1.0) < 1e-9
    n = max(MIN_N, required_n(exact, wrong))
    assert_power(exact, wrong, n, "suffix/memory alone")
    memory = pyspec.Memory(1)
    spec = pyspec.SpeculativeDecoder(target, policy="fixed", draft_max=2, memory=memory)
    assert spec.drafter == "suffix" and spec.memory is memory

    def reset(_spec):
        memory.clear()
        memory.add(doc)

    return spec, tokens, exact, wrong, n, reset


def single_run(case, **kw):
    spec, tokens, exact, wrong, n, reset = case
    d = draw(spec, tokens, n, seed0=71_000, max_tokens=3, keep=2, before=reset, **TARGET, **kw)
    t = d.totals
    assert t["memory_rounds"] >= n and t["memory_drafted"] >= 2 * n, f"not every sample drafted [a, b] from memory {t}"
    assert 0 < t["memory_accepted"] < t["memory_drafted"] and t["drafted_at"][1] > 0, t
    return d


def test_suffix_drafting_from_memory_is_lossless(single_case):
    _, _, exact, _, n, _ = single_case
    d = single_run(single_case)
    t = d.totals
    assert_law(d.counts, exact, n, "suffix/memory alone", note=f"memory rounds={t['memory_rounds']} "
               f"drafted={t['memory_drafted']} accepted={t['memory_accepted']}")


def test_negative_control_memory_draft_broken_residual(single_case):
    _, _, exact, wrong, n, _ = single_case
    d = single_run(single_case, _test=TestControls(variant="residual_is_p"))
    assert_law(d.counts, exact, n, "suffix/memory residual=p", control=True, wrong=wrong)


# ------------------------------------------------------------------ (b) batch

@pytest.fixture(scope="module")
def batch_case(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, n_seq_max=BATCH_N, seed=0)
    lone = load_model(gemma_path, n_ctx=256)  # as the batch runs (flash attention as llama.cpp chooses)
    assert target.flash_attn == lone.flash_attn
    tokens, p0, p1, exact = exact_law(lone, BATCH_PROMPT)
    a, b = memory_draft(p0, p1)
    wrong = broken_residual_law(p0, p1, a, b)
    calls = -(-max(MIN_N, required_n(exact, wrong)) // BATCH_N)
    assert_power(exact, wrong, BATCH_N * calls, f"suffix/memory batch of {BATCH_N}")
    return target, tokens, exact, wrong, calls, tokens + [a, b]


def batch_run(case, **kw):
    """`calls` batches of BATCH_N samples over one memory that grows: the first
    two tokens of every sample counted, and the memory stats summed."""
    target, tokens, _, _, calls, doc = case
    memory = pyspec.Memory(1)
    memory.add(doc)
    spec = pyspec.SpeculativeDecoder(target, policy="fixed", draft_max=2, memory=memory)
    counts: dict = {}
    totals = dict(memory_rounds=0, memory_drafted=0, memory_accepted=0, drafted=0)
    for i in range(calls):
        out = spec.generate(tokens, n=BATCH_N, max_tokens=3, seed=81_000 + i, **TARGET, **kw)
        for c in out.choices:
            key = tuple(c.tokens[:2])
            counts[key] = counts.get(key, 0) + 1
            for k in totals:
                totals[k] += getattr(c.stats, k)
    assert memory.n_documents == 1 + BATCH_N * calls, "finished samples must join the shared memory"
    n = BATCH_N * calls
    assert totals["memory_rounds"] >= n // 2, f"the memory path did not fire in the batch: {totals}"
    assert 0 < totals["memory_accepted"] < totals["memory_drafted"], totals
    return counts, totals, n


def test_suffix_drafting_from_shared_memory_in_a_batch_is_lossless(batch_case):
    _, _, exact, _, _, _ = batch_case
    counts, totals, n = batch_run(batch_case)
    assert_law(counts, exact, n, "suffix/memory batch", note=str(totals))


def test_negative_control_broken_residual_in_a_batch_with_memory(batch_case):
    _, _, exact, _, _, _ = batch_case
    counts, totals, n = batch_run(batch_case, _test=TestControls(variant="residual_is_p"))
    # The stated law is the lone path's; here the drafts follow a memory that grows, so it is a sizing, not a fit.
    assert_law(counts, exact, n, "suffix/memory batch residual=p", control=True, note=str(totals))
