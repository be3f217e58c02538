"""Writing session files: canonical lines, written atomically, and a small builder.

A written file reads back to the same entries and the same leaf. Lines are
canonical JSON (RFC 8785), which is what a projection writes; the bytes of
a member never change its hashes, so re-serialising is always safe.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ..errors import EntryError
from ..fsutil import write_output
from .entry import LEAF_LABEL, Entry, Header, ParentRef, make_entry

__all__ = ["session_bytes", "write_session", "SessionBuilder"]


def session_bytes(header: Header, entries: Iterable[Entry]) -> bytes:
    """The file's bytes: the header line, then one canonical line per entry."""
    return header.canonical_line() + b"".join(e.canonical_line() for e in entries)


def write_session(path: str | os.PathLike, header: Header, entries: Iterable[Entry]) -> None:
    """Write a whole session file: a regular file atomically (a temp file in the same
    directory, fsynced, renamed over ``path``, the directory fsynced, so a crash leaves
    the old file or the new, never a mix), a symlink's target, a device or a pipe as
    a stream (:func:`~agentsession_cas.fsutil.write_output`)."""
    write_output(os.fspath(path), session_bytes(header, entries), durable=True)


class SessionBuilder:
    """Builds a session in memory the way a harness writes one.

    ``append`` hangs an entry under the leaf and makes it the leaf;
    ``branch`` hangs one elsewhere and leaves the leaf alone; ``mark_leaf``
    writes the ``leaf`` label a reader needs to resume on a branch that is
    not the last line. Ids are computed; ``ts`` is the caller's or now.
    """

    def __init__(self, header: Header, prefix: Iterable[Entry] = ()):
        self.header = header
        self.entries: list[Entry] = list(prefix)
        self.ids = {e.id for e in self.entries}
        self.leaf: str | None = header.base

    def _add(self, entry: Entry) -> Entry:
        if entry.id in self.ids:
            raise EntryError(f"entry {entry.id} is already in the session")
        if entry.parent is not None and entry.parent not in self.ids:
            raise EntryError(f"parent {entry.parent} is not in the session")
        self.entries.append(entry)
        self.ids.add(entry.id)
        return entry

    def append(
        self,
        type_: str,
        *,
        ts: str | datetime | None = None,
        parents: Iterable[ParentRef] | None = None,
        **body: Any,
    ) -> Entry:
        """Append under the leaf; the new entry becomes the leaf."""
        entry = self._add(make_entry(type_, self.leaf, ts=ts, parents=parents, **body))
        self.leaf = entry.id
        return entry

    def branch(
        self,
        parent: str | None,
        type_: str,
        *,
        ts: str | datetime | None = None,
        parents: Iterable[ParentRef] | None = None,
        **body: Any,
    ) -> Entry:
        """Append under ``parent``; the leaf moves only when ``parent`` is the leaf.

        A reader of the file takes the newest line (under the leaf label in
        force) as the leaf, so after a branch that leaves the leaf where it
        was, call :meth:`mark_leaf` with :attr:`leaf` before writing, as a
        projection records a head that is not the last line.
        """
        entry = self._add(make_entry(type_, parent, ts=ts, parents=parents, **body))
        if parent == self.leaf:
            self.leaf = entry.id
        return entry

    def mark_leaf(self, target: str | None, *, ts: str | datetime | None = None) -> Entry:
        """Write a ``leaf`` label hung from the leaf naming ``target`` (None: the
        universal root) and move the leaf there. A session with a base may not
        rest on the universal root, so None is refused there."""
        if target is None and self.header.base is not None:
            raise EntryError("a session with a base cannot have the universal root as its leaf")
        if target is not None and target not in self.ids:
            raise EntryError(f"leaf label target {target} is not in the session")
        entry = self._add(make_entry("label", self.leaf, ts=ts, target=target, label=LEAF_LABEL))
        self.leaf = target
        return entry

    def to_bytes(self) -> bytes:
        return session_bytes(self.header, self.entries)

    def write(self, path: str | os.PathLike) -> None:
        write_session(path, self.header, self.entries)
