"""Batched speculative decoding keeps every sample's law, and samples are
independent: for n = 2 samples of one prompt at T = 1, the joint law of
(first token of sample 1, first token of sample 2) is the product of the
target's marginals p0 x p0 (9 cells under top-k 3).

Drafting fires at the first token: the consensus drafter (the default for
n > 1) has no sibling text yet there and falls back to its own n-gram lookup,
which on a prompt that repeats proposes "three" (one-hot q), so both samples'
first tokens go through the batched verification (one decode with both
sequences' rows).

The draft model: both samples draft in their own sequences of the draft
model's context, together (one draft decode per position). It drafts greedily
(q one-hot on its argmax x, far from p, so the residual matters most); the
broken residual then gives each first token p0(x)[y = x] + (1 - p0(x)) p0(y).

Sibling drafts: in a running batch (a BatchSession), a leader sample is a few
tokens ahead and two more samples of the same prompt join; their first drafts
are copied from the leader's text (the consensus path proper), and the joint
law of their first tokens must again be p0 x p0, the control again rejected.

Negative controls the same test must reject, each N from a power calculation
(power > 0.99 at alpha = 0.001) against its stated wrong law:
  * the broken residual (residual = p) in the batched path: each first token
    then follows P(y) = p0(x)[y = x] + (1 - p0(x)) p0(y);
  * the two samples on one random stream (correlated): both draw the same
    token, a law on the diagonal (its own, smaller N).
"""

from __future__ import annotations

import pytest

import pyspec
from pyspec import _core

from chisquare import assert_law, power, required_n
from laws import (TARGET, draft_row, independent_pair, lookup_proposal, next_row, one_hot, residual_is_p_row,
                  support_of, target_rows)

PROMPT = "one two three one two three one two"
GREEDY_DRAFT = dict(draft_temperature=0.0)
MIN_N = 200


@pytest.fixture(scope="module")
def case(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, n_seq_max=2, seed=0)
    tokens = target.tokenize(PROMPT)
    p0, _ = target_rows(load_model(gemma_path, n_ctx=256), tokens)  # as the batch runs
    support = support_of(p0)
    exact = independent_pair(p0, support)
    spec = pyspec.SpeculativeDecoder(target, drafter="consensus", policy="fixed", draft_max=1)
    x = lookup_proposal(target, "consensus", tokens, 1)[0]
    wrong_residual = independent_pair(residual_is_p_row(p0, one_hot(x, p0)), support)
    wrong_shared = {(a, a): float(p0[a]) for a in support}
    n = max(MIN_N, required_n(exact, wrong_residual, len(exact) - 1))
    return spec, tokens, exact, wrong_residual, wrong_shared, n


@pytest.fixture(scope="module")
def n_shared(case):
    """The shared-stream law sits on the diagonal: far fewer samples show it. At
    least 60: at N = 30 the power approximation is loose (one machine's kernels
    gave p = 0.0018 against the 0.001 the control must reach)."""
    _, _, exact, _, wrong_shared, _ = case
    return max(60, required_n(exact, wrong_shared, len(exact) - 1))


def joint(spec, tokens, n, **kw):
    counts: dict = {}
    drafted = 0
    for i in range(n):
        out = spec.generate(tokens, n=2, max_tokens=2, seed=90_000 + i, **TARGET, **kw)
        key = (out.choices[0].tokens[0], out.choices[1].tokens[0])
        counts[key] = counts.get(key, 0) + 1
        drafted += sum(c.stats.drafted > 0 for c in out.choices)
    return counts, drafted


def test_two_batched_samples_are_independent_draws_of_the_target(case):
    spec, tokens, exact, wrong, _, n = case
    assert power(exact, wrong, n, len(exact) - 1) > 0.99
    counts, drafted = joint(spec, tokens, n)
    assert drafted > n, "the batched verification path did not run"
    assert_law(counts, exact, n, "batch n=2 consensus", note=f"drafted={drafted}/{2 * n}")


