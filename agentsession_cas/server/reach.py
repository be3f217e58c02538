"""Which objects a caller may be told about (RFC 0003, Objects: "Reach").

An object is reachable by a caller when some session the caller may read holds
it: an own or prefix entry's envelope, the content it names, or a media blob
that content names through a ``sidecar:`` URL. A hash is a name, not a
capability: the server serves, and reports held, only reachable objects, so a
guess at another tenant's content learns nothing.

The index is per session and grows with its log: a session's sets are
extended by the entries appended since they were last looked at (objects never
change under their hashes, so what an entry names is cached for good). The
server is the writer of every session it serves, so a session's live state
says exactly what it holds.

Beside it, each object names the sessions its sets were last seen in
(:meth:`Reach.holders`): a question about one object asks those sessions
again, each brought up to date, and only when none of them holds it for this
caller are all the caller's sessions looked at. So a GET of an object some
session holds costs the sessions holding it, not every session of the store
(it cost a listing and a look at each: 6 ms a GET with 1,000 sessions). A
holder is only ever a hint: it is asked again before an answer uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import field

from ..errors import AgentSessionError, NoSuchObjectError
from ..format.hashing import envelope_content
from ..format.media import sidecar_names
from ..lean import dataclass
from ..store.refs import header_ident
from ..store.session import Session
from ..store.store import Store

__all__ = ["Reach"]

#: Envelopes read in one bulk read when a session's sets are first made.
_READ_CHUNK = 1024


@dataclass
class _Held:
    ident: str
    session: object = None  # the Session object the sets were last read from
    own: int = 0
    prefix: bool = False
    sets: dict[str, set[str]] = field(default_factory=lambda: {"entries": set(), "contents": set(), "blobs": set()})


class Reach:
    """The objects each session holds, for answering "may this caller see it?"."""

    def __init__(self, store: Store, open_session: Callable[[str], Session | None]):
        self.store = store
        self._open = open_session
        self._held: dict[str, _Held] = {}
        self._content_of: dict[str, str | None] = {}
        self._blobs_of: dict[str, tuple[str, ...]] = {}
        #: (space, name) -> the sessions whose sets took it (a hint: see the module).
        self._holders: dict[tuple[str, str], set[str]] = {}

    def forget(self, session_id: str) -> None:
        """Drop what is known of a session (deleted, or created again)."""
        self._held.pop(session_id, None)

    def holders(self, space: str, name: str) -> set[str]:
        """The sessions whose sets took ``name`` when last looked at (a hint)."""
        return self._holders.get((space, name), set())

    def _took(self, session_id: str, space: str, name: str) -> None:
        got = self._holders.get((space, name))
        if got is None:
            self._holders[(space, name)] = {session_id}
        else:
            got.add(session_id)

    def _read_contents(self, entry_ids: list[str]) -> None:
        """Learn the content hash of each entry not known yet, its envelopes read a chunk
        at a time in one bulk read (a pack's block at once: the first look at a session
        of 100,000 entries read them one by one, 7 s); a chunk that does not read whole
        is left to :meth:`_add`, one entry at a time."""
        todo = [e for e in dict.fromkeys(entry_ids) if e not in self._content_of]
        for at in range(0, len(todo), _READ_CHUNK):
            chunk = todo[at : at + _READ_CHUNK]
            try:
                envs = self.store.objects.get_many("entries", chunk)
            except (AgentSessionError, OSError):
                continue
            for entry_id, env in zip(chunk, envs):
                self._content_of[entry_id] = envelope_content(env)

    def _add(self, session_id: str, held: _Held, entry_id: str, sidecar: bool) -> None:
        sets = held.sets
        sets["entries"].add(entry_id)
        self._took(session_id, "entries", entry_id)
        chash = self._content_of.get(entry_id, "")
        if chash == "":
            try:
                chash = envelope_content(self.store.objects.get("entries", entry_id))
            except (NoSuchObjectError, AgentSessionError, OSError):
                chash = None
            self._content_of[entry_id] = chash
        if chash is None:
            return
        sets["contents"].add(chash)
        self._took(session_id, "contents", chash)
        if sidecar:
            blobs = self._blobs_of.get(chash)
            if blobs is None:
                try:
                    blobs = tuple(sidecar_names(self.store.objects.get("contents", chash)))
                except (AgentSessionError, OSError):
                    blobs = ()
                self._blobs_of[chash] = blobs
            sets["blobs"].update(blobs)
            for blob in blobs:
                self._took(session_id, "blobs", blob)

    def sets(self, session_id: str) -> dict[str, set[str]] | None:
        """The objects ``session_id`` holds now, by space (None: no such session, or
        one that cannot be read, which holds nothing anyone may see)."""
        s = self._open(session_id)
        if s is None:
            self._held.pop(session_id, None)
            return None
        held = self._held.get(session_id)
        order = s.log_order
        if held is None or held.session is not s:
            ident = header_ident(s.header.data)
            if held is None or held.ident != ident:
                held = self._held[session_id] = _Held(ident)
            held.session = s
        if held.own > len(order):
            held = self._held[session_id] = _Held(held.ident, s)
        sidecar = s.header.media == "sidecar"
        if not held.prefix:
            self._read_contents(list(s.prefix))
            for e in s.prefix:
                self._add(session_id, held, e, sidecar)
            held.prefix = True
        fresh = order[held.own:]
        if len(fresh) > 1:
            self._read_contents(list(fresh))
        for e in fresh:
            self._add(session_id, held, e, sidecar)
        held.own = len(order)
        return held.sets

    def view(self, sessions: Iterable[str]) -> dict[str, dict[str, set[str]]]:
        """The object sets of ``sessions`` (those a caller may read), by session, each
        brought up to date once for a request that asks about many objects."""
        out = {}
        for sid in sessions:
            sets = self.sets(sid)
            if sets is not None:
                out[sid] = sets
        return out

    def in_view(self, view: dict[str, dict[str, set[str]]], space: str, name: str) -> bool:
        """Whether a session of ``view`` holds the object: its holders asked, not every
        session of the view (each of the view's sessions was brought up to date, so its
        objects are among the holders)."""
        return any(name in view[sid][space] for sid in self.holders(space, name) if sid in view)
