"""Every length policy and every drafter keeps the target's distribution at T > 0,
with drafts of two tokens and the stop rules actually firing.

What is sampled: the joint law of the first TWO output tokens, so that draft
position 1 counts (a draft-position-1 token becomes the second output token when
position 0 is accepted). The exact target law is enumerated by plain evaluation:
P(a, b) = p0(a) * p1(b | a) (laws.py; with
draft_max = 2 the verification batch has <= 3 tokens, which this build evaluates
with the same kernels as single tokens, so engine and reference see the same p).

Each configuration must also show that the path under test fired: the policy's
stop-before / stop-after decisions (stats.stops_before / stops_after), the
heuristic's changing lengths, n-gram and model rounds of the hybrid drafter.

The wrong law every test must be able to see: the rule this suite was written
against, which discarded a drawn draft token whose belief was below a threshold
(the pre-fix `confidence` and `auto`). Its first-token law is computed exactly:
  P(y) = sum_x q0(x) [q0(x) >= t] (a(x) [x = y] + (1 - a(x)) r(y)) + P(q0(X) < t) p0(y),
a = min(1, p0/q0), r the residual. The chi-square divergence of a joint law from
the target's is at least that of its first-token marginal (data processing), so
the power computed from the marginal, at the joint test's degrees of freedom, is
a lower bound on the joint test's power. N is the smallest size with that power
> 0.99 (at least 200), at alpha = 0.001 per test; the rule itself runs as the
negative control (`_test=TestControls(discard_below=...)`) and must be rejected. For the n-gram
drafter (no beliefs) the stated wrong law is the broken residual (residual = p),
run as its control.

On the pre-fix code (which dropped drawn tokens) the confidence configuration
was rejected (chi2 = 118.9, p = 6e-22 at N = 743, with the draft then at
temperature 0.5). The auto configuration
was not (p = 0.05): its learned belief table soon credits the low-belief tokens
of this prompt, so its old drop path rarely fired; the discard-by-value control
is that path's rule, and it is rejected.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyspec
from pyspec import Sampling

from chisquare import assert_law, power, required_n
from draws import draw
from laws import (PROMPT, TARGET, draft_row, exact_law, lookup_proposal, one_hot, residual_is_p_row,
                  wrong_residual_distribution)
from pyspec.testing import TestControls

# Exact laws from single-token rows: bit-exact batch rows presumed (conftest skips these on GPU builds).
pytestmark = pytest.mark.bitexact

# The draft samples cooler than the target (q sharper than p: q0 = 0.63/0.19/0.18
# against p0 = 0.54/0.24/0.22), so that q != p and beliefs vary; top-k 3 keeps the
# outcome space small. At 0.7 the discard rule's bias needs N = 288 (at 0.5, where
# the rule discards less mass, 0.27 against 0.37: N = 556).
DRAFT = dict(draft_sampling=Sampling(temperature=0.7, top_k=3, top_p=1.0, min_p=0.0))
THRESHOLD = 0.5           # confidence's p_min, and the discard control's threshold
NGRAM_PROMPT = "one two three one two three one two"
MIN_N = 200


def marginal(joint: dict) -> dict:
    out: dict = {}
    for key, v in joint.items():
        out[key[:1]] = out.get(key[:1], 0.0) + v
    return out


def discard_law(p0: np.ndarray, q0: np.ndarray, t: float) -> dict:
    """Exact first-token law of the forbidden discard-by-value rule (module docstring)."""
    accept = np.divide(p0, q0, out=np.ones_like(p0), where=q0 > 0).clip(max=1.0)
    mass = np.maximum(p0 - q0, 0.0)
    resid = mass / mass.sum() if mass.sum() > 0 else p0
    law = np.zeros_like(p0)
    for x in np.flatnonzero(q0):
        if q0[x] < t:
            law += q0[x] * p0
        else:
            law[x] += q0[x] * accept[x]
            law += q0[x] * (1 - accept[x]) * resid
    return {(int(a),): float(law[a]) for a in np.flatnonzero(law)}


def run(spec, tokens, n, pin=None, **kw) -> tuple:
    """n samples of the first two tokens: (counts per outcome, summed stats, samples that drafted).
    Three tokens are generated, so that the first round may draft two (k <= max_tokens - 1)."""
    d = draw(spec, tokens, n, seed0=70_000, max_tokens=3, keep=2, before=pin, **TARGET, **kw)
    return d.counts, d.totals, d.drafting


def pin_costs(spec, seconds) -> None:
    """auto believes a verification batch of 1, 2, 3 tokens costs `seconds`. Such
    pinned costs model another machine, so the clock, which judges this one's wall
    times, is off here (the clock's own tests pin it: pin_clock_suspension)."""
    policy = spec.policy_object()
    policy.calibrated([1, 2, 3], seconds, fresh=False)
    policy.clock = False


def pin_cpu_costs(spec) -> None:
    """auto on CPU-shaped batch costs: V(2) = 1.35 V(1), V(3) = 1.7 V(1), so it
    drafts a first token it believes in with r0 > V(2)/V(1) - 1 = 0.35, plans two
    tokens when it trusts the draft, goes on after the first (V(3)/V(2) = 1.26
    is below (1 + r0 + r0 alpha)/(1 + r0)), and ending a draft early is worth
    something: it stops before a second token whose believed acceptance
    r1 < (1 + r0)(V(3)/V(2) - 1). (At V(2) = 1.5 V(1), r0 had to pass 0.5; on
    one machine's kernels q0 = 0.63/0.19/0.18 gave r0 = 0.45 from the starting
    belief table, and it never drafted.) The steps are pinned at 100 s so that the draft
    model's measured cost (milliseconds, even on a busy machine) is negligible
    next to them. Re-pinned before each sample: every round refines the
    estimates from real timings. The draft model's cost is put on record too (1 ms
    a token, then measured): a three-token answer would not pay to measure it."""
    pin_costs(spec, [100.0, 135.0, 170.0])
    spec.policy_object().recorded_draft_cost(0.001)


@pytest.fixture(scope="module")
def gemma_models(gemma_path, load_model):
    return load_model(gemma_path, n_ctx=256, seed=0), load_model(gemma_path, "draft", n_ctx=256, seed=0)


@pytest.fixture(scope="module")
def model_case(gemma_models):
    """Exact joint law, the discard rule's law and the test size for the model drafter."""
    target, draft = gemma_models
    tokens, p0, p1, exact = exact_law(target, PROMPT)
    wrong = discard_law(p0, draft_row(draft, tokens, DRAFT), THRESHOLD)
    n = max(MIN_N, required_n(marginal(exact), wrong, max(len(exact) - 1, 1)))
    return tokens, exact, wrong, n


# Per policy: its settings, and what must have fired.
POLICY_CASES = {
    "fixed": dict(kw={}, fired=lambda t: t["length_hist"][2] > 0),
    "heuristic": dict(kw={}, fired=lambda t: t["length_hist"][1] > 0 and t["length_hist"][2] > 0),
    "confidence": dict(kw=dict(p_min=0.6), fired=lambda t: t["stops_before"] > 0 and t["length_hist"][2] > 0),
    # SVIP's entropy rule ends round 1 right after its first token here (H(q0) = 0.92
    # nats: sqrt(0.15 H) = 0.37 > 0.3), keeping it.
    "svip": dict(kw={}, fired=lambda t: t["stops_after"] > 0 and t["length_hist"][1] > 0),
    "auto": dict(kw={}, fired=lambda t: t["stops_before"] > 0 and t["drafted"] > 0),
}


# The default policy in the default tier; the others (each ~50 s) in the slow tier,
# which a change to the policies runs before its issue is resolved (docs/testing.md).
@pytest.mark.parametrize("policy", [p if p == "auto" else pytest.param(p, marks=pytest.mark.slow)
                                    for p in POLICY_CASES])
def test_model_drafter_policy_is_lossless(gemma_models, model_case, policy):
    target, draft = gemma_models
    tokens, exact, wrong, n = model_case
    case = POLICY_CASES[policy]
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy=policy, draft_max=2)
    assert power(marginal(exact), wrong, n, max(len(exact) - 1, 1)) > 0.99
    pin = pin_cpu_costs if policy == "auto" else None
    counts, totals, drafting = run(spec, tokens, n, pin=pin, **DRAFT, **case["kw"])
    assert case["fired"](totals), f"the {policy} path under test did not fire: {totals}"
    assert drafting >= n // 4, "too few samples drafted for the test to exercise verification"
    assert_law(counts, exact, n, f"model/{policy}", note=f"{totals} drafting={drafting}")


