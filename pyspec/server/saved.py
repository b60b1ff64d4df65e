"""Saved conversations: the ``pyspec serve --cache-dir`` folder, one file
per conversation of the host-memory prompt cache (``--cache-ram``), each
holding every model's cache of it (pyspec/prefix.py's format). Loaded into the
prompt cache at startup, written from it at shutdown, so a restarted server
answers those conversations without a prefill.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

if TYPE_CHECKING:
    from .. import _core


class SavedConversations:
    """The folder ``folder`` beside the prompt cache ``cache`` of ``models``."""

    def __init__(self, folder: str, cache: Optional["_core.HostCache"], models: List["_core.Model"]) -> None:
        if cache is None:
            raise ValueError("a prompt cache folder needs host memory to load it into (--cache-ram > 0)")
        self.folder, self.cache, self.models = folder, cache, models

    def load(self) -> int:
        """The folder's saved conversations into the prompt cache (oldest first,
        so the newest are kept if they do not all fit); files that do not fit
        these models are skipped with a warning. Returns how many it took."""
        from .. import prefix

        loaded = 0
        files = sorted(Path(self.folder).glob("*" + prefix.SUFFIX), key=lambda p: p.stat().st_mtime)
        for path in files:
            try:
                parts = prefix.read(path, self.models)
            except (OSError, prefix.PrefixFileError) as e:
                warnings.warn(f"pyspec serve: skipped {path}: {e}", RuntimeWarning, stacklevel=2)
                continue
            loaded += bool(self.cache.put(parts))
        return loaded

    def save(self) -> None:
        """The prompt cache's conversations to the folder, one file each; files of
        conversations it no longer holds are removed (the folder stays within
        --cache-ram)."""
        from .. import prefix

        keep = set()
        for parts in reversed(self.cache.entries()):  # oldest first: the newest get the latest mtimes
            name = prefix.file_name(parts[0][1])
            keep.add(name)
            prefix.write(Path(self.folder) / name, parts)
        for path in Path(self.folder).glob("*" + prefix.SUFFIX):
            if path.name not in keep:
                path.unlink(missing_ok=True)
