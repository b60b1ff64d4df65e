"""Continuous batching (issue 12): sequences join and leave a running batch
between rounds; a long new prompt is prefilled in chunks that ride along with
the others' rounds; a full cache ends one sequence ("context"), not the batch.

The greedy comparisons with a lone model follow near_ties.py's rule (a flip
is accepted only at a near tie of the lone row, and the flips are bounded)."""

from __future__ import annotations

import pytest

from pyspec import _core

from near_ties import assert_near


def params(max_tokens, seed=1, temperature=0.0):
    s = _core.SamplingParams(temperature=temperature)
    return _core.SequenceParams(max_tokens=max_tokens, sampling=s, draft_sampling=s, seed=seed)


@pytest.fixture(scope="module")
def multi(gemma_path, load_model):
    return load_model(gemma_path, n_ctx=2048, n_seq_max=4, n_batch=256)


@pytest.fixture(scope="module")
def lone(gemma_path, load_model):
    return load_model(gemma_path, n_ctx=2048)


def test_a_long_prompt_joins_in_chunks_while_the_others_generate(multi, lone):
    chunk = 64
    tokens_by = {}
    with multi.engine.session(_core.SessionParams(prefill_chunk=chunk),
                               on_token=lambda h, t, text, d: tokens_by.setdefault(h, []).append(t)) as s:
        a = s.add(multi.tokenize("The capital of France is"), params(24))
        b = s.add(multi.tokenize("One, two, three,"), params(24))
        for _ in range(3):
            assert s.step()
        long_prompt = multi.tokenize(" ".join(f"item{i}" for i in range(150)))
        assert len(long_prompt) > 4 * chunk
        c = s.add(long_prompt, params(8))
        assert s.n_waiting == 1 and s.free_slots == 1
        during = []
        while s.n_waiting:
            before = {h: len(v) for h, v in tokens_by.items()}
            rows_before = s.stats.prompt_rows
            assert s.step()
            during.append((s.stats.prompt_rows - rows_before,
                           sum(len(v) - before.get(h, 0) for h, v in tokens_by.items() if h in (a, b))))
        while s.step():
            pass
        results = dict(s.take_finished())
        assert s.free_slots == 4 and s.n_active == 0
    # The prompt went in chunks of at most 64 rows, and each of those rounds
    # still gave both running sequences their next token.
    assert len(during) >= 4
    assert all(rows <= chunk for rows, _ in during)
    assert all(new == 2 for _, new in during[:-1]), during
    assert len(results[c].tokens) == 8
    cases = [(lone.tokenize(prompt), list(results[h].tokens),
              lone.generate(prompt, max_tokens=24, temperature=0, chat=False).tokens)
             for h, prompt in ((a, "The capital of France is"), (b, "One, two, three,"))]
    cases.append((long_prompt, list(results[c].tokens), lone.generate(long_prompt, max_tokens=8, temperature=0,
                                                                      chat=False).tokens))
    print(f"prompt rows per round while joining: {[r for r, _ in during]}")
    assert_near(lone, cases)


def test_equal_prompts_are_prefilled_once(multi):
    prompt = multi.tokenize(" ".join(f"line {i}." for i in range(40)))
    with multi.engine.session(_core.SessionParams()) as s:
        s.release_cache()  # no prefix kept from earlier tests
        for j in range(3):
            s.add(prompt, params(4, seed=j))
        while s.step():
            pass
        stats = s.stats
        assert len(s.take_finished()) == 3
    # One sequence computed the prompt (all but its last token); the others copied its cells.
    assert stats.prompt_rows == len(prompt) - 1
    # Control: different prompts of the same length are each computed.
    other = multi.tokenize(" ".join(f"row {i}." for i in range(40)))
    with multi.engine.session(_core.SessionParams()) as s:
        s.release_cache()
        s.add(prompt, params(4))
        s.add(other, params(4))
        while s.step():
            pass
        assert s.stats.prompt_rows == len(prompt) - 1 + len(other) - 1


def test_a_cancelled_sequence_leaves_and_its_slot_is_reused(multi):
    with multi.engine.session(_core.SessionParams()) as s:
        a = s.add(multi.tokenize("Once upon a time"), params(40))
        b = s.add(multi.tokenize("def add(a, b):"), params(12))
        s.step()
        s.step()
        s.cancel(a)
        s.step()
        done = dict(s.take_finished())
        assert done[a].stop_reason == "cancelled" and 1 <= len(done[a].tokens) <= 3
        assert s.n_active == 1 and s.free_slots == 3
        c = s.add(multi.tokenize("The sky is"), params(5))
        while s.step():
            pass
        done = dict(s.take_finished())
        assert done[b].stop_reason == "max_tokens" and len(done[b].tokens) == 12
        assert done[c].stop_reason == "max_tokens" and len(done[c].tokens) == 5
        # Finished sequences keep their cells as a prefix cache until released.
        assert any(multi.native.cached(j) for j in range(4))
        s.release_cache()
        assert all(not multi.native.cached(j) for j in range(4))


