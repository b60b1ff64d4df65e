"""Lossless on any backend: the output follows the rows the target computed.

The exact-law proofs (test_speculative_lossless.py and its kin) compare samples
with a law computed by single-token evaluation, which presumes that a
verification batch's rows are bit-exact with single-token decodes. The CPU
build gives that for small batches; CUDA does not (batch rows move by up to one
logit, issue 37). What speculative decoding promises on every backend is that
each token is distributed as the target row it was decided by, whatever that
row's numerics. The engine's probe (TestControls.pit, cpp/engine/engine.h)
records each decided token's randomized probability integral transform under
that row: u = (mass of likelier tokens) + V * p(token), V ~ U(0, 1) of its own
stream. u is i.i.d. uniform exactly when every token follows its row
(Rosenblatt), so a chi-square test of the pooled u's in BINS equal cells is a
losslessness test that needs no reference law and no bit-exact rows.

Each case runs at ALPHA on N decided tokens (printed), and its negative control
(the broken residual: resample from p after a rejection, over-weighting the
drafted tokens, which a draft makes the likelier ones) must be rejected by the
same test at the same N: the control's rejection is the power evidence, and each
case asserts that drafting fired.

The GPU tier: with PYSPEC_GPU_TARGET (and PYSPEC_GPU_DRAFT; default: the target)
naming GGUF files, the `gpu` cases load them offloaded (PYSPEC_GPU_LAYERS,
default -1) and `pytest -m gpu` selects them; random-weight files of the
default shapes serve (tests/gpu/README.md). Without the variable they are
skipped; the `cpu` cases run the same proofs on the test model here.

The RPC tier (issue 38): the target's layers on a `pyspec rpc-server` worker on
loopback, the draft here; its rows are computed by the worker's kernels (no
weight repacking), and the proof holds for whatever rows they are.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import pyspec
from pyspec import Sampling

from chisquare import ALPHA, pooled_chisquare
from pyspec.testing import TestControls

BINS = 10
TARGET = dict(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
# Lookups draft tokens the target already finds likely, where the broken
# residual's excess (1 - p(d)) * p(d) is small: a hotter target gives it room.
HOT = dict(TARGET, temperature=2.0)
# A colder draft than the target: q != p, and the broken residual's pull toward
# the draft's likely tokens moves u the same way on every row.
COLD_DRAFT = Sampling(temperature=0.5, top_k=8, top_p=1.0, min_p=0.0)
PROMPT = "The weather today is"
# Text that repeats: lookups (n-gram, memory) draft from it.
REPEAT = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
          "tau upsilon phi chi psi omega. ") * 3


def gpu_paths():
    target = os.environ.get("PYSPEC_GPU_TARGET")
    return (target, os.environ.get("PYSPEC_GPU_DRAFT") or target) if target else None


# The RPC tier is in the slow tier: its engine path is the CPU tier's (only where
# the target's rows are computed differs, and the proof holds for whatever rows
# they are); test_rpc.py checks by default that a worker's tokens are the local
# ones. Its two cases took 116 s of CI's time.
@pytest.fixture(scope="module", params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu),
                                        pytest.param("rpc", marks=pytest.mark.slow)])
def tier(request, gemma_path):
    """((target path, draft path), GPU layers, RPC workers of the target): the
    test model on the CPU; the GPU tier's files offloaded; or the test model's
    target on an RPC worker on loopback (`pyspec rpc-server`; the draft local)."""
    if request.param == "gpu":
        paths = gpu_paths()
        if paths is None:
            pytest.skip("the GPU tier needs PYSPEC_GPU_TARGET (a GGUF file; tests/gpu/README.md)")
        yield paths, int(os.environ.get("PYSPEC_GPU_LAYERS", "-1")), ()
    elif request.param == "rpc":
        if not pyspec._core.rpc_available():
            pytest.skip("this llama.cpp build has no RPC backend (docs/distributed.md)")
        from pyspec.bench.rpc_net import WorkerProcess

        with WorkerProcess() as worker:
            yield (gemma_path, gemma_path), 0, (worker.endpoint,)
    else:
        yield (gemma_path, gemma_path), 0, ()


@pytest.fixture(scope="module")
def models(tier):
    """(target, draft), loaded as the tier says (on a GPU: strictly offloaded;
    over RPC: the target's layers on the worker). Freed before the tier's
    worker stops."""
    paths, layers, rpc = tier
    load = dict(n_ctx=1024, seed=0, memory_mb=0, n_seq_max=2, n_gpu_layers=layers, strict=layers != 0)
    pair = [pyspec.Model(paths[0], rpc=rpc, **load), pyspec.Model(paths[1], **load)]
    yield tuple(pair)
    pair.clear()


def pits(decoder, prompt_tokens, generations, *, max_tokens=24, variant="correct", n=None, sampling=TARGET,
         **kwargs):
    """Decided tokens' u's over `generations` calls (seeds 1000...), and the
    drafted tokens by source (what fired)."""
    us, drafted = [], {"drafted": 0, "memory_drafted": 0, "ngram_drafted": 0}
    for i in range(generations):
        args = dict(max_tokens=max_tokens, seed=1000 + i, _test=TestControls(variant=variant, pit=True), **sampling, **kwargs)
        outs = decoder.generate(prompt_tokens, n=n, **args).choices if n else [decoder.generate(prompt_tokens, **args)]
        for out in outs:
            us.extend(out.stats.pit)
            for name in drafted:
                drafted[name] += getattr(out.stats, name)
    return np.array(us), drafted


def assert_uniform(us, label, *, control=False):
    counts = np.bincount(np.minimum((us * BINS).astype(int), BINS - 1), minlength=BINS)
    stat, df, pv = pooled_chisquare(counts, np.full(BINS, 1.0 / BINS))
    print(f"{'NEGATIVE CONTROL ' if control else ''}{label}: N={len(us)} chi2={stat:.1f} df={df} p={pv:.3g} "
          f"cells={counts.tolist()}")
    if control:
        assert pv < ALPHA, f"{label}: the broken residual was not detected (p={pv:.3g}, N={len(us)})"
    else:
        assert pv > ALPHA, f"{label}: tokens do not follow the target's rows (p={pv:.3g}, N={len(us)})"


def run_case(models, case, variant):
    target, draft = models
    if case == "model":
        spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=4)
        return pits(spec, target.tokenize(PROMPT), 40, variant=variant, draft_sampling=COLD_DRAFT)
    if case == "ngram":
        spec = pyspec.SpeculativeDecoder(target, None, drafter="ngram", policy="fixed", draft_max=8)
        return pits(spec, target.tokenize(REPEAT), 40, variant=variant, sampling=HOT)
    if case == "suffix":
        # Memory holds the text; the prompt is its start: the drafts copy from memory.
        memory = pyspec.Memory(16)
        memory.add(target.tokenize(REPEAT))
        spec = pyspec.SpeculativeDecoder(target, None, drafter="suffix", policy="fixed", draft_max=8)
        return pits(spec, target.tokenize(REPEAT[:80]), 40, variant=variant, memory=memory, sampling=HOT)
    if case == "batch":
        spec = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=4)
        return pits(spec, target.tokenize(PROMPT), 20, variant=variant, n=2, draft_sampling=COLD_DRAFT)
    raise ValueError(case)


# On the CPU only the model drafter's case runs by default (the exact-law proofs
# cover the others there; CI's time is dear); the slow tier and a GPU run
# (-m gpu) run all four.
CASES = ["model", *(pytest.param(c, marks=pytest.mark.slow) for c in ("ngram", "suffix", "batch"))]


@pytest.mark.parametrize("case", CASES)
def test_tokens_follow_the_rows_they_were_decided_by(models, case):
    us, drafted = run_case(models, case, "correct")
    assert drafted["drafted"] > len(us) // 4, f"{case}: too little drafting to test ({drafted}, N={len(us)})"
    if case == "suffix":
        assert drafted["memory_drafted"] > len(us) // 8, f"memory drafting did not fire: {drafted}"
    assert_uniform(us, f"{case} drafter")


@pytest.mark.parametrize("case", CASES)
def test_negative_control_broken_residual_is_caught_without_a_reference_law(models, case):
    us, drafted = run_case(models, case, "residual_is_p")
    assert drafted["drafted"] > 0
    assert_uniform(us, f"{case} drafter, residual = p", control=True)


CLIENTS = 4
REQUESTS = 40  # 1,920 decided tokens: the served control is weaker than in-process (p ~ 4e-4 at 960)


def served_pits(tier, models, variant):
    """Through `pyspec serve` (n-gram drafts, 4 clients, two samples a request,
    each request's timings.pit): REQUESTS requests of 24 tokens each."""
    from concurrent.futures import ThreadPoolExecutor

    from server_helpers import ServerProcess

    (path, _), layers, rpc = tier
    if rpc:
        pytest.skip("a worker serves one driver at a time, and this process holds the tier's worker")
    tokens = models[0].tokenize(REPEAT)
    server = ServerProcess("--model", path, "--drafter", "ngram", "--policy", "fixed", "--draft-max", "8",
                           "--parallel", str(2 * CLIENTS), "--n-ctx", "4096", "--model-alias", "m", "--no-memory",
                           "--n-gpu-layers", str(layers), *(["--strict"] if layers else []),
                           "--test-controls", TestControls(variant=variant, pit=True).to_json())

    def ask(i):
        body = dict(model="m", prompt=tokens, n=2, max_tokens=24, seed=50_000 + i, **HOT)
        r = server.post("/v1/completions", body)
        assert r.status_code == 200, r.text
        return r.json()["timings"]

    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            timings = list(pool.map(ask, range(REQUESTS)))
    finally:
        assert server.stop() == 0
    return np.array([u for t in timings for u in t["pit"]]), sum(t["draft_n"] for t in timings)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["correct", "residual_is_p"])
def test_served_tokens_follow_their_rows(tier, models, variant):
    """The server's shared rounds (two samples a request, four clients at a time)
    keep every token on its row; control: the broken residual."""
    us, drafted = served_pits(tier, models, variant)
    assert drafted > len(us) // 4, f"too little drafting to test ({drafted}, N={len(us)})"
    assert_uniform(us, f"server, n-gram drafts [{variant}]", control=variant != "correct")
