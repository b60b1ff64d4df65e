"""Flash attention: chosen per Model, reported as run, part of the calibration key."""

from __future__ import annotations

import json

import pytest

import pyspec
from cli_helpers import pyspec_cmd
from pyspec import calibration




@pytest.mark.parametrize("setting", ["on", "off"])
def test_flash_attn_on_and_off_load_and_generate(gemma_path, setting):
    m = pyspec.Model(gemma_path, n_ctx=256, flash_attn=setting)
    assert m.flash_attn == setting
    assert m.native.flash_attn_requested == {"on": 1, "off": 0}[setting]
    out = m.generate("The capital of France is", max_tokens=6, temperature=0, chat=False)
    assert out.n_generated_tokens == 6 and out.text


def test_flash_attn_auto_reports_what_llama_cpp_chose(gemma_path):
    m = pyspec.Model(gemma_path, n_ctx=256)  # default: auto
    assert m.native.flash_attn_requested == -1
    assert m.flash_attn in ("on", "off")  # resolved, not "auto"
    if not pyspec._core.supports_gpu_offload():
        assert m.flash_attn == "on"  # the CPU backend supports it


@pytest.mark.parametrize("bad", ["yes", "ON", "", None, True, 1])
def test_flash_attn_invalid_value(gemma_path, bad):
    with pytest.raises(ValueError, match="flash_attn"):
        pyspec.Model(gemma_path, n_ctx=64, flash_attn=bad)


def test_calibration_key_depends_on_flash_attn(gemma_path, load_model):
    on = load_model(gemma_path, n_ctx=64, flash_attn="on")
    off = load_model(gemma_path, n_ctx=64, flash_attn="off")
    assert calibration.machine_key(on.native) != calibration.machine_key(off.native)
    assert "flash_attn=1" in calibration.machine_key(on.native)


def test_cli_flash_attn_in_json_and_stats(gemma_path):
    args = ["generate", "The sky is", "-m", gemma_path, "--raw", "--no-draft", "-n", "4", "-t", "0", "--n-ctx", "256"]
    out = pyspec_cmd(*args, "--flash-attn", "off", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["flash_attn"] == "off"
    out = pyspec_cmd(*args, "--flash-attn", "on", "--stats")
    assert out.returncode == 0, out.stderr
    assert "flash attention on (--flash-attn on)" in out.stderr
    bad = pyspec_cmd(*args, "--flash-attn", "maybe")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_bench_runs_both_sides_with_one_flash_attn_setting(target_path, tmp_path):
    # The bench applies chat templates (the small Gemma has none): the default target, 4 tokens.
    out_json = tmp_path / "b.json"
    run = pyspec_cmd("bench", "paired", "-m", target_path, "--category", "translation", "--per-category", "1",
                     "--max-tokens", "4", "--policy", "", "--hybrid", "", "--ngram", "", "--lookup", "0",
                     "--n-ctx", "512", "--flash-attn", "off", "--json", str(out_json))
    assert run.returncode == 0, run.stderr
    result = json.loads(out_json.read_text())
    assert result["flash_attn"] == "off" and result["flash_attn_requested"] == "off"
    assert result["runners"] == ["pyspec plain", "llama-cpp-python"]
    assert "flash attention off for pyspec and llama-cpp-python" in run.stdout


@pytest.mark.parametrize("on", [True, False])
def test_llama_cpp_runner_passes_flash_attn(gemma_path, on):
    import llama_cpp

    from pyspec.bench.inprocess.backends import LlamaCppRunner

    r = LlamaCppRunner(gemma_path, n_ctx=256, n_threads=1, flash_attn=on)
    want = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if on else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    assert r.llm.context_params.flash_attn_type == want
