"""Several sequences in one context (the ground the batched engine stands on):
rows of different sequences in one llama_decode, a prompt shared by copying,
sequences truncated independently, and bad requests refused without damage.

Rows decoded together equal rows decoded alone: compared through their
sampling distributions at T = 1 (every probability within TOL, the same most
likely token), both contexts without flash attention, whose prompt rows on the
small model match that closely (with it, a prompt's rows move by up to 0.025
in probability when another prompt's rows share the batch: the CPU kernel's
path depends on the rows in the batch). The reference rows are checked to have
no near tie, so a flip would fail loudly instead of flaking.

Flash attention is the default with several sequences too (cpp/model/model.cpp
says why): a decode step's logits are then bit-identical whatever the other
sequences hold.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyspec import ContextOverflowError, _core

# Exact laws from single-token rows: bit-exact batch rows presumed (conftest skips these on GPU builds).
pytestmark = pytest.mark.bitexact

TOL = 2e-3
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    if n <"]


def probs(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


def assert_same_row(got: np.ndarray, want: np.ndarray) -> None:
    p, q = probs(got), probs(want)
    top2 = np.sort(q)[-2:]
    assert top2[1] - top2[0] > 10 * TOL, "near tie in the reference row: pick another prompt"
    assert int(p.argmax()) == int(q.argmax())
    assert float(np.abs(p - q).max()) < TOL


@pytest.fixture(scope="module")
def multi(gemma_path):
    return _core.Model(gemma_path, n_ctx=512, n_seq_max=4, flash_attn=0)


@pytest.fixture(scope="module")
def single(gemma_path):
    return _core.Model(gemma_path, n_ctx=512, n_seq_max=1, flash_attn=0)


def alone(model, tokens) -> np.ndarray:
    model.truncate(0)
    model.decode(tokens, 0, 1)
    return model.logits(0)


def clear(model) -> None:
    for s in range(model.n_seq):
        model.truncate(0, s)


def test_context_reports_its_sequences(multi, single):
    assert multi.n_seq == 4 and single.n_seq == 1
    assert multi.flash_attn == 0


def test_several_sequences_run_flash_attention_as_llama_cpp_chooses(gemma_path):
    lone = _core.Model(gemma_path, n_ctx=64)
    many = _core.Model(gemma_path, n_ctx=512, n_seq_max=4)
    assert many.flash_attn == lone.flash_attn != -1


def test_a_rows_logits_do_not_depend_on_the_other_sequences(gemma_path):
    """With flash attention (the default), one decode step of sequence 0 beside
    three others gives the same logits, bit for bit, whatever the others hold:
    other tokens, or caches three times longer (a wider attention span)."""
    model = _core.Model(gemma_path, n_ctx=1024, n_seq_max=4, flash_attn=1)
    prompt = model.tokenize(PROMPTS[0])

    def step(other_token: int, other_len: int) -> np.ndarray:
        clear(model)
        model.decode_rows([(0, i, t, False) for i, t in enumerate(prompt)])
        for s in range(1, 4):
            model.decode_rows([(s, i, 300 + (7 * i + s) % 500, False) for i in range(other_len)])
        model.decode_rows([(0, len(prompt), 1000, True)] +
                          [(s, other_len, other_token + s, True) for s in range(1, 4)])
        return model.logits(0)

    base = step(2000, 40)
    assert np.array_equal(step(3000, 40), base)
    assert np.array_equal(step(2000, 300), base)
    # Control: the step really depends on its own sequence (another token, other logits).
    clear(model)
    model.decode_rows([(0, i, t, False) for i, t in enumerate(prompt)] + [(0, len(prompt), 1001, True)])
    assert not np.array_equal(model.logits(0), base)


def test_rows_of_two_sequences_in_one_decode_match_each_decoded_alone(multi, single):
    clear(multi)
    tokens = [multi.tokenize(p) for p in PROMPTS]
    rows = [(s, i, t, i == len(toks) - 1) for s, toks in enumerate(tokens) for i, t in enumerate(toks)]
    multi.decode_rows(rows)
    for s, toks in enumerate(tokens):
        assert multi.cached(s) == toks
        assert_same_row(multi.logits(s), alone(single, toks))
    # Control: the rows really are per sequence (the other prompt's row differs).
    assert int(probs(multi.logits(0)).argmax()) != int(probs(multi.logits(1)).argmax())


def test_a_copied_prompt_continues_like_the_original(multi, single):
    clear(multi)
    toks = multi.tokenize(PROMPTS[0])
    multi.decode(toks[:-1], 0, 0, seq=0)
    for dst in (1, 2, 3):
        multi.copy_prefix(0, dst, len(toks) - 1)
        assert multi.cached(dst) == toks[:-1]
    # The last prompt token on all four sequences in one batch: four equal rows.
    multi.decode_rows([(s, len(toks) - 1, toks[-1], True) for s in range(4)])
    want = alone(single, toks)
    for s in range(4):
        assert_same_row(multi.logits(s), want)


def test_sequences_truncate_independently(multi, single):
    """Truncating one sequence leaves the other's cache alone. (The references
    repeat each sequence's own decodes on a lone context: K/V computed in a
    13-row batch differ in their last bits from a 3-row one, so "decode 13,
    keep 2, add 1" is compared with the same steps, not with "decode 3".)"""
    clear(multi)
    a, b = (multi.tokenize(p) for p in PROMPTS)
    multi.decode(a, 0, 0, seq=0)
    multi.decode(b, 0, 0, seq=1)
    multi.truncate(2, seq=1)
    assert multi.cached(0) == a and multi.cached(1) == b[:2]
    # Sequence 0 still continues from its whole prompt; sequence 1 from its kept prefix.
    multi.truncate(len(a) - 1, seq=0)
    multi.decode_rows([(0, len(a) - 1, a[-1], True), (1, 2, b[2], True)])
    got0, got1 = multi.logits(0), multi.logits(1)
    single.truncate(0)
    single.decode(a, 0, 0)
    single.truncate(len(a) - 1)
    single.decode(a[-1:], len(a) - 1, 1)
    assert_same_row(got0, single.logits(0))
    single.truncate(0)
    single.decode(b, 0, 0)
    single.truncate(2)
    single.decode(b[2:3], 2, 1)
    assert_same_row(got1, single.logits(0))


