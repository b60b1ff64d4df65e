"""The `pyspec` command, run as a real process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import pyspec
from cli_helpers import pyspec_cmd




def test_version():
    out = pyspec_cmd("--version")
    assert out.returncode == 0
    assert pyspec.__version__ in out.stdout


def test_help_explains_commands():
    out = pyspec_cmd("--help")
    assert out.returncode == 0
    for cmd in ("generate", "models"):
        assert cmd in out.stdout
    gen = pyspec_cmd("generate", "--help")
    for flag in ("--model", "--max-tokens", "--temperature", "--top-k", "--top-p", "--min-p", "--seed",
                 "--n-ctx", "--threads", "--n-gpu-layers", "--flash-attn", "--strict", "--raw", "--json", "--stop"):
        assert flag in gen.stdout, flag


def test_generate_json_fields(gemma_path):
    out = pyspec_cmd("generate", "The sky is", "-m", gemma_path, "--raw", "--json", "--max-tokens", "12",
                     "--temperature", "0", "--n-ctx", "256")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    for key in ("text", "tokens", "n_prompt_tokens", "n_generated_tokens", "stats"):
        assert key in d, key
    assert d["n_generated_tokens"] == len(d["tokens"]) == 12
    assert isinstance(d["text"], str) and d["text"]
    assert d["n_prompt_tokens"] > 0
    stats = d["stats"]
    assert stats["ttft_s"] > 0 and stats["decode_tok_s"] > 0
    assert stats["n_generated"] == 12


def test_generate_streams_same_text_as_json(gemma_path):
    # Plain decoding: auto's draft lengths follow measured timings, and batches of
    # different sizes may round a near tie differently (greedy text is then not
    # reproducible run to run; its distribution is).
    args = ["The sky is", "-m", gemma_path, "--raw", "--max-tokens", "12", "--temperature", "0", "--n-ctx", "256",
            "--no-draft"]
    streamed = pyspec_cmd("generate", *args)
    as_json = json.loads(pyspec_cmd("generate", *args, "--json").stdout)
    assert streamed.returncode == 0
    assert streamed.stdout.rstrip("\n") == as_json["text"]


def test_samples_print_separately_and_as_json_choices(gemma_path):
    # Plain decoding: the same seed repeats samples exactly (under auto at T > 0 only where the
    # draft lengths, which follow measured times, come out the same: python.md#seeds).
    args = ("generate", "Write a word:", "-m", gemma_path, "--raw", "--n", "3", "-n", "6", "--temperature", "1",
            "--seed", "5", "--no-draft")
    as_json = pyspec_cmd(*args, "--json")
    assert as_json.returncode == 0, as_json.stderr
    d = json.loads(as_json.stdout)
    assert len(d["choices"]) == 3
    for c in d["choices"]:
        assert isinstance(c["text"], str) and 1 <= len(c["tokens"]) <= 6 and c["stop_reason"] in ("eog", "max_tokens")
    assert d["stats"]["n_seq"] == 3 and len(d["stats"]["ttft_s"]) == 3 and d["stats"]["aggregate_tok_s"] > 0
    printed = pyspec_cmd(*args)
    assert printed.returncode == 0, printed.stderr
    for i, c in enumerate(d["choices"]):
        assert f"--- sample {i + 1} of 3" in printed.stdout
        assert c["text"] in printed.stdout  # the same seed gives the same samples


def test_missing_model_is_a_clear_error(tmp_path):
    out = pyspec_cmd("generate", "hi", "-m", str(tmp_path / "missing.gguf"))
    assert out.returncode != 0
    assert "not found" in out.stderr
    assert "Traceback" not in out.stderr


def test_bad_setting_is_a_clear_error(gemma_path):
    out = pyspec_cmd("generate", "hi", "-m", gemma_path, "--raw", "--top-p", "2")
    assert out.returncode != 0
    assert "top_p" in out.stderr or "top-p" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args", [("bench", "serve", "--clients", "1,x"), ("bench", "parallel", "--n", "0,2"),
                                  ("bench", "paired", "--draft-max", "2,-1")])
def test_bad_integer_lists_are_clear_errors(args):
    """The benches' comma-separated integer options share one parser (cli/options.IntList)."""
    out = pyspec_cmd(*args)
    assert out.returncode == 2, out.stderr
    assert f"Invalid value for '{args[2]}'" in out.stderr and "Traceback" not in out.stderr


BENCHMARKS = ["paired", "multiturn", "parallel", "serve", "editor", "vim", "agent", "soak", "rpc", "verify", "simulate"]


def _listed(help_text: str) -> list:
    """The command names of a --help's Commands section."""
    section = help_text.split("\nCommands:\n", 1)[1]
    return [line.split()[0] for line in section.splitlines() if line.startswith("  ") and not line.startswith("   ")]


def test_the_benchmarks_are_one_group():
    """The top level shows what a user does: one `bench`, whose --help lists the benchmarks."""
    from pyspec.cli.bench_group import RENAMED

    top = pyspec_cmd("--help")
    assert top.returncode == 0, top.stderr
    names = _listed(top.stdout)
    assert "bench" in names and {"generate", "serve", "models", "info", "check"} <= set(names), names
    assert not [n for n in names if n.startswith("bench-") or n in RENAMED], names
    group = pyspec_cmd("bench", "--help")
    assert group.returncode == 0, group.stderr
    assert _listed(group.stdout) == BENCHMARKS
    assert "Start with `pyspec bench paired" in group.stdout
    assert sorted(RENAMED.values()) == sorted(set(BENCHMARKS) - {"paired", "editor", "vim", "agent"})  # new, no old name


