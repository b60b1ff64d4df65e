"""Exactly one llama.cpp is mapped, whichever package is imported first."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

PROBE = r"""
import os, sys
for name in sys.argv[1:]:
    __import__(name)
libs = set()
with open("/proc/self/maps") as f:
    for line in f:
        path = line.split()[-1]
        if "libllama" in os.path.basename(path):
            libs.add(os.path.realpath(path))
print("\n".join(sorted(libs)))
"""


def _run(cmd):
    # Run outside the source tree: `python -c` puts the working directory first
    # on sys.path, and the source folder's pyspec has no compiled _core.
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.parametrize(
    "order",
    [("pyspec", "llama_cpp"), ("llama_cpp", "pyspec"), ("pyspec._core", "llama_cpp")],
    ids=lambda o: " then ".join(o),
)
def test_one_libllama_mapped(order):
    out = _run([sys.executable, "-c", PROBE, *order])
    libs = out.stdout.split()
    assert len(libs) == 1, f"{len(libs)} copies of libllama mapped: {libs}"
    assert "llama_cpp" in libs[0], libs


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_probe_can_see_two_copies():
    """Negative control for the probe: a second, separate copy is detected."""
    import os

    import pyspec._loader as loader

    lib = loader.llama_lib_path()
    copies = [p for p in sorted(lib.parent.glob("libllama.so.*")) if os.path.realpath(p) != os.path.realpath(lib)]
    if not copies:
        pytest.skip("this llama_cpp ships symlinks, so there is no second copy to load")
    code = f"import ctypes; ctypes.CDLL({str(copies[-1])!r}); import pyspec\n" + PROBE
    out = _run([sys.executable, "-c", code])
    assert len(out.stdout.split()) == 2, out.stdout
