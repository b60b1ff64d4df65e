"""`pyspec info` (what build is running) and GPU offload on a build without a GPU backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import pyspec
from cli_helpers import pyspec_cmd
from pyspec import _core
from pyspec.tools.info import KEYS, build_info

REPO = Path(__file__).resolve().parents[1]

NO_GPU = not _core.supports_gpu_offload()
cpu_only = pytest.mark.skipif(not NO_GPU, reason="this llama.cpp build can offload to a GPU")




def test_info_json_has_every_key():
    out = pyspec_cmd("info", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert list(d) == list(KEYS)
    assert d["pyspec_version"] == pyspec.__version__
    assert d["llama_cpp_python_version"] == "0.3.36"
    assert isinstance(d["gpu_offload"], bool)
    assert os.path.isfile(d["libllama_path"]) and "libllama" in os.path.basename(d["libllama_path"])
    assert d["libllama_shared_with_llama_cpp"] is True  # one copy of llama.cpp in the process
    assert isinstance(d["system_info"], str) and d["system_info"].strip()
    assert d["flash_attn_default"] == "auto" and d["llama_cpp_flash_attn_default"] == "auto"
    assert d["llama_cpp_python_flash_attn_default"] is False
    assert isinstance(d["threads"], int) and d["threads"] >= 1


def test_info_lists_backends_and_devices():
    d = build_info()
    assert d["backends"] and all(isinstance(b["name"], str) and isinstance(b["devices"], list) for b in d["backends"])
    assert any(b["name"] == "CPU" for b in d["backends"])
    types = {"cpu", "gpu", "igpu", "accel", "meta"}
    for dev in d["devices"]:
        assert dev["type"] in types and dev["name"] and isinstance(dev["description"], str)
        assert any(dev["name"] in b["devices"] for b in d["backends"] if b["name"] == dev["backend"])
    assert any(dev["type"] == "cpu" for dev in d["devices"])
    # llama.cpp offloads where a GPU (or integrated GPU) device is registered.
    if any(dev["type"] in ("gpu", "igpu") for dev in d["devices"]):
        assert d["gpu_offload"] is True


def test_info_text_report():
    out = pyspec_cmd("info")
    assert out.returncode == 0, out.stderr
    for word in ("pyspec", "llama-cpp-python", "libllama", "GPU offload", "flash attention", "threads",
                 "backends:", "devices:", "system info:"):
        assert word in out.stdout, word
    help_ = pyspec_cmd("info", "--help")
    assert help_.returncode == 0 and "--json" in help_.stdout and "libllama" in help_.stdout
    assert "info" in pyspec_cmd("--help").stdout


@cpu_only
def test_cpu_build_reports_no_gpu_offload():
    d = build_info()
    assert d["gpu_offload"] is False
    assert "docs/gpu.md" in pyspec_cmd("info").stdout
    assert (REPO / "docs" / "gpu.md").read_text().startswith("# GPU builds")


@cpu_only
def test_gpu_layers_on_a_cpu_build_warn(gemma_path):
    with pytest.warns(RuntimeWarning, match=r"no GPU backend.*runs on the CPU.*GGML_CUDA=on.*no-build-isolation"):
        m = pyspec.Model(gemma_path, n_ctx=128, n_gpu_layers=-1)
    assert m.generate("The sky is", max_tokens=2, temperature=0, chat=False).n_generated_tokens == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyspec.Model(gemma_path, n_ctx=64, n_gpu_layers=0)  # no GPU asked: no warning


@cpu_only
def test_gpu_layers_on_a_cpu_build_strict_is_an_error(gemma_path):
    with pytest.raises(pyspec.GPUOffloadUnavailableError, match="no GPU backend.*GGML_CUDA=on"):
        pyspec.Model(gemma_path, n_ctx=64, n_gpu_layers=8, strict=True)
    assert issubclass(pyspec.GPUOffloadUnavailableError, (ValueError, pyspec.PyspecError))
    pyspec.Model(gemma_path, n_ctx=64, n_gpu_layers=0, strict=True)  # strict with nothing to offload is fine


@cpu_only
def test_cli_gpu_layers_warn_and_strict(gemma_path):
    args = ["generate", "The sky is", "-m", gemma_path, "--raw", "--no-draft", "-n", "2", "-t", "0", "--n-ctx", "128",
            "--n-gpu-layers", "-1"]
    out = pyspec_cmd(*args)
    assert out.returncode == 0, out.stderr
    assert "warning: n_gpu_layers=-1" in out.stderr and "docs/gpu.md" in out.stderr
    assert "Traceback" not in out.stderr
    out = pyspec_cmd(*args, "--strict")
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and "no GPU backend" in lines[0], out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize("first", ["llama_cpp", "pyspec"])
def test_info_sees_one_libllama_whatever_is_imported_first(first, tmp_path):
    """The extension calls the very libllama/libggml files llama_cpp loads, in either import order.
    (Run outside the checkout: `python -c` puts the current folder first on sys.path.)"""
    code = (f"import json, {first}, llama_cpp, pyspec.tools.info as i; d = i.build_info(); "
            "print(json.dumps({k: d[k] for k in ('libllama_path', 'libllama_shared_with_llama_cpp', 'libggml_path')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["libllama_shared_with_llama_cpp"] is True
    assert os.path.dirname(d["libggml_path"]) == os.path.dirname(d["libllama_path"])
    assert os.path.basename(os.path.dirname(d["libllama_path"])) == "lib"