def test_negative_control_discarding_drawn_tokens_is_caught(gemma_models, model_case):
    """The pre-fix rule (confidence's and auto's drop path): discard a drawn token
    whose belief is below THRESHOLD. Run under `confidence`, whose drafts of two
    tokens it then cuts; the same N as the tests above must reject it."""
    target, draft = gemma_models
    tokens, exact, wrong, n = model_case
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="confidence", draft_max=2)
    counts, totals, _ = run(spec, tokens, n, _test=TestControls(discard_below=THRESHOLD), **DRAFT)
    assert totals["stops_after"] > 0 or totals["length_hist"][0] > 0, "nothing was discarded"
    assert_law(counts, exact, n, "discard-by-value", control=True, note=str(totals))


# ------------------------------------------------------------------ n-gram and hybrid

@pytest.fixture(scope="module")
def ngram_case(gemma_models):
    target, _ = gemma_models
    tokens, p0, p1, exact = exact_law(target, NGRAM_PROMPT)
    proposal = lookup_proposal(target, "ngram", tokens, 2)
    assert len(proposal) == 2, "the prompt must give the n-gram drafter a two-token proposal"
    wrong = wrong_residual_distribution(target, p0, one_hot(proposal[0], p0), p1)
    n = max(MIN_N, required_n(exact, wrong, max(len(exact) - 1, 1)))
    return tokens, exact, wrong, n


