"""Timings of the target's verification batches, kept on disk so that the
``auto`` policy times them once per model and machine, not once per process.

The policy object owns the numbers (it asks the engine to time batch sizes on
first use, and refines them online); this module only persists them:
:func:`prepare` hands a policy the timings on record before a generation,
:func:`keep` records new ones after it.

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
from pathlib import Path
from typing import Dict

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


def prepare(policy: "_core.LengthPolicy", core_model) -> None:
    """Give ``policy`` the timings on record if it still wants some and all are known."""
    sizes = policy.calibration_sizes(policy.draft_max + 1)
    if not sizes:
        return
    known = load(core_model)
    if all(n in known for n in sizes):
        policy.calibrated(sizes, [known[n] for n in sizes])


def keep(policy: "_core.LengthPolicy", core_model, stats) -> None:
    """Record the timings a generation just measured (``stats.calibrate_s > 0``)."""
    if stats.calibrate_s > 0 and isinstance(policy, _core.AutoPolicy):
        save(core_model, policy.calibration)


def _read() -> Dict[str, Dict[str, float]]:
    try:
        data = json.loads(cache_file().read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def load(core_model) -> Dict[int, float]:
    """Seconds per target batch size on record for this model and machine ({} if none)."""
    entry = _read().get(machine_key(core_model), {})
    out: Dict[int, float] = {}
    if isinstance(entry, dict):
        for n, s in entry.items():
            try:
                n, s = int(n), float(s)
            except (TypeError, ValueError):
                continue
            if n > 0 and s > 0:
                out[n] = s
    return out


def save(core_model, timings: Dict[int, float]) -> None:
    """Record timings (best effort: a read-only cache only costs a recalibration)."""
    data = _read()
    key = machine_key(core_model)
    entry = data.get(key) if isinstance(data.get(key), dict) else {}
    entry.update({str(n): float(s) for n, s in timings.items() if s > 0})
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
