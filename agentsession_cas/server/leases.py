"""Leases: RFC 0002's hold on a session, over a network (RFC 0003, Leases).

A lease expires (on the server's monotonic clock, from its acquire or last
renew), is renewed and released by its lease ID (a 128-bit secret), and
carries a fencing token: a number greater than every token issued before for
that session id. Every write to a session presents the token and is refused
(:class:`LeaseLostError`) unless it is the current, unexpired lease's.

The token counter is kept in the store's own state (the remote-state table,
under a reserved remote URL) and written durably before a token is handed out,
so tokens never repeat under an id across restarts, deletion and re-creation.
The table of live leases is the server's memory: a restart ends every lease
(their holders see ``lease_lost`` and acquire again), which never lets two
writers in, since the next token is still greater.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from ..errors import LeaseLostError, SessionLockedError
from ..format.timestamps import now_ts
from ..lean import dataclass
from ..store.store import Store

__all__ = ["LEASE_STATE_URL", "Lease", "Leases"]

#: The reserved remote under which a store keeps the server's fencing counters.
LEASE_STATE_URL = "agentsession-server:leases"


@dataclass
class Lease:
    session: str
    lease_id: str
    token: int
    holder: str
    ttl_ms: int
    deadline: float  # time.monotonic() seconds

    def expired(self, now: float) -> bool:
        return now >= self.deadline

    def as_dict(self) -> dict[str, object]:
        left = max(0.0, self.deadline - time.monotonic())
        return {"lease_id": self.lease_id, "token": self.token, "holder": self.holder, "ttl_ms": self.ttl_ms,
                "expires": _expires(left), "session": self.session}


def _expires(seconds: float) -> str:
    """The advisory expiry as an RFC 3339 time (a client computes its own deadline)."""
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Leases:
    """The leases of one server over one store. Callers hold the server's lock."""

    def __init__(self, store: Store, *, max_ttl_ms: int, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.max_ttl_ms = max_ttl_ms
        self.clock = clock
        self._live: dict[str, Lease] = {}

    def current(self, session_id: str) -> Lease | None:
        """The session's unexpired lease, or None."""
        lease = self._live.get(session_id)
        if lease is not None and lease.expired(self.clock()):
            return None
        return lease

    def _next_token(self, session_id: str, *, skip: int = 0) -> int:
        remotes = self.store.backend.remotes
        held = remotes.get(LEASE_STATE_URL, "sessions", session_id) or {}
        last = held.get("token")
        token = (last if isinstance(last, int) else 0) + 1 + skip
        remotes.put(LEASE_STATE_URL, "sessions", session_id, {"session": session_id, "token": token, "at": now_ts()})
        return token

    def acquire(self, session_id: str, holder: str, ttl_ms: int) -> tuple[Lease, Lease | None]:
        """A new lease; SessionLockedError while another is current. Returns the lease
        and the expired one it replaces (whose holder's working state the caller
        commits first: a takeover resumes from a durable log)."""
        ttl = max(1, min(int(ttl_ms), self.max_ttl_ms))
        old = self._live.get(session_id)
        if old is not None and not old.expired(self.clock()):
            raise SessionLockedError(f"session {session_id} is leased (holder {old.holder!r})")
        token = self._next_token(session_id)
        lease = Lease(session_id, secrets.token_urlsafe(24), token, holder, ttl, self.clock() + ttl / 1000)
        self._live[session_id] = lease
        return lease, old

    def _by_id(self, session_id: str, lease_id: str) -> Lease:
        lease = self._live.get(session_id)
        # Compared as bytes: compare_digest refuses a str holding anything but ASCII with a
        # TypeError, and a Lease-ID header may hold any byte (it answered 500).
        if lease is None or not secrets.compare_digest(lease.lease_id.encode(), (lease_id or "").encode()):
            raise LeaseLostError(f"that lease of session {session_id} is not its current one (released, broken or taken)")
        if lease.expired(self.clock()):
            raise LeaseLostError(f"that lease of session {session_id} expired")
        return lease

    def renew(self, session_id: str, lease_id: str, ttl_ms: int | None) -> Lease:
        lease = self._by_id(session_id, lease_id)
        if ttl_ms is not None:
            lease.ttl_ms = max(1, min(int(ttl_ms), self.max_ttl_ms))
        lease.deadline = self.clock() + lease.ttl_ms / 1000
        return lease

    def release(self, session_id: str, lease_id: str) -> Lease:
        lease = self._by_id(session_id, lease_id)
        del self._live[session_id]
        return lease

    def break_(self, session_id: str) -> Lease | None:
        """End whatever lease the session has and advance the token, so the breaker's
        successor holds a token greater than any the broken holder had."""
        old = self._live.pop(session_id, None)
        self._next_token(session_id)
        return old

    def check(self, session_id: str, token: str | None) -> Lease:
        """The fence: the write's ``Lease-Token`` must be the current, unexpired lease's."""
        lease = self._live.get(session_id)
        if token is None:
            raise LeaseLostError(f"a write to session {session_id} carries its lease's token (Lease-Token)")
        if lease is None or str(lease.token) != token.strip():
            raise LeaseLostError(f"token {token} is not the current lease of session {session_id}")
        if lease.expired(self.clock()):
            raise LeaseLostError(f"the lease of session {session_id} (token {token}) expired")
        return lease

    def drop(self, session_id: str) -> None:
        """The session was deleted: its lease ends with it (the counter stays)."""
        self._live.pop(session_id, None)
