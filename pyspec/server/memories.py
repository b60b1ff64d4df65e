"""The server's memories: one per user, so that one client's text is never
drafted into another user's answer.

A draft never changes an answer (verification is lossless), but how fast an
answer comes does: a client who could make the server draft from another
user's text could time its answers and learn whether that text was seen. So
the store is keyed by the request's ``user`` field (OpenAI's end-user id;
requests without one share the anonymous store, as one local user's tools
do). The API key is not a separate key: the server has one, so it names no
user. ``pyspec serve --no-memory`` turns memory off altogether.
"""

from __future__ import annotations

import collections
import threading
from typing import Optional

from ..memory import Memory


class UserMemories:
    """Up to ``max_users`` memories of ``cap_mb`` each (the least recently
    active user's is dropped first); ``cap_mb`` 0: no memory."""

    def __init__(self, cap_mb: float, max_users: int = 8) -> None:
        self.cap_mb = cap_mb
        self.max_users = max_users
        self._stores: "collections.OrderedDict[str, Memory]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, user: str) -> Optional[Memory]:
        if self.cap_mb <= 0:
            return None
        with self._lock:
            store = self._stores.pop(user, None) or Memory(self.cap_mb)
            self._stores[user] = store  # the most recently active
            while len(self._stores) > self.max_users:
                self._stores.popitem(last=False)
            return store

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(m.bytes for m in self._stores.values())
