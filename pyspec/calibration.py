"""Timings the ``auto`` policy needs, kept on disk so that it measures them once
per model and machine, not once per process: the target's verification batches
and the draft model's cost per drafted token. Without the latter, every new
process would prefill the draft model and probe it once only to learn that it
cannot pay on this machine. Beside them, what auto learnt about text that
outlives a call (``AutoPolicy.memory``: the long-run acceptance of each lookup
bucket and the host work per round), so that a new process, and a short
answer in it, starts from what earlier ones learnt instead of the built-in
priors.

The policy object owns the numbers (it asks the engine to time batch sizes on
first use, measures the draft model when it drafts, and refines both online);
this module only persists them: :func:`prepare` hands a policy the timings on
record before a generation, :func:`keep` records new ones after it.

The file is ``$PYSPEC_CACHE/calibration.json`` (default ``~/.cache/pyspec``).
An entry is keyed by everything the timings depend on: the model file (path,
size, mtime), threads, GPU layers, flash attention (as run) and llama.cpp's
build features. A missing, unreadable or foreign file only means calibrating
again.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Dict, Sequence

from . import _core


def cache_file() -> Path:
    root = os.environ.get("PYSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "pyspec")
    return Path(root) / "calibration.json"


def machine_key(core_model) -> str:
    """What batch timings depend on, as one string."""
    path = os.path.realpath(core_model.path)
    st = os.stat(path)
    return "|".join([
        path, str(st.st_size), str(int(st.st_mtime)), f"threads={core_model.n_threads}",
        f"gpu_layers={core_model.n_gpu_layers}", f"flash_attn={core_model.flash_attn}",
        _core.llama_system_info().strip(),
    ])


DRAFT_TOKEN = "draft_token_s"  # a draft model's entry: seconds per drafted token (beside its batch sizes)
MEMORY = "auto_memory"  # a target's entry: AutoPolicy.memory
MEMORY_EVERY_S = 60.0   # a process writes its memory at most this often (a server answers many calls)
_memory_written: Dict[str, float] = {}


def prepare(policies: Sequence["_core.LengthPolicy"], core_model, draft_model=None) -> None:
    """Give each policy (a batch has one per sequence) the timings on record that
    it still wants: the target's batch sizes (if all are known; the engine's
    choice of sizes, :func:`pyspec._core.calibration_rows`), the draft model's
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
            if all(n in known for n in sizes):
                policy.calibrated(sizes, [known[n] for n in sizes])
        if draft_model is not None and auto and policy.draft_cost("model") < 0:
            cost = _entry(draft_model).get(DRAFT_TOKEN) if cost is None else cost
            if isinstance(cost, (int, float)) and cost > 0:
                policy.recorded_draft_cost(float(cost))
        if auto and policy.rounds_seen == 0:
            memory = entry.get(MEMORY)
            if isinstance(memory, list) and all(isinstance(x, (int, float)) for x in memory):
                policy.remember([float(x) for x in memory])


def keep(policy: "_core.LengthPolicy", core_model, stats, draft_model=None) -> None:
    """Record the timings a generation just measured: new batch timings
    (``stats.calibrate_s > 0``), the draft model's cost when it moved by more
    than a tenth from the one on record, and the policy's memory at most once a
    minute (not a file write per generation)."""
    if not isinstance(policy, _core.AutoPolicy):
        return
    if stats.calibrate_s > 0:
        save(core_model, policy.calibration)
    # Throttled per model file in this process (machine_key would stat the file every call).
    last = _memory_written.get(core_model.path, -MEMORY_EVERY_S)
    if time.monotonic() - last >= MEMORY_EVERY_S and policy.rounds_seen > 0:
        _memory_written[core_model.path] = time.monotonic()
        _update(core_model, {MEMORY: [float(x) for x in policy.memory]})
    cost = policy.draft_cost("model")
    if draft_model is not None and cost > 0:
        recorded = _entry(draft_model).get(DRAFT_TOKEN)
        if not isinstance(recorded, (int, float)) or abs(cost - recorded) > 0.1 * recorded:
            _update(draft_model, {DRAFT_TOKEN: cost})


def _read() -> Dict[str, Dict[str, float]]:
    try:
        data = json.loads(cache_file().read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
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
    return out


def save(core_model, timings: Dict[int, float]) -> None:
    """Record batch timings (best effort: a read-only cache only costs a recalibration)."""
    _update(core_model, {str(n): float(s) for n, s in timings.items() if s > 0})


def _update(core_model, fields: Dict[str, object]) -> None:
    data = _read()
    key = machine_key(core_model)
    entry = data.get(key) if isinstance(data.get(key), dict) else {}
    entry.update(fields)
    data[key] = entry
    target = cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".calibration-", suffix=".json")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, target)  # atomic: concurrent writers never leave half a file
    except OSError:
        Path(tmp).unlink(missing_ok=True)
