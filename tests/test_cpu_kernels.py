"""A CPU feature never kills pyspec (issue 48): where ggml's AMX tiles fault, a
probe in a child process finds out once per machine and build, and models load
without the AMX buffer type but keep the other repacked kernels (pyspec/cpu.py,
cpp/model/cpu_kernels.h). Fatal signals print one plain line.

These machines have no AMX, so the whole path runs on CPU_REPACK instead
(PYSPEC_TEST_CPU_PROBE=OUTCOME:CPU_REPACK): the same probe, record, exclusion
and per-tensor overrides, on the buffer type that is here. Where AMX is present
the real thing is checked too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import pyspec
from pyspec import _core, cpu

REPACK = "CPU_REPACK"
PROMPT = "def fibonacci(n):\n    "

# Loads the default target as pyspec.Model does, prints what decided and what happened.
LOAD_AND_GENERATE = textwrap.dedent("""
    import json, sys
    import pyspec
    from pyspec import cpu
    model = pyspec.Model(sys.argv[1], n_ctx=256)
    out = model.generate(sys.argv[2], max_tokens=24, temperature=0, chat=False)
    v = cpu.verdict()
    print(json.dumps({"state": v.state, "reason": v.reason, "probes": cpu.probes_run,
                      "buffers": model.weight_buffers, "text": out.text}))
