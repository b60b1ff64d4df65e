"""Writes that survive a crash: the one rule every cache of pyspec follows
(docs/promises.md, "Caches and crashes"). A file is written beside its final
name, fsynced, renamed over it (atomic), and then its folder is fsynced, so
that the rename itself is on disk before anyone is told the file is there."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator


def cache_root() -> Path:
    """pyspec's own cache folder: ``$PYSPEC_CACHE``, else ``~/.cache/pyspec``
    (calibration, CPU verdicts, the editor plugin; models have theirs: models/fetch.py)."""
    return Path(os.environ.get("PYSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "pyspec"))


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


@contextlib.contextmanager
def replacing(target: Path, *, prefix: str, suffix: str = "") -> Iterator[BinaryIO]:
    """A binary file to write that then replaces ``target`` whole: written
    beside it (``prefix``...``suffix``, so that its owner can recognise a
    leftover), fsynced, renamed over it, the folder fsynced. A crash at any
    moment leaves the old file or the new one; an exception removes the new."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
