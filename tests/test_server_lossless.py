"""The server keeps the target's law: an end-to-end chi-square through `pyspec serve`.

What is new on this path and is exercised here: requests join a batch that is
already running (continuous batching), every slot's drafter and length policy
are kept from one request to the next, and each request's choices are seeded
from the request's seed. The law must not move.

Setup: the small test model, n-gram drafting at a fixed length of 1, and a
prompt that repeats ("one two three one two three one two"), so each
sequence's first token is drafted ("three", q one-hot) and decided by the
batched verification. Four clients keep requests of n = 2 samples in flight
at once (up to 16 verification rows a round). Outcome of a request: the first
tokens of its two samples; their joint law must be p0 x p0 (9 cells under
top-k 3), p0 the target's distribution after the prompt.

Negative control: the same server started with the TEST-ONLY acceptance rule
residual = p (`pyspec serve --test-controls '{"variant": "residual_is_p"}'`). Each first token
then follows P(y) = p0(x)[y = x] + (1 - p0(x)) p0(y) (x the draft); N comes
from a power calculation (power > 0.99 at ALPHA against that law), and the
same test must reject it, and find it fits that law.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest


from server_helpers import ServerProcess
from chisquare import assert_law, power, required_n
from laws import TARGET, independent_pair, lookup_proposal, one_hot, residual_is_p_row, support_of, target_rows
from pyspec.testing import TestControls

# Exact laws from single-token rows: bit-exact batch rows presumed (conftest skips these on GPU builds).
pytestmark = pytest.mark.bitexact

PROMPT = "one two three one two three one two"
CLIENTS = 4
MIN_N = 200


@pytest.fixture(scope="module")
def case(gemma_path, load_model):
    lone = load_model(gemma_path, n_ctx=256)  # as the batch runs (flash attention as llama.cpp chooses)
    tokens = lone.tokenize(PROMPT)
    p0, _ = target_rows(lone, tokens)
    support = support_of(p0)
    pieces = {lone.native.token_to_piece(t, False).decode("utf-8", "replace"): t for t in support}
    assert len(pieces) == len(support), "two tokens of the support print alike: outcomes would be ambiguous"
    x = lookup_proposal(lone, "ngram", tokens, 1)[0]
    assert x in support, "the n-gram draft is outside top-k 3: nothing would be verified"
    exact = independent_pair(p0, support)
    wrong = independent_pair(residual_is_p_row(p0, one_hot(x, p0)), support)
    n = max(MIN_N, required_n(exact, wrong))
    assert power(exact, wrong, n) > 0.99
    return tokens, pieces, exact, wrong, n


def _server(gemma_path, variant: str) -> ServerProcess:
    return ServerProcess("--model", gemma_path, "--drafter", "ngram", "--policy", "fixed", "--draft-max", "1",
                         "--parallel", "8", "--n-ctx", "2048", "--model-alias", "gemma",
                         "--test-controls", TestControls(variant=variant).to_json())


def _metric(server: ServerProcess, name: str) -> float:
    text = httpx.get(server.url("/metrics"), timeout=10).text
    return float(re.search(rf"^{name}(?:_total)? (\S+)$", text, re.M).group(1))


def sample_joint(server: ServerProcess, tokens, pieces, n: int):
    """n requests of 2 samples each, CLIENTS at a time: counts of (first token of
    sample 0, first token of sample 1), and the drafted / accepted totals."""
    def ask(i):
        body = dict(model="gemma", prompt=list(tokens), n=2, max_tokens=3, seed=70_000 + i, logprobs=0, **TARGET)
        r = server.post("/v1/completions", body)
        assert r.status_code == 200, r.text
        out = r.json()
        firsts = [pieces[c["logprobs"]["tokens"][0]] for c in sorted(out["choices"], key=lambda c: c["index"])]
        return tuple(firsts), out["timings"]

    counts: dict = {}
    drafted = accepted = 0
    with ThreadPoolExecutor(CLIENTS) as pool:
        for key, t in pool.map(ask, range(n)):
            counts[key] = counts.get(key, 0) + 1
            drafted += t["draft_n"]
            accepted += t["draft_n_accepted"]
    rows_per_round = _metric(server, "pyspec_batch_rows") / _metric(server, "pyspec_rounds")
    return counts, drafted, accepted, rows_per_round


def served_chisquare(gemma_path, case, variant: str):
    """Sample through a server with acceptance rule `variant`; chi-square against p0 x p0
    (and, for the broken residual, its law)."""
    tokens, pieces, exact, wrong, n = case
    server = _server(gemma_path, variant)
    try:
        counts, drafted, accepted, rows = sample_joint(server, tokens, pieces, n)
    finally:
        status = server.stop()
    assert status == 0, f"the server exited with {status}"
    control = variant != "correct"
    assert_law(counts, exact, n, f"server [{variant}] n=2 x {CLIENTS} clients, ngram k=1", control=control,
               wrong=wrong if control else None, note=f"drafted={drafted} accepted={accepted} rows/round={rows:.1f}")
    return n, drafted, accepted, rows


def test_served_samples_are_independent_draws_of_the_target(case, gemma_path):
    n, drafted, accepted, rows = served_chisquare(gemma_path, case, "correct")
    assert drafted >= 2 * n and accepted > 0, "the drafts were not verified: the path did not fire"
    # One request alone has at most 2 x 2 rows a round: more means requests shared rounds.
    assert rows > 4, "requests never shared a round: continuous batching was not exercised"


def test_negative_control_server_with_the_broken_residual(case, gemma_path):
    served_chisquare(gemma_path, case, "residual_is_p")
