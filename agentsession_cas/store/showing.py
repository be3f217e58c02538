"""What ``show`` reads of a session, read once as it comes (issue 11: show in bounded memory).

A session file, standard input or a stored session's projection is verified as ``verify``
verifies it (:func:`~agentsession_cas.format.reader.verify_file`, ``verify_bytes``,
``verify_lines``: every rule, in one pass, the entries parked as the pass leaves them), and
each entry the line and tree rules accept is handed, as it is read, to what ``show`` makes
of it: its place in an outline (:class:`~agentsession_cas.store.session.ProjectionOutline`:
ids, parents, types, labels, the contents they name), its context hash, a caller's hook (a
``--json`` row written at once). What is held is then per entry an id, a parent's place, a
type, a line number and a context hash, not the entry: the rest (the leaf, its path, the
context and the runs there) is asked of the verify's report afterwards, which reads the
path's entries again, parked as it goes. No printing here: ``show`` prints.
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, cast

from ..errors import Problem
from ..format.canonical import loads_canonical, loads_flagged
from ..format.codes import RULES
from ..format.context import ContextHasher
from ..format.entry import Entry, Header
from ..format.hashing import HASH_PREFIX
from ..format.links import CalleeLink, callees, judges
from ..format.reader import Parking, SessionFile, file_header, read_if_stream, verify_bytes, verify_file, verify_lines
from ..format.results import RunsReport, VerifyReport
from ..format.rules import PathChecker, read_header
from ..format.runs import Inbox
from ..progress import Progress
from .session import ProjectionOutline

if TYPE_CHECKING:
    from .session import Session

__all__ = ["ShowRead", "PathWalk", "read_file", "read_bytes", "read_stored", "path_links"]


class ShowRead:
    """A session read once for ``show``: its outline, each entry's line and context hash,
    and the verify's report (the problems the read found, the checker that walks a path
    again). :meth:`entries` reads entries again for a listing, in order."""

    def __init__(self, source: str, header: Header, *, hashes: bool, keep: bool) -> None:
        self.source, self.header = source, header
        #: What an entry name that names nothing was looked for in (errors say it): the
        #: source, or ``session ID`` for a stored one, as the store's names say it.
        self.where = source
        self.outline = ProjectionOutline()
        #: Each entry's line in the file (its position's).
        self.lines = array("q")
        #: The context hash at every entry, fed as read (when asked for: ``--json``).
        self.hashes: ContextHasher | None = ContextHasher() if hashes else None
        #: A migrated entry's ``legacy_id``, by position (what ``--leaf`` may name).
        self.legacy: dict[int, str] = {}
        #: The entries as read, for a source with nothing to read them again from.
        self.kept: list[Entry] | None = [] if keep else None
        self.last: Entry | None = None
        #: A file's size, time and inode as the read began (the file read again must be that one).
        self.stat: tuple[int, int, int] | None = None
        self.report: VerifyReport | None = None
        #: The entries read and not yet placed in the outline: ids, (content, parent, ts, type), parents, labels.
        self._chunk: tuple[list[str], list[tuple[str, str, Any, str]], dict[int, Any], dict[int, Mapping[str, Any]]] = (
            [], [], {}, {})
        self._reread: Callable[[Iterable[int]], Iterator[tuple[int, Entry]]] | None = None
        self._along: Callable[[list[int]], Iterator[Entry]] | None = None
        self._wake: Callable[[Entry], dict[str, Any]] | None = None
        #: Where a listing read each entry of a file (its line's offset and length), to read it again.
        self._at = array("q")
        self._size = array("q")

    # -- the pass --------------------------------------------------------------------

    def add(self, e: Entry) -> str | None:
        """One entry as read: placed in the outline; returns its context hash (None when
        its path is cut, or when hashes are not asked for)."""
        data = e.data
        t = data.get("type")
        chunk = self._chunk
        at = len(chunk[0])
        chunk[0].append(e.id)
        parent = data.get("parent")
        chunk[1].append((e.content_hash, parent if isinstance(parent, str) else "", "", t if isinstance(t, str) else ""))
        if t == "label":
            chunk[3][at] = {k: data[k] for k in ("label", "target") if k in data}
        if "parents" in data:
            chunk[2][at] = data["parents"]
        if at + 1 == _CHUNK:
            self._place()
        assert e.line is not None
        self.lines.append(e.line)
        legacy = e.legacy_id
        if legacy is not None:
            self.legacy[len(self.lines) - 1] = legacy
        if self.kept is not None:
            self.kept.append(e)
        self.last = e
        return self.hashes.take(e) if self.hashes is not None else None

    def _place(self) -> None:
        """Place the entries read since the last call in the outline (a chunk at a time:
        :meth:`ProjectionOutline.extend`)."""
        ids, members, parents, labels = self._chunk
        if ids:
            self.outline.extend(ids, members, parents, labels)
            self._chunk = ([], [], {}, {})

    def finish(self, report: VerifyReport) -> None:
        """The pass is over: what it found, and the last entries placed."""
        self._place()
        self.report = report
        #: What reading the lines found (the line and tree rules: ``SessionFile.problems``),
        #: the truncation aside; not what the record and context rules found.
        self.problems: list[Problem] = [
            p for p in report.problems if RULES[p.code].scope in ("line", "tree") and p.code not in ("truncated", "empty")]
        self.truncated: Problem | None = next((p for p in report.problems if p.code == "truncated"), None)
        #: The session's own ``link`` entries.
        self.links: list[Entry] = report.links

    # -- what the read found ---------------------------------------------------------

    @property
    def migrated(self) -> bool:
        return self.header.is_legacy

    def _verified(self) -> VerifyReport:
        assert self.report is not None, "the session was not read yet"
        return self.report

    def release(self) -> None:
        """Let the verify's report go (its checker's facts of every entry: most of what the
        read holds) once what is printed of it was taken: the problems, the truncation,
        the own links. Entries are read again from the file or the store then
        (:meth:`listing_parking`), not through it; a runs report needs it kept."""
        self.report = None

    def listing_parking(self) -> Parking:
        """The parking of a listing's entries, read again by themselves (not through the
        verify's report: :meth:`release`): from the store, from the file at the place the
        listing read it, or held."""
        if self.kept is not None:
            return _Holding()
        assert self._wake is not None
        return Parking(self._wake)

    def leaf(self, name: str | None = None) -> str | None:
        """The entry ``name`` names (a full id, a legacy id, a unique hex prefix), or
        without one the leaf the resume rule gives: both asked of the session as a file of
        stubs (:meth:`stub_file`), where those rules are."""
        if name:
            return self.stub_file().resolve(name, where=self.where).id
        # The resume rule reads the labels and, when the session holds none, the last
        # entry alone: then that one is the file.
        return self.stub_file(whole=bool(self.outline.label_members)).leaf

    def stub_file(self, whole: bool = True) -> SessionFile:
        """The session as a file of stubs (each entry's id, parent, type, a label's members,
        a ``legacy_id``): what the reader's rules over the tree read, for the resume rule
        and the names an entry answers to, kept in one place
        (:class:`~agentsession_cas.format.reader.SessionFile`'s). Not ``whole``: the last
        entry alone."""
        outline, legacy, labels = self.outline, self.legacy, self.outline.label_members
        stubs: list[Entry] = []
        first = 0 if whole else max(len(outline) - 1, 0)
        for pos, (entry_id, t) in enumerate(zip(outline.ids[first:], outline.types[first:]), start=first):
            if pos not in labels and pos not in legacy:
                stubs.append(cast(Entry, _Stub(entry_id, outline.parent(pos), t)))
                continue
            data: dict[str, Any] = dict(labels.get(pos, ()))
            data.update(id=entry_id, parent=outline.parent(pos), type=t)
            if pos in legacy:
                data["legacy_id"] = legacy[pos]
            stubs.append(Entry(data, computed_id=entry_id, content_hash=""))
        return SessionFile(self.source, self.header, stubs)


    def entries(self, positions: Iterable[int]) -> Iterator[tuple[int, Entry]]:
        """The entries at ``positions`` (ascending) read again, each with its position and
        its line: what a listing prints of each."""
        if self.kept is not None:
            for pos in positions:
                yield pos, self.kept[pos]
            return
        assert self._reread is not None
        yield from self._reread(positions)

    def path_entries(self, path: list[int]) -> Iterator[Entry]:
        """The whole entries on a path (positions, root first: ascending), read again in
        order, in bulk: what a runs report walks (:meth:`VerifyReport.runs_report`'s
        ``path``), faster than each entry loaded by id."""
        if self._along is not None:
            yield from self._along(path)
        else:
            for _, e in self.entries(path):
                yield e

    def parking(self) -> Parking:
        """A :class:`~agentsession_cas.format.reader.Parking` whose entries are read again
        as the verify reads one (from the file, or the store), and which parks again, as
        it settles or tidies, what the pass parked and was woken since."""
        if self.kept is not None:
            return _Holding()
        return _Parking(self._verified())


class _Stub:
    """A stub of an entry that is no label and has no ``legacy_id``: all the tree's rules
    and the names an entry answers to read of one (its id, parent and type), without the
    dict of members a stub :class:`Entry` would hold (a third of the size)."""

    __slots__ = ("id", "parent", "type")
    is_leaf_label = False
    legacy_id = None

    def __init__(self, entry_id: str, parent: str | None, type_: str) -> None:
        self.id, self.parent, self.type = entry_id, parent, type_


class _Holding(Parking):
    """The parking of a session whose entries are held (read from memory): nothing is
    parked, there being nowhere to read an entry again from."""

    def __init__(self) -> None:
        super().__init__(lambda e: e.data)

    def settle(self, entry: Entry, n: int = 0) -> None:
        pass

    def tidy(self) -> None:
        pass


class _Parking(Parking):
    """:meth:`ShowRead.parking`'s."""

    def __init__(self, report: VerifyReport) -> None:
        super().__init__(lambda e: report.entry(e.id).data)
        self._report = report

    def settle(self, entry: Entry, n: int = 0) -> None:
        super().settle(entry, n)
        self._report.tidy()

    def tidy(self) -> None:
        super().tidy()
        self._report.tidy()


#: Entries placed in the outline at once.
_CHUNK = 256

#: What is told of each entry as it is read: the entry and its context hash (None: its path is cut, or not asked).
OnEntry = Callable[[Entry, "str | None"], None]


def read_file(path: str, *, hashes: bool = False, on_start: Callable[[Header], None] | None = None,
              on_entry: OnEntry | None = None, progress: Progress | None = None, paths: bool = True) -> ShowRead:
    """A session file read for ``show``, as ``verify FILE`` reads it: ``on_start(header)``
    once its header is read, then ``on_entry`` of each entry as it is read. A file of a
    format before 0.5 is migrated whole, as any reader does, and its entries kept.
    ``paths=False``: the line and tree rules alone (``verify_file``'s), for a mode that
    prints no other (the listing, the graph): the report then holds no record fact."""
    held = read_if_stream(path)  # a pipe or a FIFO: read once, whole, as standard input is
    if held is not None:
        return read_bytes(held, source=path, hashes=hashes, on_start=on_start, on_entry=on_entry, progress=progress)
    header = file_header(path)
    if header.is_legacy:
        with open(path, "rb") as f:
            return read_bytes(f.read(), source=path, hashes=hashes, on_start=on_start, on_entry=on_entry, progress=progress)
    if on_start is not None:
        on_start(header)
    read = ShowRead(path, header, hashes=hashes, keep=False)
    read.stat = _stat(path)
    read.finish(verify_file(path, on_entry=_hook(read, on_entry), progress=progress, objects=False, paths=paths,
                            sidecars=False))  # (a view reports the line and tree rules alone)
    read._reread = lambda positions: _lines_again(path, read, positions)
    read._wake = lambda e: _line_again(path, read, e)
    return read


def read_bytes(data: bytes, *, source: str, hashes: bool = False, on_start: Callable[[Header], None] | None = None,
               on_entry: OnEntry | None = None, progress: Progress | None = None) -> ShowRead:
    """:func:`read_file` of a session held in memory (standard input): its entries are kept."""
    if not data:
        verify_bytes(data, source=source)  # (raises: no header)
    header = read_header(data.split(b"\n", 1)[0], source)
    if on_start is not None:
        on_start(header)
    read = ShowRead(source, header, hashes=hashes, keep=True)
    read.finish(verify_bytes(data, source=source, on_entry=_hook(read, on_entry), progress=progress))
    return read


def read_stored(session: Session, *, source: str, hashes: bool = False, on_start: Callable[[Header], None] | None = None,
                on_entry: OnEntry | None = None, progress: Progress | None = None) -> ShowRead:
    """:func:`read_file` of a stored session's projection, as ``verify ID`` reads it (each
    entry the checker goes back to read again from the store). The outline names each
    entry's content, and its synthetic ``leaf`` marker when it ends with one, so a listing
    reads the contents again in bulk
    (:func:`~agentsession_cas.store.views.listing_entries`)."""
    from .views import listing_entries

    if on_start is not None:
        on_start(session.header)
    read = ShowRead(source, session.header, hashes=hashes, keep=False)
    read.where = f"session {session.id}"
    read.finish(verify_lines(session.projection_lines(), source=source, loader=session.store.entry, progress=progress,
                             total=len(session.prefix) + len(session), on_entry=_hook(read, on_entry)))
    outline = read.outline
    if len(outline) > len(session.prefix) + len(session.state.log_order) and read.last is not None:
        outline.marker = read.last  # no store holds it: the projection made it
    read._reread = lambda positions: listing_entries(session, outline, positions)
    read._along = lambda path: _stored_path(session, read, path)
    store = session.store
    read._wake = lambda e: store.entry(e.id).data
    return read


def _hook(read: ShowRead, then: OnEntry | None) -> Callable[[Entry], None]:
    def added(e: Entry) -> None:
        chash = read.add(e)
        if then is not None:
            then(e, chash)

    return added


def _lines_again(path: str, read: ShowRead, positions: Iterable[int]) -> Iterator[tuple[int, Entry]]:
    """The file's entries at ``positions`` (ascending), each parsed again from its line:
    the file is read in order, the lines between skipped unparsed."""
    want = iter(positions)
    pos = next(want, None)
    if pos is None:
        return
    lines, ids, outline = read.lines, read.outline.ids, read.outline
    # A line is not hashed again: the file is the one read, as its size and time say
    # before and after (one read as it is written to is refused, as a verify refuses it).
    changed = OSError(f"{path}: the file changed while it was shown")
    if _stat(path) != read.stat:
        raise changed
    if len(read._at) != len(ids):
        read._at = array("q", bytes(8 * len(ids)))
        read._size = array("q", bytes(8 * len(ids)))
    at = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            start, at = at, at + len(raw)
            if lineno != lines[pos]:
                continue
            read._at[pos], read._size[pos] = start, len(raw)
            obj, careful, _ = loads_canonical(raw.rstrip(b"\n"))  # (the strict parse's value and flag, orjson's when proven)
            e = Entry(obj, computed_id=ids[pos], content_hash=outline.content(pos))
            e.careful, e.line = careful, lineno
            yield pos, e
            pos = next(want, None)
            if pos is None:
                break
    if pos is not None or _stat(path) != read.stat:
        raise changed


def _line_again(path: str, read: ShowRead, e: Entry) -> dict[str, Any]:
    """The members of a file's entry a listing read, read again where it read them (the
    file still the one read, the line still the entry's)."""
    pos = read.outline.index[e.id]
    with open(path, "rb") as f:
        if _stat(path) != read.stat:
            raise OSError(f"{path}: the file changed while it was shown")
        raw = os.pread(f.fileno(), read._size[pos], read._at[pos])
    obj = loads_flagged(raw.rstrip(b"\n").decode("utf-8"))[0]
    if not isinstance(obj, dict) or obj.get("id", e.id) != e.id:
        raise OSError(f"{path}: the file changed while it was shown")
    return obj


def _stat(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def _stored_path(session: Session, read: ShowRead, path: list[int]) -> Iterator[Entry]:
    """The entries of a stored session's path, whole, read in bulk (``Store.entries``:
    every object verified), each with its line; the synthetic marker, which no store
    holds, the outline's."""
    outline = read.outline
    ids = outline.ids
    marked = outline.marker is not None and bool(path) and path[-1] == len(ids) - 1
    stored = path[:-1] if marked else path
    for pos, e in zip(stored, session.store.entries([ids[p] for p in stored])):
        e.line = read.lines[pos]
        yield e
    if marked:
        assert outline.marker is not None
        outline.marker.line = read.lines[path[-1]]
        yield outline.marker


class PathWalk:
    """What ``show`` of a stored session makes of the leaf's path (``--runs``, ``--json``)
    in the one walk that reads its entries in projection order, each once: the record
    rules along the path (a :class:`~agentsession_cas.format.rules.PathChecker` pushed the
    path's entries, given the calls and dispatches off it for the session-wide facts
    (:meth:`~agentsession_cas.format.rules.PathChecker.aside`), no request rebuilt:
    ``show`` prints no context rule), whose builder stands at the leaf once the walk is
    over, and the path's links (held only when the path holds a ``link``).

    No verify runs first: the store verified each entry as it took it in (the line, tree
    and record rules refuse there; docs/cli.md says what ``show`` trusts), and each
    object is checked against its name as it is read. The path's entries are parked
    behind the walk and woken, a chunk of the path at a time, from the store
    (:class:`_Ahead`): the context's items are read back in path order at the end."""

    def __init__(self, session: Session, outline: ProjectionOutline, path: list[int]) -> None:
        store = session.store
        self.checker = PathChecker(session.header, loader=store.entry, requests=False)
        self.checker.walker.collect_runs = True
        self.checker.walker.forward_only()  # (the path alone is pushed: nothing is popped)
        #: The context at the leaf, once the walk is over.
        self.builder = self.checker.builder
        self.parking = Parking(_Ahead(session, outline, path))
        self._inbox = Inbox()
        self._prefix = len(session.prefix)
        self._marker = len(outline) - 1 if outline.marker is not None else -1
        self._links = any(outline.types[p] == "link" for p in path)
        self._picked: list[Entry] = []

    def add(self, pos: int, e: Entry, t: str, on_path: bool) -> None:
        """The entry at ``pos`` (its ``line`` set), of type ``t``, as the walk reads it:
        every entry on the path, and off it every call and dispatch (:data:`ASIDE`). Its
        context hash taken first: a path's entry is held without its content hash (a
        text an entry, which nothing after the context hash reads)."""
        prefix = pos < self._prefix
        if not on_path:
            self.checker.aside(e, prefix=prefix)
            self.parking.settle(e)  # (a call is held as the first with its id: parked, as the path's are)
            return
        self.checker.add(e, prefix=prefix)
        e.content_hash = ""
        self._inbox.feed(e)
        if self._links and t in ("item", "dispatch", "link"):
            self._picked.append(e)
        if pos != self._marker:  # (the synthetic marker: no store holds it to wake it from)
            self.parking.settle(e)

    def runs(self, leaf: str | None, source: str) -> RunsReport:
        """The runs report of the path (each call's entry woken as it is described, parked again)."""
        return self.checker.report_here(leaf, self._inbox, source=source, tidy=self.parking.tidy)

    def links(self) -> tuple[list[CalleeLink], list[Entry]]:
        """The callees and the judges on the path (:func:`path_links`'s)."""
        return (callees(self._picked), judges(self._picked)) if self._picked else ([], [])


class OutlineHashes(MutableMapping[str, tuple[str, str, "str | None"]]):
    """What a :class:`~agentsession_cas.format.context.ContextHasher` keeps of each entry
    fed (its context hash, type and parent), kept by the entry's place in an outline of
    the session: the hash's 32 bytes, the type and parent the outline's. A stored
    session's ``show --json`` feeds every entry: a dict of them held a tuple, a text and
    a slot an entry (a sixth of the walk's memory). The last entry fed is kept as fed:
    the parent the next one asks for, most of the time."""

    def __init__(self, outline: ProjectionOutline) -> None:
        self._outline = outline
        self._raw = bytearray(32 * len(outline))
        self._fed = bytearray(len(outline))
        self._count = 0
        self._last: tuple[str | None, tuple[str, str, str | None] | None] = (None, None)

    def _at(self, entry_id: object) -> int | None:
        pos = self._outline.index.get(entry_id) if isinstance(entry_id, str) else None
        return pos if pos is not None and self._fed[pos] else None

    def __contains__(self, entry_id: object) -> bool:
        return entry_id == self._last[0] or self._at(entry_id) is not None

    def __getitem__(self, entry_id: str) -> tuple[str, str, str | None]:
        last_id, last = self._last
        if entry_id == last_id and last is not None:
            return last
        pos = self._at(entry_id)
        if pos is None:
            raise KeyError(entry_id)
        outline = self._outline
        return HASH_PREFIX + self._raw[32 * pos : 32 * pos + 32].hex(), outline.types[pos], outline.parent(pos)

    def __setitem__(self, entry_id: str, value: tuple[str, str, str | None]) -> None:
        pos = self._outline.index[entry_id]
        chash = value[0]
        # (the outline's type and parent are the entry's: the hasher was fed the entry the outline names)
        assert chash.startswith(HASH_PREFIX) and len(chash) == 71, chash
        self._raw[32 * pos : 32 * pos + 32] = bytes.fromhex(chash[7:])
        self._count += not self._fed[pos]
        self._fed[pos] = 1
        self._last = (entry_id, value)

    def __delitem__(self, entry_id: str) -> None:
        raise TypeError("a context hash once fed is kept")

    def __iter__(self) -> Iterator[str]:
        ids = self._outline.ids
        return (ids[pos] for pos, fed in enumerate(self._fed) if fed)

    def __len__(self) -> int:
        return self._count


#: The types of the entries off the path a :class:`PathWalk` is given (the session-wide facts').
ASIDE = frozenset({"item", "dispatch"})


class _Ahead:
    """The wake of a stored session's parked path entries: the one asked for and the next
    ones on the path read together, as a listing reads them
    (:func:`~agentsession_cas.store.views.listing_entries`: the contents alone, in bulk,
    each verified against its name; no ``ts`` nor ``parents``, which nothing reading a
    path's entries back asks for), since they are asked for in path order (the context's
    items, written at the end): a read a chunk of the path, not a lookup an entry. What
    it holds is one chunk's."""

    CHUNK = 256

    def __init__(self, session: Session, outline: ProjectionOutline, path: list[int]) -> None:
        self._session, self._outline, self._path = session, outline, path
        self._stored = len(outline) - 1 if outline.marker is not None else len(outline)  # (the marker is no store's)
        self._ready: dict[str, dict[str, Any]] = {}

    def __call__(self, e: Entry) -> dict[str, Any]:
        from .views import listing_entries

        data = self._ready.pop(e.id, None)
        if data is not None:
            return data
        path, outline = self._path, self._outline
        at = bisect_left(path, outline.index[e.id])
        chunk = [p for p in path[at : at + self.CHUNK] if p < self._stored]
        if not chunk or outline.ids[chunk[0]] != e.id:  # not on the path: read alone
            return self._session.store.entry(e.id).data
        self._ready = {x.id: x.data for _, x in listing_entries(self._session, outline, chunk)}
        return self._ready.pop(e.id)


def path_links(read: ShowRead, path: list[int]) -> tuple[list[CalleeLink], list[Entry]]:
    """The callees and the judges on the path (positions, root first): read only when the
    path holds a ``link`` (callees and judges are links); then its entries of the types
    :func:`~agentsession_cas.format.links.callees` reads (items for the calls, dispatches,
    links), read again, in path order, which is all the order they keep."""
    types = read.outline.types
    if not any(types[p] == "link" for p in path):
        return [], []
    report = read._verified()
    ids = read.outline.ids
    picked = [report.entry(ids[p]) for p in path if types[p] in ("item", "dispatch", "link")]
    return callees(picked), judges(picked)


