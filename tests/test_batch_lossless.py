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
from pyspec import Sampling, _core

from chisquare import assert_law, power, required_n
from laws import (TARGET, draft_row, exact_distribution, independent_pair, lookup_proposal, next_row, one_hot,
                  residual_is_p_row, support_of, target_rows)
from pyspec.request import Request
from pyspec.testing import TestControls

# Exact laws from single-token rows: bit-exact batch rows presumed (conftest skips these on GPU builds).
pytestmark = pytest.mark.bitexact

PROMPT = "one two three one two three one two"
GREEDY_DRAFT = dict(draft_sampling=Sampling(**{**TARGET, "temperature": 0.0}))
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
    counts, _ = joint(spec, tokens, n, _test=TestControls(variant="residual_is_p"))
    assert_law(counts, exact, n, "batch residual=p", control=True)


def pin_joint_costs(spec) -> None:
    """Both samples' auto policies on a curve whose 3 and 4 rows cost what 2 do:
    the joint plan (issue 12: free rows allotted across the batch's sequences)
    gives each sample a one-token draft. Re-pinned before each sample: every
    round refines the estimates from real timings."""
    for slot in range(2):
        policy = spec.policy_object("auto", draft_max=2, key=slot)
        policy.calibrated([1, 2, 3, 4], [100.0, 100.0, 100.0, 100.0], fresh=False)
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
    counts, _, _ = joint_plan_run(spec, tokens, n, _test=TestControls(variant="residual_is_p"))
    assert_law(counts, exact, n, "joint plan, residual=p", control=True)


def test_negative_control_samples_on_one_stream(case, n_shared):
    spec, tokens, exact, _, wrong_shared, _ = case
    n = n_shared
    assert power(exact, wrong_shared, n, len(exact) - 1) > 0.99
    counts, _ = joint(spec, tokens, n, _test=TestControls(shared_stream=True))
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
    counts, _ = joint(spec, tokens, n, _test=TestControls(variant="residual_is_p"), **GREEDY_DRAFT)
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
    shared = target.session_params(_test=TestControls(variant=variant))
    pool = _core.ConsensusPool(3)
    drafters = [_core.ConsensusDrafter(pool, j, target.n_vocab, 1, 16) for j in range(3)]
    # One token a round each (a sequence drafts through its policy; without one it is plain).
    fixed1 = [_core.make_policy(_core.PolicyParams(name="fixed", draft_max=1)) for _ in range(3)]
    counts: dict = {}
    fired = 0
    with target.engine.session(shared) as s:
        leader = s.add(tokens, _core.SequenceParams(max_tokens=4000, sampling=greedy, draft_sampling=greedy),
                       drafter=drafters[0], policy=fixed1[0])
        for _ in range(4):
            s.step()
        for i in range(n):
            joined = []
            for j in (1, 2):
                p = _core.SequenceParams(max_tokens=2, sampling=_core.SamplingParams(**SIBLING_SAMPLING),
                                          draft_sampling=greedy, seed=70_000 + i)
                joined.append(s.add(tokens, p, drafter=drafters[j], policy=fixed1[j], stream=j))
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



# A draft model spared in a batch (issue 34, BatchSession::draft_model_may_pay):
# on costs where a batch's rows are dear, sample B's policy judges the draft
# model unable to pay beside sample A, so B's prompt is not processed on it.
# A ends after one token; B, alone in round 2, drafts one token from the draft
# model, which first catches up on the prompt and B's first token. The law of
# B's two tokens must be the target's p0(a) p1(b | a); the control (residual =
# p) then gives p0(a) [min(p1, q1) + (1 - beta) p1](b), q1 the greedy draft's
# one-hot after a.
DEAR_ROWS = {1: 1.0, 2: 1.05, 4: 2.2, 8: 4.4, 16: 8.8, 32: 17.6, 64: 35.2}  # batch cost in steps
STEP_S = 0.01


@pytest.fixture(scope="module")
def spared_case(gemma_path, load_model, tmp_path_factory):
    env = pytest.MonkeyPatch()
    env.setenv("PYSPEC_CACHE", str(tmp_path_factory.mktemp("spared")))  # the made-up costs stay out of the shared cache
    target = load_model(gemma_path, n_ctx=256, n_seq_max=2)
    draft = load_model(gemma_path, "draft", n_ctx=256, n_seq_max=2)
    lone = load_model(gemma_path, n_ctx=256)
    tokens = target.tokenize(PROMPT)
    p0, p1 = target_rows(lone, tokens)
    exact = exact_distribution(lone, p0, p1)
    wrong = {}
    for a in support_of(p0):
        q1 = draft_row(lone, list(tokens) + [a], GREEDY_DRAFT)
        row = residual_is_p_row(p1[a], q1)
        for b in support_of(row):
            wrong[(a, b)] = float(p0[a] * row[b])
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="auto", draft_max=1)
    for j in (0, 1):
        policy = spec.policy_object(key=j)
        sizes = policy.calibration_sizes(_core.calibration_rows(policy.draft_max, target.native.n_batch, 2))
        policy.calibrated(sizes, [DEAR_ROWS[k] * STEP_S for k in sizes], fresh=False)
        policy.recorded_draft_cost(0.05 * STEP_S)
        policy.clock = False  # decisions from the costs alone, however the rounds' times fall
        policy.learn_costs = False
    n = max(MIN_N, required_n(exact, wrong))
    yield spec, draft, tokens, exact, wrong, n
    env.undo()


def spared_samples(spec, draft, tokens, n, variant="correct"):
    """n trials of A (1 token) and B (3 tokens) in one session: B's first two
    tokens; how many trials spared B's draft model its prompt, and drafted after."""
    counts: dict = {}
    spared = drafted = 0
    for i in range(n):
        spec.clear_cache()  # the draft model's sequence 1 holds the last trial's catch-up
        with spec.open_session(lambda *a: True, _test=TestControls(variant=variant)) as s:
            handles = []
            for slot, max_tokens in ((0, 1), (1, 3)):
                request = Request(tuple(tokens), Sampling(**TARGET), spec.drafting(draft_max=1, **GREEDY_DRAFT),
                                  max_tokens=max_tokens)
                setup = spec.setup(request, seed=60_000 + i, slots=[slot], drafters="slots")[0]
                handles.append(s.add(tokens, setup.params, drafter=setup.drafter, policy=setup.policy,
                                     stream=slot, slot=slot))
            s.step()
            spared += draft.native.cached(1) == []
            while s.step():
                pass
            b = dict(s.take_finished())[handles[1]]
        key = tuple(b.tokens[:2])
        counts[key] = counts.get(key, 0) + 1
        drafted += b.stats.drafted > 0
    return counts, spared, drafted


def test_a_spared_draft_model_that_drafts_later_keeps_the_law(spared_case):
    spec, draft, tokens, exact, wrong, n = spared_case
    assert power(exact, wrong, n) > 0.99
    counts, spared, drafted = spared_samples(spec, draft, tokens, n)
    assert spared == n, f"the draft model processed B's prompt beside A in {n - spared} of {n} trials"
    assert drafted >= 0.9 * n, f"B drafted after catching up in only {drafted} of {n} trials"
    assert_law(counts, exact, n, "spared draft model", note=f"spared={spared} drafted={drafted}/{n}")


def test_negative_control_broken_residual_after_a_spared_draft_model(spared_case):
    spec, draft, tokens, exact, _, n = spared_case
    counts, _, drafted = spared_samples(spec, draft, tokens, n, variant="residual_is_p")
    assert drafted >= 0.9 * n
    assert_law(counts, exact, n, "spared draft model, residual=p", control=True)
