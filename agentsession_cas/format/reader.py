"""Reading and verifying session files (RFC 0001 "File", "Entry hash", "Versioning").

:func:`read_session` reads a whole file and returns a :class:`SessionFile`
holding the header, the entries in file order and every problem found,
line by line. It never stops at the first problem, since a verifier wants
them all; :meth:`SessionFile.raise_for_problems` turns them into one error
for callers that must refuse a bad file (an import, say).

Checked on every line: it parses as I-JSON, it is an object with a type,
its ``id`` is ``sha256:`` + 64 hex and the hash of its members, its ``ts``
is in the admitted form, its body carries no reserved name, its parent
appears earlier, its ``parents`` obey the convergence rules, and in a file
with a ``base`` the prefix/own-entry rule holds. A repeated id is the same
entry, reported once. A final line that does not parse is tolerated and
reported as truncation; any other unparsable line is a problem.
"""

from __future__ import annotations

import gc
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import (
    AgentSessionError,
    EntryError,
    IJSONError,
    NoSuchEntryError,
    Problem,
    SessionFormatError,
)
from .canonical import loads, loads_flagged
from .entry import Entry, Header, header_or_error, short_id
from .hashing import entry_hashes, entry_objects, is_hash
from .legacy import migrate_entry
from .timestamps import is_valid_ts
from .tree import Tree

__all__ = ["SessionFile", "read_session", "read_session_bytes", "split_lines"]

_CLAIMED_ID = re.compile(rb'"id"\s*:\s*"(sha256:[0-9a-f]{64})"')


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
            problems = [Problem(None, "empty", "the file holds a header and no entries")]
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


def _show(value: object) -> str:
    """An untrusted value for a one-line message: a hash as is, anything else
    JSON-quoted, so a newline or an escape sequence cannot break the line."""
    if is_hash(value):
        return value  # type: ignore[return-value]
    return json.dumps(value)


#: Entry types RFC 0001 defines; any other type must be namespaced (``ns:type``).
CORE_TYPES = frozenset(
    {"item", "response", "config", "compaction", "branch_summary", "run", "dispatch",
     "decision", "queued", "label", "info", "env", "outcome", "link", "custom"}
)


