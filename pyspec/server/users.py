"""What the server keeps per user (the request's ``user`` field, OpenAI's
end-user id; requests without one share the anonymous user, as one local
user's tools do): each user's draft memory (:class:`UserMemories`) and the
length policies their requests teach (:class:`UserPolicies`). Both keep a
bounded number of users, the least recently seen going first.

Memories are per user so that one client's text is never drafted into another
user's answer. A draft never changes an answer (verification is lossless), but
how fast an answer comes does: a client who could make the server draft from
another user's text could time its answers and learn whether that text was
seen. The API key is not a separate key: the server has one, so it names no
user. ``pyspec serve --no-memory`` turns memory off altogether.

Length policies (``auto`` keeps learning) follow the user, not the slot its
conversation happens to be cached in: a user's requests, one after another,
keep teaching one policy.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Dict, Optional, Tuple

from ..memory import Memory

#: Users whose length policies are kept (the least recently seen gives its own to a new user).
POLICY_USERS = 64


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


class UserPolicies:
    """The length policy each sequence teaches, as a key ``(user id, index)``
    of the decoder's policies (``setup(policy_keys=...)``). Used by the
    scheduler's thread alone."""

    def __init__(self, max_users: int = POLICY_USERS) -> None:
        self.max_users = max_users
        self._ids: "collections.OrderedDict[str, int]" = collections.OrderedDict()  # most recent last
        self._held: Dict[int, Tuple[int, int]] = {}  # a running sequence's handle -> its policy's key

    def key(self, user: str) -> Tuple[int, int]:
        """The user's first length policy that no running sequence uses: a user's
        requests, one after another, keep teaching one policy. At most
        ``max_users`` users keep theirs (a new one takes the least recently seen
        user's: what a policy learned is costs and acceptance, not text)."""
        uid = self._ids.pop(user, None)
        if uid is None:
            full = len(self._ids) >= self.max_users
            uid = self._ids.popitem(last=False)[1] if full else len(self._ids)
        self._ids[user] = uid
        taken = {k[1] for k in self._held.values() if k[0] == uid}
        return uid, next(i for i in itertools.count() if i not in taken)

    def hold(self, handle: int, key: Tuple[int, int]) -> None:
        """The running sequence ``handle`` teaches the policy ``key``."""
        self._held[handle] = key

    def release(self, handle: int) -> None:
        """``handle`` ended: its policy is free for its user's next request."""
        self._held.pop(handle, None)

    @property
    def users(self) -> Dict[str, int]:
        """Each user kept and their id (least recently seen first)."""
        return dict(self._ids)
