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
import stat
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import field
from itertools import accumulate, chain
from typing import Any, BinaryIO

import orjson

from ..errors import (
    AgentSessionError,
    Problem,
    SessionFormatError,
)
from ..lean import dataclass
from ..progress import Progress, reported
from . import parallel
from .canonical import loads_canonical, loads_flagged
from .entry import Entry, Header
from .hashing import entry_hashes
from .legacy import migrate_entry
from .media import SidecarNames, check_sidecars, sidecar_dir
from .names import resolve_entry_name
from .results import VerifyReport
from .rules import (
    CORE_TYPES,
    PathChecker,
    TreeState,
    check_line,
    clean_entry,
    gc_paused,
    line_failure,
    problem,
    read_header,
    unloaded_claims,
    verify_report,
)
from .tree import Tree

#: The bytes a streamed verify reads at a time (its lines split from them).
_BLOCK = 1 << 20

_orjson_loads = orjson.loads

__all__ = ["CORE_TYPES", "Parking", "SessionFile", "file_header", "gc_paused", "read_if_stream", "read_session", "read_session_bytes", "split_lines", "verify_bytes", "verify_file", "verify_lines"]



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
        """True when every line verified and nothing was cut short (a header alone
        included: a session just created, which the ``empty`` note remarks on)."""
        return not self.problems and self.truncated is None

    def raise_for_problems(self) -> None:
        """Raise :class:`SessionFormatError` unless the file read clean."""
        problems = self.all_problems()
        if problems:
            raise SessionFormatError(self.source, problems)

    def resolve(self, name: str, *, where: str | None = None) -> Entry:
        """The entry ``name`` names: a full id, a ``legacy_id``, or a unique prefix of 4+
        hex digits, by the one rule (:func:`~agentsession_cas.format.names.resolve_entry_name`,
        whose errors name ``where``: by default the file's source)."""
        tree = self.tree
        entries = self.entries
        entry_id = resolve_entry_name(
            name,
            held=tree.__contains__,
            ids=lambda: (e.id for e in entries),
            legacy=lambda: ((e.legacy_id, e.id) for e in entries if e.legacy_id is not None),
            where=self.source if where is None else where,
        )
        return tree.by_id[entry_id]

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


def read_session(path: str | os.PathLike, *, keep_objects: bool = False, progress: Progress | None = None) -> SessionFile:
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
    return read_session_bytes(data, source=name, keep_objects=keep_objects, progress=progress)


def _ends_with_lf(data: bytes) -> Callable[[], bool]:
    """Whether the last line of ``data`` was terminated, as :class:`_Reader` asks it."""
    terminated = data.endswith(b"\n")
    return lambda: terminated


def read_session_bytes(
    data: bytes, *, source: str = "<bytes>", keep_objects: bool = False, progress: Progress | None = None
) -> SessionFile:
    """Read and check a session held in memory (see :func:`read_session`).

    ``keep_objects`` keeps each entry's two objects (content and envelope bytes,
    computed anyway to check its hashes) on ``Entry.objects``, for an import that
    writes them next; it costs their size in memory. ``progress(lines, total)`` is
    called as the entry lines are read (:mod:`agentsession_cas.progress`)."""
    lines = split_lines(data)
    if not lines:
        raise SessionFormatError(source, [problem(1, "header", "the file is empty: no header")])
    header = read_header(lines[0], source)
    with gc_paused():
        return _Reader(source, header, reported(lines[1:], len(lines) - 1, progress), keep_objects=keep_objects,
                       terminated=_ends_with_lf(data)).run()


def read_if_stream(path: str | os.PathLike) -> bytes | None:
    """The whole of ``path`` when it is no regular file (a pipe, as ``<(zcat f.gz)`` gives,
    a FIFO, a device), else None. Such a file is read once, as standard input is: a second
    open of a FIFO waits for a writer that never comes, and of a pipe finds nothing, and a
    line cannot be read again from either; so a caller that would open the file twice
    (an import reads its header first) takes its bytes instead."""
    name = _session_file(path)
    with open(name, "rb") as f:
        return None if _seekable(f) else f.read()