def pin_for_ngram(spec) -> None:
    """auto with verification as cheap as a step, so that it drafts by lookup."""
    pin_costs(spec, [100.0, 100.0, 100.0])


@pytest.mark.parametrize("drafter, policy", [pytest.param("ngram", "fixed", marks=pytest.mark.slow),
                                             ("ngram", "auto"), ("hybrid", "auto"),
                                             pytest.param("hybrid", "confidence", marks=pytest.mark.slow)])
def test_ngram_and_hybrid_are_lossless(gemma_models, ngram_case, drafter, policy):
    target, draft = gemma_models
    tokens, exact, wrong, n = ngram_case
    # No memory: its copies of the earlier runs would take every round from the model
    # (memory drafting has its own tests: test_suffix_lossless.py).
    spec = pyspec.SpeculativeDecoder(target, draft if drafter == "hybrid" else None, drafter=drafter,
                                     policy=policy, draft_max=2, memory=False)
    assert power(exact, wrong, n, max(len(exact) - 1, 1)) > 0.99
    pin = pin_for_ngram if policy == "auto" else None
    kw = dict(DRAFT) if drafter == "hybrid" else {}
    if policy == "confidence":  # at its default p_min (0.75) it never trusts this draft (q0 = 0.63): no model round
        kw.update(POLICY_CASES["confidence"]["kw"])
    counts, totals, drafting = run(spec, tokens, n, pin=pin, **kw)
    assert totals["ngram_rounds"] > 0 and drafting >= n // 2
    if drafter == "ngram":  # the copy cursor's re-anchoring after a rejected token drafted too
        assert totals["ngram_reanchored"] > 0, totals
    if drafter == "hybrid":
        model_rounds = totals["rounds"] - totals["length_hist"][0] - totals["ngram_rounds"]
        assert model_rounds > 0, "the hybrid drafter never fell back to the model"
    assert_law(counts, exact, n, f"{drafter}/{policy}", note=f"{totals} drafting={drafting}")


def test_negative_control_ngram_broken_residual_two_tokens(gemma_models, ngram_case):
    target, _ = gemma_models
    tokens, exact, _, n = ngram_case
    spec = pyspec.SpeculativeDecoder(target, drafter="ngram", policy="fixed", draft_max=2)
    counts, totals, _ = run(spec, tokens, n, _test=TestControls(variant="residual_is_p"))
    assert totals["ngram_reanchored"] > 0, "the re-anchoring path did not run under the control"
    assert_law(counts, exact, n, "ngram residual=p, draft_max=2", control=True)


# ------------------------------------------------ a drafter named in the call
# generate(drafter=...) on a decoder whose own drafter is another one takes the
# batch path (issue 50; before that the name was ignored). The decoder's own
# drafter is the suffix drafter with a memory that holds the prompt followed by
# another token than the one the prompt's own n-gram lookup proposes: the two
# drafters propose different first tokens, and which one drafted shows, greedy
# in whether the first token was a kept draft, and at T > 0 in the broken
# residual's law, which holds the proposal. One-token drafts, and the first
# token's law alone: p0, and under the bug
#     P(x) = p0(d) [x = d] + (1 - p0(d)) p0(x)   (d the n-gram drafter's proposal).

