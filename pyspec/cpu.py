"""Whether this machine can run the CPU kernels that its llama.cpp build chose:
today, ggml's AMX tiles (cpp/model/cpu_kernels.h says why they can kill a
process on some VMs).

The verdict is a fact of the machine and the build. A process that needs it
and finds none on record runs a child (``python -c ...probe``) that multiplies
small weights held in the AMX buffer type and in plain memory: the child's
death (SIGILL), a hang or a wrong result says "unusable", agreement "usable".
The verdict is kept in ``$PYSPEC_CACHE/cpu/`` (beside the calibration
records), keyed by the CPU (model, flags, kernel) and the build (libggml's file
and ggml's feature line), so the probe runs once per machine and build, and
every later process reads it and spawns nothing. Where the build has no AMX
buffer type here, nothing is probed ("absent").

Where AMX is unusable, every model this process loads leaves the AMX buffer type
out and keeps the other repacked kernels (``ModelParams.excluded_buffer_types``;
the core's process default is set too, so direct ``_core.Model`` users get it).
The first process to learn that says so in one line on stderr; ``pyspec info``
reports the verdict and its reason.

The other trap of a native build: a wheel compiled for another CPU (pip's cache
keys a built wheel by the sdist, not by the machine; a shared home or an image
built elsewhere reuses it). Its instruction sets are in ggml's feature line;
:func:`missing_instruction_sets` compares them with this CPU's flags, and
loading a model where any is missing raises :class:`~pyspec.UnsupportedCPUError`
naming them and the reinstall, where it would otherwise die of SIGILL.

TEST-ONLY: ``PYSPEC_TEST_CPU_PROBE=OUTCOME:NAME`` makes the verdict guard the
extra buffer type NAME instead of AMX, so that the whole path runs where no AMX
is (NAME=CPU_REPACK); OUTCOME ``probe`` runs the real probe on it, ``crash``
makes the probe child die of SIGILL as a refusing CPU would. Child processes
(``pyspec serve``'s, the tests' CLI runs) inherit it, as they would a real verdict.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from . import _core
from ._durable import cache_root, replacing
from ._platform import package_version
from ._locks import CacheLock
from ._platform import physical_cores

USABLE, UNUSABLE, ABSENT = "usable", "unusable", "absent"
PROBE_TIMEOUT_S = 120.0
TEST_SWITCH = "PYSPEC_TEST_CPU_PROBE"
_WRONG_RESULT_EXIT = 3  # the child's status when the kernels ran but disagreed


@dataclass(frozen=True)
class KernelVerdict:
    """Whether the extra buffer type ``buffer_type`` may hold weights here."""

    buffer_type: str
    state: str  # USABLE, UNUSABLE or ABSENT (this build has no such kernels on this CPU)
    reason: str
    recorded: Optional[str] = None  # the file it was read from or written to; None: not probed

    @property
    def excluded(self) -> bool:
        return self.state == UNUSABLE


def _test_switch() -> Optional[Tuple[str, str]]:
    raw = os.environ.get(TEST_SWITCH)
    if not raw:
        return None
    outcome, _, name = raw.partition(":")
    if outcome not in ("probe", "crash") or not name:
        raise ValueError(f"{TEST_SWITCH} must be 'probe:NAME' or 'crash:NAME', got {raw!r}")
    return outcome, name


# ggml's feature names (llama_system_info) and the /proc/cpuinfo flag each needs.
_FLAG_OF = {
    "SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX2": "avx2", "F16C": "f16c", "FMA": "fma", "BMI2": "bmi2",
    "AVX_VNNI": "avx_vnni", "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16", "AMX_INT8": "amx_int8",
}


def missing_instruction_sets(system_info: Optional[str] = None, flags: Optional[str] = None) -> List[str]:
    """Instruction sets the llama.cpp build was compiled to use that this CPU
    lacks (x86 Linux; [] where the flags cannot be read)."""
    system_info = _core.llama_system_info() if system_info is None else system_info
    flags = _cpu_flags()[1] if flags is None else flags
    have = set(flags.split())
    if not have or "avx" not in have and "pni" not in have:
        return []  # not an x86 flag list: nothing to compare with
    built = {part.split("=")[0].strip() for part in system_info.replace("CPU :", "|").split("|")
             if part.strip().endswith("= 1")}
    return sorted(name for name in built if name in _FLAG_OF and _FLAG_OF[name] not in have)


def check_instruction_sets() -> None:
    """Raise :class:`~pyspec.UnsupportedCPUError` where the build needs an
    instruction set this CPU lacks (its first matmul would die of SIGILL)."""
    missing = missing_instruction_sets()
    if missing:
        from .errors import UnsupportedCPUError

        raise UnsupportedCPUError(
            f"this llama.cpp build was compiled for a CPU with {', '.join(missing)}, which this CPU lacks "
            f"(a wheel built on another machine, reused from pip's cache): reinstall it here with "
            f"CMAKE_ARGS=\"-DGGML_RPC=ON\" pip install --force-reinstall --no-cache-dir --no-deps "
            f"llama-cpp-python=={package_version('llama-cpp-python', '<its version>')}, then pyspec")


def guarded_buffer_type() -> str:
    """The extra buffer type the verdict is about: AMX (a test may name another)."""
    switch = _test_switch()
    return switch[1] if switch else _core.AMX_BUFFER_TYPE


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> Tuple[str, str]:
    """The CPU's model name and flags as /proc/cpuinfo lists them ('' elsewhere;
    read once: every model load checks them)."""
    model = flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = value.strip()
    except OSError:
        pass
    return model or platform.processor(), flags


def _record_file(name: str) -> Path:
    """Where the verdict on ``name`` for this CPU and build is kept."""
    model, flags = _cpu_flags()
    lib = os.path.realpath(_core.libggml_path() or _core.libllama_path() or "")
    try:
        st = os.stat(lib)
        build = f"{lib}|{st.st_size}|{int(st.st_mtime)}"
    except OSError:
        build = lib
    key = "|".join([name, model, flags, platform.release(), build, _core.llama_system_info().strip()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "cpu" / f"{name.lower()}-{digest}.json"


def _absent_reason(name: str) -> str:
    if name != _core.AMX_BUFFER_TYPE:
        return f"this build has no {name} buffer type on this CPU"
    _, flags = _cpu_flags()
    if "amx_tile" not in flags.split():
        return "this CPU has no AMX"
    if "AMX_INT8 = 1" in _core.llama_system_info():
        return "the build has AMX kernels, but the kernel refused the tile permission (ggml's own check)"
    return "this build has no AMX kernels"


def _read(path: Path, name: str) -> Optional[KernelVerdict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("state") in (USABLE, UNUSABLE) and isinstance(data.get("reason"), str):
            return KernelVerdict(name, data["state"], data["reason"], str(path))
    except (OSError, ValueError, AttributeError):
        pass
    return None  # none, or not one of ours: probe again


def _write(path: Path, verdict: KernelVerdict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {**asdict(verdict), "probed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        body.pop("recorded")
        with replacing(path, prefix=".cpu-", suffix=".json") as f:
            f.write(json.dumps(body, indent=1).encode())
    except OSError:
        pass  # a read-only cache: probed again next time (a second, not a crash)


probes_run = 0  # probe children this process started (the tests check that a record spares them)


def _run_probe(name: str) -> Tuple[str, str]:
    """(state, reason) from a child process that multiplies through ``name``."""
    global probes_run
    probes_run += 1
    switch = _test_switch()
    outcome = switch[0] if switch else "probe"
    code = ("import sys; from pyspec.cpu import _probe_child; "
            "sys.exit(_probe_child(sys.argv[1], int(sys.argv[2]), sys.argv[3]))")
    cmd = [sys.executable, "-c", code, name, str(physical_cores()), outcome]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              env={**os.environ, TEST_SWITCH: ""})
    except subprocess.TimeoutExpired:
        return UNUSABLE, f"a {name} probe did not finish in {PROBE_TIMEOUT_S:.0f} s"
    if done.returncode < 0:
        sig = signal.Signals(-done.returncode).name
        return UNUSABLE, f"a {name} matmul killed its probe process ({sig}): this CPU refuses its instructions"
    if done.returncode == 0:
        return USABLE, f"a {name} matmul on {physical_cores()} threads agreed with the plain kernels"
    if done.returncode == _WRONG_RESULT_EXIT:
        return UNUSABLE, done.stdout.strip()
    raise RuntimeError(f"the {name} probe could not run (exit {done.returncode}): {done.stderr.strip()[-500:]}")


def _probe_child(name: str, n_threads: int, outcome: str) -> int:
    """The probe process: exit 0 when ``name``'s kernels agree with the plain ones."""
    if outcome == "crash":
        os.kill(os.getpid(), signal.SIGILL)  # as a CPU that refuses the tiles kills it
    problem = _core.probe_buffer_type(name, n_threads)
    if problem:
        print(problem)
        return _WRONG_RESULT_EXIT
    return 0


