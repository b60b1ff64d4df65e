"""`pyspec bench paired --paired`: the arithmetic of paired ratios and their bootstrap
interval, on hand-made samples whose truth is known (speed itself is never
asserted in tests), and the command end to end.

The interval's claim is statistical, so it is tested as one: over 200 simulated
benchmarks (12 prompts, 6 repetitions) whose configuration B is truly 3 %
slower than A, with a drift of the machine's speed of 10 % that hits both runs
of a pair alike and 5 % noise of each run's own, the 95 % interval must
cover the true ratio in at least 88 % of them (at 95 % nominal coverage,
Binomial(200, 0.95) falls below 176 with probability < 0.001), and must exclude
1.00 in at least 80 % of them (power; 4 repetitions gave 67 %). Negative control: the same data read *unpaired* (B's
runs matched with A's runs of another repetition) must lose that power: the
pairing is what lets 3 % show.
"""

from __future__ import annotations

import math
import random

import pytest

from pyspec.bench.inprocess.backends import Sample
from pyspec.bench.inprocess.paired import comparisons, format_paired, pair_logs, parse_config, summarize_pair
from pyspec.bench.stats import bootstrap_interval, run_order

PROMPTS = [f"{c}/{i}" for c in ("code", "math", "qa", "translation") for i in range(3)]


def simulate(true_ratio: float, reps: int, rng: random.Random, noise: float = 0.05) -> list:
    """Samples of A and B on 12 prompts: rate = prompt speed x drift of the
    moment (shared by the pair) x own noise (lognormal, sd `noise`)."""
    out = []
    for pid in PROMPTS:
        speed = 25 * math.exp(rng.gauss(0, 0.2))
        for rep in range(reps):
            drift = math.exp(rng.gauss(0, 0.10))
            for runner, r in (("A", 1.0), ("B", true_ratio)):
                rate = speed * drift * r * math.exp(rng.gauss(0, noise))
                n = 200
                out.append(Sample(runner, pid, pid.split("/")[0], 10, n + 1, 0.1, n / rate, {"rep": rep}))
    return out


def test_pairs_match_prompt_and_repetition():
    s = [Sample("A", "p/0", "p", 1, 11, 0.1, 1.0, {"rep": 0}), Sample("B", "p/0", "p", 1, 11, 0.1, 0.5, {"rep": 0}),
         Sample("A", "p/0", "p", 1, 11, 0.1, 2.0, {"rep": 1}), Sample("B", "p/0", "p", 1, 11, 0.1, 1.0, {"rep": 1})]
    logs = pair_logs(s, "A", "B")
    assert logs == {"p/0": [pytest.approx(math.log(2.0)), pytest.approx(math.log(2.0))]}
    summary = summarize_pair(s, "A", "B", n_boot=200)
    assert summary["all"]["ratio"] == pytest.approx(2.0)
    assert summary["all"]["low"] == pytest.approx(2.0) and summary["all"]["high"] == pytest.approx(2.0)
    assert summary["ordinary"]["below_1"] == 0
    assert "[B / A]" in format_paired({"B / A": summary})
    assert comparisons(["plain", "ngram", "default"]) == [("plain", "ngram"), ("plain", "default"),
                                                          ("ngram", "default")]


def test_groups_split_copy_heavy_from_ordinary_prompts():
    s = []
    for pid, cat, t_b in (("code_editing/0", "code_editing", 0.5), ("qa/0", "qa", 1.25)):
        s += [Sample("A", pid, cat, 1, 11, 0.1, 1.0, {"rep": 0}), Sample("B", pid, cat, 1, 11, 0.1, t_b, {"rep": 0})]
    summary = summarize_pair(s, "A", "B", n_boot=100)
    assert summary["copy"]["ratio"] == pytest.approx(2.0)
    assert summary["ordinary"]["ratio"] == pytest.approx(0.8)
    assert summary["ordinary"]["below_1"] == 1 and summary["ordinary"]["worst_prompt"] == "qa/0"
    assert summary["all"]["ratio"] == pytest.approx(math.sqrt(1.6))


def _unpaired(samples):
    """The negative control: B's repetition r matched with A's repetition r + 1."""
    reps = 1 + max(s.extra["rep"] for s in samples)
    return [Sample(s.runner, s.prompt_id, s.category, s.n_prompt, s.n_generated, s.ttft_s, s.decode_s,
                   {"rep": (s.extra["rep"] + 1) % reps if s.runner == "B" else s.extra["rep"]}) for s in samples]


