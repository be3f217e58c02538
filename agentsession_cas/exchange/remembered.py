"""What a store remembers of each remote it exchanged with.

Per remote and session: the remote head this store's line is known to
contain (the expected value of the next push's compare-and-swap) and how
much of its log the remote holds, so an incremental push names, reads and
sends only what is new; per remote ref, the session it named when last
seen. The records are kept by the backend's
:class:`~agentsession_cas.backends.base.RemoteStore`; all of it is a hint a
push re-learns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..format.hashing import is_hash
from ..format.names import check_ref_name, check_session_id
from ..lean import dataclass

if TYPE_CHECKING:
    from ..store.store import Store

__all__ = ["RemoteState", "Remembered"]


@dataclass
class RemoteState:
    """What a store remembers of one session at one remote.

    ``head`` is the remote head this store's line is known to contain (the
    expected value of the next push's compare-and-swap); ``pushed`` how many
    of this store's own entries, in its log order, the remote is known to
    hold, ``last`` the id of the last of them (so a log that changed is
    noticed); ``ident`` the session's incarnation (``refs.header_ident``),
    so a session deleted and created again under its id starts afresh.
    """

    session: str
    ident: str
    head: str | None
    pushed: int = 0
    last: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"head": self.head, "ident": self.ident, "last": self.last, "pushed": self.pushed, "session": self.session}


class Remembered:
    """The remembered state of one remote in one store: a :class:`RemoteState` per
    session, and the session each ref named there when last seen. A record that does
    not read is treated as absent, since all of it is a hint a push re-learns."""

    def __init__(self, store: Store, url: str):
        self.store = store
        self.url = url
        self.remotes = store.backend.remotes

    def get(self, session_id: str, ident: str) -> RemoteState | None:
        """The state remembered for ``session_id``, if it is of the incarnation ``ident``."""
        data = self.remotes.get(self.url, "sessions", check_session_id(session_id))
        if data is None or data.get("session") != session_id or data.get("ident") != ident:
            return None
        head, last, pushed = data.get("head"), data.get("last"), data.get("pushed")
        if head is not None and not is_hash(head):
            return None
        if last is not None and not is_hash(last):
            return None
        if not isinstance(pushed, int) or isinstance(pushed, bool) or pushed < 0:
            return None
        return RemoteState(session_id, ident, head, pushed, last)

    def set(self, state: RemoteState) -> None:
        self.remotes.put(self.url, "sessions", check_session_id(state.session), state.as_dict())

    def get_ref(self, name: str) -> str | None:
        data = self.remotes.get(self.url, "refs", check_ref_name(name))
        if data is None or data.get("name") != name:
            return None
        session = data.get("session")
        return session if isinstance(session, str) else None

    def set_ref(self, name: str, session: str | None) -> None:
        check_ref_name(name)
        if session is None:
            self.remotes.delete(self.url, "refs", name)
        else:
            self.remotes.put(self.url, "refs", name, {"name": name, "session": session})
