"""Exact laws of real models, for the end-to-end chi-square tests.

The target's rows come from plain evaluation, split exactly like the engine
(prompt[:-1] as one batch, then single tokens), so that the engine's p and the
reference's are the same numbers (test_speculative_lossless.py checks the
premise: batches of <= 3 tokens give the logits of single tokens on this build).
From them: the exact two-token law P(a, b) = p0(a) * p1(b | a), the law of two
independent first tokens p0 x p0, and the laws of the 'residual = p' bug that
the tests are sized against.
"""

from __future__ import annotations

import numpy as np

import pyspec
from pyspec import Sampling, _core, sampling

PROMPT = "The weather today is"
#: The target's sampling settings: top-k 3 keeps the outcome space small.
TARGET = dict(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)

# Draft settings of the Gemma self-draft proofs. Both give q != p with a wider
# support than p (draft top-k 8 against the target's 3), so acceptances,
# rejections, residual draws and proposals outside p's support all occur.
# Default tier: colder and wider. The broken residual's law is then far from p
# (~620 samples give power 0.99), so N = 680 proves the same thing as N = 20,000
# did with the hot draft, whose bug deviates little (~4,800 samples for 0.99).
GEMMA_COLD_DRAFT = dict(draft_sampling=Sampling(temperature=0.5, top_k=8, top_p=1.0, min_p=0.0))
# Slow tier: the original hotter and wider draft.
GEMMA_DRAFT = dict(draft_sampling=Sampling(temperature=2.0, top_k=8, top_p=1.0, min_p=0.0))


def next_row(model: pyspec.Model, tokens, **settings) -> np.ndarray:
    """The model's distribution of the token after `tokens` (all decoded as one
    batch), under sampling `settings`; the model's cache is left empty."""
    core = model.native
    core.truncate(0)
    core.decode(list(tokens), 0, 1)
    row = sampling.distribution(core.logits(0), **settings)
    core.truncate(0)
    return row


def target_rows(model: pyspec.Model, prompt_tokens, *, infill: bool = False, firsts=None):
    """p0 and p1(.|a) by plain evaluation, split exactly like the engine:
    prompt[:-1] as one batch, then single tokens; ``infill``: TARGET then the
    infill sampler (cpp/core/infill.h). p1 for each a in ``firsts`` (default:
    p0's support)."""
    core = model.native
    settings = dict(TARGET, infill=model if infill else None)
    core.truncate(0)
    core.decode(prompt_tokens[:-1], 0, 0)
    core.decode(prompt_tokens[-1:], len(prompt_tokens) - 1, 1)
    p0 = sampling.distribution(core.logits(0), **settings)
    p1 = {}
    for a in np.flatnonzero(p0) if firsts is None else firsts:
        core.truncate(len(prompt_tokens))
        core.decode([int(a)], len(prompt_tokens), 1)
        p1[int(a)] = sampling.distribution(core.logits(0), **settings)
    core.truncate(0)
    return p0, p1


def exact_distribution(model, p0, p1):
    """The two-token law {(a, b): p0(a) p1(b | a)}; an end of generation a is an outcome (a,)."""
    out = {}
    for a in np.flatnonzero(p0):
        a = int(a)
        if model.native.is_eog(a):
            out[(a,)] = float(p0[a])
            continue
        for b in np.flatnonzero(p1[a]):
            out[(a, int(b))] = float(p0[a] * p1[a][b])
    return out


def residual_is_p_row(p0, q0) -> np.ndarray:
    """The first token's law under the 'residual = p' bug (one draft from q0):
    min(p0, q0) + (1 - beta) p0, beta = sum min(p0, q0)."""
    beta = np.minimum(p0, q0).sum()
    return np.minimum(p0, q0) + (1.0 - beta) * p0


def one_hot(x: int, like: np.ndarray) -> np.ndarray:
    """q of a deterministic drafter that proposes x."""
    q = np.zeros_like(like)
    q[x] = 1.0
    return q


def wrong_residual_distribution(model, p0, q0, p1):
    """What the 'residual = p' bug samples (draft_max = 1, two tokens)."""
    return exact_distribution(model, residual_is_p_row(p0, q0), p1)


