"""Writes that survive a crash: the one rule every cache of pyspec follows
(docs/promises.md, "Caches and crashes"). A file is written beside its final
name, fsynced, renamed over it (atomic), and then its folder is fsynced, so
that the rename itself is on disk before anyone is told the file is there."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Put a rename in ``folder`` on disk (where directories can be opened; where
    they cannot, the rename is atomic all the same)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
