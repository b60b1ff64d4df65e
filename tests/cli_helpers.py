"""Running the `pyspec` command as a user would, for the CLI tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile


def pyspec_cmd(*args: str, **kw) -> subprocess.CompletedProcess:
    """`pyspec ARGS...` in a separate process (outside the checkout, whose source
    folder would otherwise shadow the installed package for `python -m`)."""
    exe = shutil.which("pyspec")
    cmd = [exe] if exe else [sys.executable, "-m", "pyspec.cli"]
    kw.setdefault("cwd", tempfile.gettempdir())
    kw.setdefault("timeout", 600)
    return subprocess.run([*cmd, *args], capture_output=True, text=True, **kw)