def test_negative_control_broken_residual_in_the_batched_path(case):
    spec, tokens, exact, _, _, n = case
    counts, _ = joint(spec, tokens, n, _test=dict(variant="residual_is_p"))
    assert_law(counts, exact, n, "batch residual=p", control=True)


def pin_joint_costs(spec) -> None:
    """Both samples' auto policies on a curve whose 3 and 4 rows cost what 2 do:
    the joint plan (issue 12: free rows allotted across the batch's sequences)
    gives each sample a one-token draft. Re-pinned before each sample: every
    round refines the estimates from real timings."""
    for slot in range(2):
        policy = spec.policy_object("auto", draft_max=2, key=slot)
        policy.calibrated([1, 2, 3, 4], [100.0, 100.0, 100.0, 100.0])
        policy.clock = False  # pinned costs model another machine; the clock would judge this one


def joint_plan_run(spec, tokens, n, **kw):
    counts: dict = {}
    drafted = joint_rounds = 0
    for i in range(n):
        pin_joint_costs(spec)
        out = spec.generate(tokens, n=2, max_tokens=2, seed=95_000 + i, policy="auto", draft_max=2, **TARGET, **kw)
        key = (out.choices[0].tokens[0], out.choices[1].tokens[0])
        counts[key] = counts.get(key, 0) + 1
        drafted += sum(c.stats.drafted > 0 for c in out.choices)
        joint_rounds += out.stats.joint_rounds
    assert joint_rounds >= n, "the joint plan did not allot the drafts"
    assert drafted > n, "too few samples drafted for the test to exercise verification"
    return counts, drafted, joint_rounds


def test_jointly_planned_drafts_keep_two_samples_independent_draws(case):
    """auto in a batch: the session allots the drafts of all sequences at once
    (plans_jointly); the joint law must not move."""
    spec, tokens, exact, wrong, _, n = case
    counts, drafted, joint_rounds = joint_plan_run(spec, tokens, n)
    assert_law(counts, exact, n, "batch n=2 joint plan", note=f"drafted={drafted}/{2 * n} joint rounds={joint_rounds}")


def test_negative_control_broken_residual_under_the_joint_plan(case):
    spec, tokens, exact, _, _, n = case
    counts, _, _ = joint_plan_run(spec, tokens, n, _test=dict(variant="residual_is_p"))
    assert_law(counts, exact, n, "joint plan, residual=p", control=True)


def test_negative_control_samples_on_one_stream(case, n_shared):
    spec, tokens, exact, _, wrong_shared, _ = case
    n = n_shared
    assert power(exact, wrong_shared, n, len(exact) - 1) > 0.99
    counts, _ = joint(spec, tokens, n, _test=dict(shared_stream=True))
    assert_law(counts, exact, n, "shared stream", control=True)


@pytest.fixture(scope="module")
def model_case(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, n_seq_max=2, seed=0)
    draft = load_model(gemma_path, "draft", n_ctx=256, n_seq_max=2)
    tokens = target.tokenize(PROMPT)
    lone = load_model(gemma_path, n_ctx=256)
    p0, _ = target_rows(lone, tokens)
    q0 = draft_row(lone, tokens, GREEDY_DRAFT)  # the draft shares the target's weights: one-hot on its argmax
    support = support_of(p0)
    exact = independent_pair(p0, support)
    wrong = independent_pair(residual_is_p_row(p0, q0), support)
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=1)
    return spec, tokens, exact, wrong, max(MIN_N, required_n(exact, wrong))


def test_two_samples_drafting_with_a_draft_model_are_independent_draws(model_case):
    spec, tokens, exact, wrong, n = model_case
    assert power(exact, wrong, n) > 0.99
    counts, drafted = joint(spec, tokens, n, **GREEDY_DRAFT)
    assert drafted == 2 * n, "the draft model did not draft every sample's first token"
    assert_law(counts, exact, n, "batch n=2 draft model", note=f"drafted={drafted}/{2 * n}")


