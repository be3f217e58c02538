"""Reading and verifying session files (RFC 0001 "File", "Entry hash", "Versioning").

:func:`read_session` reads a whole file and returns a :class:`SessionFile`
holding the header, the entries in file order and every problem found,
line by line. It never stops at the first problem, since a verifier wants
them all; :meth:`SessionFile.raise_for_problems` turns them into one error
for callers that must refuse a bad file (an import, say).

The rules are :mod:`agentsession_cas.format.rules`': each line goes through
:func:`~agentsession_cas.format.rules.check_line` (it parses as I-JSON, it is an
object with a type, its ``id`` is ``sha256:`` + 64 hex and the hash of its
members, its ``ts`` is in the admitted form, its body carries no reserved
name, it has the members its type requires) and then
:class:`~agentsession_cas.format.rules.TreeState` (its parent appears earlier,
its ``parents`` obey the convergence rules, and in a file with a ``base`` the
prefix/own-entry rule holds; a repeated id is the same entry, reported once).
A final line that does not parse is tolerated and reported as truncation; any
other unparsable line is a problem. The record and context rules are the
second half of a verify (:func:`~agentsession_cas.format.rules.verify_session`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    AgentSessionError,
    NoSuchEntryError,
    Problem,
    SessionFormatError,
)
from .canonical import loads_flagged
from .entry import Entry, Header
from .legacy import migrate_entry
from .rules import CORE_TYPES, TreeState, check_line, gc_paused, line_failure, problem, read_header, unloaded_claims
from .tree import Tree

__all__ = ["CORE_TYPES", "SessionFile", "gc_paused", "read_session", "read_session_bytes", "split_lines"]



@dataclass
class SessionFile:
    """A session file as read: header, entries in file order, and what was wrong."""

    source: str
    header: Header
    entries: list[Entry]
    problems: list[Problem] = field(default_factory=list)
    truncated: Problem | None = None
    migrated: bool = False
    #: Migration notes: references an earlier-format file holds that could not be rewritten.
    unresolved: list[Problem] = field(default_factory=list)
    _tree: Tree | None = field(default=None, repr=False)
    #: What :func:`~agentsession_cas.format.rules.verify_session` found, once asked.
    _verified: Any = field(default=None, repr=False, compare=False)

    @property
    def tree(self) -> Tree:
        if self._tree is None:
            base = self.header.base
            prefix: list[str] = []
            if base is not None:
                for e in self.entries:
                    if e.id == base:
                        break
                    prefix.append(e.id)
                else:
                    prefix = []
            self._tree = Tree(self.entries, base=base, prefix=prefix)
        return self._tree

    @property
    def leaf(self) -> str | None:
        """The leaf the resume rule gives (None: the universal root or no entries)."""
        return self.tree.resume_leaf()

    def all_problems(self) -> list[Problem]:
        """Every problem, truncation included, in line order."""
        out = list(self.problems)
        if self.truncated is not None:
            out.append(self.truncated)
        return sorted(out, key=lambda p: (p.line is None, p.line or 0))

    @property
    def ok(self) -> bool:
        """True when every line verified, nothing was cut short, and there is an entry."""
        return not self.problems and self.truncated is None and bool(self.entries)

    def raise_for_problems(self) -> None:
        """Raise :class:`SessionFormatError` unless the file read clean."""
        problems = self.all_problems()
        if not self.entries and not problems:
            problems = [problem(None, "empty", "the file holds a header and no entries")]
        if problems:
            raise SessionFormatError(self.source, problems)

    def resolve(self, name: str) -> Entry:
        """Find an entry by full id, by ``legacy_id``, or by a unique prefix of its hex digest."""
        tree = self.tree
        if name in tree:
            return tree.by_id[name]
        for e in self.entries:
            if e.legacy_id == name:
                return e
        digits = name[7:] if name.startswith("sha256:") else name
        if digits and all(c in "0123456789abcdef" for c in digits):
            found = [e for e in self.entries if e.id.startswith("sha256:" + digits)]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise NoSuchEntryError(f"{name} names {len(found)} entries; give more of the hash")
        raise NoSuchEntryError(f"no such entry: {name}")

    def canonical_bytes(self) -> bytes:
        """The file written back out: the header, then each entry, as canonical lines.

        A file migrated from before 0.5 is refused: RFC 0001 says a reader
        migrates such a file in memory and never rewrites it.
        """
        if self.migrated:
            raise AgentSessionError(
                f"{self.source} was migrated in memory from {self.header.format}; such a file is never rewritten"
            )
        return self.header.canonical_line() + b"".join(e.canonical_line() for e in self.entries)


def split_lines(data: bytes) -> list[bytes]:
    """Split on LF; a final LF ends the last line rather than starting an empty one."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def read_session(path: str | os.PathLike, *, keep_objects: bool = False) -> SessionFile:
    """Read and check the session file at ``path``.

    Raises ``OSError`` when the file cannot be read and
    :class:`SessionFormatError` when its first line is no usable header;
    every other problem is collected in the result.
    """
    name = os.fspath(path)
    if os.path.isdir(name):
        raise IsADirectoryError(21, "is a directory, not a session file", name)
    with open(name, "rb") as f:
        data = f.read()
    return read_session_bytes(data, source=name, keep_objects=keep_objects)