def test_bad_requests_are_refused_and_change_nothing(multi, gemma_path):
    clear(multi)
    a = multi.tokenize(PROMPTS[0])
    multi.decode(a, 0, 1, seq=0)
    with pytest.raises(ValueError, match="n_seq_max"):
        _core.Model(gemma_path, n_ctx=64, n_seq_max=0)
    with pytest.raises(IndexError, match="sequence 4"):
        multi.decode(a, 0, 1, seq=4)
    with pytest.raises(IndexError):
        multi.cached(-1)
    with pytest.raises(ValueError, match="continue the cached tokens"):
        multi.decode_rows([(1, 0, a[0], False), (1, 2, a[1], True)])  # a gap at position 1
    with pytest.raises(ValueError, match="continue the cached tokens"):
        multi.decode_rows([(0, 0, a[0], True)])  # would overwrite sequence 0's cache
    with pytest.raises(ValueError, match="do not fit one batch"):
        multi.decode_rows([(1, i, a[0], False) for i in range(multi.n_batch + 1)])
    with pytest.raises(ValueError, match="cannot copy"):
        multi.copy_prefix(0, 1, len(a) + 1)
    assert multi.cached(0) == a and multi.cached(1) == []


def test_sequences_share_the_contexts_cells(gemma_path):
    """n_ctx is for all sequences together (one unified cache): rows that do not
    fit beside the other sequence fail as a context overflow and leave both as
    they were."""
    m = _core.Model(gemma_path, n_ctx=64, n_seq_max=2)
    n_ctx = m.n_ctx  # llama.cpp may round it up
    filler = m.tokenize("one")[-1]
    m.decode([filler] * (n_ctx - 8), 0, 0, seq=0)
    with pytest.raises(ContextOverflowError):
        m.decode([filler] * 16, 0, 1, seq=1)  # fits its own positions, not the shared cells
    assert len(m.cached(0)) == n_ctx - 8 and m.cached(1) == [] and m.pos_max(1) == -1
    # Control: what fits, fits (in one batch of rows).
    m.decode_rows([(1, i, filler, i == 3) for i in range(4)])
    assert len(m.cached(1)) == 4