def independent_pair(row, support) -> dict:
    """The law {(a, b): row(a) row(b)} of two independent first tokens."""
    return {(a, b): float(row[a] * row[b]) for a in support for b in support}


def support_of(row) -> list:
    return [int(t) for t in np.flatnonzero(row)]


def draft_row(draft: pyspec.Model, prompt_tokens, draft_kwargs: dict):
    """q0: the draft's distribution at the first draft position under its sampling
    settings (``draft_sampling``; absent, the target's: TARGET, as in the engine)."""
    settings = draft_kwargs.get("draft_sampling") or Sampling(**TARGET)
    return next_row(draft, prompt_tokens, **settings.truncation())


def exact_law(target: pyspec.Model, prompt: str, *, infill: bool = False):
    """prompt tokens, p0, p1 and the exact two-token law of the target after `prompt`."""
    tokens = target.tokenize(prompt)
    p0, p1 = target_rows(target, tokens, infill=infill)
    return tokens, p0, p1, exact_distribution(target, p0, p1)


def lossless_case(target: pyspec.Model, draft: pyspec.Model, draft_kwargs: dict):
    """prompt tokens, the exact two-token law, and the broken-residual law (the
    stated wrong distribution the Gemma self-draft tests are sized against)."""
    tokens, p0, p1, exact = exact_law(target, PROMPT)
    wrong = wrong_residual_distribution(target, p0, draft_row(draft, tokens, draft_kwargs), p1)
    return tokens, exact, wrong


def lookup_proposal(target: pyspec.Model, drafter: str, tokens, k: int) -> list:
    """The draft that a fresh `drafter` ("ngram", or "consensus" alone: its own
    lookup) of a SpeculativeDecoder with default settings proposes after `tokens`."""
    return _core.make_drafter(_core.DrafterParams(name=drafter), target.native).propose(tokens, k)


def masked_row(logits, allowed, settings=TARGET) -> np.ndarray:
    """The distribution under `settings` of `logits` restricted to the `allowed`
    tokens (cpp/constraint/grammar.h, "The constrained target")."""
    logits = np.asarray(logits, dtype=np.float32)
    return sampling.distribution(np.where(allowed[:len(logits)], logits, -np.inf), **settings)


def constrained_law(target: pyspec.Model, prompt_tokens, grammar, *, row1_prefix=None, settings=TARGET) -> dict:
    """The exact two-token law under `grammar` (a compiled _core.Grammar):
    P(a, b) = p0'(a) p1'(b | a), each row masked with the grammar's state after
    the tokens before it. `row1_prefix(a)`: the prefix whose state masks the
    second row instead (a wrong law: lambda a: [] is a stale mask). Rows are
    split like the engine's (target_rows); `settings`: the target's sampling."""
    core = target.native
    core.truncate(0)
    core.decode(prompt_tokens[:-1], 0, 0)
    core.decode(prompt_tokens[-1:], len(prompt_tokens) - 1, 1)
    p0 = masked_row(core.logits(0), grammar.allowed([]), settings)
    p1 = {}
    for a in np.flatnonzero(p0):
        a = int(a)
        core.truncate(len(prompt_tokens))
        core.decode([a], len(prompt_tokens), 1)
        prefix = [a] if row1_prefix is None else row1_prefix(a)
        p1[a] = masked_row(core.logits(0), grammar.allowed(prefix), settings)
    core.truncate(0)
    return p0, p1, exact_distribution(target, p0, p1)


def constrained_draft_row(draft: pyspec.Model, prompt_tokens, grammar, draft_kwargs: dict) -> np.ndarray:
    """q0 under the grammar: the draft's first row, masked, under its own settings."""
    settings = draft_kwargs.get("draft_sampling") or Sampling(**TARGET)
    core = draft.native
    core.truncate(0)
    core.decode(list(prompt_tokens), 0, 1)
    logits = np.asarray(core.logits(0), dtype=np.float32)
    core.truncate(0)
    allowed = grammar.allowed([])
    return sampling.distribution(np.where(allowed[:len(logits)], logits, -np.inf), **settings.truncation())