def read_session_bytes(data: bytes, *, source: str = "<bytes>", keep_objects: bool = False) -> SessionFile:
    """Read and check a session held in memory (see :func:`read_session`).

    ``keep_objects`` keeps each entry's two objects (content and envelope bytes,
    computed anyway to check its hashes) on ``Entry.objects``, for an import that
    writes them next; it costs their size in memory."""
    lines = split_lines(data)
    if not lines:
        raise SessionFormatError(source, [problem(1, "header", "the file is empty: no header")])
    header = read_header(lines[0], source)
    with gc_paused():
        return _Reader(source, header, lines, keep_objects=keep_objects).run()


class _Reader:
    """One pass over a file's lines: the line rules of each, then the tree rules."""

    def __init__(self, source: str, header: Header, lines: list[bytes], *, keep_objects: bool = False):
        self.keep_objects = keep_objects
        self.source = source
        self.header = header
        self.lines = lines
        self.entries: list[Entry] = []
        self.problems: list[Problem] = []
        self.truncated: Problem | None = None
        self.unresolved: list[Problem] = []
        self.tree = TreeState(header)

    def parsed_objects(self) -> Iterator[tuple[int, dict, bool]]:
        """Parse every entry line, reporting those that do not parse."""
        last = len(self.lines)
        lines = self.lines
        for lineno in range(2, last + 1):
            raw = lines[lineno - 1]
            # parse_line's work, with its fast path inline: a bulk read calls it per line
            try:
                obj, careful = loads_flagged(raw.decode("utf-8"))
            except ValueError as exc:  # IJSONError, JSONDecodeError, UnicodeDecodeError
                self._failed(raw, exc, lineno, last)
                continue
            if obj.__class__ is not dict:
                self._failed(raw, None, lineno, last)
                continue
            yield lineno, obj, careful

    def _failed(self, raw: bytes, exc: Exception | None, lineno: int, last: int) -> None:
        found, claims = line_failure(raw, exc, line=lineno, last=lineno == last)
        if found.code == "truncated":
            self.truncated = found
        else:
            self.problems.append(found)
        for claim in claims:
            self.tree.mark_broken(claim)

    def run(self) -> SessionFile:
        objects = self.parsed_objects()
        migrated = self.header.is_legacy
        if migrated:
            objects = self._migrated(objects)
        tree = self.tree
        held = tree.held
        entries = self.entries
        problems = self.problems
        keep = self.keep_objects
        for lineno, obj, careful in objects:
            entry, found = check_line(obj, line=lineno, careful=careful, keep_objects=keep, migrated=migrated)
            if found:
                problems.extend(found)
                for claim in unloaded_claims(obj, entry):
                    tree.mark_broken(claim)
            if entry is None:
                continue
            if entry.id in held:
                problems.extend(tree.add(entry))  # the same entry again: reported, not loaded
                continue
            found = tree.add(entry)
            if found:
                problems.extend(found)
            entries.append(entry)
        problems.extend(tree.finish())
        return SessionFile(
            source=self.source,
            header=self.header,
            entries=entries,
            problems=problems,
            truncated=self.truncated,
            migrated=migrated,
            unresolved=self.unresolved,
        )

    def _migrated(self, objects: Iterator[tuple[int, dict, bool]]) -> Iterator[tuple[int, dict, bool]]:
        assigned: dict[str, str] = {}
        for lineno, obj, careful in objects:
            new, notes = migrate_entry(obj, lineno, assigned, self.header.id)
            self.unresolved.extend(notes)
            old = obj.get("id")
            if isinstance(old, str) and "id" in new:
                assigned.setdefault(old, new["id"])
            yield lineno, new, careful