@pytest.fixture(scope="module")
def named_drafter_case(gemma_models):
    target, _ = gemma_models
    tokens, p0, _, _ = exact_law(target, NGRAM_PROMPT)
    d = lookup_proposal(target, "ngram", tokens, 1)[0]
    assert d == int(np.argmax(p0)), "the n-gram drafter's proposal must be the greedy token"
    other = next(int(x) for x in np.argsort(p0)[::-1] if int(x) != d)  # what the memory says comes next
    memory = pyspec.Memory(1)

    def remember(_spec=None):  # a generation adds its text to memory: the one document again
        memory.clear()
        memory.add(tokens + [other])

    exact = {(int(x),): float(p0[x]) for x in np.flatnonzero(p0)}
    bug = residual_is_p_row(p0, one_hot(d, p0))
    wrong = {(int(x),): float(bug[x]) for x in np.flatnonzero(p0)}
    n = max(MIN_N, required_n(exact, wrong))
    spec = pyspec.SpeculativeDecoder(target, policy="fixed", draft_max=1, memory=memory)
    assert spec.drafter == "suffix"
    return spec, tokens, d, other, remember, exact, wrong, n


def test_a_drafter_named_in_the_call_drafts(named_drafter_case):
    """Greedy: named, the n-gram drafter proposes the greedy token, kept; the
    control, the decoder's own suffix drafter, proposes the memory's token,
    rejected."""
    spec, tokens, d, other, remember, *_ = named_drafter_case
    for drafter, kept in (("ngram", True), (None, False)):
        remember()
        flags = []
        out = spec.generate(tokens, max_tokens=2, temperature=0, drafter=drafter,
                            on_token=lambda text, drafted: flags.append(drafted))
        s = out.stats
        print(f"drafter={drafter}: memory rounds {s.memory_rounds}, lookup rounds {s.ngram_rounds}, "
              f"first kept {flags[0]}")
        assert out.tokens[0] == d and flags[0] is kept, (drafter, out.tokens, flags)
        assert (s.memory_rounds > 0) is (drafter is None), "the drafter that ran is not the one named"


def named_run(case, **kw):
    spec, tokens, d, other, remember, exact, wrong, n = case
    dr = draw(spec, tokens, n, seed0=73_000, max_tokens=2, keep=1, before=remember, drafter="ngram", **TARGET, **kw)
    t = dr.totals
    assert t["ngram_rounds"] >= n and t["drafted_at"][0] >= n and t["memory_rounds"] == 0, \
        f"not every sample drafted, by lookup in its own text alone {t}"
    return dr


def test_a_drafter_named_in_the_call_is_lossless(named_drafter_case):
    *_, exact, wrong, n = named_drafter_case
    d = named_run(named_drafter_case)
    assert_law(d.counts, exact, n, "ngram named on a suffix decoder", note=f"accepted {d.totals['accepted_at'][:1]}")


def test_negative_control_a_drafter_named_in_the_call_with_the_broken_residual(named_drafter_case):
    """The bug's law holds the n-gram drafter's proposal: samples drafted by the
    decoder's own drafter (the memory's token) would not fit it."""
    *_, exact, wrong, n = named_drafter_case
    d = named_run(named_drafter_case, _test=TestControls(variant="residual_is_p"))
    assert_law(d.counts, exact, n, "ngram named on a suffix decoder, residual = p", control=True, wrong=wrong)


def first_run_sample(spec) -> None:
    """auto as a first run meets it (issue 39): a new policy with no timings on
    record (calibration.prepare is off in the test), so its first round is
    plain and the engine times batch size 2 on the target between rounds 1 and 2
    (calibration_share 1e9: at once). The lookup buckets' acceptance is remembered
    high, so that round 2 drafts: it decides the second token from rows computed
    after the timing decode was dropped from the cache."""
    spec._policies.clear()
    spec.policy_object().remember([0.99] * 7 + [0.0, 0.0])


def first_run(target, tokens, n, monkeypatch, **kw) -> tuple:
    from pyspec import calibration

    monkeypatch.setattr(calibration, "prepare", lambda *a, **k: None)  # nothing on record
    monkeypatch.setattr(calibration, "keep", lambda *a, **k: None)     # and nothing kept
    spec = pyspec.SpeculativeDecoder(target, drafter="ngram", policy="auto", draft_max=2, memory=False)
    spec.calibration_share = 1e9
    # The timed batches report the fastest round's time (the filler decode still
    # runs and is dropped): drafting then pays, whatever this machine's clock says.
    kw["_test"] = kw.get("_test", TestControls()).replace(timing_scale=1.0)
    counts, totals, drafting = run(spec, tokens, n, pin=first_run_sample, **kw)
    # The path under test fired: every sample timed a size between its rounds, and drafted after.
    assert totals["calibrate_s"] > 0 and totals["length_hist"][0] >= n, totals
    assert drafting >= n // 2, f"too few samples drafted after the timing: {drafting}/{n}"
    return counts, totals, drafting