""")


def _run(code: str, *args: str, switch: str, cache) -> subprocess.CompletedProcess:
    env = {**os.environ, cpu.TEST_SWITCH: switch, "PYSPEC_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=cache)


def _loaded(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def repack_here():
    if REPACK not in _core.cpu_extra_buffer_types():
        pytest.skip(f"this build has no {REPACK} buffer type on this CPU: nothing to leave out")


@pytest.fixture(scope="module")
def plain_answer(target_path, repack_here):
    """The greedy answer of a model loaded with no extra buffer types at all."""
    model = pyspec.Model(target_path, n_ctx=256, repack=False)
    assert set(model.weight_buffers) == {"CPU_Mapped"}, model.weight_buffers
    return model.generate(PROMPT, max_tokens=24, temperature=0, chat=False).text


@pytest.mark.pair
def test_a_broken_verdict_leaves_the_buffer_type_out_and_the_answer_unchanged(target_path, plain_answer, tmp_path):
    broken = _loaded(_run(LOAD_AND_GENERATE, target_path, PROMPT, switch=f"crash:{REPACK}", cache=tmp_path))
    assert broken["state"] == cpu.UNUSABLE and "SIGILL" in broken["reason"], broken
    assert broken["probes"] == 1
    assert REPACK not in broken["buffers"], broken["buffers"]
    assert broken["text"] == plain_answer


@pytest.mark.pair
def test_control_a_working_verdict_keeps_the_buffer_type(target_path, repack_here, tmp_path):
    """The same load, the real probe on CPU_REPACK: it agrees, and the weights go there."""
    working = _loaded(_run(LOAD_AND_GENERATE, target_path, PROMPT, switch=f"probe:{REPACK}", cache=tmp_path))
    assert working["state"] == cpu.USABLE, working
    assert working["buffers"].get(REPACK, 0) > 100, working["buffers"]  # MiB: the 1.5B's matrices


def test_the_probe_runs_once_per_machine_and_build(repack_here, tmp_path):
    code = ("import json; from pyspec import cpu; v = cpu.verdict(); "
            "print(json.dumps({'state': v.state, 'probes': cpu.probes_run, 'record': v.recorded}))")
    first = _run(code, switch=f"crash:{REPACK}", cache=tmp_path)
    second = _run(code, switch=f"crash:{REPACK}", cache=tmp_path)
    a, b = _loaded(first), _loaded(second)
    assert a["probes"] == 1 and b["probes"] == 0, (a, b)
    assert a["state"] == b["state"] == cpu.UNUSABLE
    assert a["record"] == b["record"] and os.path.exists(a["record"])
    # One line names the fallback, the first time only.
    assert f"{REPACK} kernels are unusable here" in first.stderr
    assert "unusable" not in second.stderr, second.stderr


def test_the_real_probe_agrees_on_a_working_buffer_type(repack_here):
    assert _core.probe_buffer_type(REPACK, 2) == ""
    with pytest.raises(RuntimeError, match="no NOT_A_BUFFER buffer type"):
        _core.probe_buffer_type("NOT_A_BUFFER", 2)


def test_info_reports_the_verdict(repack_here, tmp_path):
    env = {**os.environ, cpu.TEST_SWITCH: f"crash:{REPACK}", "PYSPEC_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "pyspec.cli", "info", "--json"], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    kernels = json.loads(done.stdout)["cpu_kernels"]
    assert kernels["excluded"] == [REPACK]
    assert kernels[REPACK.lower()]["state"] == cpu.UNUSABLE
    text = subprocess.run([sys.executable, "-m", "pyspec.cli", "info"], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path).stdout
    assert f"left out: {REPACK}" in text and "SIGILL" in text


def test_amx_stays_on_where_it_works(gemma_path):
    if _core.AMX_BUFFER_TYPE not in _core.cpu_extra_buffer_types():
        pytest.skip(f"no AMX kernels here: {cpu.verdict().reason}")
    v = cpu.verdict()
    if v.state != cpu.USABLE:
        pytest.skip(f"AMX is unusable here ({v.reason}): test_a_broken_verdict... covers the fallback")
    assert "AMX" in pyspec.Model(gemma_path, n_ctx=128).weight_buffers


def test_an_unknown_test_switch_is_refused(monkeypatch):
    monkeypatch.setenv(cpu.TEST_SWITCH, "sometimes:AMX")
    with pytest.raises(ValueError, match="probe:NAME"):
        cpu.guarded_buffer_type()


@pytest.mark.parametrize("sig, words", [(signal.SIGILL, "refused an instruction"),
                                        (signal.SIGSEGV, "invalid memory access"),
                                        (signal.SIGBUS, "memory-mapped model file")])
def test_a_fatal_signal_in_a_command_prints_one_plain_line(sig, words, tmp_path):
    code = f"import os, pyspec.cli; os.kill(os.getpid(), {int(sig)})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == -sig  # it still dies of the signal (exit status 128 + N in a shell)
    lines = [line for line in done.stderr.splitlines() if line.startswith("pyspec: fatal")]
    assert len(lines) == 1 and words in lines[0] and "pyspec info" in lines[0], done.stderr


def test_control_without_the_cli_no_line(tmp_path):
    """A library user's process keeps its own handlers: importing pyspec installs nothing."""
    done = subprocess.run([sys.executable, "-c", "import os, signal, pyspec; os.kill(os.getpid(), signal.SIGILL)"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == -signal.SIGILL and "pyspec: fatal" not in done.stderr


@pytest.mark.pair
def test_the_overrides_place_the_weights_as_llama_cpp_does(target_path, repack_here, load_model):
    """What a model keeps where AMX is left out is computed weight by weight
    (llama.cpp can only turn every extra buffer type off): with nothing left
    out, that rule must give CPU_REPACK the very weights llama.cpp's own
    placement gives it, which is what an AMX machine's fallback relies on."""
    planned = sum(b for _, name, b in _core.buffer_overrides_without(target_path, []) if name == REPACK) / 2**20
    stock = load_model(target_path, n_ctx=256).weight_buffers[REPACK]
    assert planned > 100 and abs(planned - stock) <= 0.01 * stock, (planned, stock)
    # A left-out type is never planned.
    assert all(name != REPACK for _, name, _ in _core.buffer_overrides_without(target_path, [REPACK]))


FEATURES = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | FMA = 1 | AVX512 = 1 | AVX512_VNNI = 1 | LLAMAFILE = 1 | REPACK = 1"


def test_a_build_for_another_cpu_is_named_before_it_crashes():
    """A wheel built where AVX-512 was (pip's cache is not keyed by CPU) on a CPU without it."""
    no_avx512 = "fpu sse sse2 pni ssse3 avx avx2 fma f16c bmi2"
    assert pyspec.cpu.missing_instruction_sets(FEATURES, no_avx512) == ["AVX512", "AVX512_VNNI"]
    # control: the CPU it was built for lacks nothing; a flag list that is not x86's is not compared
    assert pyspec.cpu.missing_instruction_sets(FEATURES, no_avx512 + " avx512f avx512_vnni") == []
    assert pyspec.cpu.missing_instruction_sets(FEATURES, "fp asimd evtstrm aes") == []
    # this build runs here, so nothing is missing here
    assert pyspec.cpu.missing_instruction_sets() == []


def test_loading_on_a_cpu_the_build_was_not_made_for_is_a_clear_error(gemma_path, monkeypatch):
    monkeypatch.setattr(pyspec.cpu, "_cpu_flags", lambda: ("test CPU", "fpu sse sse2 pni"))
    if not pyspec.cpu.missing_instruction_sets():
        pytest.skip("this build uses no instruction set beyond SSE3")
    with pytest.raises(pyspec.UnsupportedCPUError, match="reinstall it here"):
        pyspec.Model(gemma_path, n_ctx=128)


@pytest.mark.parametrize("state", [cpu.UNUSABLE, cpu.USABLE])
def test_the_llama_cpp_python_baseline_follows_the_verdict(state, monkeypatch):
    """pyspec bench's in-process llama-cpp-python baseline cannot be told to leave
    one buffer type out: where one faults it loads with none (and says so); the
    usable verdict (the control) leaves its defaults alone."""
    import llama_cpp.llama_cpp as lib

    from pyspec.bench.inprocess.backends import _without_faulting_kernels

    monkeypatch.setattr(cpu, "_verdict", cpu.KernelVerdict(REPACK, state, "test"))
    before = lib.llama_model_default_params
    with pytest.warns(UserWarning, match="without repacked weights") if state == cpu.UNUSABLE else _no_warning():
        with _without_faulting_kernels():
            loaded_with = lib.llama_model_default_params().use_extra_bufts
    assert loaded_with is (state == cpu.USABLE)
    assert lib.llama_model_default_params is before and lib.llama_model_default_params().use_extra_bufts


class _no_warning:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)
