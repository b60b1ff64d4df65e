"""A newcomer's first minutes (issue 39): `n` works on a model loaded the
default way, and a cache that pyspec used holds only what the user asked for.

The first answer's path (no batch timing before the first token) is proven in
test_drafters_policies.py (test_auto_times_batches_off_the_first_answers_path_once_per_machine)
and its law in test_lossless_policies.py (test_first_run_timing_between_rounds_is_lossless).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

import pytest

import pyspec
from pyspec._locks import CacheLock, Timeout
from pyspec.models import catalog as C

from cli_helpers import pyspec_cmd


def test_n_samples_work_on_models_loaded_the_default_way(gemma_path):
    target = pyspec.Model(gemma_path, n_ctx=512)  # no n_seq_max
    draft = pyspec.Model(gemma_path, n_ctx=512)
    out = target.generate("The weather today is", n=4, max_tokens=6, chat=False)
    assert len(out.choices) == 4 and all(c.n_generated_tokens == 6 for c in out.choices)
    spec = pyspec.SpeculativeDecoder(target, draft)
    out = spec.generate("The weather today is", n=4, max_tokens=6, chat=False)
    assert len(out.choices) == 4 and len({c.stats.seed for c in out.choices}) == 4
    # Past what the context holds: a clear error that says how to get more.
    with pytest.raises(ValueError, match=r"n_seq_max=17"):
        target.generate("The weather today is", n=17, max_tokens=2, chat=False)


def _litter(folder: Path):
    """What a cache should not hold: empty files and lock files."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and (p.stat().st_size == 0 or p.name.endswith(".lock")))


def test_a_used_cache_holds_no_empty_or_lock_files(gemma_path, tmp_path, monkeypatch):
    """Generations (timings and memory written under their locks) and a pull
    (verified under the model's lock) leave only the files they keep.
    Control: a filelock lock, which stays after release, is seen by the same look."""
    cache = tmp_path / "cache"
    models = cache / "models"
    models.mkdir(parents=True)
    (models / C.CATALOG[C.TEST_MODEL].filename).symlink_to(gemma_path)
    env = dict(os.environ, PYSPEC_CACHE=str(cache), PYSPEC_MODELS=str(models))
    for _ in range(2):
        proc = pyspec_cmd("generate", "-m", "test", "--raw", "-n", "24", "--n-ctx", "256", "--seed", "1",
                          "one two three one two three one two", env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
    monkeypatch.setenv("PYSPEC_MODELS", str(models))
    pyspec.models.pull("test", progress=False)  # takes the model's lock, re-hashes, releases
    assert (cache / "calibration.json").stat().st_size > 0
    assert _litter(cache) == [], f"left in the cache: {_litter(cache)}"

    from filelock import FileLock
    with FileLock(str(cache / "control.lock")):
        pass
    assert _litter(cache) == ["control.lock"]


def _bump(path: Path) -> None:
    """A read-modify-write that interleaves without a lock (each write whole, by rename)."""
    n = int(path.read_text())
    time.sleep(0.002)
    tmp = path.with_name(f"{path.name}.{threading.get_ident()}")
    tmp.write_text(str(n + 1))
    os.replace(tmp, path)


def _count(path: Path, lock_path: str, times: int) -> None:
    for _ in range(times):
        with CacheLock(lock_path):
            _bump(path)


def _hold_and_die(lock_path: str) -> None:
    CacheLock(lock_path).acquire()
    os._exit(0)  # killed while holding it: the file stays


def test_cache_lock_excludes_and_leaves_nothing(tmp_path):
    counter, lock = tmp_path / "n", str(tmp_path / "n.lock")
    counter.write_text("0")
    threads = [threading.Thread(target=_count, args=(counter, lock, 25)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.read_text() == "100", "two holders at once: updates were lost"
    assert not os.path.exists(lock), "the lock file stayed after release"

    # Control: the same counting without the lock loses updates (the look above can fail).
    counter.write_text("0")

    def unlocked():
        for _ in range(25):
            _bump(counter)

    threads = [threading.Thread(target=unlocked) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert int(counter.read_text()) < 100

    # Held elsewhere: a bounded wait ends in filelock's Timeout.
    held = CacheLock(lock).acquire()
    with pytest.raises(Timeout):
        CacheLock(lock, timeout=0.2).acquire()
    held.release()

    # A holder that died leaves its empty file; the next holder takes it at once and removes it.
    p = multiprocessing.get_context("spawn").Process(target=_hold_and_die, args=(lock,))
    p.start()
    p.join(60)
    assert os.path.exists(lock)
    with CacheLock(lock, timeout=0):
        pass
    assert not os.path.exists(lock)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