def test_first_run_timing_between_rounds_is_lossless(gemma_models, ngram_case, monkeypatch):
    """Issue 39: batch sizes are timed between rounds (a filler decode on the
    sequence, then dropped), never before the first token. The next round's
    rows must be the same as without it: the two-token law must not move."""
    target, _ = gemma_models
    tokens, exact, _, n = ngram_case
    counts, totals, drafting = first_run(target, tokens, n, monkeypatch)
    assert_law(counts, exact, n, "auto, first run", note=f"{totals} drafting={drafting}")


def test_negative_control_first_run_broken_residual(gemma_models, ngram_case, monkeypatch):
    """The same first-run configuration with the broken residual must be rejected."""
    target, _ = gemma_models
    tokens, exact, _, n = ngram_case
    counts, totals, _ = first_run(target, tokens, n, monkeypatch, _test=TestControls(variant="residual_is_p"))
    assert_law(counts, exact, n, "auto first run, residual=p", control=True)


def pin_guess_costs(spec) -> None:
    """auto with CPU-shaped costs (a 2-token batch costs 1.6 steps): whether a
    lookup pays hangs on its estimated acceptance, which the n-gram's guesses,
    checked for free on plain rounds, keep moving. Both kinds of round run: in
    a trial of 150 samples, 141 drafted and 44 plain rounds checked a guess."""
    pin_costs(spec, [100.0, 160.0, 200.0])


def guess_run(target, tokens, n, **kw) -> tuple:
    spec = pyspec.SpeculativeDecoder(target, drafter="ngram", policy="auto", draft_max=2)
    counts, totals, drafting = run(spec, tokens, n, pin=pin_guess_costs, **kw)
    assert totals["ngram_guesses"] > 0 and totals["ngram_rounds"] > 0, "the guess path or drafting did not run"
    assert drafting >= n // 2, "too few samples drafted for the test to exercise verification"
    return counts, totals


# auto's inner paths (guesses checked on plain rounds; lengths the clock suspended)
# decide a length before any draft is drawn: slow tier, with their controls, which a
# change to the policies runs before its issue is resolved (docs/testing.md).
@pytest.mark.slow
def test_ngram_guess_path_is_lossless(gemma_models, ngram_case):
    """Plain rounds check the n-gram's guess and feed auto; lengths then follow
    that evidence (both paths must run). The output law must not move."""
    target, _ = gemma_models
    tokens, exact, _, n = ngram_case
    counts, totals = guess_run(target, tokens, n)
    assert_law(counts, exact, n, "ngram guesses", note=f"guesses={totals['ngram_guesses']} "
               f"hits={totals['ngram_guess_hits']} drafted rounds={totals['ngram_rounds']}")


@pytest.mark.slow
def test_negative_control_guess_path_broken_residual(gemma_models, ngram_case):
    """The same configuration with the broken residual (residual = p) must be rejected."""
    target, _ = gemma_models
    tokens, exact, _, n = ngram_case
    counts, totals = guess_run(target, tokens, n, _test=TestControls(variant="residual_is_p"))
    assert_law(counts, exact, n, "guess path, residual=p", control=True,
               note=f"guesses={totals['ngram_guesses']} drafted rounds={totals['ngram_rounds']}")


def pin_clock_suspension(spec) -> None:
    """auto with verification as cheap as a step (every lookup draft pays by the
    model), and a clock that has seen two-token lookup drafts lose: a plain round
    of 100 s, then three rounds drafting 2 that kept nothing in 300 s each. The
    kind (lookup, 2-3 tokens) is suspended, and a new generation carries the
    suspension into its first rounds, so the first round drafts 1 token where the
    model would draft 2 (counted in clock_vetoes). The suspending rounds are
    reported on a long match (another acceptance bucket than this prompt's), so
    that the acceptance the model uses here stays this text's own."""
    policy = spec.policy_object()
    policy.observe(0, 0, 0.0, 100.0, "ngram", 20, 1, round_s=100.0, length=0)
    for _ in range(3):
        policy.observe(2, 0, 0.0, 300.0, "ngram", 20, 1, round_s=300.0, length=2)
    policy.calibrated([1, 2, 3], [100.0, 100.0, 100.0], fresh=False)


