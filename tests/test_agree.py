"""`pyspec agree` and `pyspec quantize`, on the small test model and copies of it
made here: a Q8_0 requantisation (healthy), the same with the block scales of
one weight tensor shuffled (still loads, computes nonsense: broken), and a copy
of the test model with one FFN tensor zeroed (its own type: broken)."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import pyspec
from pyspec import _core
from pyspec.agree import agree, builtin_streams
from pyspec.agree.speculation import acceptance_by_position, expected_rounds
from pyspec.agree.verdict import SAME_TYPE_FLOOR, judge
from pyspec import Sampling

from cli_helpers import pyspec_cmd
from gguf_edit import scramble_q8_0_scales, zero_tensor

BROKEN_TENSOR = "blk.0.ffn_down.weight"


@pytest.fixture(scope="module")
def copies(tmp_path_factory, gemma_path):
    """(Q8_0 requantisation, its broken copy), made with `pyspec quantize` as users run it."""
    d = tmp_path_factory.mktemp("quants")
    q8 = d / "q8.gguf"
    out = pyspec_cmd("quantize", gemma_path, str(q8), "--type", "Q8_0", "--allow-requantize")
    assert out.returncode == 0, out.stderr
    assert q8.is_file() and sorted(p.name for p in d.iterdir()) == ["q8.gguf"], "a partial file was left"
    broken = d / "broken.gguf"
    shutil.copy(q8, broken)
    assert scramble_q8_0_scales(str(broken), BROKEN_TENSOR) > 0
    return str(q8), str(broken)


def test_a_model_against_itself_agrees_exactly(gemma_path, load_model):
    ref = load_model(gemma_path, n_ctx=1024)
    same = load_model(gemma_path, "second", n_ctx=1024)  # a second load: its own context, the same logits
    streams = builtin_streams(ref)[::2]  # one text of each category
    for sampling in (Sampling.OPENAI, Sampling(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05)):
        r = agree(ref, same, streams, costs=False, keep_rows=True, sampling=sampling)
        assert r["n_positions"] == sum(s.n_rows for s in streams) > 300
        for rows in r["rows"]:
            assert np.all(rows["alpha"] == 1.0) and np.all(rows["kl"] == 0.0) and rows["top1"].all()
            assert np.array_equal(rows["logp_ref"], rows["logp_cand"])
        assert r["ppl_ratio"] == 1.0 and r["verdict"] == "healthy" and r["same_type"], r["reason"]
        assert "same type" in r["reason"] and r["healthy_below"] == SAME_TYPE_FLOOR
        # Every draft accepted: k + 1 tokens per pass, but for each stream's last round.
        exact = [sum(s.n_rows for s in streams) / sum(math.ceil(s.n_rows / (k + 1)) for s in streams)
                 for k in range(1, 9)]
        assert [p["tokens_per_pass"] for p in r["speculation"]["sampled"]] == pytest.approx(exact, rel=1e-12)
        assert r["speculation"]["acceptance_by_position"] == [1.0] * 8


def _numpy_rows(ref, cand, tokens, temperature, top_k):
    """The same quantities from the two models' logits, in NumPy: both decode the
    stream as the core does (one batch, logits on every row, so the logits are
    bit-identical), and the maths is redone here from the definitions."""
    def logits(model):
        core = model.native
        core.truncate(0)
        core.decode(tokens[:-1], 0, len(tokens) - 1)
        out = np.array([core.logits(i) for i in range(len(tokens) - 1)], dtype=np.float64)
        core.truncate(0)
        return out

    def log_softmax(x):
        m = x.max(axis=1, keepdims=True)
        return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))

    def sampled(x):  # top-k on the logits, then the temperature on the survivors
        cut = np.sort(x, axis=1)[:, -top_k][:, None] if top_k else -np.inf
        y = np.where(x >= cut, x / temperature, -np.inf)
        return np.exp(log_softmax(y))

    lp_all, lq_all = logits(ref), logits(cand)
    lp, lq = log_softmax(lp_all), log_softmax(lq_all)
    p = np.exp(lp)
    nxt = np.array(tokens[1:])
    idx = np.arange(len(nxt))
    return {
        "alpha": np.minimum(sampled(lp_all), sampled(lq_all)).sum(axis=1),
        "kl": (p * (lp - lq)).sum(axis=1),
        "top1": lp_all.argmax(axis=1) == lq_all.argmax(axis=1),
        "logp_ref": lp[idx, nxt],
        "logp_cand": lq[idx, nxt],
    }


@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.7, 20)])
def test_rows_match_an_independent_numpy_computation(gemma_path, load_model, copies, temperature, top_k):
    ref = load_model(gemma_path, n_ctx=512)
    cand = load_model(copies[0], n_ctx=512)
    tokens = ref.tokenize("def area(r):\n    return 3.14159 * r * r\n\nThe circle's area grows with the square "
                          "of its radius, so doubling r makes it four times larger.")
    assert len(tokens) <= 64  # one chunk of the core: the same decode as _numpy_rows
    got = _core.agreement(ref.native, cand.native, tokens, 0,
                           Sampling(temperature, top_k, 1.0, 0.0).native())
    want = _numpy_rows(ref, cand, tokens, temperature, top_k)
    assert got["nonfinite"] == 0
    for key in ("alpha", "kl", "logp_ref", "logp_cand"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-9, atol=1e-12, err_msg=key)
    assert np.array_equal(got["top1"], want["top1"])
    assert 0 < got["kl"].mean() and got["alpha"].min() < 1  # a real difference was measured


def _agree_json(*args):
    out = pyspec_cmd("agree", *args, "--json", "-", "--no-costs")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_q8_0_copy_is_healthy_and_the_broken_copy_is_broken(gemma_path, copies, tmp_path):
    q8, broken = copies
    healthy = _agree_json(gemma_path, q8)
    for key in ("acceptance_mean", "kl_mean", "top1_agreement", "n_positions", "verdict", "reason", "per_category"):
        assert key in healthy, key
    assert set(healthy["per_category"]) == {"code", "prose", "math", "chat"}
    print(f"Q8_0: KL {healthy['kl_mean']:.4g} alpha {healthy['acceptance_mean']:.4f} -> {healthy['verdict']}")
    assert healthy["verdict"] == "healthy", healthy["reason"]
    assert 0 < healthy["kl_mean"] < healthy["healthy_below"]
    # The broken copy on three short streams of prose: far past the bound on any text.
    text = tmp_path / "t.txt"
    text.write_text("One morning the river rose above its banks and the village moved to the hill. " * 12)
    bad = _agree_json(gemma_path, broken, "--text", str(text), "--window", "64")
    print(f"broken: KL {bad['kl_mean']:.4g} alpha {bad['acceptance_mean']:.4f} -> {bad['verdict']}")
    assert bad["verdict"] == "broken", bad["reason"]
    assert bad["kl_mean"] > 10 * healthy["kl_mean"] and bad["acceptance_mean"] < healthy["acceptance_mean"]


def test_agree_text_prompts_and_plot(gemma_path, copies, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("One morning the river rose above its banks and the village moved to the hill. " * 12)
    r = _agree_json(gemma_path, copies[0], "--text", str(text), "--window", "64")
    assert r["settings"]["streams"] >= 3 and set(r["per_category"]) == {"text"}
    prompts = tmp_path / "p.txt"
    prompts.write_text("The capital of France is\n\ndef fib(n):\n")
    png = tmp_path / "cdf.png"
    out = pyspec_cmd("agree", gemma_path, copies[0], "--prompts", str(prompts), "--raw", "-n", "12", "-t", "0",
                     "--plot", str(png), "-k", "4")
    assert out.returncode == 0, out.stderr
    assert "speed-up" in out.stdout and "verdict: HEALTHY" in out.stdout
    assert png.stat().st_size > 10_000


def test_agree_refuses_models_without_a_shared_vocabulary(gemma_path, draft_path):
    out = pyspec_cmd("agree", gemma_path, draft_path, "--no-costs")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "vocabular" in out.stderr or "token" in out.stderr, out.stderr


def test_quantize_errors_are_clear_and_leave_nothing(gemma_path, tmp_path):
    out = pyspec_cmd("quantize", gemma_path, str(tmp_path / "a.gguf"), "--type", "Q8_0")
    assert out.returncode == 1 and "--allow-requantize" in out.stderr, out.stderr
    out = pyspec_cmd("quantize", str(tmp_path / "missing.gguf"), str(tmp_path / "b.gguf"), "--type", "Q8_0")
    assert out.returncode == 1 and "not found" in out.stderr, out.stderr
    out = pyspec_cmd("quantize", gemma_path, str(tmp_path / "c.gguf"), "--type", "Q9_K")
    assert out.returncode == 2 and "q8_0" in out.stderr.lower()
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(64))
    out = pyspec_cmd("quantize", str(corrupt), str(tmp_path / "d.gguf"), "--type", "Q8_0", "--allow-requantize")
    assert out.returncode == 1 and "Traceback" not in out.stderr and "corrupt.gguf" in out.stderr, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.gguf"]
    (tmp_path / "e.gguf").write_bytes(b"keep")
    out = pyspec_cmd("quantize", gemma_path, str(tmp_path / "e.gguf"), "--type", "Q8_0", "--allow-requantize")
    assert out.returncode == 1 and "--force" in out.stderr and (tmp_path / "e.gguf").read_bytes() == b"keep"


def _interrupted(*args: str, started: str) -> str:
    """Run `pyspec ARGS`, send SIGINT a second after stderr shows `started`; its
    stderr once it exits 130."""
    exe = shutil.which("pyspec")
    cmd = [exe] if exe else [sys.executable, "-m", "pyspec.cli"]
    proc = subprocess.Popen(cmd + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:  # the work has begun once this line is out
        seen.append(line)
        if started in line:
            break
    time.sleep(1)
    assert proc.poll() is None, f"finished before the interrupt: {''.join(seen)}"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    return err


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_during_quantize_leaves_no_file(target_path, tmp_path):
    """The default target takes ~15 s to quantise here: interrupted a second in."""
    _interrupted("quantize", target_path, str(tmp_path / "t8.gguf"), "--type", "Q8_0", "--allow-requantize",
                 started="pyspec quantize:")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_during_agree_exits_cleanly(gemma_path):
    """Scoring the built-in texts takes ~15 s here: interrupted a second in (the core stops within a decode)."""
    err = _interrupted("agree", gemma_path, gemma_path, "--no-costs", started="pyspec agree: scoring")
    assert "interrupted" in err


def test_expected_rounds_match_a_simulation_and_the_geometric_shortcut_does_not():
    """The speculation view's dynamic programme against a Monte Carlo of the round
    process it models (rounds of k drafts, draft j at row i accepted with
    probability alpha[i + j - 1]), on a stream with runs of easy and hard rows. Test:
    |DP - simulated mean| < 4 standard errors (two-sided, alpha ~ 6e-5; 20,000
    runs). Negative control, the same test: the geometric formula from the mean
    alpha (what a summary number would predict) must be rejected."""
    rng = np.random.default_rng(7)
    alpha = np.concatenate([np.full(30, 0.95), np.full(30, 0.1), rng.uniform(0, 1, 40)])
    k, runs = 4, 20_000
    sims = np.empty(runs)
    for r in range(runs):
        i = rounds = 0
        u = rng.random((len(alpha), k))
        while i < len(alpha):
            j = 0
            while j < k and i + j < len(alpha) and u[i, j] < alpha[i + j]:
                j += 1
            i += j + 1
            rounds += 1
        sims[r] = rounds
    se = sims.std(ddof=1) / math.sqrt(runs)

    def test(predicted):
        return abs(predicted - sims.mean()) < 4 * se

    dp = expected_rounds(alpha, k)
    a = alpha.mean()
    geometric = len(alpha) / ((1 - a ** (k + 1)) / (1 - a))
    print(f"rounds: DP {dp:.3f}, simulated {sims.mean():.3f} +- {se:.3f}, geometric {geometric:.3f}")
    assert test(dp)
    assert not test(geometric)


def test_acceptance_by_position_on_streams_shorter_than_the_draft():
    assert acceptance_by_position([np.ones(3)], 8) == [1.0] * 3 + [None] * 5
    assert acceptance_by_position([np.array([1, 1, 0, 1, 1, 1.0])], 3) == [5 / 6, 3 / 4, 1 / 2]


def test_agree_refuses_options_that_would_be_ignored(gemma_path):
    out = pyspec_cmd("agree", gemma_path, gemma_path, "--window", "64")
    assert out.returncode == 2 and "--window applies to --text only" in out.stderr
    out = pyspec_cmd("agree", gemma_path, gemma_path, "--top-p", "0")
    assert out.returncode == 1 and "top_p" in out.stderr and "Traceback" not in out.stderr


def test_verdicts_for_non_finite_logits_and_other_models():
    q8 = 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    ok = dict(kl_mean=0.001, top1=0.99, cand_type=q8, cand_params=10**9, ref_params=10**9)
    assert judge(nonfinite=0, **ok).verdict == "healthy"
    assert judge(nonfinite=3, **ok).verdict == "broken"
    assert judge(nonfinite=0, **{**ok, "kl_mean": 0.02}).verdict == "suspicious"
    assert judge(nonfinite=0, **{**ok, "top1": 0.3}).verdict == "broken"
    assert judge(nonfinite=0, **{**ok, "cand_params": 5 * 10**8}).verdict == "not-a-quantization"
    odd = judge(nonfinite=0, **{**ok, "cand_type": 38})  # a type without a published band
    assert odd.verdict == "healthy" and "no published band" in odd.reason


ZEROED_TENSOR = "blk.17.ffn_down.weight"  # the last layer's FFN: its output is zero


def test_a_same_type_copy_with_a_zeroed_ffn_tensor_is_broken(gemma_path, load_model, tmp_path):
    """The test model (Q4_K_M) against a copy with one FFN weight tensor zeroed:
    it loads and is judged as a same-type pair, which should agree almost
    exactly. Its mean KL (~0.45 on these streams, 0.34-0.54 on each built-in
    text; the Q4_K_M edge 0.25) lies inside the Q4_K_M band
    for a quantisation against its source (what the verdict said before: the
    control below), far above the same-type floor: broken."""
    zeroed = tmp_path / "zeroed.gguf"
    shutil.copy(gemma_path, zeroed)
    assert zero_tensor(str(zeroed), ZEROED_TENSOR) > 0
    ref = load_model(gemma_path, n_ctx=1024)
    cand = pyspec.Model(str(zeroed), n_ctx=1024)  # not the session's: freed with the test
    assert cand.native.file_type == ref.native.file_type == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M, declared
    streams = builtin_streams(ref)[2::4]  # a prose and a chat text: ~190 positions
    r = agree(ref, cand, streams, costs=False)
    print(f"zeroed {ZEROED_TENSOR}: KL {r['kl_mean']:.4g} alpha {r['acceptance_mean']:.4f} -> {r['verdict']}: "
          f"{r['reason']}")
    assert r["nonfinite"] == 0 and r["same_type"]
    assert r["verdict"] == "broken" and "same type (Q4_K_M)" in r["reason"], r["reason"]
    assert r["kl_mean"] > 1000 * SAME_TYPE_FLOOR
    old = judge(kl_mean=r["kl_mean"], top1=r["top1_agreement"], nonfinite=0, cand_type=15,
                cand_params=cand.native.n_params, ref_params=ref.native.n_params)  # reference's type unknown
    assert old.verdict == "suspicious" and not old.same_type


def test_same_type_verdict_bands():
    """A same-type pair: healthy up to SAME_TYPE_FLOOR, broken from the type's
    own healthy edge; what is not a same-type pair (another or a guessed type,
    another parameter count) keeps the bands of a quantisation."""
    q4km, q8, guessed = 15, 7, 1024
    n = 268_098_176
    base = dict(top1=0.99, nonfinite=0, cand_type=q4km, ref_type=q4km, cand_params=n, ref_params=n)
    edge = judge(kl_mean=0.0, **base)
    assert edge.same_type and edge.healthy_below == SAME_TYPE_FLOOR
    top = edge.broken_above
    assert top == pytest.approx(4 * 0.0313 * 2)  # Q4_K_M's healthy edge under 2B parameters

    def verdict(kl, **kw):
        return judge(kl_mean=kl, **{**base, **kw}).verdict

    assert [verdict(kl) for kl in (0.0, SAME_TYPE_FLOOR, 1.01 * SAME_TYPE_FLOOR, 0.99 * top, top, 0.4)] == \
        ["healthy", "healthy", "suspicious", "suspicious", "broken", "broken"]
    assert verdict(0.0, nonfinite=2) == "broken" and verdict(0.01, top1=0.4) == "broken"
    assert "not covered" in judge(kl_mean=0.01, **base).reason
    # Not same-type pairs: exactly the verdicts of old (judged without the reference's type).
    for kw in (dict(ref_type=q8), dict(cand_type=q4km | guessed), dict(ref_type=q4km | guessed),
               dict(cand_params=n + 1), dict(ref_type=None)):
        for kl in (0.0, 0.01, 0.2, 0.26, 0.9, 1.0, 2.0):
            args = {**base, **kw, "kl_mean": kl}
            v = judge(**args)
            args.pop("ref_type")
            assert v == judge(**args) and not v.same_type, (kw, kl)
    assert [verdict(kl, ref_type=q8) for kl in (0.0, 0.25, 0.26, 0.99, 1.0)] == \
        ["healthy", "healthy", "suspicious", "suspicious", "broken"]
    # A same-type pair of a precise type: the broken edge stays above the floor.
    f16 = judge(kl_mean=0.0, **{**base, "cand_type": 1, "ref_type": 1, "cand_params": 8 * 10**9,
                                "ref_params": 8 * 10**9})
    assert f16.verdict == "healthy" and f16.broken_above >= 2 * SAME_TYPE_FLOOR