def _seekable(f: BinaryIO) -> bool:
    """Whether ``f`` is a regular file, whose lines can be read again where they lie."""
    return stat.S_ISREG(os.fstat(f.fileno()).st_mode)


def file_header(path: str | os.PathLike) -> Header:
    """The header of the session file at ``path`` (its first line, checked), the rest
    unread. Raises as :func:`read_session` does for a file with no usable header."""
    name = _session_file(path)
    with open(name, "rb") as f:
        return _first_line(f, name)[1]


def _session_file(path: str | os.PathLike) -> str:
    name = os.fspath(path)
    if os.path.isdir(name):
        raise IsADirectoryError(21, "is a directory, not a session file", name)
    return name


def _first_line(f: BinaryIO, name: str) -> tuple[bytes, Header]:
    """The file's first line as read (its LF kept) and the header it holds, checked."""
    first = f.readline()
    if not first:
        raise SessionFormatError(name, [problem(1, "header", "the file is empty: no header")])
    return first, read_header(first[:-1] if first.endswith(b"\n") else first, name)


def verify_file(
    path: str | os.PathLike, *, on_entry: Callable[[Entry], None] | None = None, progress: Progress | None = None,
    processes: bool | None = None, on_ready: Callable[[list[parallel.Ready]], None] | None = None,
    objects: bool = True, paths: bool = True, sidecars: bool = True,
) -> VerifyReport:
    """What ``agentsession verify FILE`` reports (:func:`~agentsession_cas.format.rules.verify_session`
    of the file as read), in one pass over the file read line by line: each line through
    the line and tree rules, then at once through the record and context rules, its
    item's canonical bytes made once for both its id and the request hashes. What it holds
    is not the file nor its entries, but the entries on the path the checker stands on
    (what the context algorithm holds), each entry's line number, and the session-wide
    facts of the rules (call ids, problems); an entry of a branch the checker left is
    read again from the file when the file's order comes back to it.

    ``on_entry`` is given each entry the line and tree rules accepted, in file order, with
    its two objects (``Entry.objects``, dropped once it returns): what a streamed import
    writes (``objects=False``: a caller that reads the entries alone, ``show``, does not
    have the helper process make them). A file of a format before 0.5 is read whole
    (migration assigns ids as it goes), and then ``on_entry`` is refused.

    Raises ``OSError`` when the file cannot be read and :class:`SessionFormatError` when
    its first line is no usable header. ``progress(bytes read, file size)`` is called as
    the file is read (:mod:`agentsession_cas.progress`).

    ``processes``: whether the line rules run in a helper process, on another core, as
    this one runs the rest (:mod:`~agentsession_cas.format.parallel`; the report is the
    same either way): True or False as said, None (the default) as
    :func:`~agentsession_cas.format.parallel.wanted` decides (a large file, two cores,
    ``AGENTSESSION_VERIFY_PROCESSES`` not ``1``). ``on_ready``, with ``on_entry``: the
    helper makes the entries' objects into compressed pack blocks for the file backend,
    given to ``on_ready`` (each such entry's ``Entry.objects`` is then
    :data:`~agentsession_cas.format.parallel.PACKED`): the compression is done on the
    other core too.

    ``paths=False`` applies the line and tree rules alone, not the record and context
    rules along each path (the report's record and context parts are then empty): for a
    caller that reports no other, ``show FILE``'s listing.

    ``sidecars``: a ``media: sidecar`` session's blobs, each read from the directory
    beside the file and verified against its name (:func:`~.media.check_sidecars`;
    ``missing-blob``, ``blob-hash``), once the lines are read. An import passes False: it
    reads them itself, to store them, by the same check."""
    name = _session_file(path)
    with open(name, "rb") as f:
        first, header = _first_line(f, name)
        if header.is_legacy:  # migration assigns ids as it goes: entries are kept, not read again
            if on_entry is not None:
                raise ValueError("a file before format 0.5 is migrated whole: it is not streamed")
            return verify_bytes(first + f.read(), source=name, progress=progress,
                                sidecars=sidecar_dir(name, str(header.id)) if sidecars else None)
        if not _seekable(f):  # a pipe or a FIFO: no line can be read again from it, so it is held
            # (its blobs are checked where a directory of them lies beside it, a FIFO's; a
            # pipe, /dev/fd/N, has none: its media is unchecked, as standard input's is)
            beside = sidecar_dir(name, str(header.id)) if sidecars else None
            return verify_bytes(first + f.read(), source=name, progress=progress, on_entry=on_entry,
                                sidecars=beside if beside is not None and os.path.isdir(beside) else None)
        named = SidecarNames() if sidecars and header.media == "sidecar" else None
        starts = array("q")  # each line's offset and length, to read it again
        sizes = array("q")
        # A line read again must be the line checked: its members must hash to the id it was
        # checked under (the entry's computed id; an id the line states wrongly is mapped
        # here to the one its members gave, by the reader, which reports it).
        misstated: dict[str, str] = {}
        fd = f.fileno()
        size = os.fstat(fd).st_size
        ending = [True]  # whether the file ends with LF (known once the blocks are read)

        def blocks() -> Iterator[tuple[bytes, list[bytes]]]:
            # Read in blocks and split: per line, only C (the split, lengths, offsets).
            # Each block comes whole (its lines joined, for the helper) and split. The file
            # is read into one buffer, kept (a fresh one a block, as each was read, then cut
            # and joined, cost the pass two more copies and their memory's page faults);
            # the line begun at its end is moved to its start.
            pos = len(first)
            buf = bytearray(2 * _BLOCK)
            have = 0  # the bytes of the line begun at the end of the blocks read so far
            while True:
                if len(buf) < have + _BLOCK:  # (a line longer than the buffer holds)
                    buf.extend(bytes(have + _BLOCK - len(buf)))
                got = f.readinto(memoryview(buf)[have : have + _BLOCK])
                if not got:
                    break
                end = have + got
                cut = buf.rfind(b"\n", 0, end)
                if cut < 0:
                    have = end
                    continue
                joined = bytes(memoryview(buf)[:cut])
                parts = joined.split(b"\n")
                buf[: end - cut - 1] = buf[cut + 1 : end]  # (a copy first: the two may overlap)
                have = end - cut - 1
                if named is not None:
                    named.add_block(joined, parts, len(sizes) + 2)
                lengths = list(map(len, parts))
                sizes.extend(lengths)
                offsets = list(accumulate([n + 1 for n in lengths], initial=pos))
                pos = offsets.pop()
                starts.extend(offsets)
                if progress is not None:
                    progress(pos, max(size, pos))
                yield joined, parts
                del parts, joined
            last = bytes(memoryview(buf)[:have])
            del buf
            if last:  # the last line, with no LF after it
                ending[0] = False
                if named is not None:
                    named.add(last, len(sizes) + 2)
                starts.append(pos)
                sizes.append(len(last))
                pos += len(last)
                yield last, [last]
            if progress is not None:
                progress(pos, max(size, pos))

        where: dict[str, int] = {}

        def changed(i: int) -> SessionFormatError:
            return SessionFormatError(name, [problem(i + 2, "entry", "the line changed while it was verified")])

        def line_at(i: int) -> bytes:
            # The file is reopened once the pass is over (a report's entries may be asked after it).
            if f.closed:
                with open(name, "rb") as reopened:
                    return os.pread(reopened.fileno(), sizes[i], starts[i])
            return os.pread(fd, sizes[i], starts[i])

        def load(entry_id: str) -> Entry:
            i = where[entry_id] - 2
            obj, careful = loads_flagged(line_at(i).decode("utf-8"))
            entry, _ = check_line(obj, line=i + 2, careful=careful, keep_objects=True)
            if entry is None or entry.id != entry_id or entry.computed_id != misstated.get(entry_id, entry_id):
                raise changed(i)  # the file changed under the verify
            entry.objects = None
            return entry

        def wake(entry: Entry) -> dict[str, Any]:
            # A parked entry's object, read again. The line must still claim the id it
            # was checked under.
            assert entry.line is not None
            i = entry.line - 2
            raw = line_at(i)
            try:
                obj, careful = loads_flagged(raw.decode("utf-8"))
                computed = entry_hashes(obj, parsed=True, careful=careful)[0] if isinstance(obj, dict) else None
            except (ValueError, AgentSessionError):
                obj = computed = None
            stated = obj.get("id") if isinstance(obj, dict) else None
            if computed != entry.computed_id or (stated if isinstance(stated, str) else computed) != entry.id:
                raise changed(i)
            assert isinstance(obj, dict)
            return obj

        checker = PathChecker(header, loader=load)

        def media() -> list[Problem]:
            return [] if named is None else check_sidecars(sidecar_dir(name, str(header.id)), named.first)

        if not parallel.wanted(size, processes):
            lines = chain.from_iterable(parts for _, parts in blocks())
            return _verify(name, header, lines, checker, where, on_entry, Parking(wake), misstated, paths=paths,
                           terminated=lambda: ending[0], media=media)
        with parallel.LineHelper(objects=on_entry is not None and objects,
                                 on_ready=on_ready if on_entry is not None else None) as helper:
            return _verify(name, header, helper.lines(blocks()), checker, where, on_entry, Parking(wake), misstated,
                           helper.known, paths=paths, terminated=lambda: ending[0], media=media)


