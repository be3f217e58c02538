"""Helpers the store tests share: what a killed writer leaves, objects written by hand."""

from __future__ import annotations

import os

from agentsession_cas import Entry
from agentsession_cas.format.hashing import entry_objects
from agentsession_cas.store import Store


def crash(st: Store) -> None:
    """Let go of a writing store's sessions as a killed process would: no commit, no
    checkpoint (one in flight is let finish, as the process's thread would have or not),
    the lock freed."""
    for s in list(st._open.values()):
        log = s.log
        if log._inflight is not None:
            log._inflight[0].result()
            log._inflight = None
        if log._fd is not None:
            os.close(log._fd)
            log._fd = None
        s._closed = True
        log._closed = True
        if log.lock is not None:
            log.lock.release()
            log.lock = None
        st.objects.unregister(log)
    st._open.clear()


def put_entry(st: Store, e: Entry) -> None:
    """Write an entry's two objects durably, as if some writer had (no log names them)."""
    _, chash, content, env = entry_objects(dict(e.data))
    st.objects.put("contents", chash, content, durable=True)
    st.objects.put("entries", e.id, env, durable=True)
