"""The infill sampler (cpp/core/infill.h): its rule on hand-made rows over a
real vocabulary (the coder's), the core against an independent reading of the
rule in Python on the coder's real fill-in-the-middle rows, its errors, and
that speculation keeps its law (a chi-square proof with two controls)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import pyspec
from pyspec import fim, sampling

from chisquare import assert_law, assert_power, required_n, simulated_power
from draws import draw
from laws import GEMMA_COLD_DRAFT, PROMPT, TARGET, draft_row, exact_law, wrong_residual_distribution
from pyspec.testing import TestControls

NEG = -np.inf


@pytest.fixture(scope="module")
def coder(draft_path, load_model):
    return load_model(draft_path, n_ctx=1024)


def one_token(model, text: str) -> int:
    ids = model.tokenize(text, add_special=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def row(model, weights: dict) -> np.ndarray:
    """Logits over the vocabulary: log(weight) for the given tokens, -inf elsewhere."""
    lg = np.full(model.native.n_vocab, NEG, dtype=np.float32)
    for t, w in weights.items():
        lg[t] = math.log(w)
    return lg


def reference(model, logits, *, top_k: int, top_p: float = 1.0, temperature: float = 1.0) -> np.ndarray:
    """The rule as docs/editor.md and cpp/core/infill.h state it, written again
    here: top-k, top-p, then steps a-d, then temperature on the survivors."""
    order = sorted(np.flatnonzero(np.isfinite(logits)), key=lambda t: (-logits[t], t))[:top_k]
    e = np.exp(logits[order].astype(np.float64) - logits[order[0]])
    cand = order
    if top_p < 1:  # the smallest prefix whose mass reaches top_p (sampling.h, step 4)
        cum, keep = 0.0, len(order)
        for j, x in enumerate(e):
            cum += x
            if cum >= top_p * e.sum():
                keep = j + 1
                break
        cand = order[:keep]
    p = np.exp(logits[cand].astype(np.float64) - logits[cand[0]])
    p /= p.sum()
    eog = np.array([model.native.is_eog(int(t)) for t in cand])
    pieces = [model.native.token_to_piece(int(t)) for t in cand]
    if 3 * p[eog].sum() * len(cand) > p[~eog].sum():
        keep = list(np.flatnonzero(eog))
    else:
        mass, gone = p.copy(), [False] * len(cand)
        for i0 in range(len(cand)):
            for i1 in range(len(cand)):
                if gone[i0]:
                    break
                if i1 == i0 or gone[i1] or not pieces[i0] or not pieces[i1].startswith(pieces[i0]):
                    continue
                keep, drop = (i1, i0) if mass[i1] > mass[i0] else (i0, i1)  # ties: the earlier stays
                mass[keep] += mass[drop]
                mass[drop], gone[drop] = 0.0, True
        keep = [i for i in range(len(cand)) if eog[i] or mass[i] >= 0.2]
        n_text = sum(not eog[i] for i in keep)
        out = np.zeros(len(logits))
        if n_text == 0:
            out[model.native.infill_vocab().end] = 1.0
            return out
        total = sum(mass[i] for i in keep)
        keep = [i for i in keep if eog[i] or mass[i] / total >= 1 / (n_text + 1)]
    out = np.zeros(len(logits))
    ids = [int(cand[i]) for i in keep]
    if temperature == 0:
        out[min(ids, key=lambda t: (-logits[t], t))] = 1.0
        return out
    w = np.exp((logits[ids].astype(np.float64) - max(logits[ids])) / temperature)
    out[ids] = w / w.sum()
    return out


def test_tokens_sharing_a_prefix_count_as_one_choice(coder):
    ret, return_, x = (one_token(coder, t) for t in (" ret", " return", " x"))
    got = sampling.distribution(row(coder, {ret: 0.30, return_: 0.26, x: 0.44}), top_k=40, infill=coder)
    # " ret" (0.30) takes " return"'s mass: 0.56 against " x"'s 0.44, both kept;
    # the survivors are then drawn by their own logits.
    assert np.flatnonzero(got).tolist() == sorted([ret, x])
    assert got[ret] == pytest.approx(0.30 / 0.74) and got[x] == pytest.approx(0.44 / 0.74)
    # Control: three tokens sharing no prefix, the same masses: all three stay.
    a, b, c = (one_token(coder, t) for t in (" a", " b", " c"))
    apart = sampling.distribution(row(coder, {a: 0.30, b: 0.26, c: 0.44}), top_k=40, infill=coder)
    assert np.flatnonzero(apart).tolist() == sorted([a, b, c])


def test_a_likely_end_ends_and_nothing_likely_ends_too(coder):
    eot, a, b = coder.native.eot, one_token(coder, " a"), one_token(coder, " b")
    end = sampling.distribution(row(coder, {eot: 0.15, a: 0.45, b: 0.40}), top_k=40, infill=coder)
    assert np.flatnonzero(end).tolist() == [eot]  # 3 * 0.15 * 3 > 0.85
    goes_on = sampling.distribution(row(coder, {eot: 0.05, a: 0.50, b: 0.45}), top_k=40, infill=coder)
    assert goes_on[eot] > 0 and goes_on[a] > 0 and goes_on[b] > 0  # 3 * 0.05 * 3 < 0.95: the end stays a choice
    # Greedy takes the argmax of what is left, not of the row.
    assert np.flatnonzero(sampling.distribution(row(coder, {eot: 0.15, a: 0.45, b: 0.40}), temperature=0,
                                                top_k=40, infill=coder)).tolist() == [eot]
    end = coder.native.infill_vocab().end
    flat = {one_token(coder, t): 1 / 6 for t in (" a", " b", " c", " d", " e", " f")}
    flat[end] = 0.001  # the end allowed, unlikely: 3 * 0.001 * 7 is no end branch; no text reaches 0.2
    assert np.flatnonzero(sampling.distribution(row(coder, flat), top_k=40, infill=coder)).tolist() == [end]
    c = one_token(coder, " c")
    second = sampling.distribution(row(coder, {a: 0.55, b: 0.24, c: 0.21}), top_k=40, infill=coder)
    assert np.flatnonzero(second).tolist() == [a]  # all pass 0.2; then 1/(3 + 1) keeps 0.55 only
    # 1/(n + 1), not 1/n: 0.28 stays (>= 1/4); a floor of 1/3 would keep 0.40 alone.
    three = sampling.distribution(row(coder, {a: 0.40, b: 0.32, c: 0.28}), top_k=40, infill=coder)
    assert np.flatnonzero(three).tolist() == sorted([a, b, c])


def test_a_forbidden_end_leaves_the_row_and_a_tiny_temperature_weighs_the_survivors(coder):
    """Where nothing is likely enough but the row forbids the end token (a
    constraint's mask: -inf), the step leaves the candidates as they came; and
    when it removes the row's max (the end branch), a tiny temperature still
    gives a distribution over what is left, not an underflow."""
    flat = {one_token(coder, t): 1 / 6 for t in (" a", " b", " c", " d", " e", " f")}
    lg = row(coder, flat)
    assert lg[coder.native.infill_vocab().end] == NEG
    kept = sampling.distribution(lg, top_k=40, infill=coder)
    assert sorted(np.flatnonzero(kept).tolist()) == sorted(flat)
    a, eot = one_token(coder, " a"), coder.native.eot
    lg = row(coder, {a: 0.80, eot: 0.20})  # 3 * 0.20 * 2 > 0.80: the end branch removes " a", the max
    cold = sampling.distribution(lg, temperature=0.001, top_k=40, infill=coder)
    assert np.flatnonzero(cold).tolist() == [eot] and cold.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("temperature", [1.0, 0.0, 0.7])
def test_the_core_follows_the_rule_on_real_rows(coder, temperature):
    """Fill-in-the-middle rows of the coder (prefixes typed along a function):
    the core's distribution equals :func:`reference` on every row; sampled,
    the step acted on several of them (the rows without it differ). Greedy
    rows it rarely changes: test_a_likely_end_ends... has one it does."""
    prefix, suffix = "import os\n\n\ndef read(path):\n", "\n\n\ndef write(path, text):\n    pass\n"
    core, changed = coder.native, 0
    typed = "    with open(path) as f:\n        return f.read()"
    for cut in range(4, len(typed), 3):
        p = fim.build(coder, prefix, suffix, typed=typed[:cut], healing=False)
        core.truncate(0)
        core.decode(p.tokens, 0, 1)
        lg = np.array(core.logits(0), dtype=np.float32)
        core.truncate(0)
        got = sampling.distribution(lg, temperature=temperature, top_k=40, top_p=0.9, infill=coder)
        np.testing.assert_allclose(got, reference(coder, lg, top_k=40, top_p=0.9, temperature=temperature),
                                   atol=1e-9, err_msg=repr(typed[:cut]))
        changed += not np.allclose(got, sampling.distribution(lg, temperature=temperature, top_k=40, top_p=0.9))
    assert temperature == 0 or changed >= 3, f"the infill step changed {changed} rows"


def test_bad_settings_are_clear_errors(coder):
    lg = row(coder, {one_token(coder, " a"): 1.0})
    for top_k in (0, 257):
        with pytest.raises(ValueError, match="infill sampler needs top_k in 1..256"):
            sampling.distribution(lg, top_k=top_k, infill=coder)
        with pytest.raises(ValueError, match="infill sampler needs top_k"):
            coder.generate("def f():", chat=False, max_tokens=1, top_k=top_k, infill=True)


@pytest.fixture(scope="module")
def gemma_pair(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, seed=0)
    draft = load_model(gemma_path, "draft", n_ctx=256, seed=0)
    return target, pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=1)


@pytest.mark.parametrize("variant", ["correct", "residual_is_p", "infill_off"])
def test_speculation_keeps_the_infill_law(gemma_pair, variant):
    """Gemma drafting for itself (draft at T = 0.5, top-k 8, no infill) under the
    target's TARGET settings plus the infill sampler: the two-token law is the
    infill law (after " weather today is" it keeps 2 of top-k's 3 tokens:
    asserted, so the step acts). alpha = 0.001; N = 1.2 x what power > 0.99
    needs against the broken-residual law. Controls, rejected at the same
    level: that broken residual; and generations without the infill step,
    judged against the infill law (N = 100; a fifth of their mass falls
    outside its support, where the noncentral approximation means nothing: the
    Monte Carlo power is checked)."""
    target, spec = gemma_pair
    tokens, p0, p1, exact = exact_law(target, PROMPT, infill=True)
    plain = exact_law(target, PROMPT)[3]
    assert np.count_nonzero(p0) >= 2 and set(exact) < set(plain), "the infill step did not act on this law"
    wrong = wrong_residual_distribution(target, p0, draft_row(spec.draft, tokens, GEMMA_COLD_DRAFT), p1)
    if variant == "infill_off":
        n = 100
        assert simulated_power(exact, plain, n) > 0.99, "the control's N is too small"
    else:
        n = math.ceil(1.2 * required_n(exact, wrong))
        assert_power(exact, wrong, n, "infill law vs residual=p")
    d = draw(spec, tokens, n, seed0=20_000, draft_max=1, infill=variant != "infill_off",
             _test=TestControls(variant="residual_is_p" if variant == "residual_is_p" else "correct"),
             **TARGET, **GEMMA_COLD_DRAFT)
    assert d.drafting == n, f"{d.drafting} of {n} generations drafted"
    if variant == "correct":
        assert_law(d.counts, exact, n, "infill sampler, speculative", note=f"outcomes={len(exact)}")
    else:
        assert_law(d.counts, exact, n, f"infill sampler, {variant}", control=True)