def verify_bytes(
    data: bytes, *, source: str = "<bytes>", progress: Progress | None = None, on_entry: Callable[[Entry], None] | None = None,
    sidecars: str | None = None,
) -> VerifyReport:
    """:func:`verify_file` of a session held in memory (standard input, say): the entries
    are kept, since there is no file to read one again from. ``progress(lines, total)``;
    ``on_entry`` as :func:`verify_file`'s (a file before format 0.5 too: it is migrated here).
    A ``media: sidecar`` session's blobs are checked in the directory ``sidecars`` (a
    file's, read whole); with none, a stream's, they are noted as not checked
    (``media-unchecked``)."""
    lines = split_lines(data)
    if not lines:
        raise SessionFormatError(source, [problem(1, "header", "the file is empty: no header")])
    header = read_header(lines[0], source)

    def media() -> list[Problem]:
        if header.media != "sidecar":
            return []
        named = SidecarNames()
        for i, raw in enumerate(lines[1:]):
            named.add(raw, i + 2)
        if sidecars is not None:
            return check_sidecars(sidecars, named.first)
        if not named.first:
            return []
        return [problem(None, "media-unchecked", f"the {len(named.first)} sidecar blob(s) its items name were not "
                        f"checked: {source} is no file, with no sidecar directory beside it")]

    return _verify(source, header, reported(lines[1:], len(lines) - 1, progress), PathChecker(header), None, on_entry,
                   terminated=_ends_with_lf(data), media=media)


