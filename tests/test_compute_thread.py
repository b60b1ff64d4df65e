"""One compute thread per process (issue 60; cpp/model/compute_thread.h).

libgomp keeps an OpenMP team for every thread that ever computed a graph; two
teams on a machine with as many cores as one team's threads throttle every
barrier (decoding ran at 0.69x once a second thread had decoded, 0.96x with the
compute thread: `python tests/test_compute_thread.py` prints the rates). This
checks the mechanism, not a timing: after entries on three long-lived threads
(the main thread, a plain generation's and an embedder's) have all decoded,
every graph ran on one thread and the only OpenMP workers alive are the compute
thread's. The control, the old arrangement (each caller computes), must show a
team per entry, so the same check would catch a decode that bypasses the
compute thread.

Each case runs in a child process: the arrangement is process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile


CHILD = r"""
import json, os, sys, threading, time
from pyspec import Model, _core
from pyspec.embedding import Embedder

_core.set_compute_thread(sys.argv[2] == "on")
model = Model(sys.argv[1], n_ctx=256, n_threads=2)

def comm(tid):
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:  # a thread that just ended
        return None

def names():
    time.sleep(0.2)  # lets generate()'s finished worker threads leave
    return [n for n in map(comm, os.listdir("/proc/self/task")) if n is not None]

def rate():
    model.clear_cache()
    t = time.perf_counter()
    model.generate("Count: 1, 2, 3,", max_tokens=24, temperature=0, chat=False)
    return 24 / (time.perf_counter() - t)

def foreign():
    # Native threads beside Python's that carry a Python thread's name (new
    # threads inherit their creator's): OpenMP workers of a team some Python
    # thread started, and whatever the imports started (numpy's BLAS), counted
    # before any decode.
    return sum(1 for n in names() if n != "pyspec-compute") - len(threading.enumerate())

before = foreign()
alone = max(rate() for _ in range(int(sys.argv[3])))
hold = threading.Event()
def entry(work, done):
    work()
    done.set()
    hold.wait()  # stays alive: a thread's OpenMP team lives as long as it does
embedder = Embedder(model)
for work in (lambda: model.generate("Hi", max_tokens=2, temperature=0, chat=False),
             lambda: embedder.embed(["a short text"])):
    done = threading.Event()  # one after the other: computing both at once, the old way once stalled > 50 s
    threading.Thread(target=entry, args=(work, done), daemon=True).start()
    done.wait()
beside = max(rate() for _ in range(int(sys.argv[3])))
print(json.dumps({
    "computed_on": _core.threads_that_computed(),
    "compute_threads": names().count("pyspec-compute"),
    "foreign_workers": foreign() - before,
    "alone": alone, "beside": beside}))
hold.set()
"""


def child(model_path: str, arrangement: str, repeats: int = 1) -> dict:
    # Run from the temporary folder: from the checkout, `-c` would import the
    # source folder's pyspec, which has no compiled core.
    r = subprocess.run([sys.executable, "-c", CHILD, model_path, arrangement, str(repeats)],
                       capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir())
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_entry_computes_on_the_one_compute_thread(gemma_path):
    seen = child(gemma_path, "on")
    assert seen["computed_on"] == 1, seen
    assert seen["compute_threads"] == 2, seen  # the thread and its one OpenMP worker (2 threads)
    assert seen["foreign_workers"] == 0, seen


def test_control_each_caller_computing_leaves_a_team_per_entry(gemma_path):
    seen = child(gemma_path, "off")
    assert seen["computed_on"] >= 3, seen
    assert seen["compute_threads"] == 0, seen
    # At least the two entries' teams (one worker each) alive.
    assert seen["foreign_workers"] >= 2, seen


if __name__ == "__main__":  # the rates, side by side: a benchmark, not a test
    from pyspec.models import resolve

    path = str(resolve(sys.argv[1] if len(sys.argv) > 1 else "target"))
    for arrangement in ("off", "on", "off", "on"):
        seen = child(path, arrangement, repeats=3)
        print(f"compute thread {arrangement:>3}: {seen['alone']:.1f} tok/s alone, {seen['beside']:.1f} after two "
              f"other threads decoded ({seen['beside'] / seen['alone']:.2f}x)")