_lock = threading.Lock()
_verdict: Optional[KernelVerdict] = None


def verdict() -> KernelVerdict:
    """This machine's verdict on the guarded extra buffer type (AMX): read from
    the record, or probed once (in a child) and recorded. Cached per process."""
    global _verdict
    with _lock:
        if _verdict is None:
            _verdict = _decide(guarded_buffer_type())
            _core.set_default_excluded_buffer_types([_verdict.buffer_type] if _verdict.excluded else [])
        return _verdict


def _decide(name: str) -> KernelVerdict:
    if name not in _core.cpu_extra_buffer_types():
        return KernelVerdict(name, ABSENT, _absent_reason(name))
    path = _record_file(name)
    known = _read(path, name)
    if known is not None:
        return known
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = CacheLock(str(path) + ".lock", timeout=PROBE_TIMEOUT_S + 30)
    except OSError:
        lock = contextlib.nullcontext()  # a read-only cache: probe without it
    with lock:
        known = _read(path, name)  # another process probed while this one waited
        if known is not None:
            return known
        try:
            state, reason = _run_probe(name)
        except RuntimeError as e:  # the probe itself failed: leave the kernels out, record nothing
            return KernelVerdict(name, UNUSABLE, str(e))
        decided = KernelVerdict(name, state, reason, str(path))
        _write(path, decided)
    if decided.excluded:
        print(f"pyspec: {name} kernels are unusable here ({reason}); models load without the {name} buffer type "
              f"and keep the other repacked kernels (`pyspec info`; docs/cli.md#cpu-features)", file=sys.stderr)
    return decided


def excluded_buffer_types() -> List[str]:
    """The extra buffer types models must leave out on this machine ([] or ["AMX"])."""
    v = verdict()
    return [v.buffer_type] if v.excluded else []