def verify_lines(
    lines: Iterable[bytes], *, source: str, loader: Callable[[str], Entry] | None = None,
    progress: Progress | None = None, total: int = 0, processes: bool | None = False,
    on_entry: Callable[[Entry], None] | None = None, known: deque[parallel.Known] | None = None,
) -> VerifyReport:
    """:func:`verify_file` of a session given as its lines as they come (the header's
    first, each with or without its LF: a stored session's projection, say). ``loader``
    gives an entry again by id when the checker goes back to a branch it left (its line
    number is set here), so the entries are not held; without one they are.
    ``progress(lines, total)`` is called as they come (``total`` an estimate);
    ``on_entry`` as :func:`verify_file`'s.
    ``processes``, with a ``loader``: whether the line rules run in a helper process,
    as :func:`verify_file`'s do (the report is the same either way); None decides by
    :func:`~agentsession_cas.format.parallel.wanted` on the bytes of the first lines
    (up to :data:`~agentsession_cas.format.parallel.MIN_BYTES`); False, the default,
    keeps one process. ``known``, with a ``loader``: the answers of a helper the caller
    runs, one an entry line as it comes (``LineHelper.built``: it makes the lines too);
    ``processes`` is then not asked."""
    it = iter(reported(lines, total + 1, progress))
    first = next(it, None)
    if first is None:
        raise SessionFormatError(source, [problem(1, "header", "the file is empty: no header")])
    header = read_header(first[:-1] if first.endswith(b"\n") else first, source)
    if header.is_legacy:
        loader = None  # migration assigns ids as it goes: nothing to load them by
    where: dict[str, int] | None = {} if loader is not None else None

    def load(entry_id: str) -> Entry:
        assert loader is not None and where is not None
        entry = loader(entry_id)
        entry.line = where[entry_id]
        return entry

    ending = [first.endswith(b"\n")]  # whether the last line came with its LF

    def stripped() -> Iterator[bytes]:
        for raw in it:
            ending[0] = raw.endswith(b"\n")
            yield raw[:-1] if ending[0] else raw

    def terminated() -> bool:
        return ending[0]

    entries: Iterable[bytes] = stripped()
    if loader is None:
        return _verify(source, header, entries, PathChecker(header), where, on_entry, terminated=terminated)

    def wake(entry: Entry) -> dict[str, Any]:
        assert loader is not None
        return loader(entry.id).data  # the loader's own checks (a store's: every object read verified)

    checker = PathChecker(header, loader=load)
    if known is not None or processes is False or header.is_legacy:
        return _verify(source, header, entries, checker, where, on_entry, Parking(wake), None, known,
                       terminated=terminated)
    blocks = _blocks_of(entries)
    opening: list[tuple[bytes, list[bytes]]] = []
    size = 0
    for block in blocks:  # enough lines to judge by, as a file's size is judged
        opening.append(block)
        size += len(block[0])
        if size >= parallel.MIN_BYTES:
            break
    if not parallel.wanted(size, processes):
        return _verify(source, header, chain.from_iterable(parts for _, parts in chain(opening, blocks)), checker, where,
                       on_entry, Parking(wake), terminated=terminated)
    with parallel.LineHelper() as helper:
        return _verify(source, header, helper.lines(chain(opening, blocks)), checker, where, on_entry, Parking(wake),
                       None, helper.known, terminated=terminated)


