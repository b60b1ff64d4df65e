"""Many sequences in one batch (issue 12): one target decode per round for all
of them, each sequence as it would be alone.

Batch rounding: a row computed in a batch differs from a lone decode's by the
kernels' rounding (near_ties.py: the row law measured with flash attention on
and off), so a greedy sequence may part from its lone run at a near tie of the
lone row; such flips are counted, and no more may happen than the row law
gives the lone paths the chance of (near_ties.assert_near).
"""

from __future__ import annotations

import pytest

import pyspec
from pyspec import _core

from near_ties import assert_near

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time", "1, 2, 3, 4,"]


@pytest.fixture(scope="module")
def batch_model(gemma_path, load_model):
    return load_model(gemma_path, n_ctx=1024, n_seq_max=4, seed=3, flash_attn="off")


@pytest.fixture(scope="module")
def lone_model(gemma_path, load_model):
    return load_model(gemma_path, n_ctx=1024, seed=3, flash_attn="off")


def test_greedy_batch_equals_each_sequence_alone(batch_model, lone_model):
    out = batch_model.generate_batch(PROMPTS, max_tokens=24, temperature=0, chat=False)
    assert len(out.choices) == 4 and out.stats.n_seq == 4
    # One target decode per round for every unfinished sequence.
    assert out.stats.rounds == max(c.n_generated_tokens for c in out.choices)
    assert out.stats.max_rows == 4
    assert_near(lone_model, [(lone_model.tokenize(prompt), choice.tokens,
                              lone_model.generate(prompt, max_tokens=24, temperature=0, chat=False).tokens)
                             for prompt, choice in zip(PROMPTS, out.choices)])


def test_each_sample_is_the_lone_generation_with_its_seed(batch_model, lone_model):
    """n samples of one prompt: choice j is what a lone call with seed
    stats.seed gives (its own stream, whoever shares the batch)."""
    out = batch_model.generate("Write a word:", n=3, max_tokens=12, temperature=0.8, seed=1234, chat=False)
    seeds = [c.stats.seed for c in out.choices]
    assert seeds[0] == 1234 and len(set(seeds)) == 3
    same = 0
    for c in out.choices:
        alone = lone_model.generate("Write a word:", max_tokens=12, temperature=0.8, seed=c.stats.seed, chat=False)
        same += c.tokens == alone.tokens
    assert same >= 2, "samples do not follow their own seeds"
    # Control: the samples differ from each other (not one stream copied thrice).
    assert len({tuple(c.tokens) for c in out.choices}) > 1


def test_sequences_end_on_their_own(batch_model):
    stops = []
    out = batch_model.generate_batch(PROMPTS[:3], max_tokens=16, temperature=0, chat=False,
                                     on_token=lambda j, text, drafted: stops.append(j) or j != 1)
    assert out.choices[1].stop_reason == "cancelled" and out.choices[1].n_generated_tokens == 1
    assert all(c.n_generated_tokens == 16 for i, c in enumerate(out.choices) if i != 1)
    assert set(stops) == {0, 1, 2}


def test_batch_of_one_is_the_single_generation(batch_model, lone_model):
    # Both start from an empty cache: a prompt prefix kept from an earlier test's
    # batch was computed in other batch shapes, whose rounding differs (on one
    # machine it flipped a T = 0.8 sample).
    batch_model.clear_cache()
    lone_model.clear_cache()
    one = batch_model.generate_batch([PROMPTS[0]], max_tokens=10, temperature=0.8, seed=7, chat=False)
    alone = lone_model.generate(PROMPTS[0], max_tokens=10, temperature=0.8, seed=7, chat=False)
    assert one.choices[0].tokens == alone.tokens


def test_one_prompt_given_as_a_batch_is_a_clear_error(batch_model):
    for one in ("The capital of France is", batch_model.tokenize("hi")):
        with pytest.raises(TypeError, match="list of prompts"):
            batch_model.generate_batch(one, max_tokens=2)


def test_too_many_sequences_is_a_clear_error(batch_model):
    with pytest.raises(ValueError, match="n_seq_max >= 5"):
        batch_model.generate("hi", n=5, max_tokens=2)


def test_consensus_drafts_from_siblings(gemma_path, load_model):
    """n samples that write the same list: siblings' text is drafted and accepted."""
    target = load_model(gemma_path, n_ctx=1024, n_seq_max=4)
    spec = pyspec.SpeculativeDecoder(target, policy="fixed", draft_max=4)
    prompt = "Count from 1 to 30, separated by commas: 1, 2, 3,"
    out = spec.generate(prompt, n=4, max_tokens=40, temperature=0, chat=False)
    lone = load_model(gemma_path, n_ctx=1024).generate(prompt, max_tokens=40, temperature=0,
                                                                        chat=False)
    for c in out.choices:
        assert c.tokens == lone.tokens or c.tokens[:10] == lone.tokens[:10]
    assert sum(c.stats.accepted for c in out.choices) > 0


def test_greedy_batch_drafting_with_a_draft_model(gemma_path, load_model, lone_model):
    """Four sequences draft with the (self-)draft model, each in its own
    sequence of its context and all together: one draft decode per draft
    position for the whole batch. Each output is its lone greedy output, apart
    from near ties (counted)."""
    target = load_model(gemma_path, n_ctx=1024, n_seq_max=4)
    draft = load_model(gemma_path, "draft", n_ctx=1024, n_seq_max=4)
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=4)
    out = spec.generate_batch(PROMPTS, max_tokens=24, temperature=0, chat=False)
    s = out.stats
    assert sum(c.stats.accepted for c in out.choices) > 40  # the draft model drafted, and was right
    # k = 4: at most 4 draft decodes per round (catch-up rows ride in the first),
    # where drafting the sequences one by one would take 4 per sequence.
    assert 0 < s.draft_decodes <= 4 * s.rounds
    assert s.draft_decodes < sum(c.stats.rounds for c in out.choices) * 3
    print(f"draft decodes {s.draft_decodes} in {s.rounds} rounds")
    assert_near(lone_model, [(lone_model.tokenize(prompt), choice.tokens,
                              lone_model.generate(prompt, max_tokens=24, temperature=0, chat=False).tokens)
                             for prompt, choice in zip(PROMPTS, out.choices)])
    # Control: a batch cannot give two sequences one draft sequence.
    one = _core.make_batch_drafters(_core.DrafterParams(name="model"), target.native, draft.native, 1)[0]
    with pytest.raises(ValueError, match="same sequence"):
        fixed = [_core.make_policy(_core.PolicyParams(name="fixed", draft_max=2)) for _ in range(2)]
        target.engine.generate_batch([target.tokenize("a"), target.tokenize("b")], _core.SequenceParams(
            max_tokens=2), drafters=[one, one], policies=fixed)


def test_a_batch_needs_a_draft_sequence_per_sample(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=512, n_seq_max=2)
    draft = load_model(gemma_path, "draft", n_ctx=512, n_seq_max=1)  # one sequence
    spec = pyspec.SpeculativeDecoder(target, draft, drafter="model")
    with pytest.raises(ValueError, match="n_seq_max >= 2"):
        spec.generate("hi", n=2, max_tokens=2, chat=False)


def test_sequence_seed_is_stable():
    assert _core.sequence_seed(42, 0) == 42
    assert _core.sequence_seed(42, 1) != _core.sequence_seed(42, 2)
    assert _core.sequence_seed(42, 1) == _core.sequence_seed(42, 1)