def test_negative_control_broken_residual_with_a_draft_model(model_case):
    spec, tokens, exact, _, n = model_case
    counts, _ = joint(spec, tokens, n, _test=dict(variant="residual_is_p"), **GREEDY_DRAFT)
    assert_law(counts, exact, n, "batch draft model, residual=p", control=True)


# Sibling drafts. The leader (greedy) continues "1 2 3 1 2 3 ..." periodically,
# so a joining sample's longest suffix "... 1 2" is found in the leader's text,
# followed by " " (x): that is the joining samples' first draft. T = 5 flattens
# p0 (top-3) so that the broken rule's bias towards x is large.
SIBLING_PROMPT = "1 2 3 1 2 3 1 2 3 1 2 3 1 2"
SIBLING_SAMPLING = dict(temperature=5.0, top_k=3, top_p=1.0, min_p=0.0)


@pytest.fixture(scope="module")
def sibling_case(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=4096, n_seq_max=3)
    tokens = target.tokenize(SIBLING_PROMPT)
    p0 = next_row(load_model(gemma_path, n_ctx=256), tokens, **SIBLING_SAMPLING)
    support = support_of(p0)
    x = target.tokenize(" ", add_special=False)[0]  # the " " between digits
    assert x in support
    exact = independent_pair(p0, support)
    wrong = independent_pair(residual_is_p_row(p0, one_hot(x, p0)), support)
    return target, tokens, exact, wrong, max(60, required_n(exact, wrong))


def joining_samples(target, tokens, n, variant="correct"):
    """n trials: two samples join a batch whose leader is ahead; their first tokens."""
    greedy = _core.SamplingParams(temperature=0)
    shared = _core.GenerateParams(max_tokens=1, sampling=greedy, draft_sampling=greedy, seed=0)
    shared.draft_max = 1
    shared.test = _core.TestControls(variant=variant)
    pool = _core.ConsensusPool(3)
    drafters = [_core.ConsensusDrafter(pool, j, target.n_vocab, 1, 16) for j in range(3)]
    counts: dict = {}
    fired = 0
    with target.engine.session(shared) as s:
        leader = s.add(tokens, _core.GenerateParams(max_tokens=4000, sampling=greedy, draft_sampling=greedy),
                       drafter=drafters[0])
        for _ in range(4):
            s.step()
        for i in range(n):
            joined = []
            for j in (1, 2):
                p = _core.GenerateParams(max_tokens=2, sampling=_core.SamplingParams(**SIBLING_SAMPLING),
                                         draft_sampling=greedy, seed=70_000 + i)
                joined.append(s.add(tokens, p, drafter=drafters[j], stream=j))
            s.step()  # both verify their first draft beside the leader's row
            for h in joined:
                s.cancel(h)
            s.step()
            done = dict(s.take_finished())
            key = (done[joined[0]].tokens[0], done[joined[1]].tokens[0])
            counts[key] = counts.get(key, 0) + 1
            fired += drafters[1].sibling_drafts + drafters[2].sibling_drafts
        s.cancel(leader)
        s.step()
        led = dict(s.take_finished())[leader]
    assert target.detokenize(led.tokens[:12]).startswith(" 3 1 2 3 1 2"), "the leader left its pattern"
    return counts, fired


def test_samples_drafting_from_a_siblings_text_stay_independent_draws(sibling_case):
    target, tokens, exact, wrong, n = sibling_case
    assert power(exact, wrong, n) > 0.99
    counts, fired = joining_samples(target, tokens, n)
    assert fired >= 2 * n - 4, "the joining samples did not draft from the leader's text"
    assert_law(counts, exact, n, "batch n=2 consensus, sibling drafts", note=f"sibling drafts {fired}/{2 * n}")


def test_negative_control_broken_residual_with_sibling_drafts(sibling_case):
    target, tokens, exact, _, n = sibling_case
    counts, fired = joining_samples(target, tokens, n, variant="residual_is_p")
    assert fired >= 2 * n - 4
    assert_law(counts, exact, n, "sibling drafts, residual=p", control=True)