def _blocks_of(lines: Iterable[bytes]) -> Iterator[tuple[bytes, list[bytes]]]:
    """Lines (without their LF) in blocks of about :data:`_BLOCK` bytes, each whole (joined
    by LF) and as its lines: what a helper process is given (``LineHelper.lines``)."""
    parts: list[bytes] = []
    held = 0
    for line in lines:
        parts.append(line)
        held += len(line) + 1
        if held >= _BLOCK:
            yield b"\n".join(parts), parts
            parts, held = [], 0
    if parts:
        yield b"\n".join(parts), parts


class Parking:
    """What a one-pass verify keeps of the entries on its path: the last few whole (at
    most :attr:`WINDOW` entries and :attr:`WINDOW_BYTES` of their lines: a response's
    outputs, the entries just before it, are read back at once), older ones parked
    (:meth:`Entry.park`: their objects dropped, read again from the file if a rule
    consults them: a compaction's kept range, a request rebuilt under new settings), so
    what the pass holds grows by an id and a line number per entry, not by the entries.
    An entry woken is parked again once the entry being added is in."""

    WINDOW = 64
    WINDOW_BYTES = 1 << 20

    def __init__(self, wake: Callable[[Entry], dict[str, Any]]):
        self._recent: deque[tuple[Entry, int]] = deque()
        self._bytes = 0
        # (not a closure over self: parked entries hold the wake, and a cycle through them
        # would outlive a pass run with the collector paused)
        self._woken: list[Entry] = []
        woken = self._woken

        def counted(entry: Entry) -> dict[str, Any]:
            woken.append(entry)
            return wake(entry)

        self._wake = counted

    def settle(self, entry: Entry, n: int = 0) -> None:
        """``entry`` was added (``n``: the length of its line, which the window's bytes
        count): park what fell out of the window, and what woke meanwhile."""
        recent = self._recent
        recent.append((entry, n))
        self._bytes += n
        while len(recent) > self.WINDOW or (self._bytes > self.WINDOW_BYTES and recent):
            old, n = recent.popleft()
            self._bytes -= n
            old.park(self._wake)
        if self._woken:
            self.tidy()

    def tidy(self) -> None:
        """Park again what woke since the last call (what a rule, or a caller printing
        the entries' items, read back)."""
        if self._woken:
            for e in self._woken:
                if not e.parked:
                    e.park(self._wake)
            self._woken.clear()


