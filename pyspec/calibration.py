"""Timings the ``auto`` policy needs, kept on disk so that it measures them once
per model and machine, not once per process: the target's verification batches
and the draft model's cost per drafted token. Without the latter, every new
process would prefill the draft model and probe it once only to learn that it
cannot pay on this machine. Beside them, what auto learnt about text that
outlives a call (``AutoPolicy.memory``: the long-run acceptance of each lookup
bucket and the host work per round), so that a new process, and a short
answer in it, starts from what earlier ones learnt instead of the built-in
priors.

The policy object owns the numbers (the engine times the batch sizes it has
not timed yet between rounds, never before the first token, and a round that
uses a size times it too; it measures the draft model when it drafts, and
refines both online);
this module only persists them: :func:`prepare` hands a policy the timings on
record before a generation, :func:`keep` records new ones after it.

The file is ``$PYSPEC_CACHE/calibration.json`` (default ``~/.cache/pyspec``).
An entry is keyed by everything the timings depend on: the model file (path,
size, mtime), threads, GPU layers, flash attention (as run) and llama.cpp's
build features. A missing or unreadable file only means calibrating again.

Crash safety (docs/promises.md, "Caches and crashes"): the file is only ever
replaced whole (written to ``.calibration-*.json``, fsynced, renamed, the
folder fsynced), under ``calibration.json.lock`` (present only while held:
pyspec/_locks.py) so that concurrent processes
neither lose each other's entries nor see a half-written file. A file that is
not valid JSON of the expected shape is discarded with a warning (its timings
are measured again), and a temporary file that a killed writer left behind is
removed with a warning the first time a process reads the cache.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from . import _core
from ._durable import cache_root, replacing
from ._locks import CacheLock, Timeout


def cache_file() -> Path:
    return cache_root() / "calibration.json"


def machine_key(core_model) -> str:
    """What batch timings depend on, as one string."""
    path = os.path.realpath(core_model.path)
    st = os.stat(path)
    return "|".join([
        path, str(st.st_size), str(int(st.st_mtime)), f"threads={core_model.n_threads}",
        f"gpu_layers={core_model.n_gpu_layers}", f"flash_attn={core_model.flash_attn}",
        # Layers on RPC workers cost the network's round trips: timed per set of workers.
        *([f"rpc={','.join(core_model.rpc)}", f"split={list(core_model.tensor_split)}"] if core_model.rpc else []),
        # Timings recorded before decodes waited for their work (Model::wait_for_work)
        # timed a GPU's launches, not its work: they are not reused.
        "clock=work", _core.llama_system_info().strip(),
    ])


DRAFT_TOKEN = "draft_token_s"  # a draft model's entry: seconds per drafted token (beside its batch sizes)
MEMORY = "auto_memory"  # a target's entry: AutoPolicy.memory
MEMORY_EVERY_S = 60.0   # a process writes its memory, or a draft cost, at most this often per model file
_memory_written: Dict[str, float] = {}  # (a server answers many calls, each on its engine thread:
_draft_written: Dict[str, float] = {}   # a locked, fsynced write per request would cost it)


def prepare(policies: Sequence["_core.LengthPolicy"], core_model, draft_model=None) -> None:
    """Give each policy (a batch has one per sequence) the timings on record that
    it still wants: the target's batch sizes on record (the engine's choice of
    sizes, :func:`pyspec._core.calibration_rows`; it times the rest), the draft model's
    cost per token, and auto's memory to a policy that has seen no round yet. Each model's entry is read at most once."""
    entry = known = cost = None
    for policy in policies:
        rows = _core.calibration_rows(policy.draft_max, core_model.n_batch, core_model.n_seq)
        sizes = policy.calibration_sizes(rows)
        auto = isinstance(policy, _core.AutoPolicy)
        if entry is None and (sizes or (auto and policy.rounds_seen == 0)):
            entry = _entry(core_model)
        if sizes:
            known = _timings(entry) if known is None else known
            have = [n for n in sizes if n in known]
            if have:
                policy.calibrated(have, [known[n] for n in have], fresh=False)
        if draft_model is not None and auto and policy.draft_cost("model") < 0:
            cost = _entry(draft_model).get(DRAFT_TOKEN) if cost is None else cost
            if isinstance(cost, (int, float)) and cost > 0:
                policy.recorded_draft_cost(float(cost))
            elif _both_on_this_cpu(core_model, draft_model):
                # Nothing on record (a first run): a CPU step reads every weight once,
                # so the draft's step is about its share of the bytes. Where even that
                # cannot pay, the first run does not spend a catch-up and probes to learn so.
                policy.draft_cost_prior(os.path.getsize(draft_model.path) / os.path.getsize(core_model.path))
        if auto and policy.rounds_seen == 0:
            memory = entry.get(MEMORY)
            if isinstance(memory, list) and all(isinstance(x, (int, float)) for x in memory):
                policy.remember([float(x) for x in memory])


def _both_on_this_cpu(core_model, draft_model) -> bool:
    return all(m.n_gpu_layers == 0 and not m.rpc for m in (core_model, draft_model))


def keep(policy: "_core.LengthPolicy", core_model, draft_model=None, *, defer: bool = False):
    """Record the timings a generation just measured: batch sizes it timed
    first (``policy.take_new_timings()``), the draft model's cost when it moved by more
    than a tenth from the one on record, and the policy's memory; the last two
    at most once a minute per model file (not a file read and write per
    generation). The policy is read now; with ``defer`` the file work is
    returned as one callable (None: nothing to write) for another thread to run
    (a server's round thread does not wait for a disk)."""
    if not isinstance(policy, _core.AutoPolicy):
        return None
    writes: List[Callable[[], None]] = []
    timed = policy.take_new_timings()
    if timed:
        writes.append(lambda: save(core_model, timed))
    # Throttled per model file in this process (machine_key would stat the file every call).
    if policy.rounds_seen > 0 and _due(_memory_written, core_model.path):
        memory = [float(x) for x in policy.memory]
        writes.append(lambda: _update(core_model, {MEMORY: memory}))
    cost = policy.draft_cost("model")
    if draft_model is not None and cost > 0 and _due(_draft_written, draft_model.path):

        def write_cost() -> None:
            recorded = _entry(draft_model).get(DRAFT_TOKEN)
            if not isinstance(recorded, (int, float)) or abs(cost - recorded) > 0.1 * recorded:
                _update(draft_model, {DRAFT_TOKEN: cost})

        writes.append(write_cost)
    if not writes:
        return None

    def run() -> None:
        for write in writes:
            write()

    if defer:
        return run
    run()
    return None


def _due(last_written: Dict[str, float], path: str) -> bool:
    """True (and stamped) when ``path``'s entry of this cache file was not
    written for MEMORY_EVERY_S in this process."""
    key, now = f"{cache_file()}|{path}", time.monotonic()
    if now - last_written.get(key, -MEMORY_EVERY_S) < MEMORY_EVERY_S:
        return False
    last_written[key] = now
    return True


_TEMP_GLOB = ".calibration-*.json"  # a writer's file before its rename (_durable.replacing, in _write)
_LOCK_WAIT_S = 5.0  # a writer holds the lock for milliseconds; past this, skip the write (best effort)
_swept: Set[str] = set()  # cache folders this process has looked at for leftovers
_said: Set[Tuple[str, str]] = set()  # (file, why) of bad files this process could not remove, said once


def _warn(path: Path, why: str, then: str) -> None:
    warnings.warn(f"pyspec: discarded {path} ({why}); {then}", RuntimeWarning, stacklevel=5)


def _lock(locked: bool = False, timeout: float = _LOCK_WAIT_S):
    """The cache's lock (a no-op context when the caller already holds it)."""
    return contextlib.nullcontext() if locked else CacheLock(str(cache_file()) + ".lock", timeout=timeout)


def _positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _problem(data: object) -> Optional[str]:
    """Why ``data`` (parsed JSON) is not a calibration cache, or None. Fields
    this version does not know are allowed (a newer pyspec may add some)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key, entry in data.items():
        if not isinstance(entry, dict):
            return f"entry {key[:60]!r} is a JSON {type(entry).__name__}, not an object"
        for field, value in entry.items():
            if field.isdigit() or field == DRAFT_TOKEN:
                if not _positive(value):
                    return f"{field!r} is {value!r}, not a positive number of seconds"
            elif field == MEMORY and not (isinstance(value, list) and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value)):
                return f"{field!r} is not a list of numbers"
    return None


def _parse(raw: bytes) -> Tuple[Dict[str, Dict[str, object]], Optional[str]]:
    """The cache's data and, for a file that is not one, why (data then {})."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as e:  # a truncated file, or not UTF-8 text
        return {}, f"not valid JSON: {e}"
    why = _problem(data)
    return ({}, why) if why else (data, None)


def _sweep(locked: bool) -> None:
    """Remove the temporary files of writers that were killed before their
    rename (once per process and folder; only under the lock, so that every
    temporary file found is a dead writer's)."""
    folder = cache_file().parent
    if str(folder) in _swept:
        return
    try:
        if any(folder.glob(_TEMP_GLOB)):
            with _lock(locked, timeout=0):
                for tmp in folder.glob(_TEMP_GLOB):
                    tmp.unlink(missing_ok=True)
                    _warn(tmp, "a partial write left by a process that stopped while saving timings",
                          "calibration.json itself is untouched")
        _swept.add(str(folder))
    except (OSError, Timeout):
        pass  # a writer is busy (or the folder unreadable): the next read sweeps


def _read(locked: bool = False) -> Dict[str, Dict[str, object]]:
    """The cache's data ({} if none). A file that is not a calibration cache
    is discarded with a warning, so that its timings are measured again.
    ``locked``: the caller holds the cache's lock."""
    _sweep(locked)
    path = cache_file()
    try:
        data, why = _parse(path.read_bytes())
    except OSError:
        return {}  # missing, or e.g. no permission: not ours to remove
    if why is None:
        return data
    try:
        with _lock(locked):
            # Re-checked under the lock: a writer may have replaced the file meanwhile.
            if _parse(path.read_bytes())[1] is not None:
                path.unlink()
                _warn(path, why, "its timings will be measured again")
    except (OSError, Timeout):
        if (str(path), why) not in _said:  # it stays: say so once per process
            _said.add((str(path), why))
            _warn(path, why, "it is ignored and its timings measured again")
    return {}


def _entry(core_model) -> Dict[str, object]:
    entry = _read().get(machine_key(core_model), {})
    return entry if isinstance(entry, dict) else {}


def load(core_model) -> Dict[int, float]:
    """Seconds per target batch size on record for this model and machine ({} if none)."""
    return _timings(_entry(core_model))


def _timings(entry: Dict[str, object]) -> Dict[int, float]:
    out: Dict[int, float] = {}
    for n, s in entry.items():
        try:
            n, s = int(n), float(s)
        except (TypeError, ValueError):
            continue  # other fields of the entry (DRAFT_TOKEN, MEMORY), or a foreign value
        if n > 0 and s > 0:
            out[n] = s
    return _plausible(out)


#: A batch of n tokens costs at most this many times n/m batches of m < n (it could
#: be run as those), and a batch of m < n tokens at most this many times a batch of
#: n (it does part of that work): a timing outside either was taken on a busy machine.
PLAUSIBLE_SLACK = 1.5


def _plausible(timings: Dict[int, float]) -> Dict[int, float]:
    """The timings without those that a busy machine inflated: a size that cost
    more than a larger one (judged against the cheapest larger size), then a
    size that cost more than n/m batches of the largest smaller size m kept.
    Such a size is timed again instead of steering the policy for good: an
    inflated large size is never used, so never refined by a round; an
    inflated V(1) (no smaller size to judge it by) made every draft look cheap
    (measured: V(1) on record 0.163 s against 0.043 s, and prose after an
    agent's conversation decoded at half of plain's rate)."""
    sizes = sorted(timings)
    small_ok = [n for i, n in enumerate(sizes)
                if not any(timings[n] > PLAUSIBLE_SLACK * timings[m] for m in sizes[i + 1:])]
    kept: Dict[int, float] = {}
    for n in small_ok:
        below = [m for m in kept if m < n]
        if below and timings[n] > PLAUSIBLE_SLACK * (n / max(below)) * kept[max(below)]:
            continue
        kept[n] = timings[n]
    return kept


def save(core_model, timings: Dict[int, float]) -> None:
    """Record batch timings (best effort: a read-only cache only costs a recalibration)."""
    _update(core_model, {str(n): float(s) for n, s in timings.items() if s > 0})


def _update(core_model, fields: Dict[str, object]) -> None:
    """Merge ``fields`` into the model's entry: read, change and replace the
    file under the lock, so that no other process's entry is lost."""
    target = cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _lock():
            data = _read(locked=True)
            key = machine_key(core_model)
            entry = data.get(key) if isinstance(data.get(key), dict) else {}
            entry.update(fields)
            data[key] = entry
            if _problem(data) is None:  # never write what a reader would discard
                _write(target, json.dumps(data, indent=1))
    except (OSError, Timeout):
        pass  # best effort: a read-only or busy cache only costs a recalibration


def _write(target: Path, text: str) -> None:
    """Replace ``target`` with ``text`` whole: a crash at any moment leaves the
    old file or the new one (the rename is atomic, and both the data and the
    rename reach the disk before the lock is released)."""
    with replacing(target, prefix=".calibration-", suffix=".json") as f:
        f.write(text.encode("utf-8"))