def test_the_interval_covers_a_3_percent_loss_and_sees_it():
    rng = random.Random(22)
    trials, covered, excluded, excluded_unpaired = 200, 0, 0, 0
    for t in range(trials):
        samples = simulate(0.97, reps=6, rng=rng)
        r = summarize_pair(samples, "A", "B", n_boot=300, seed=t)["all"]
        covered += r["low"] <= 0.97 <= r["high"]
        excluded += r["high"] < 1.0
        u = summarize_pair(_unpaired(samples), "A", "B", n_boot=300, seed=t)["all"]
        excluded_unpaired += u["high"] < 1.0
    print(f"coverage {covered}/{trials}, 3 % loss seen paired {excluded}/{trials}, unpaired {excluded_unpaired}")
    assert covered >= 176
    assert excluded >= 0.8 * trials
    assert excluded_unpaired < 0.5 * excluded  # negative control: without pairing the loss hides


def test_orders_balance_positions():
    assert ["".join(run_order(list("AB"), r)) for r in range(4)] == ["AB", "BA", "BA", "AB"]
    orders = ["".join(run_order(list("ABC"), r)) for r in range(6)]
    assert orders == ["ABC", "CBA", "BCA", "ACB", "CAB", "BAC"]
    for i in range(3):  # each configuration twice at every position
        assert sorted(o[i] for o in orders) == list("AABBCC")


def test_bootstrap_of_identical_logs_is_a_point():
    assert bootstrap_interval([[0.0, 0.0], [0.0]], n_boot=50) == (1.0, 1.0)


@pytest.mark.parametrize("text, drafter, policy, k", [("plain", None, None, None), ("default", "hybrid", "auto", None),
                                                      ("ngram", "ngram", "auto", None),
                                                      ("model:fixed:4", "model", "fixed", 4)])
def test_configurations_parse(text, drafter, policy, k):
    c = parse_config(text)
    assert (c.drafter, c.policy, c.draft_max) == (drafter, policy, k)


@pytest.mark.parametrize("text", ["nope", "ngram:nope", "model:fixed:0", "model:fixed:x", "a:b:c:d"])
def test_bad_configurations_are_clear_errors(text):
    with pytest.raises(ValueError):
        parse_config(text)


def test_paired_command_end_to_end(gemma_path, tmp_path):
    """The real command on two prompts of the test model: ABBA order, every
    sample paired, the JSON and the plot written; runner options are refused."""
    import json
    import shutil
    import subprocess
    import sys

    exe = shutil.which("pyspec")
    cmd = [exe] if exe else [sys.executable, "-m", "pyspec.cli"]
    out_json, out_png = tmp_path / "p.json", tmp_path / "p.png"
    args = [*cmd, "bench", "paired", "-m", gemma_path, "--category", "translation", "--category", "code_editing",
            "--per-category", "1", "--max-tokens", "12", "--reps", "2", "--n-ctx", "1024", "--raw",
            "--paired", "plain,ngram"]
    run = subprocess.run([*args, "--json", str(out_json), "--plot", str(out_png)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(out_json.read_text())
    assert result["configurations"] == ["plain", "ngram"] and result["order"] == "ABBA"
    order = [(s["extra"]["rep"], s["prompt_id"], s["runner"]) for s in result["samples"]]
    first = order[0][1]  # the categories' order as given: translation/0
    assert order[:2] == [(0, first, "plain"), (0, first, "ngram")]
    assert [o for o in order if o[0] == 1][:2] == [(1, first, "ngram"), (1, first, "plain")]  # ABBA
    rows = result["paired"]["ngram / plain"]
    # A pair counts where both sides decoded past their first token (a raw prompt may end at once).
    timed = {(s["extra"]["rep"], s["prompt_id"]) for s in result["samples"] if s["n_generated"] > 1 and
             s["runner"] == "plain"} & {(s["extra"]["rep"], s["prompt_id"]) for s in result["samples"]
                                        if s["n_generated"] > 1 and s["runner"] == "ngram"}
    assert rows["all"]["n_pairs"] == len(timed) >= 2
    assert rows["all"]["low"] <= rows["all"]["ratio"] <= rows["all"]["high"]
    assert "[ngram / plain]" in run.stdout
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    refused = subprocess.run([*args, "--lookup", "3"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--lookup" in refused.stderr
