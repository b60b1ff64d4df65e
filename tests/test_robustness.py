"""Fresh samples by default, and the small defects of the issue-9 review: each
test fails on the code before its fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pyspec
from pyspec import sampling

from chisquare import pooled_chisquare

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ seeds

def test_each_call_draws_a_fresh_sample_and_reports_its_seed(gemma):
    kw = dict(max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, chat=False)
    outs = [gemma.generate("Once upon a time", **kw) for _ in range(3)]
    assert len({tuple(o.tokens) for o in outs}) > 1, "three calls without a seed gave the same sample"
    assert len({o.stats.seed for o in outs}) == 3
    again = gemma.generate("Once upon a time", seed=outs[1].stats.seed, **kw)
    assert again.tokens == outs[1].tokens


def test_a_seeded_model_gives_a_reproducible_sequence_of_samples(gemma_path):
    kw = dict(max_tokens=16, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, chat=False)
    runs = []
    for _ in range(2):
        m = pyspec.Model(gemma_path, n_ctx=256, seed=7)
        runs.append([m.generate("The sea", **kw).tokens for _ in range(2)])
    assert runs[0] == runs[1], "Model(seed=...) did not make the calls reproducible"
    assert runs[0][0] != runs[0][1], "successive calls of a seeded model repeated the same sample"


def test_cli_fresh_seed_is_reported_and_reproduces(gemma_path):
    def run(*extra):
        cmd = [sys.executable, "-c", "from pyspec.cli import main; main()", "generate", "--raw", "--json",
               "-m", gemma_path, "--no-draft", "-n", "12", "-t", "1.0", "--top-k", "0", "--top-p", "1",
               "--min-p", "0", "The sea", *extra]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd="/")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    a, b = run(), run()
    assert a["stats"]["seed"] != b["stats"]["seed"]
    assert run("--seed", str(a["stats"]["seed"]))["tokens"] == a["tokens"]


# ------------------------------------------------------------------ vocabularies of different sizes

def test_draft_vocabulary_smaller_than_the_targets_is_lossless():
    """A target with padding ids the draft lacks (Qwen2.5-7B: 152,064 ids; the
    0.5B draft: 151,936): q has fewer columns, the missing ids count as q = 0.
    Chi-square at alpha = 0.001 over N = 40,000 rounds (first output token); the
    residual=p control must be rejected at the same size."""
    p = np.array([[0.3, 0.1, 0.2, 0.25, 0.15], [0.2, 0.2, 0.2, 0.2, 0.2]])  # ids 3, 4: the target's padding
    q = np.array([[0.1, 0.6, 0.3]])
    n = 40_000
    for variant, should_pass in (("correct", True), ("residual_is_p", False)):
        n_acc, nxt, drafts = sampling.verify_many(p, q, None, n, seed=3, variant=variant, return_drafts=True)
        first = np.where(n_acc > 0, drafts[:, 0], nxt)
        obs = np.bincount(first, minlength=5)
        pv = pooled_chisquare(obs, p[0])[2]  # every cell expects >= 4,000: none pooled, df = 4
        assert (pv > 1e-3) == should_pass, (variant, pv, obs)


def test_draft_token_outside_the_target_vocabulary_is_always_rejected():
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    q = np.array([[0.0, 0.0, 1.0]])  # the draft's extra id 2 does not exist for the target
    n_acc, nxt = sampling.verify_many(p, q, np.array([2]), 2000, seed=1)
    assert (n_acc == 0).all() and set(np.unique(nxt)) <= {0, 1}


# ------------------------------------------------------------------ limits and bad input

def test_huge_max_tokens_does_not_reserve_memory_for_them(gemma_path, load_model):
    m = load_model(gemma_path, n_ctx=64)
    out = m.generate("Hi", chat=False, max_tokens=2**31 - 1, temperature=0)
    assert out.stop_reason in ("context", "eog")


def test_speculation_with_n_batch_1_is_a_clear_error(gemma_path, load_model):
    target = load_model(gemma_path, n_ctx=256, n_batch=1)
    spec = pyspec.SpeculativeDecoder(target, drafter="ngram", policy="fixed", draft_max=2)
    with pytest.raises(ValueError, match="n_batch >= 2"):
        spec.generate("one two one two", chat=False, max_tokens=4)
    assert target.generate("one two", chat=False, max_tokens=2, temperature=0).n_generated_tokens == 2


@pytest.mark.parametrize("call", ["detokenize", "token_to_piece", "token_text", "token_attr"])
def test_token_ids_out_of_range_are_value_errors(gemma, call):
    core = gemma.native
    for bad in (-1, core.n_vocab):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            getattr(core, call)([bad] if call == "detokenize" else bad)


def test_prompt_token_out_of_range_is_a_value_error(gemma):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gemma.generate([gemma.n_vocab + 5], max_tokens=2)


# ------------------------------------------------------------------ callbacks

def test_callback_results_follow_python_truthiness(gemma):
    seen = []
    out = gemma.generate("Count: one two three", chat=False, max_tokens=12, temperature=0,
                         on_text=lambda t: seen.append(t) or 0)  # falsy, not a bool
    assert out.stop_reason == "cancelled" and len(seen) == 1
    out = gemma.generate("Count: one two three", chat=False, max_tokens=6, temperature=0,
                         on_text=lambda t: "yes")  # truthy, not a bool
    assert out.stop_reason != "cancelled" and out.n_generated_tokens == 6

    class Bad:
        def __bool__(self):
            raise ZeroDivisionError("no truth here")

    with pytest.raises(ZeroDivisionError):
        gemma.generate("Count:", chat=False, max_tokens=4, on_text=lambda t: Bad())


def test_a_callback_that_asked_to_stop_is_not_called_again(gemma):
    """The first token's text is held back (it starts a stop string); the callback
    stops at once; the final flush must not call it with the held-back text."""
    first = gemma.generate("Count: one two three", chat=False, max_tokens=1, temperature=0).text
    assert first
    calls = []

    def cb(token, piece, drafted):
        calls.append((token, piece))
        return False

    core_sampling = pyspec.Sampling(0.0, 0, 1.0, 0.0).native()
    tokens = gemma.prompt_tokens("Count: one two three", chat=False)
    params = pyspec._core.SequenceParams(max_tokens=8, sampling=core_sampling, draft_sampling=core_sampling,
                                         stop=[first + "QQQ"])
    out = gemma.engine.generate(tokens, params, on_token=cb)
    assert out.stop_reason == "cancelled"
    assert len(calls) == 1 and calls[0][1] == b"", calls


# ------------------------------------------------------------------ importing from a checkout

def test_importing_the_source_folder_gives_a_clear_error():
    """`python -c "import pyspec"` in the repository root finds the source folder
    (no compiled core) before the installed package."""
    if any((REPO / "pyspec").glob("_core*")):
        pytest.skip("this checkout has a compiled core in place")
    res = subprocess.run([sys.executable, "-c", "import pyspec"], capture_output=True, text=True, cwd=str(REPO),
                         timeout=120)
    if res.returncode == 0:
        pytest.skip("the source folder is importable here (an editable install maps the core)")
    assert "compiled core" in res.stderr and "pip install -e ." in res.stderr, res.stderr
    assert "circular import" not in res.stderr