def clock_run(target, tokens, n, **kw) -> tuple:
    spec = pyspec.SpeculativeDecoder(target, drafter="ngram", policy="auto", draft_max=2)
    counts, totals, drafting = run(spec, tokens, n, pin=pin_clock_suspension, **kw)
    vetoes = spec.policy_object().clock_vetoes
    assert vetoes >= n // 2, f"the clock's suspension did not change the chosen length ({vetoes} vetoes)"
    assert totals["length_hist"][1] > 0 and drafting >= n // 2, f"too few drafts to exercise verification {totals}"
    return counts, totals, vetoes


@pytest.mark.slow
def test_clock_suspension_path_is_lossless(gemma_models, ngram_case):
    """Issue 22: a length the clock has suspended is not chosen, whatever the model
    predicts; that decision is made before a draft is drawn, so the law of the
    output must not move. The path must fire (vetoed rounds, one-token drafts)."""
    target, _ = gemma_models
    tokens, exact, wrong, n = ngram_case
    assert power(exact, wrong, n, max(len(exact) - 1, 1)) > 0.99
    counts, totals, vetoes = clock_run(target, tokens, n)
    assert_law(counts, exact, n, "clock suspension", note=f"vetoes={vetoes} lengths={totals['length_hist']}")


@pytest.mark.slow
def test_negative_control_clock_suspension_broken_residual(gemma_models, ngram_case):
    """The same configuration with the broken residual (residual = p) must be rejected."""
    target, _ = gemma_models
    tokens, exact, _, n = ngram_case
    counts, totals, vetoes = clock_run(target, tokens, n, _test=TestControls(variant="residual_is_p"))
    assert_law(counts, exact, n, "clock suspension, residual=p", control=True, note=f"vetoes={vetoes}")


# A draft cache out of step costs speed, never the output's law (the hybrid's
# chi-square tests above stay in the default tier): slow tier.
@pytest.mark.slow
def test_hybrid_model_rounds_accept_nearly_everything_when_q_equals_p(gemma_models):
    """Draft = target model with the target's own settings: q = p up to rounding,
    so model-drafted tokens are rejected only with probability TV(p, q). A draft
    cache left out of step after n-gram rejections would draft for the wrong
    prefix, and be rejected most of the time: that is what this test catches.
    Not "every" token: the draft catches up after n-gram rounds in batches of
    more than 3 tokens, which this build evaluates with other kernels than the
    target's small verification batches (logits differ by up to ~0.7), so q is
    only close to p. Measured: 130 of 134 accepted on one machine, 45 of 51 on
    another (other SIMD kernels, other rounding); the bound is 80 %, far above
    what a desynchronised draft gets. (24 seeds gave 31 model-drafted tokens on
    the second machine: 48 are run for the 40 checked.)"""
    target, draft = gemma_models
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="hybrid", policy="fixed", draft_max=2)
    prompt = "one two three one two three one two three four five one two three"
    totals = dict(ngram_drafted=0, ngram_accepted=0, model_drafted=0, model_accepted=0)
    for seed in range(48):
        out = spec.generate(prompt, chat=False, max_tokens=40, seed=seed, **TARGET)
        s = out.stats
        totals["ngram_drafted"] += s.ngram_drafted
        totals["ngram_accepted"] += s.ngram_accepted
        totals["model_drafted"] += s.drafted - s.ngram_drafted
        totals["model_accepted"] += s.accepted - s.ngram_accepted
    print(totals)
    assert totals["ngram_drafted"] > totals["ngram_accepted"], "no n-gram rejection: the sync path was not exercised"
    assert totals["model_drafted"] >= 40, "too few model-drafted tokens to check"
    assert totals["model_accepted"] >= 0.8 * totals["model_drafted"]


def test_pyspec_check_covers_the_stop_rule():
    """`pyspec check` runs the real confidence policy's stop-before decision and
    the discard-by-value control; the control must be rejected."""
    from pyspec.tools import check

    raw: list = []
    seeds = iter(range(1, 100))
    check._stop_rule_cases(100_000, lambda: next(seeds), raw)
    kinds = [(label.startswith("NEGATIVE"), "stops before" in label) for label, *_ in raw]
    assert (False, True) in kinds and (False, False) in kinds and (True, False) in kinds
    for label, _, pv, expected in raw:
        assert (pv < 1e-4) == (expected == check.REJECTED), (label, pv)