def test_an_old_name_runs_as_before_after_one_line_on_stderr():
    """`pyspec bench-verify` (like the other old names, bench_group.RENAMED) runs
    `pyspec bench verify`: the same output, stdout untouched (--json)."""
    out = pyspec_cmd("bench-verify", "--json", "--seconds", "0.1")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "pyspec: 'pyspec bench-verify' is now 'pyspec bench verify' (the old name goes in a later release)"]
    assert json.loads(out.stdout)["verify_only_rounds_per_s"] > 0


def test_bench_with_options_is_bench_paired_after_one_line_on_stderr():
    """The old `pyspec bench [options]` (no subcommand) runs `pyspec bench paired`:
    here its usage error, exit 2, with the notice first."""
    out = pyspec_cmd("bench", "--draft-max", "2,-1")
    assert out.returncode == 2 and out.stdout == "", out.stderr
    notice, *rest = out.stderr.splitlines()
    assert notice == ("pyspec: 'pyspec bench [options]' is now 'pyspec bench paired [options]' "
                      "(the old spelling goes in a later release)")
    assert "Invalid value for '--draft-max'" in rest[-1] and "Traceback" not in out.stderr


def test_bare_bench_is_bench_paired_after_one_line_on_stderr(monkeypatch):
    """Bare `pyspec bench` ran the default suite before the grouping, and still
    does (after the notice), not the group's help. The suite itself is stubbed
    (it takes many minutes); control: `pyspec bench --help` does not run it."""
    from click.testing import CliRunner

    from pyspec.cli import main
    from pyspec.cli.bench_group import bench

    ran = []
    monkeypatch.setattr(bench.commands["paired"], "callback", lambda **kw: ran.append(kw))
    out = CliRunner().invoke(main, ["bench"])
    assert out.exit_code == 0 and len(ran) == 1, (out.output, out.stderr)
    assert ran[0]["paired"] is None and out.stdout == ""
    assert out.stderr.splitlines() == ["pyspec: 'pyspec bench [options]' is now 'pyspec bench paired [options]' "
                                       "(the old spelling goes in a later release)"]
    helped = CliRunner().invoke(main, ["bench", "--help"])
    assert helped.exit_code == 0 and len(ran) == 1 and "paired" in helped.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_exits_cleanly(gemma_path):
    exe = shutil.which("pyspec")
    cmd = [exe] if exe else [sys.executable, "-m", "pyspec.cli"]
    proc = subprocess.Popen(
        [*cmd, "generate", "Count from one to a thousand:", "-m", gemma_path, "--raw", "--max-tokens", "4000",
         "--temperature", "0", "--n-ctx", "4096"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A C++ frame killed at exit aborts at once instead of first forking gdb for a backtrace.
        env=dict(os.environ, GGML_NO_BACKTRACE="1"),
    )
    first = proc.stdout.read(1)  # generation has started
    assert first
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("pyspec did not stop on Ctrl-C")
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert "Traceback" not in err and "terminate" not in err


def test_models_list(monkeypatch, tmp_path):
    env = dict(os.environ, PYSPEC_MODELS=str(tmp_path))
    out = pyspec_cmd("models", "list", "--json", env=env)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    names = {r["name"] for r in rows}
    from pyspec import models

    assert {models.DEFAULT_TARGET, models.DEFAULT_DRAFT, models.TEST_MODEL} <= names
    assert not any(r["present"] for r in rows)


def test_cli_default_names_match_the_catalog():
    from pyspec import cli, models

    assert cli.DEFAULT_MODEL == models.DEFAULT_TARGET
    assert cli.DEFAULT_DRAFT == models.DEFAULT_DRAFT


def test_generate_speculative_json_has_drafting_stats(gemma_path):
    out = pyspec_cmd("generate", "one two three one two three one two", "-m", gemma_path, "--raw", "--json",
                     "--drafter", "ngram", "--policy", "fixed", "-k", "3", "-n", "12", "-t", "0", "--n-ctx", "256")
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    for key in ("rounds", "drafted", "accepted", "acceptance_rate", "mean_accepted_len", "accepted_per_position",
                "draft_s", "verify_s", "overhead_s", "length_hist", "policy_plain", "ngram_rounds"):
        assert key in stats, key
    assert stats["drafted"] > 0 and stats["ngram_rounds"] > 0
    assert len(stats["accepted_per_position"]) == 3


def test_a_model_without_a_draft_drafts_by_lookup(gemma_path):
    out = pyspec_cmd("generate", "one two three one two three one two", "-m", gemma_path, "--raw", "--json",
                     "-n", "8", "-t", "0", "--n-ctx", "256")
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    assert stats["rounds"] > 0 and stats["policy_plain"] + stats["ngram_rounds"] > 0
    plain = json.loads(pyspec_cmd("generate", "x", "-m", gemma_path, "--raw", "--json", "-n", "4", "--no-draft",
                                  "--n-ctx", "256").stdout)["stats"]
    assert plain["policy_plain"] == plain["ngram_rounds"] == 0


def test_a_draft_model_drafter_without_a_draft_is_a_clear_error(gemma_path):
    out = pyspec_cmd("generate", "hi", "-m", gemma_path, "--raw", "--drafter", "hybrid", "-n", "4")
    assert out.returncode != 0 and "needs a draft model" in out.stderr
    assert "Traceback" not in out.stderr


def test_stats_summary_goes_to_stderr(gemma_path):
    out = pyspec_cmd("generate", "The sky is", "-m", gemma_path, "--raw", "-n", "6", "-t", "0", "--n-ctx", "256",
                     "--drafter", "ngram", "--stats")
    assert out.returncode == 0, out.stderr
    assert "tok/s" in out.stderr and "tok/s" not in out.stdout
