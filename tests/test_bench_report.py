"""The benchmark's arithmetic and pictures (on hand-made samples: speed itself
is never asserted in tests)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from pyspec.bench.inprocess.backends import Sample
from pyspec.bench.inprocess.report import decode_rate, format_table, summarize


def _s(runner, cat, n, secs, **extra):
    return Sample(runner, f"{cat}/0", cat, 10, n, 0.1, secs, extra)


def test_ratios_pool_tokens_and_time():
    samples = [
        _s("base", "code", 11, 1.0),
        _s("base", "qa", 21, 1.0),
        _s("fast", "code", 11, 0.5, rounds=5, drafted=10, accepted=5, policy_plain=0, drafted_at=[5, 5],
           accepted_at=[3, 2]),
        _s("fast", "qa", 21, 4.0, rounds=20, drafted=0, accepted=0, policy_plain=20),
    ]
    assert decode_rate(samples[:2]) == pytest.approx(30 / 2.0)
    t = summarize(samples, "base")
    assert t["code"]["fast"]["ratio"] == pytest.approx(2.0)
    assert t["qa"]["fast"]["ratio"] == pytest.approx(0.25)
    assert t["all"]["fast"]["ratio"] == pytest.approx((30 / 4.5) / 15)
    assert t["code"]["fast"]["acceptance"] == pytest.approx(0.5)
    assert t["code"]["fast"]["mean_accepted_len"] == pytest.approx(2.0)
    assert t["code"]["fast"]["mean_draft_len"] == pytest.approx(2.0)
    assert t["code"]["base"]["acceptance"] is None
    text = format_table(t, ["base", "fast"], "base")
    assert "[code]" in text and "2.00x" in text and "0.25x" in text


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from pyspec.bench.plot import acceptance_by_position, plot

    samples = [
        _s("base", "code", 11, 1.0),
        _s("fast", "code", 11, 0.5, rounds=5, drafted=10, accepted=5, drafted_at=[5, 5], accepted_at=[3, 2]),
    ]
    assert acceptance_by_position([asdict(s) for s in samples]) == {"fast": [0.6, 0.4]}
    result = {
        "summary": summarize(samples, "base"),
        "runners": ["base", "fast"],
        "baseline": "base",
        "settings": {"sampling": {"temperature": 0.0}},
        "threads": 2,
        "samples": [asdict(s) for s in samples],
    }
    out = tmp_path / "bench.png"
    plot(result, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _FakeGenerator:
    """Records what the runner does, in order."""

    def __init__(self):
        self.log = []

    def clear_cache(self):
        self.log.append(("clear_cache",))

    def generate(self, tokens, **kw):
        from pyspec.results import Completion, GenerationStats

        self.log.append(("generate", len(tokens)))
        return Completion("x", [1, 2], len(tokens), "max_tokens", GenerationStats(n_generated=2, decode_s=0.1))


def test_pyspec_runner_starts_every_run_from_empty_caches():
    """Runners share models: without a reset, later runners would reuse the
    prompt the previous one processed and report a shorter time to first token."""
    from pyspec.bench.inprocess.backends import PyspecRunner, Settings

    gen = _FakeGenerator()
    PyspecRunner(gen, "r").run([5, 6, 7], Settings(max_tokens=2))
    assert gen.log == [("clear_cache",), ("generate", 3)]


@pytest.mark.pair
def test_bench_command_end_to_end(gemma_path, tmp_path):
    """The real command on one short prompt (the small model, raw text: it has no
    chat template): every runner reports, the JSON and the plot are written."""
    import json
    import shutil
    import subprocess
    import sys

    exe = shutil.which("pyspec")
    cmd = [exe] if exe else [sys.executable, "-m", "pyspec.cli"]
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    run = subprocess.run([*cmd, "bench", "paired", "-m", gemma_path, "--raw", "--category", "translation",
                          "--per-category", "1", "--max-tokens", "8", "--policy", "", "--hybrid", "", "--ngram", "auto",
                          "--lookup", "4", "--n-ctx", "512", "--json", str(out_json), "--plot", str(out_png)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(out_json.read_text())
    assert result["runners"] == ["pyspec plain", "pyspec ngram auto", "llama-cpp-python", "llama-cpp-python lookup"]
    rows = result["summary"]["translation"]
    assert all(rows[r]["decode_tok_s"] > 0 for r in result["runners"])
    assert rows["llama-cpp-python"]["ratio"] == pytest.approx(1.0)
    assert "[translation]" in run.stdout and "vs plain" in run.stdout
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_parallel_end_to_end(gemma_path, tmp_path):
    """The real command, tiny: V(n) and the ceiling for each n, the three
    runners' aggregate speeds, the consensus rows, the JSON and the plot."""
    import json

    from cli_helpers import pyspec_cmd

    out_json, out_png = tmp_path / "p.json", tmp_path / "p.png"
    run = pyspec_cmd("bench", "parallel", "-m", gemma_path, "--raw", "--n", "2", "--max-tokens", "6", "--reps", "1",
                     "--consensus-n", "2", "--per-category", "1", "--json", str(out_json), "--plot", str(out_png))
    assert run.returncode == 0, run.stderr
    result = json.loads(out_json.read_text())
    rows = {r["n"]: r for r in result["parallel"]}
    assert sorted(rows) == [1, 2]  # n = 1 is always measured: V(n) is in its units
    assert rows[1]["V"] == 1.0 and rows[2]["V"] > 0 and rows[2]["ceiling"] == pytest.approx(2 / rows[2]["V"])
    for r in rows.values():
        assert r["batched_tok_s"] > 0 and r["serial_tok_s"] > 0 and r["llama_tok_s"] > 0
        assert r["speedup"] == pytest.approx(r["batched_tok_s"] / r["serial_tok_s"])
        assert len(r["ttft_s"]) == r["n"]
    assert [r["category"] for r in result["consensus"]] == ["math", "code"]
    assert all(r["plain_tok_s"] > 0 and r["consensus_tok_s"] > 0 for r in result["consensus"])
    assert "ceiling" in run.stdout and "consensus drafting" in run.stdout
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulator_replays_copying_and_finds_no_gain_without_it():
    """The replay simulator on synthetic outputs with GPU-like costs: a copied
    output gains under auto and more under the oracle; an output with nothing
    to copy (the control) gains nothing under the oracle and loses little under auto."""
    import random

    from pyspec.bench.inprocess.simulate import simulate

    costs = {n: 1.0 + 0.05 * (n - 1) for n in range(1, 18)}
    source = list(range(10, 210))
    copied = simulate([1] + source + [2], source[:150], costs, n_vocab=1000)
    assert copied["auto"] > 2.0 and copied["oracle"] >= copied["auto"] * 0.95
    rng = random.Random(0)
    noise = [rng.randrange(300, 1000) for _ in range(150)]
    control = simulate([1] + source + [2], noise, costs, n_vocab=1000)
    assert control["oracle"] == pytest.approx(1.0) and 0.85 < control["auto"] <= 1.0 + 1e-9
