"""Speculative engine on real models: greedy equivalence, rollback, vocabulary
compatibility, limits. (Distributional losslessness: test_speculative_lossless.py.)"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import pyspec
from pyspec import IncompatibleModelsError, Sampling

from near_ties import assert_near

GREEDY_PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash table is in two sentences.",
    "Fix the bug: def add(a, b): return a - b",
    "List three uses of the `grep` command.",
]


@pytest.fixture(scope="module")
def pair(target_path, draft_path, load_model):
    target = load_model(target_path, n_ctx=1024, seed=0)
    draft = load_model(draft_path, n_ctx=1024, seed=0)
    return target, pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=4)


def _self_draft(target, draft, k):
    """Gemma drafting for itself: the draft-model engine at a fixed length k."""
    return pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=k)


@pytest.mark.pair
# The slow tier: the default tier proves greedy equality exactly on gemma
# (test_greedy_equals_plain_exactly_with_small_batches) and in batches.
@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_equals_plain(pair, k):
    target, spec = pair
    cases = []
    for prompt in GREEDY_PROMPTS:
        tokens = target.prompt_tokens(prompt)
        plain = target.generate(tokens, max_tokens=48, temperature=0).tokens
        cases.append((tokens, spec.generate(tokens, max_tokens=48, temperature=0, draft_max=k).tokens, plain))
    assert_near(target, cases, what=f"k={k}: ")


def test_greedy_equals_plain_exactly_with_small_batches(gemma_path, load_model):
    """With k <= 2 the verification batch (<= 3 tokens) uses the single-token
    kernels, so greedy output must match plain decoding token for token."""
    target = load_model(gemma_path, n_ctx=512)
    spec = _self_draft(target, load_model(gemma_path, "draft", n_ctx=512), 2)
    for prompt in ("The capital of France is", "def fibonacci(n):", "Roses are red,"):
        plain = target.generate(prompt, chat=False, max_tokens=40, temperature=0)
        fast = spec.generate(prompt, chat=False, max_tokens=40, temperature=0,
                             draft_sampling=Sampling(temperature=1.0))
        assert fast.tokens == plain.tokens
        assert fast.text == plain.text


@pytest.mark.pair
def test_rollback_leaves_exactly_the_accepted_sequence(pair, target_path, load_model):
    target, spec = pair
    tokens = target.prompt_tokens("Write a limerick about a cat.")
    # Start from empty caches: a prompt prefix kept from an earlier call was computed
    # in another batch split, whose kernels round differently than the fresh model's.
    spec.clear_cache()
    # Hot draft settings make rejections frequent; k = 2 keeps batches <= 3 tokens
    # so that the rolled-back cache can be compared bit for bit with a fresh one.
    out = spec.generate(tokens, max_tokens=40, temperature=0.9, top_k=20, seed=3, draft_max=2,
                        draft_sampling=Sampling(temperature=1.8, top_k=50))
    assert out.stats.accepted < out.stats.drafted, "no rejection happened; the test would prove nothing"
    history = tokens + out.tokens
    core = target.native
    # The target holds every committed token but the last, at positions 0..n-2.
    assert core.pos_max() == len(history) - 2
    # The draft holds a prefix of the committed sequence and nothing else.
    dcore = spec.draft.native
    assert dcore.pos_max() <= len(history) - 1
    # Next round's logits from the rolled-back cache equal a fresh evaluation.
    core.decode([history[-1]], len(history) - 1, 1)
    after_rollback = np.array(core.logits(0))
    fresh = load_model(target_path, n_ctx=1024)
    fresh.native.decode(tokens[:-1], 0, 0)
    for i, t in enumerate(history[len(tokens) - 1:]):
        fresh.native.decode([t], len(tokens) - 1 + i, 1)
    np.testing.assert_allclose(after_rollback, np.array(fresh.native.logits(0)), atol=1e-3, rtol=0)
    # clear_cache empties both models' caches (the bench starts every runner from there).
    spec.clear_cache()
    assert core.cached() == [] and dcore.cached() == []


@pytest.mark.pair
def test_statistics_are_consistent(pair):
    target, spec = pair
    out = spec.generate("Write a bubble sort in Python.", max_tokens=64, temperature=0, draft_max=4)
    s = out.stats
    assert s.rounds > 0 and s.drafted > 0
    assert 0 <= s.accepted <= s.drafted
    assert len(s.drafted_at) == 4 and sum(s.drafted_at) == s.drafted and sum(s.accepted_at) == s.accepted
    # Acceptance can only fall along the draft: position i+1 is reached only after i is accepted.
    assert all(a1 <= a0 for a0, a1 in zip(s.accepted_at, s.accepted_at[1:]))
    # Every round emits its accepted drafts plus one token (the last may be cut by max_tokens).
    assert s.accepted + s.rounds >= out.n_generated_tokens
    assert 1.0 <= s.mean_accepted_len <= 5.0
    assert s.draft_s > 0 and s.verify_s > 0 and s.overhead_s >= 0
    plain = target.generate("Write a bubble sort in Python.", max_tokens=64, temperature=0)
    assert plain.stats.drafted == 0 and plain.stats.rounds == plain.n_generated_tokens


@pytest.mark.pair
def test_gemma_draft_for_qwen_is_refused(target_path, gemma_path, load_model):
    target = load_model(target_path, n_ctx=256)
    draft = load_model(gemma_path, n_ctx=256)
    with pytest.raises(IncompatibleModelsError, match="tokenizer types|differ at token"):
        pyspec.SpeculativeDecoder(target, draft)


def test_compatible_pair_is_accepted(gemma_path, load_model):
    a = load_model(gemma_path, n_ctx=256)
    b = load_model(gemma_path, "draft", n_ctx=256)
    pyspec.SpeculativeDecoder(a, b)  # no exception


def test_context_limit_is_respected(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=64)
    spec = _self_draft(target, load_model(gemma_path, "draft", n_ctx=target.n_ctx), 8)
    prompt = "Count: " + ", ".join(str(i) for i in range(target.n_ctx // 10))
    out = spec.generate(prompt, chat=False, max_tokens=10 * target.n_ctx, temperature=0)
    assert out.stop_reason in ("context", "eog")
    assert out.n_prompt_tokens + out.n_generated_tokens <= target.n_ctx + 1
    assert target.native.pos_max() < target.n_ctx
    # Still usable after hitting the limit.
    assert spec.generate("Hi", chat=False, max_tokens=3, temperature=0).n_generated_tokens == 3


def test_stop_strings_and_max_tokens(gemma_path, load_model):
    # draft_max=2: batches of <= 3 tokens, so greedy text equals plain text exactly.
    target = load_model(gemma_path, n_ctx=512)
    spec = _self_draft(target, load_model(gemma_path, "draft", n_ctx=512), 2)
    full = target.generate("The three primary colours are", chat=False, max_tokens=30, temperature=0).text
    stop = full.strip().split()[2]
    out = spec.generate("The three primary colours are", chat=False, max_tokens=30, temperature=0, stop=[stop])
    assert out.stop_reason == "stop" and stop not in out.text and full.startswith(out.text)
    for n in (1, 2, 5, 7):
        assert spec.generate("Once upon a time", chat=False, max_tokens=n, temperature=0).n_generated_tokens == n


def test_keyboard_interrupt_mid_generation(gemma_path):
    # Models of its own: an interrupt is a state no other test should meet.
    target = pyspec.Model(gemma_path, n_ctx=512)
    spec = _self_draft(target, pyspec.Model(gemma_path, n_ctx=512), 2)
    seen = []

    def on_text(t):
        seen.append(t)
        if len(seen) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return True

    with pytest.raises(KeyboardInterrupt):
        spec.generate("Once upon a time", chat=False, max_tokens=200, temperature=0, on_text=on_text)
    assert len(seen) < 10
    again = spec.generate("Once upon a time", chat=False, max_tokens=6, temperature=0)
    plain = target.generate("Once upon a time", chat=False, max_tokens=6, temperature=0)
    assert again.n_generated_tokens == 6 and again.tokens == plain.tokens


def test_invalid_draft_settings(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256)
    spec = pyspec.SpeculativeDecoder(target, load_model(gemma_path, "draft", n_ctx=256))
    with pytest.raises(ValueError):
        spec.generate("Hi", chat=False, draft_max=-1)
    with pytest.raises(ValueError):
        spec.generate("Hi", chat=False, draft_sampling=Sampling(temperature=-0.5))
    with pytest.raises(ValueError):
        pyspec.SpeculativeDecoder(target, load_model(gemma_path, "draft", n_ctx=256), draft_max=-2)
