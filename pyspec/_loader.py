"""Make sure the process holds exactly one copy of llama.cpp.

llama-cpp-python's wheel ships libllama.so, libllama.so.0 and libllama.so.0.x as
separate identical files, and llama_cpp opens ``libllama.so`` by path. Our
extension asks for its soname, ``libllama.so.0``. Loading llama_cpp's exact file
first (RTLD_GLOBAL) makes the dynamic linker satisfy the extension's soname
lookup with that same copy, whichever of ``pyspec`` and ``llama_cpp`` the user
imports first; a later ``import llama_cpp`` dlopens the same path and gets the
same handle.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

_handle = None


def llama_lib_path() -> Path:
    """Path of the libllama that llama_cpp itself loads."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise ImportError("pyspec needs llama-cpp-python (pip install llama-cpp-python==0.3.36)")
    lib_dir = Path(spec.origin).parent / "lib"
    names = {"darwin": "libllama.dylib", "win32": "llama.dll"}
    path = lib_dir / names.get(sys.platform, "libllama.so")
    if not path.exists():
        raise ImportError(f"llama_cpp's library is missing: {path}")
    return path


def preload_llama() -> None:
    """dlopen llama_cpp's libllama once, globally, before pyspec._core loads."""
    global _handle
    if _handle is None:
        mode = getattr(os, "RTLD_GLOBAL", ctypes.RTLD_GLOBAL)
        _handle = ctypes.CDLL(str(llama_lib_path()), mode=mode)


preload_llama()