def test_a_prompt_cancelled_while_it_prefills_reports_only_what_was_decoded(multi):
    """A server's prompt_n (stats.n_prompt_decoded) is the work done for a
    request: a prompt cancelled half-way in must count neither the rest as
    decoded (an /infill warm-up superseded in 0.25 s reported 5,303 tokens)
    nor as found cached."""
    chunk = 32
    with multi.engine.session(_core.SessionParams(prefill_chunk=chunk)) as s:
        a = s.add(multi.tokenize("The capital of France is"), params(30))
        s.step()
        long_prompt = multi.tokenize(" ".join(f"word{i}" for i in range(120)))
        c = s.add(long_prompt, params(4))
        s.step()
        s.step()
        assert s.n_waiting == 1, "the long prompt must still be prefilling"
        s.cancel(c)
        s.step()
        done = dict(s.take_finished())
        st = done[c].stats
        assert done[c].stop_reason == "cancelled" and not done[c].tokens
        # Two or three chunks went in before the cancel; the rest was neither
        # decoded nor found cached (at most a shared BOS was).
        assert 0 < st.n_prompt_decoded <= 3 * chunk < len(long_prompt) / 2, (st.n_prompt_decoded, len(long_prompt))
        assert st.n_cached_tokens <= 1, st.n_cached_tokens
        s.cancel(a)
        while s.step():
            pass


def test_every_slot_taken_is_a_clear_error_and_changes_nothing(multi):
    with multi.engine.session(_core.SessionParams()) as s:
        for j in range(4):
            s.add(multi.tokenize(f"Number {j}:"), params(3))
        assert s.free_slots == 0
        with pytest.raises(ValueError, match="in use"):
            s.add(multi.tokenize("one too many"), params(3))
        while s.step():
            pass
        assert [len(r.tokens) for _, r in sorted(s.take_finished())] == [3, 3, 3, 3]


def test_a_full_cache_ends_one_sequence_not_the_batch(gemma_path, load_model):
    """Four sequences share 256 cells: when they no longer fit, the longest
    ends with "context" and the others go on in its cells."""
    m = load_model(gemma_path, n_ctx=256, n_seq_max=4)
    out = m.generate_batch(["Once upon a time", "def add(a, b):", "1, 2, 3,", "The sky is"], max_tokens=200,
                           temperature=0.8, seed=5, chat=False)
    reasons = [c.stop_reason for c in out.choices]
    assert "context" in reasons, reasons
    # Every cell is used before a sequence is ended (it ends only when the cache is full).
    total = sum(c.n_prompt_tokens + c.n_generated_tokens for c in out.choices if c.stop_reason == "context")
    assert all(c.n_generated_tokens > 0 for c in out.choices)
    assert total > 0 and max(c.n_prompt_tokens + c.n_generated_tokens for c in out.choices) <= 256


def test_s_at_the_contexts_maximum(gemma_path, load_model):
    m = load_model(gemma_path, n_ctx=512, n_seq_max=8)
    out = m.generate("Write a word:", n=8, max_tokens=6, temperature=1.0, seed=3, chat=False)
    assert len(out.choices) == 8 and all(c.n_generated_tokens == 6 for c in out.choices)
    assert out.stats.max_rows == 8
    with pytest.raises(ValueError, match="n_seq_max >= 9"):
        m.generate("Write a word:", n=9, max_tokens=2)


def test_a_session_claims_its_model(multi):
    s = multi.engine.session(_core.SessionParams())
    try:
        with pytest.raises(RuntimeError, match="batch session"):
            multi.generate("hi", max_tokens=2, chat=False)
    finally:
        s.close()
    assert multi.generate("hi", max_tokens=2, chat=False).n_generated_tokens == 2
    with pytest.raises(RuntimeError, match="closed"):
        s.step()


def test_a_chunked_prompt_goes_in_in_chunks_even_alone(multi):
    """An editor's prompt (SequenceSpec.chunked: the server's supersedable
    requests) is prefilled prefill_chunk rows per decode even when nothing
    else runs, so that a cancel stops it within one chunk. Control: the same
    prompt, not chunked, goes in whole at the first step."""
    chunk = 32
    decoded = {}
    for chunked in (True, False):
        prompt = multi.tokenize(" ".join(f"{'edit' if chunked else 'plain'}{i}" for i in range(60)))
        assert 3 * chunk < len(prompt) < 256  # one decode holds it all (n_batch 256)
        with multi.engine.session(_core.SessionParams(prefill_chunk=chunk)) as s:
            c = s.add(prompt, params(4), chunked=chunked)
            s.step()
            s.cancel(c)
            s.step()
            done = dict(s.take_finished())
            assert done[c].stop_reason == "cancelled"
            decoded[chunked] = done[c].stats.n_prompt_decoded
    assert 0 < decoded[True] <= 2 * chunk, decoded
    assert decoded[False] > 3 * chunk, decoded
