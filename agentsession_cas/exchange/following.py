"""Following a session as it is written, from a store this process opens or from a
server (RFC 0003 Following): what ``agentsession show -f`` prints.

Both give the same :class:`Change` values, committed changes only (a follower
that prints is told what will survive a crash): each own entry once, in log
order, and each head move. A remote follow reads the server's durable stream,
verifies every entry it receives by its hashes, and resumes after a dropped
connection from the last event it saw.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..errors import BadObjectError, NoSuchSessionError
from ..format.canonical import canonical_bytes
from ..format.entry import Entry
from ..format.hashing import sha256_ref
from ..lean import dataclass
from ..store.refs import header_ident
from ..store.session import entry_from_objects
from ..store.store import Store
from .wire import error_from_problem

__all__ = ["Change", "follow_remote", "follow_store"]


@dataclass
class Change:
    """One committed change: an entry appended (``entry``, and the head after it), or a
    head move no append explains (``entry`` None)."""

    kind: str
    session: str
    head: str | None
    entry: Entry | None = None
    cursor: str | None = None


def follow_store(
    store: Store, session_id: str, *, interval: float = 0.1, sleep: Callable[[float], None] = time.sleep
) -> Iterator[Change]:
    """The session's committed entries from the first, then each one committed after,
    read from ``store`` every ``interval`` seconds (a store on this machine tells no
    one of a commit). Ends with :class:`NoSuchSessionError` when the session is
    deleted or created again while followed."""
    seen = 0
    ident: str | None = None
    head: Any = object()
    while True:
        try:
            s = store.read(session_id)
        except NoSuchSessionError:
            if ident is None:
                raise
            raise NoSuchSessionError(f"session {session_id} was deleted while followed") from None
        try:
            now = header_ident(s.header.data)
            if ident is not None and now != ident:
                raise NoSuchSessionError(f"session {session_id} was deleted and created again while followed")
            ident = now
            entries, current, _ = s.exchange_view()
            fresh = list(entries[seen:])
            # Read a chunk at a time as they are printed, the snapshot open meanwhile (an
            # object may still be only in its log): a long session's first line comes at
            # once, not after every entry was read (6 s for 100,000).
            for entry in store.entries(fresh):
                yield Change("appended", session_id, current, entry)
        finally:
            s.close()
        if fresh and current == fresh[-1]:
            head = current
        if current != head:
            head = current
            yield Change("head", session_id, current)
        seen += len(fresh)
        sleep(interval)


def _verified_entry(entry_id: str, envelope: Any, content: Any) -> Entry:
    """An entry received inline, its two hashes recomputed: a server's word is not taken."""
    if not isinstance(envelope, dict) or not isinstance(content, dict):
        raise BadObjectError(f"entry {entry_id} came without its envelope and content")
    if sha256_ref(canonical_bytes(envelope)) != entry_id or sha256_ref(canonical_bytes(content)) != envelope.get("content"):
        raise BadObjectError(f"entry {entry_id} came with objects that do not hash to their names")
    return entry_from_objects(entry_id, envelope, content)


#: Records of a snapshot whose entries are read from the server together, when it did
#: not send them inline: their envelopes in one batch read, then their contents.
SNAPSHOT_CHUNK = 1024


def _snapshot_entries(transport: Any, session_id: str, data: Mapping[str, Any]) -> Iterator[Change]:
    """The entries a snapshot names, in its order: those sent inline as they are, the
    rest read a chunk at a time (:meth:`~.http_client.HttpTransport.get_objects`: a
    batch read where the server offers one, not two GETs an entry)."""
    inline = data.get("entries") or {}
    records = [rec for rec in data.get("records") or [] if rec.get("entry") is not None]
    for at in range(0, len(records), SNAPSHOT_CHUNK):
        chunk = records[at : at + SNAPSHOT_CHUNK]
        lacking = [str(rec["entry"]) for rec in chunk if rec["entry"] not in inline]
        read: dict[str, Any] = {}
        if lacking:
            envs = {name: json.loads(raw) for _, name, raw in transport.get_objects([("entries", e) for e in lacking])}
            names = list(dict.fromkeys(str(env.get("content")) for env in envs.values()))
            contents = {name: json.loads(raw) for _, name, raw in transport.get_objects([("contents", c) for c in names])}
            read = {e: {"envelope": env, "content": contents.get(str(env.get("content")))} for e, env in envs.items()}
        for rec in chunk:
            entry_id = str(rec["entry"])
            obj = inline.get(entry_id) or read.get(entry_id) or {}
            yield Change("appended", session_id, rec.get("head"),
                         _verified_entry(entry_id, obj.get("envelope"), obj.get("content")), rec.get("cursor"))


def follow_remote(transport: Any, session_id: str) -> Iterator[Change]:
    """The committed changes of a session a server holds (``GET .../follow?durable=true``),
    from its first entry. The transport keeps the stream open (its ``stream_lines``): a
    connection that drops or ends, or that the server refuses for a while (its follow
    streams at their limit: 503, ``Retry-After``), is opened again after the wait its
    retry rule gives, within its bound (``AGENTSESSION_RETRY_WAIT``), and resumes after
    the last event seen (``Last-Event-ID``; a ``reset`` then says the session was
    replaced: :class:`NoSuchSessionError`)."""
    last_id: str | None = None
    ident: str | None = None

    def headers() -> dict[str, str]:
        return {"Accept": "application/x-ndjson", **({"Last-Event-ID": last_id} if last_id is not None else {})}

    for event in transport.stream_lines(f"/sessions/{session_id}/follow", params={"durable": "true"}, headers=headers):
        if not event.strip():
            continue  # the server's keep-alive on an idle stream (every 15 s)
        frame = json.loads(event)
        kind, data = frame.get("event"), frame.get("data") or {}
        if kind == "error":  # the problem it carries: no_session when the session went
            where = f"remote {getattr(transport, 'url', '?')}"
            raise error_from_problem(int(data.get("status") or 500), data, where=where)
        if kind in ("snapshot", "reset"):
            if ident is not None:
                raise NoSuchSessionError(f"session {session_id} was replaced while followed")
            ident = data.get("incarnation")
            yield from _snapshot_entries(transport, session_id, data)
        elif kind == "appended":
            entry = _verified_entry(str(data.get("entry")), data.get("envelope"), data.get("content"))
            yield Change("appended", session_id, data.get("head"), entry, data.get("cursor"))
        elif kind == "head":
            yield Change("head", session_id, data.get("leaf"), None, data.get("cursor"))
        # (an "end" is the stream's age limit: the transport opens it again from its id)
        last_id = frame.get("id") or last_id
