"""A lock between processes that leaves no file behind.

filelock's lock files stay after release (removing one is racy in general): a
cache that pyspec locks would collect an empty ``*.lock`` beside every model
and beside ``calibration.json``. Here the holder removes the file while it
still holds the lock, and an acquirer checks, once it holds a lock, that the
path still names the file it locked; if not (a holder removed it meanwhile),
it locks the path anew. So at most one process holds the lock on the file the
path names, and a released lock leaves nothing. A process that is killed while
holding it leaves the empty file, which the next holder removes.

POSIX ``flock``; elsewhere (Windows) filelock's lock, which removes its file
itself there. The timeout error is filelock's :class:`~filelock.Timeout`.
"""
from __future__ import annotations

import os
import time
from typing import Optional

from filelock import FileLock as _FileLock
from filelock import Timeout

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["CacheLock", "Timeout"]

_POLL_S = 0.05


class CacheLock:
    """``with CacheLock(path, timeout=5):`` holds the lock on ``path`` (created
    while held, removed on release). ``timeout``: seconds to wait (0: fail at
    once, None or < 0: wait for ever), raising :class:`Timeout`. Reentrant
    within one object, like filelock's."""

    def __init__(self, path: str, timeout: Optional[float] = None) -> None:
        self.lock_file = os.fspath(path)
        self.timeout = timeout
        self._fd: Optional[int] = None
        self._depth = 0
        self._fallback = _FileLock(self.lock_file) if fcntl is None else None

    @property
    def is_locked(self) -> bool:
        return self._depth > 0

    def acquire(self, timeout: Optional[float] = None) -> "CacheLock":
        timeout = self.timeout if timeout is None else timeout
        if self._depth == 0:
            if self._fallback is not None:  # pragma: no cover - Windows
                self._fallback.acquire(timeout=-1 if timeout is None else timeout)
            else:
                self._fd = self._lock(timeout)
        self._depth += 1
        return self

    def _lock(self, timeout: Optional[float]) -> int:
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise Timeout(self.lock_file) from None
                time.sleep(_POLL_S)
                continue
            except BaseException:
                os.close(fd)
                raise
            # Locked: but a holder may have removed the file between our open and
            # our flock, making this a lock on a file nobody else will see.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.lock_file))
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def release(self) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth:
            return
        if self._fallback is not None:  # pragma: no cover - Windows
            self._fallback.release()
            return
        fd, self._fd = self._fd, None
        try:
            os.unlink(self.lock_file)  # while held: whoever opened it meanwhile retries
        except OSError:
            pass  # gone already, or a folder we may not change: only litter is at stake
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> "CacheLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
