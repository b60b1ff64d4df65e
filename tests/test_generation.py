"""Plain generation: determinism, stops, streaming, cancellation, KV rollback."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest


PROMPT = "The three primary colours are"


def test_greedy_is_deterministic_across_runs_and_models(gemma, gemma_path, load_model):
    a = gemma.generate(PROMPT, chat=False, max_tokens=24, temperature=0)
    b = gemma.generate(PROMPT, chat=False, max_tokens=24, temperature=0)
    fresh = load_model(gemma_path, n_ctx=512)  # another Model than gemma
    c = fresh.generate(PROMPT, chat=False, max_tokens=24, temperature=0)
    assert a.tokens == b.tokens == c.tokens
    assert a.text == b.text == c.text
    assert a.n_generated_tokens == 24 and a.stop_reason == "max_tokens"


def test_a_first_token_from_the_prompts_decode_only_where_asked(gemma, monkeypatch):
    """first_with_prompt (the server's setting: cpp/engine/decode.cpp) reads a new
    prompt's first token from its prompt's decode; a prompt found cached starts
    with a round as before. Control: off (the library's default, so that a first
    token does not depend on whether the prompt was cached), no first token
    comes from the prompt's decode."""
    kw = dict(chat=False, max_tokens=3, temperature=0)
    gemma.clear_cache()
    off = gemma.generate(PROMPT, **kw)
    monkeypatch.setattr(gemma, "first_with_prompt", True)
    gemma.clear_cache()
    new = gemma.generate(PROMPT, **kw)
    cached = gemma.generate(PROMPT, **kw)
    assert (off.stats.first_with_prompt, new.stats.first_with_prompt, cached.stats.first_with_prompt) == (0, 1, 0)
    assert new.stats.n_cached_tokens == 0 and new.stats.n_prompt_decoded == new.stats.n_prompt_tokens
    assert new.n_generated_tokens == cached.n_generated_tokens == 3


def test_same_seed_same_sample_different_seed_differs(gemma):
    kw = dict(chat=False, max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = gemma.generate(PROMPT, seed=7, **kw)
    b = gemma.generate(PROMPT, seed=7, **kw)
    others = {tuple(gemma.generate(PROMPT, seed=s, **kw).tokens) for s in range(8, 12)}
    assert a.tokens == b.tokens
    assert len(others | {tuple(a.tokens)}) > 1, "different seeds never changed the sample"


def test_text_matches_tokens(gemma):
    out = gemma.generate(PROMPT, chat=False, max_tokens=20, temperature=0)
    assert out.text == gemma.detokenize(out.tokens)


def test_stop_string_cuts_text(gemma):
    full = gemma.generate(PROMPT, chat=False, max_tokens=30, temperature=0).text
    stop = full.strip().split()[2]  # a word that does occur
    out = gemma.generate(PROMPT, chat=False, max_tokens=30, temperature=0, stop=[stop])
    assert out.stop_reason == "stop"
    assert stop not in out.text
    assert full.startswith(out.text)
    assert full[len(out.text):].startswith(stop)


def test_one_stop_string_and_seed_sentinel(gemma):
    """pyspec/request.py's rules for the keywords: a string is one stop string
    (it was split into its characters), an empty one is dropped, and seed -1
    draws a fresh seed as on every other entry."""
    full = gemma.generate(PROMPT, chat=False, max_tokens=30, temperature=0).text
    # A stop string one of whose characters occurs earlier: its characters alone would stop there.
    at = next(i for i in range(1, len(full) - 3) if full[i:i + 3].strip() == full[i:i + 3]
              and full[i:i + 3] not in full[:i] and set(full[i:i + 3]) & set(full[:i]))
    out = gemma.generate(PROMPT, chat=False, max_tokens=30, temperature=0, stop=full[at:at + 3])
    assert out.text == full[:at] and out.stop_reason == "stop"
    assert gemma.generate(PROMPT, chat=False, max_tokens=30, temperature=0, stop=["", full[at:at + 3]]).text == out.text
    kw = dict(chat=False, max_tokens=2, temperature=1.0)
    assert gemma.generate(PROMPT, seed=-1, **kw).stats.seed != gemma.generate(PROMPT, seed=-1, **kw).stats.seed
    with pytest.raises(ValueError, match="seed"):
        gemma.generate(PROMPT, seed=-2, **kw)


def test_stream_equals_generate(gemma):
    whole = gemma.generate(PROMPT, chat=False, max_tokens=20, temperature=0).text
    pieces = list(gemma.stream(PROMPT, chat=False, max_tokens=20, temperature=0))
    assert len(pieces) > 1
    assert "".join(pieces) == whole


def test_stream_can_be_abandoned(gemma):
    it = gemma.stream(PROMPT, chat=False, max_tokens=200, temperature=0)
    first = next(it)
    it.close()  # stops the worker; the model is free again
    assert first
    assert gemma.generate(PROMPT, chat=False, max_tokens=3, temperature=0).n_generated_tokens == 3


def test_callback_can_stop(gemma):
    seen = []

    def on_text(t):
        seen.append(t)
        return len(seen) < 3

    out = gemma.generate(PROMPT, chat=False, max_tokens=50, temperature=0, on_text=on_text)
    assert out.stop_reason == "cancelled"
    assert len(seen) == 3


def test_ctrl_c_stops_between_tokens_and_model_stays_usable(gemma):
    count = []

    def on_text(t):
        count.append(t)
        if len(count) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C
        return True

    with pytest.raises(KeyboardInterrupt):
        gemma.generate(PROMPT, chat=False, max_tokens=100, temperature=0, on_text=on_text)
    assert len(count) <= 3
    again = gemma.generate(PROMPT, chat=False, max_tokens=5, temperature=0)
    assert again.n_generated_tokens == 5


def test_stats_are_sane(gemma):
    out = gemma.generate(PROMPT, chat=False, max_tokens=16, temperature=0)
    s = out.stats
    assert s.n_prompt_tokens == out.n_prompt_tokens > 0
    assert s.n_generated == 16
    assert 0 < s.ttft_s < 60 and s.decode_tok_s > 0
    assert s.drafted == 0 and s.accepted == 0


# ---------------------------------------------------------------- KV cache

# With the same tokens in the same batch shapes the CPU kernels are expected to
# be bit-identical; allow float noise. Different batch shapes are NOT compared:
# llama.cpp's batched kernels (n >= 4 here) round differently from the
# single-token path, and those differences reach ~1 logit on these Q4 models.
LOGIT_ATOL = 1e-3


def _logits(model):
    return np.array(model.native.logits(0), dtype=np.float64)


def test_kv_rollback_redecode_gives_same_logits(gemma):
    core = gemma.native
    prompt = gemma.tokenize("A short story about a cat:", add_special=True)
    cont = gemma.tokenize(" The cat sat on the mat", add_special=False)[:4]
    core.truncate(0)
    core.decode(prompt, 0, 1)
    core.decode(cont[:2], len(prompt), 1)
    core.decode(cont[2:], len(prompt) + 2, 1)
    before = _logits(gemma)
    assert core.pos_max() == len(prompt) + len(cont) - 1
    # Roll back two tokens and decode them again.
    core.truncate(len(prompt) + len(cont) - 2)
    assert core.pos_max() == len(prompt) + len(cont) - 3
    core.decode(cont[-2:], len(prompt) + len(cont) - 2, 1)
    np.testing.assert_allclose(_logits(gemma), before, atol=LOGIT_ATOL, rtol=0)


def _colours(gemma):
    """(prompt, a wrong continuation, the right one): the rollback tests' tokens."""
    return (gemma.tokenize("Colours: red, green,", add_special=True),
            gemma.tokenize(" purple banana", add_special=False),
            gemma.tokenize(" blue and", add_special=False))


def test_different_continuation_after_rollback_matches_fresh_context(gemma, gemma_path, load_model):
    core = gemma.native
    prompt, wrong, right = _colours(gemma)
    core.truncate(0)
    core.decode(prompt, 0, 1)
    core.decode(wrong, len(prompt), 1)
    core.truncate(len(prompt))
    core.decode(right, len(prompt), 1)
    after_rollback = _logits(gemma)

    fresh = load_model(gemma_path, n_ctx=512)  # another Model than gemma, its cache empty
    fresh.native.decode(prompt, 0, 1)
    fresh.native.decode(right, len(prompt), 1)
    reference = _logits(fresh)
    # Same tokens, same batch split: identical up to float noise.
    np.testing.assert_allclose(after_rollback, reference, atol=LOGIT_ATOL, rtol=0)
    assert int(np.argmax(after_rollback)) == int(np.argmax(reference))


def test_rollback_check_can_fail(gemma):
    """Negative control: without the rollback the logits do differ."""
    core = gemma.native
    prompt, wrong, right = _colours(gemma)
    core.truncate(0)
    core.decode(prompt, 0, 1)
    core.decode(right, len(prompt), 1)
    reference = _logits(gemma)
    core.truncate(0)
    core.decode(prompt, 0, 1)
    core.decode(wrong, len(prompt), 1)
    core.decode(right, len(prompt) + len(wrong), 1)  # no rollback: stale tokens stay in context
    assert np.max(np.abs(_logits(gemma) - reference)) > LOGIT_ATOL