def _verify(
    source: str, header: Header, lines: Iterable[bytes], checker: PathChecker, where: dict[str, int] | None,
    on_entry: Callable[[Entry], None] | None = None, parking: Parking | None = None,
    misstated: dict[str, str] | None = None, known: deque[parallel.Known] | None = None, *, paths: bool = True,
    terminated: Callable[[], bool], media: Callable[[], list[Problem]] | None = None,
) -> VerifyReport:
    """The pass of a streamed verify; ``paths=False``: ``checker`` is fed nothing (:func:`verify_file`'s).
    ``media``: the sidecar blobs' problems (and note), asked once the lines are read."""
    with gc_paused():
        reader = _Reader(source, header, lines, checker=checker if paths else None, keep_entries=False, where=where,
                         on_entry=on_entry, parking=parking, misstated=misstated, known=known, terminated=terminated)
        sf = reader.run()
        checker.finish()
    found = media() if media is not None else []
    read = sf.all_problems() + [p for p in found if p.severity == "error"]
    unresolved = sf.unresolved + [p for p in found if p.severity != "error"]
    report = verify_report(source, header, reader.count, sf.migrated, read, unresolved, checker, reader.links)
    if parking is not None:
        report._tidy = parking.tidy
    return report


class _Reader:
    """One pass over a file's lines: the line rules of each, then the tree rules; and, for
    a streamed verify, the record and context rules of each entry as it is accepted
    (``checker``), the entries not kept (``keep_entries=False``)."""

    def __init__(
        self,
        source: str,
        header: Header,
        lines: Iterable[bytes],
        *,
        keep_objects: bool = False,
        checker: PathChecker | None = None,
        keep_entries: bool = True,
        terminated: Callable[[], bool],
        where: dict[str, int] | None = None,
        on_entry: Callable[[Entry], None] | None = None,
        parking: Parking | None = None,
        misstated: dict[str, str] | None = None,
        known: deque[parallel.Known] | None = None,
    ):
        self.parking = parking
        #: What a helper process found of each line, taken one a line (see parallel.LineHelper).
        self.known = known
        #: id -> computed id of each entry held under an id its members do not hash to.
        self.misstated = misstated if misstated is not None else {}
        self.keep_objects = keep_objects
        self.on_entry = on_entry
        self.source = source
        self.header = header
        self.lines = lines  # the entry lines, the header's excluded
        #: Whether the file's last line ended with LF, asked once the lines are all read:
        #: only a last line without one is worded as cut short.
        self.terminated = terminated
        self.entries: list[Entry] = []
        self.count = 0
        self.problems: list[Problem] = []
        self.truncated: Problem | None = None
        self.unresolved: list[Problem] = []
        # entry id -> its line, for a checker that loads entries again (see verify_file):
        # the ids the tree holds, with the lines they were read from
        self.tree = TreeState(header, held=where)
        self.checker = checker
        self.keep_entries = keep_entries
        #: The own ``link`` entries (after the base), kept when the entries are not.
        self.links: list[Entry] = []

    def parsed_objects(self) -> Iterator[tuple[int, dict, bool, bytes | None, int, Entry | None]]:
        """Parse every entry line, reporting those that do not parse (the last line of the
        file may be cut short: one line is read ahead to know which is last). Each comes
        with its bytes when they are proven its canonical form (else None), its length,
        and its entry when a helper process checked the line and found it clean (else
        None: the line rules are to be applied)."""
        it = iter(self.lines)
        raw = next(it, None)
        lineno = 1
        known = self.known
        while raw is not None:
            lineno += 1
            if known is not None:
                k = known.popleft()  # (before the next line is read: its block's answers follow)
                if k is not None:
                    chash, start, end, objects = k
                    obj = _orjson_loads(raw)
                    entry = clean_entry(obj, chash, line=lineno, item_bytes=raw[start:end] if end else None, objects=objects)
                    yield lineno, obj, False, raw, len(raw), entry
                    raw = next(it, None)
                    continue
            following = next(it, None)
            # parse_line's work, with its fast path: a bulk read calls it per line
            try:
                obj, careful, canonical = loads_canonical(raw)
            except ValueError as exc:  # IJSONError, JSONDecodeError, UnicodeDecodeError
                self._failed(raw, exc, lineno, following is None)
                raw = following
                continue
            if obj.__class__ is not dict:
                self._failed(raw, None, lineno, following is None)
                raw = following
                continue
            yield lineno, obj, careful, raw if canonical else None, len(raw), None
            raw = following

    def _failed(self, raw: bytes, exc: Exception | None, lineno: int, last: bool) -> None:
        found, claims = line_failure(raw, exc, line=lineno, last=last, terminated=last and self.terminated())
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
        checker = self.checker
        # A streamed verify shares the item's canonical bytes between the id check and the
        # request hashes (the context builder takes them): hashed once, not kept after.
        keep = self.keep_objects or (checker is not None and not migrated) or self.on_entry is not None
        on_entry = self.on_entry
        misstated = self.misstated
        parking = self.parking if checker is not None and not migrated else None
        base = self.header.base
        on_prefix = base is not None
        keep_entries = self.keep_entries
        drop_objects = checker is not None and not self.keep_objects
        add = tree.add
        count = 0
        for lineno, obj, careful, raw, size, entry in objects:
            if entry is None:
                entry, found = check_line(obj, line=lineno, careful=careful, keep_objects=keep, migrated=migrated, raw=raw)
            else:
                found = []
            if found:
                problems.extend(found)
                for claim in unloaded_claims(obj, entry):
                    tree.mark_broken(claim)
            if entry is None:
                continue
            eid = entry.id
            if eid in held:
                problems.extend(add(entry))  # the same entry again: reported, not loaded
                continue
            if found and eid != entry.computed_id:
                misstated[eid] = entry.computed_id
            found = add(entry)
            if found:
                problems.extend(found)
            count += 1
            if keep_entries:
                entries.append(entry)
            elif not on_prefix and obj.get("type") == "link":
                self.links.append(entry)
            if on_entry is not None:
                on_entry(entry)
            if checker is not None:
                if drop_objects:
                    entry.objects = None
                checker.add(entry, prefix=on_prefix)  # as PathChecker.add_all feeds a file
                if parking is not None:
                    parking.settle(entry, size)
            if eid == base:
                on_prefix = False
        self.count = count
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

    def _migrated(
        self, objects: Iterator[tuple[int, dict, bool, bytes | None, int, Entry | None]]
    ) -> Iterator[tuple[int, dict, bool, bytes | None, int, Entry | None]]:
        assigned: dict[str, str] = {}
        for lineno, obj, careful, _, size, _ in objects:
            new, notes = migrate_entry(obj, lineno, assigned, self.header.id)
            self.unresolved.extend(notes)
            old = obj.get("id")
            if isinstance(old, str) and "id" in new:
                assigned.setdefault(old, new["id"])
            yield lineno, new, careful, None, size, None  # a migrated object is not its line