def split_lines(data: bytes) -> list[bytes]:
    """Split on LF; a final LF ends the last line rather than starting an empty one."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _describe_json_error(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"is not valid UTF-8 (byte {exc.start})"
    if isinstance(exc, json.JSONDecodeError):
        return f"does not parse as JSON: {exc.msg} at column {exc.colno}"
    return f"does not parse as JSON: {exc}"


def _parse(raw: bytes) -> object:
    return loads(raw.decode("utf-8"))


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
        raise SessionFormatError(source, [Problem(1, "header", "the file is empty: no header")])
    try:
        header_obj = _parse(lines[0])
    except (ValueError, IJSONError) as exc:
        raise SessionFormatError(source, [Problem(1, "header", f"the header {_describe_json_error(exc)}")]) from None
    header = header_or_error(header_obj, source)
    with gc_paused():
        return _Reader(source, header, lines, keep_objects=keep_objects).run()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector for a bulk pass over a session (a read, a
    projection, a log replay): such a pass allocates a few objects per entry and
    no reference cycles, and the collector would otherwise rescan the growing
    heap again and again (about a fifth of a 100,000-entry read). It is
    restored as it was, whatever happens."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


class _Reader:
    """One pass over a file's lines; state for the parent, parents and base rules."""

    def __init__(self, source: str, header: Header, lines: list[bytes], *, keep_objects: bool = False):
        self.keep_objects = keep_objects
        self.source = source
        self.header = header
        self.lines = lines
        self.entries: list[Entry] = []
        self.index: dict[str, Entry] = {}
        self.problems: list[Problem] = []
        self.truncated: Problem | None = None
        self.unresolved: list[Problem] = []
        # Ids of lines that could not be loaded, so their children do not
        # also report a missing parent for a fault already reported.
        self.broken: set[str] = set()
        self.base = header.base
        self.in_prefix = self.base is not None
        self.prefix_prev: str | None = None
        self.own: set[str] = set()

    def problem(self, line: int, code: str, message: str, entry: str | None = None) -> None:
        self.problems.append(Problem(line, code, message, entry))

    def parsed_objects(self) -> Iterator[tuple[int, dict, bool]]:
        """Parse every entry line, reporting those that do not parse."""
        last = len(self.lines)
        for lineno in range(2, last + 1):
            raw = self.lines[lineno - 1]
            try:
                obj, careful = loads_flagged(raw.decode("utf-8"))
            except IJSONError as exc:
                self.problem(lineno, "ijson", f"not I-JSON: {exc}")
                self._mark_broken(raw)
                continue
            except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
                if lineno == last:
                    self.truncated = Problem(lineno, "truncated", f"the last line was cut short: {_describe_json_error(exc)}")
                else:
                    self.problem(lineno, "json", f"the line {_describe_json_error(exc)}")
                    self._mark_broken(raw)
                continue
            if not isinstance(obj, dict):
                self.problem(lineno, "json", "the line is not a JSON object")
                continue
            yield lineno, obj, careful

    def _mark_broken(self, raw: bytes) -> None:
        """Best effort: find the id a broken line claims, by a plain search (any
        spelling: whitespace around the colon, and every candidate, since a
        nested member may also be named ``id``)."""
        for m in _CLAIMED_ID.finditer(raw):
            self.broken.add(m.group(1).decode("ascii"))

    def run(self) -> SessionFile:
        objects = self.parsed_objects()
        migrated = self.header.is_legacy
        if migrated:
            objects = self._migrated(objects)
        for lineno, obj, careful in objects:
            self.check_entry(lineno, obj, migrated, careful)
        if self.base is not None and self.in_prefix and self.entries:
            self.problem(None, "base", f"the header names base {self.base}, which the file does not hold")  # type: ignore[arg-type]
        return SessionFile(
            source=self.source,
            header=self.header,
            entries=self.entries,
            problems=self.problems,
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

    def check_entry(self, lineno: int, obj: dict, migrated: bool, careful: bool | None = None) -> None:
        type_ = obj.get("type")
        if not isinstance(type_, str) or not type_:
            self.problem(lineno, "entry", "the entry has no string 'type'")
            return
        if type_ == "session":
            self.problem(lineno, "entry", "a second header: only the first line may be of type 'session'")
            return
        if type_ not in CORE_TYPES and ":" not in type_:
            self.problem(lineno, "type", f"unknown entry type {_show(type_)}: neither a core type nor namespaced (ns:type)")
        stated = obj.get("id")
        objects = None
        try:
            if self.keep_objects and not migrated:
                computed, chash, content, env = entry_objects(obj, parsed=True, careful=careful)
                objects = (content, env)
            else:
                computed, chash = entry_hashes(obj, parsed=True, careful=careful, allow_reserved=migrated)
        except EntryError as exc:
            code = "reserved" if "reserved" in str(exc) else "entry"
            self.problem(lineno, code, str(exc), stated if isinstance(stated, str) else None)
            if isinstance(stated, str):
                self.broken.add(stated)
            return
        except IJSONError as exc:
            self.problem(lineno, "ijson", f"not I-JSON: {exc}", stated if isinstance(stated, str) else None)
            if isinstance(stated, str):
                self.broken.add(stated)
            return
        if stated == computed:
            pass  # the common case: the line's id is the hash of its members
        elif stated is None:
            self.problem(lineno, "id", f"the entry has no id (its members hash to {computed})", computed)
        elif not is_hash(stated):
            self.problem(lineno, "id", f"id {stated!r} is not sha256: followed by 64 lowercase hex digits", None)
            # Its children name the hash it should have carried: the fault is
            # reported here, not again as each child's missing parent.
            self.broken.add(computed)
        elif stated != computed:
            self.problem(lineno, "hash", f"id {_show(stated)} does not match the hash of the entry's members ({computed})", stated)
        if not is_valid_ts(obj.get("ts")):
            self.problem(
                lineno,
                "ts",
                f"ts {obj.get('ts')!r} is not in the admitted form (UTC, 'T' and 'Z', "
                "fraction only when non-zero, no trailing zeros, at most nine digits)",
            )
        entry = Entry(obj, computed_id=computed, content_hash=chash, line=lineno)
        entry.careful = careful  # the parse's flag, so a later serialisation skips the scan
        entry.objects = objects
        if entry.id in self.index:
            first = self.index[entry.id]
            self.problem(
                lineno, "duplicate", f"id {_show(short_id(entry.id))[1:-1] if not is_hash(entry.id) else short_id(entry.id)} repeats line {first.line}; read as the same entry", entry.id
            )
            return
        parent = obj.get("parent")
        if parent not in self.index or parent is None:
            self.check_parent(lineno, entry)
        if "parents" in obj:
            self.check_parents(lineno, entry)
        if self.base is not None:
            self.check_base(lineno, entry)
        self.index[entry.id] = entry
        self.entries.append(entry)

    def check_parent(self, lineno: int, entry: Entry) -> None:
        parent = entry.data.get("parent", None)
        if "parent" not in entry.data:
            self.problem(lineno, "parent", "the entry has no 'parent' (null for a root)", entry.id)
        elif parent is not None and not isinstance(parent, str):
            self.problem(lineno, "parent", "'parent' is neither an id nor null", entry.id)
        elif parent is not None and parent not in self.index and parent not in self.broken:
            self.problem(lineno, "parent", f"parent {_show(parent)} does not appear earlier in the file", entry.id)

    def check_parents(self, lineno: int, entry: Entry) -> None:
        refs = entry.data.get("parents")
        if refs is None:
            return
        if not isinstance(refs, list):
            self.problem(lineno, "parents", "'parents' is not an array", entry.id)
            return
        seen: set[str] = set()
        for ref in refs:
            if not isinstance(ref, dict) or not isinstance(ref.get("entry"), str):
                self.problem(lineno, "parents", "a 'parents' reference has no string 'entry'", entry.id)
                continue
            target = ref["entry"]
            session = ref.get("session")
            if target == entry.parent:
                self.problem(lineno, "parents", f"'parents' repeats the parent {short_id(target)}", entry.id)
            if target in seen:
                self.problem(lineno, "parents", f"'parents' names {short_id(target)} twice", entry.id)
            seen.add(target)
            if session is None or session == self.header.id:
                if target not in self.index and target not in self.broken:
                    self.problem(
                        lineno, "parents", f"'parents' names {_show(target)}, which does not appear earlier in this file", entry.id
                    )

    def check_base(self, lineno: int, entry: Entry) -> None:
        """The file opens with the path to the base; every own entry hangs from it."""
        if self.in_prefix:
            if entry.parent != self.prefix_prev:
                expected = "null (the root)" if self.prefix_prev is None else self.prefix_prev
                self.problem(
                    lineno,
                    "base",
                    f"the file must open with the path to base {short_id(self.base)}: "
                    f"this entry's parent is {_show(entry.parent)}, expected {expected}",
                    entry.id,
                )
            self.prefix_prev = entry.id
            if entry.id == self.base:
                self.in_prefix = False
            return
        if entry.parent != self.base and entry.parent not in self.own:
            self.problem(
                lineno,
                "base",
                f"an own entry must hang from the base or another own entry; its parent {_show(entry.parent)} "
                "is on the prefix above the base",
                entry.id,
            )
        self.own.add(entry.id)
