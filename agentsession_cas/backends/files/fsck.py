"""fsck of a store directory: walk it all, as ``git fsck --full`` walks a repository.

It reads, and never writes: no lock is taken, no index is refreshed, no
object is restored. It is safe beside writers in other processes: what a
writer in progress (or a crash) can legitimately leave is told apart from
damage, and an object that seems missing is looked up again through the
store (a concurrent pack or merge moves objects) before it is reported.

The walk, in order (``docs/fsck.md`` has the whole list of checks and codes):

1. **packs**: every index opened and checked (magic, layout, checksum,
   sorted names, fan-out, records in range), every pack's checksum and its
   pairing with its index, then every block decompressed once and every
   object in it hashed against its name;
2. **loose objects**: every file of ``objects/<space>/<2 hex>/`` hashed
   against its name; envelopes (``entries``) are parsed as they are hashed;
3. **sessions**: each header, each log's checksums (damage named by line;
   a torn or uncommitted tail is a writer in progress or a crash, not
   damage), every entry the log or the prefix needs present with its
   content, the parent, ``parents``, base and head rules, and ``HEAD`` and
   ``mark`` against the log;
4. **refs**, staged sessions, leftovers, and stray names everywhere;
5. **retention**: objects that no log or prefix retains are counted per
   space (as git counts dangling objects), never reported as errors, by the
   sweep's rule (:class:`~agentsession_cas.maintenance.sweep.Retention`), each
   log folded in as the walk reads it and not kept, its reads of the objects
   answered from what the walk parsed.

Each finding is a :class:`FsckProblem` of severity ``error`` (the store is
damaged: exit 1), ``warning`` (something to look at that loses nothing) or
``note`` (a remark, such as a writer's uncommitted tail).
"""

from __future__ import annotations

import binascii
import bisect
import gc
import hashlib
import itertools
import operator
import os
import re
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any

from ...errors import (
    AgentSessionError,
    BadNameError,
    CorruptObjectError,
    CorruptPackError,
    NoSuchObjectError,
    StoreError,
    store_relative,
)
from ...format.canonical import canonical_bytes, loads
from ...format.entry import LEAF_LABEL, Entry, Header
from ...format.hashing import HASH_PREFIX, is_hash
from ...format.names import check_session_id
from ...format.rules import TreeState
from ...fsutil import ATOMIC_TMP, NotAFileError, has_hole, hash_file, read_dense, read_small, read_whole
from ...lean import dataclass
from ...maintenance.sweep import RawNames, Retention
from ...store.state import index_damage, replay, stale_head
from ..base import COMMIT_POINTS, FsckProblem, FsckReport
from . import FileBackend
from .locks import PACK_LOCK
from .log import Record, header_of, read_log, read_snapshot_ids, scan_log, snapshot_ids_disagree
from .objects import DROPPED_PACK, HASH_FIRST, FileObjects
from .packs import SPACE_BITS, Pack, salvage_pack
from .refs import read_refs_log
from .sessions import HEADER_LIMIT, kept_summary, payload_entry
from .sessions import checkpoint_covers as _checkpoint_covers
from .sweep import SESSION_FILES, retention_source

if TYPE_CHECKING:
    from ...store.store import Store

__all__ = ["fsck_files", "writer_holds"]

_SPACES = ("entries", "contents", "blobs")
_BIT_E, _BIT_C, _BIT_B = SPACE_BITS["entries"], SPACE_BITS["contents"], SPACE_BITS["blobs"]
_ALL_BITS = _BIT_E | _BIT_C | _BIT_B
_FAN = re.compile(r"[0-9a-f]{2}")
_REST = re.compile(r"[0-9a-f]{62}")
_PACK_FILE = re.compile(r"pack-([0-9a-f]{64})\.(pack|idx)")
#: A canonical envelope: content, parent, [parents], ts, type, in that order. The fast
#: path; anything else is parsed as JSON and judged member by member.
_ENVELOPE = re.compile(
    rb'\{"content":"sha256:([0-9a-f]{64})","parent":(?:null|"sha256:([0-9a-f]{64})")'
    rb'(,"parents":\[[^\t\n]*\])?,"ts":"[^"\\]*","type":"([^"\\]*)"\}'
)
_SIDECAR = re.compile(rb"sidecar:sha256:([0-9a-f]{64})")
#: Names a writer of this store leaves at its root, in ``locks/`` and beside files.
_ROOT_NAMES = {
    "layout": "file",
    "objects": "dir",
    "sessions": "dir",
    "locks": "dir",
    "tmp": "dir",
    "trash": "dir",
    "refs": "dir",
    "refs.lock": "file",
    PACK_LOCK: "file",  # the pack lock (backends/files/locks.py)
    "refs.log": "file",  # the refs' history (backends/files/refs.py)
    "remotes": "dir",  # what exchange remembers of each remote (docs/storage-format.md)
    "migrated": "dir",  # what `migrate` kept for the operator (docs/migrate.md)
    "journal": "tombstone",  # the earlier layout's journal, replaced by `migrate`
    "gc.lock": "file",  # the earlier layout's flock files, which `migrate` keeps
    "sweep.lock": "file",
    # the reference library's flock files, which `migrate` keeps (never unlinked)
    "sweep.lock.want": "file",
    "sweep.lock.next": "file",
    "reflocks": "dir",
}
_DAMAGED_LOG = "log.damaged-"  # repair keeps the damaged log beside the new one
_DAMAGED_PACK = ".damaged-"  # pack sets a damaged pack file aside under this suffix


_HASH = re.compile(r"sha256:[0-9a-f]{64}")


def _is_hash(value: object) -> bool:
    """:func:`hashing.is_hash`, without the call through it (it runs once per log record)."""
    return isinstance(value, str) and _HASH.fullmatch(value) is not None


def _read_block(pack: Pack, b: int, data_end: int) -> Any:
    """Block ``b`` decompressed; None when it lies past ``data_end`` (a pack cut short),
    or the error when it does not read."""
    offset, csize, _ = pack.block_info(b)
    if offset + csize > data_end:
        return None
    try:
        return pack.read_block(b)
    except (CorruptPackError, OSError) as exc:
        return exc


def _name(raw: bytes) -> str:
    return HASH_PREFIX + raw.hex()


def _raw(name: str) -> bytes:
    return binascii.unhexlify(name[7:])


_FIRST = operator.itemgetter(0)


def _spaces_of(bits: int) -> str:
    return "+".join(s for s in _SPACES if bits & SPACE_BITS[s]) or "no space"




#: HEAD and mark hold one id or word and a newline: a bigger one is damage, not read.
_INDEX_LIMIT = 4096


def _read_or_none(path: str, limit: int | None = None) -> bytes | None:
    """A session file's bytes, or None when absent. A log is read as every log is
    (fsutil.read_dense: a FIFO does not block, /dev/zero and links are refused, a sparse
    log's holes are not read), and an index file of more
    than ``limit`` bytes (a sparse file of gigabytes) is not read at all; anything not a
    regular file, or too big, is a StoreError naming it, which fsck reports."""
    try:
        return read_dense(path) if limit is None else read_small(path, limit)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except NotAFileError as exc:
        raise StoreError(f"{path}: {exc}" if limit is not None else str(exc)) from None


def _proc_locks() -> set[tuple[int, int, int]] | None:
    """(major, minor, inode) of every file a process holds a lock on (Linux's
    ``/proc/locks``), or None where that cannot be known. Read-only: taking the
    lock to test it would make a writer opening the session at that moment fail."""
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    held = set()
    for line in text.splitlines():
        for token in line.split():
            parts = token.split(":")
            if len(parts) == 3 and parts[2].isdigit():
                try:
                    held.add((int(parts[0], 16), int(parts[1], 16), int(parts[2])))
                except ValueError:
                    pass
                break
    return held


def writer_holds(root: str, session_id: str) -> bool | None:
    """Whether a process holds the session's writer lock now: True, False, or None
    when this platform cannot tell without taking the lock (fsck never takes it)."""
    try:
        st = os.stat(os.path.join(root, "locks", session_id + ".lock"))
    except FileNotFoundError:
        return False  # never locked: no writer has opened it since the store was made
    except OSError:
        return None
    held = _proc_locks()
    if held is None:
        return None
    return (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in held


class _Prefix:
    """A fork's prefix as the tree rules look it up: walked in the objects on first
    lookup (an own entry naming something not own), not for every fork."""

    __slots__ = ("fsck", "base")

    def __init__(self, fsck: Any, base: bytes):
        self.fsck, self.base = fsck, base

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.fsck.prefix_ids(self.base)


@dataclass
class _SessionState:
    """What pass one learned of a session that pass two (media, retention) needs."""

    id: str
    base: bytes | None
    media: str
    rules_checked: bool


class _Read:
    """The objects as the walk read them (and, for one it did not find, as the store reads
    them now: :meth:`_Walk.confirm`), for the retention rule: an envelope's content and
    parent as the walk parsed them, a content's ``sidecar:`` names as it found them."""

    __slots__ = ("walk",)

    def __init__(self, walk: _Walk):
        self.walk = walk

    def content_names(self, entries: Collection[bytes]) -> Iterator[bytes]:
        walk = self.walk
        infos = list(map(walk.env.get, entries))  # (no Python call per name)
        # (the walk's envelopes are all sound: it keeps none of a copy that is not)
        yield from map(_FIRST, filter(None, infos))
        for raw in itertools.compress(entries, map(operator.not_, infos)):
            info = walk.envelope(raw)  # not found in the walk: asked of the store
            if info is not None:
                yield info[0]

    def parent_of(self, entry: bytes) -> bytes | None:
        info = self.walk.envelope(entry)
        if info is None:
            raise NoSuchObjectError(f"no sound entries object {_name(entry)}")
        return info[1]

    def blob_names(self, contents: Collection[bytes]) -> Iterator[bytes]:
        named = self.walk.sidecars
        for raw in filter(named.__contains__, contents):
            yield from named[raw]


class _Walk:
    """One fsck run over one store. Every set of names holds raw 32-byte digests."""

    def __init__(self, store: Store, progress: Callable[[str], None] | None):
        self.store = store
        backend = store.backend
        assert isinstance(backend, FileBackend)
        self.root: str = backend.root
        self.objects: FileObjects = backend.objects
        self.progress = progress
        self.report = FsckReport(self.root)
        self.sound: dict[str, set[bytes]] = {s: set() for s in _SPACES}
        self.env: dict[bytes, tuple[bytes, bytes | None, bool]] = {}
        self.env_parents: dict[bytes, Any] = {}
        self.prefixes: dict[bytes, set[str]] = {}  # base -> the ids on the path to it
        self.sidecars: dict[bytes, tuple[bytes, ...]] = {}
        #: (space, raw) -> why the copies seen are not sound (for the messages of those who need it).
        self.unsound: dict[tuple[str, bytes], str] = {}
        self._absent: set[tuple[str, bytes]] = set()
        self.counts: dict[str, Any] = {
            "objects": 0,
            "loose": 0,
            "packed": 0,
            "packs": 0,
            "blocks": 0,
            "bytes": 0,
            "sessions": 0,
            "log_records": 0,
            "in_log_only": 0,
            "refs": 0,
        }
        # The retention rule (maintenance/sweep.py), each log the walk reads folded in as it
        # is read and not kept: what a sweep would remove is counted by that rule at the end.
        self.retention = Retention()
        self.owner: dict[bytes, str] = {}
        self.sessions: list[_SessionState] = []
        self.chain: dict[bytes, tuple[str, bytes, str] | None] = {}
        self.orphan_packs: list[str] = []
        self.corrupt_loose: list[tuple[str, bytes, str, str]] = []
        #: Objects a log carries whole in an append no checkpoint record covers yet.
        self.carried: dict[tuple[str, bytes], str] = {}

    # -- findings -----------------------------------------------------------------

    def error(self, code: str, message: str, **where: Any) -> None:
        self.report.add("error", code, message, **where)

    def warn(self, code: str, message: str, **where: Any) -> None:
        self.report.add("warning", code, message, **where)

    def note(self, code: str, message: str, **where: Any) -> None:
        self.report.add("note", code, message, **where)

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def stray(self, path: str, why: str) -> None:
        self.warn("stray", f"{self.rel(path)}: {why}; nothing in the store reads it", file=self.rel(path))

    def listing(self, path: str) -> list[str] | None:
        """A directory's names, sorted; None when it is missing, or cannot be listed (an
        ``unreadable`` error then: what it holds cannot be checked, and the walk goes on).
        A name at the root that is no directory was reported by :meth:`walk_root`."""
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            rel = self.rel(path)
            if not (isinstance(exc, NotADirectoryError) and os.sep not in rel):
                self.error("unreadable", f"{rel} cannot be listed: {exc.strerror or exc}; nothing in it was checked",
                           file=rel)
            return None

    # -- the run ------------------------------------------------------------------

    def run(self) -> FsckReport:
        self.walk_root()
        self.walk_packs()
        for space in _SPACES:
            self.walk_loose(space)
        self.walk_sessions()
        self.walk_staged()
        self.walk_refs()
        self.walk_refs_log()
        self.walk_locks()
        self.finish()
        # Objects first, then sessions, then the rest, each in the order found.
        self.report.problems.sort(key=_place)
        self.report.counts = self.counts
        return self.report

    # -- the root -------------------------------------------------------------------

    def walk_root(self) -> None:
        try:
            names = sorted(os.listdir(self.root))
        except OSError as exc:
            raise StoreError(f"cannot list the store at {self.root}: {exc.strerror or exc}") from None
        for name in names:
            path = os.path.join(self.root, name)
            kind = _ROOT_NAMES.get(name)
            if kind is None:
                if name.startswith(ATOMIC_TMP):
                    self.note("temporary", f"{name}: a temporary file (a write in progress, or a crash's leftover)", file=name)
                else:
                    self.stray(path, "not a name a store holds at its root")
            elif kind == "dir" and not os.path.isdir(path):
                self.warn("stray", f"{name} is not a directory", file=name)
        for name in ("objects", "sessions"):
            if not os.path.isdir(os.path.join(self.root, name)):
                self.warn("missing-directory", f"the store has no {name}/ directory", file=name)
        objects = os.path.join(self.root, "objects")
        try:
            subs = sorted(os.listdir(objects))
        except OSError:
            subs = []
        for name in subs:
            if name not in _SPACES and name != "pack":
                self.stray(os.path.join(objects, name), "not a space of objects/ (entries, contents, blobs) nor pack")
        try:
            trash = os.listdir(os.path.join(self.root, "trash"))
        except OSError:
            trash = []
        if trash:
            self.note(
                "temporary",
                f"trash/ holds {len(trash)} session(s) being deleted (a delete in progress, or a crash's leftover)",
                file="trash",
            )

    # -- objects: packs -------------------------------------------------------------

    def walk_packs(self) -> None:
        pack_dir = os.path.join(self.root, "objects", "pack")
        names = self.listing(pack_dir)
        if names is None:
            return
        idx = set()
        packs = set()
        for n in names:
            m = _PACK_FILE.fullmatch(n)
            if m is None and _DAMAGED_PACK in n:
                self.note("damaged-pack-kept", f"objects/pack/{n} is a damaged pack file `pack` set aside "
                          "(what of it read was copied); remove it once read", file=f"objects/pack/{n}")
            elif m is None:
                self.stray(os.path.join(pack_dir, n), "not a pack or pack index name (pack-<64 hex>.pack|.idx)")
            elif m.group(2) == "idx":
                idx.add(n[: -len(".idx")])
            else:
                packs.add(n[: -len(".pack")])
        self.orphan_packs = sorted(packs - idx)
        todo = sorted(idx)
        for i, key in enumerate(todo, start=1):
            self.say(f"pack {i}/{len(todo)}")
            self.check_pack(os.path.join(pack_dir, key + ".idx"))

    def check_pack(self, idx_path: str) -> None:
        rel_idx = self.rel(idx_path)
        try:
            pack = Pack(idx_path)
        except FileNotFoundError:
            if os.path.exists(idx_path):
                rel_pack = rel_idx[: -len(".idx")] + ".pack"
                key = os.path.basename(idx_path)[: -len(".idx")]
                try:
                    aside = any((m := DROPPED_PACK.fullmatch(n)) is not None and m.group(1) == key
                                for n in os.listdir(os.path.join(self.root, "tmp")))
                except OSError:
                    aside = False
                hint = ("; it is in tmp/, moved aside by a pack or sweep that was killed: `agentsession pack` puts it back"
                        if aside else "")
                self.error("missing-pack", f"{rel_idx} has no pack beside it ({rel_pack} is missing){hint}", file=rel_pack)
            return  # else removed since it was listed: a merge or a sweep
        except (CorruptPackError, OSError, ValueError) as exc:
            self.error(
                "bad-pack-index",
                f"{rel_idx}: {_short(exc, self.root)}; none of its objects can be read through it "
                "(`agentsession pack` rebuilds them from the pack)",
                file=rel_idx,
            )
            return
        try:
            self._check_open_pack(pack, rel_idx)
        finally:
            pack.close()

    def _check_open_pack(self, pack: Pack, rel_idx: str) -> None:
        rel_pack = self.rel(pack.path)
        self.counts["packs"] += 1
        if pack.name != "pack-" + pack.pack_sum.hex():
            self.error(
                "bad-pack",
                f"{rel_pack} is named for another checksum than its own ({pack.pack_sum.hex()[:16]}...): "
                "packs are named by their checksum",
                file=rel_pack,
            )
        size = os.fstat(pack._pack_fd()).st_size
        try:
            pack.check_pack_checksum()
        except CorruptPackError as exc:
            self.error("bad-pack", f"{_short(exc, self.root)} (`agentsession pack` copies what reads and sets it aside)", file=rel_pack)
        nblocks = pack.nblocks
        # The index's records: in strict hash order (a lookup is a binary search) and
        # counted right by the fan-out table.
        records = list(pack.records())
        names = [r[0] for r in records]
        disorder = sum(map(operator.ge, names, itertools.islice(names, 1, None)))
        if disorder:
            self.error("bad-pack-index", f"{rel_idx}: {disorder} name(s) out of order; lookups may miss objects it holds",
                       file=rel_idx)
        else:
            fanout = getattr(pack, "_fanout", None)
            firsts = b"".join(names)[::32]
            if fanout is not None and tuple(bisect.bisect_right(firsts, i) for i in range(256)) != tuple(fanout):
                self.error("bad-pack-index", f"{rel_idx}: its fan-out table does not count its names; lookups may miss",
                           file=rel_idx)
        del names
        # The blocks, in order: each read and decompressed once, its objects hashed in place.
        groups: list[list] = [[] for _ in range(nblocks)]
        bad_records: list[bytes] = []
        for rec in records:
            b = rec[1][0]
            if b < nblocks:
                groups[b].append(rec)
            else:
                bad_records.append(rec[0])
                self._mark_unsound(rec[0], _ALL_BITS, f"its record in {rel_idx} names no block")
        del records
        sha = hashlib.sha256
        unhex = binascii.unhexlify
        env = self.env
        add_e, add_c = self.sound["entries"].add, self.sound["contents"].add
        env_match = _ENVELOPE.fullmatch
        objects = hashed = 0
        lost: dict[int, list] = {}  # block -> [why (None: past the end of the pack), objects]
        for b, objs in enumerate(groups):
            if not objs:
                continue
            block = _read_block(pack, b, size - 32)
            if b % 64 == 0:
                self.say(f"pack {pack.name[5:17]}: block {b}/{nblocks}")
            if isinstance(block, Exception) or block is None:
                why = _short(block, self.root) if block is not None else None
                lost[b] = [why, len(objs)]
                for raw, (_, _, _, sp) in objs:
                    self._mark_unsound(raw, sp or _ALL_BITS, f"block {b} of {rel_pack} "
                                       + ("does not read" if why else "lies past the end of the pack"))
                continue
            self.counts["blocks"] += 1
            plain = getattr(block, "kinds", None)  # format 2: plain slots are read without a call
            for raw, (_, o, length, sp) in objs:
                if not 0 < sp <= _ALL_BITS:
                    bad_records.append(raw)
                    self._mark_unsound(raw, _ALL_BITS, f"its record in {rel_idx} names no known space")
                    continue
                try:
                    if plain is not None and 0 <= o < len(plain) and not plain[o]:
                        data = block.stream[block.starts[o] : block.ends[o]]
                    else:
                        data = block.object(o, length)
                except CorruptPackError as exc:
                    if pack.version == 1:
                        self.error("bad-pack-index", f"{rel_idx} places {_spaces_of(sp)} object {_name(raw)} past the "
                                   f"end of block {b}", file=rel_idx, object=_name(raw), block=b)
                        self._mark_unsound(raw, sp, f"{rel_idx} places it past the end of block {b}")
                    else:
                        name = _name(raw)
                        self.error("corrupt-object", f"{_spaces_of(sp)} object {name} in {rel_pack} (block {b}) does "
                                   f"not decode: {_short(exc, self.root)}", object=name, space=_spaces_of(sp),
                                   file=rel_pack, block=b)
                        self._mark_unsound(raw, sp, f"its copy in {rel_pack} (block {b}) does not decode")
                    continue
                objects += 1
                hashed += len(data)
                if sha(data).digest() != raw:
                    name = _name(raw)
                    self.error("corrupt-object", f"{_spaces_of(sp)} object {name} in {rel_pack} (block {b}) does "
                               "not hash to its name", object=name, space=_spaces_of(sp), file=rel_pack, block=b)
                    self._mark_unsound(raw, sp, f"its copy in {rel_pack} (block {b}) is corrupt")
                    continue
                if sp == _BIT_C:
                    add_c(raw)
                    if b"sidecar:" in data:
                        self._sidecars(raw, data)
                    continue
                if sp & _BIT_E:
                    m = env_match(data)
                    if m is not None and m.group(3) is None:
                        c, p, _, t = m.groups()
                        env[raw] = (unhex(c), unhex(p) if p is not None else None, t == b"label")
                        add_e(raw)
                    elif self._parse_envelope(raw, data, rel_pack):
                        add_e(raw)
                if sp & _BIT_C:
                    add_c(raw)
                    if b"sidecar:" in data:
                        self._sidecars(raw, data)
                if sp & _BIT_B:
                    self.sound["blobs"].add(raw)
        if bad_records:
            self.error("bad-pack-index", f"{rel_idx}: {len(bad_records)} record(s) name a block past the last or no "
                       f"known space (first {_name(min(bad_records))})", file=rel_idx, object=_name(min(bad_records)))
        cut = sorted(b for b, (why, _) in lost.items() if why is None)
        if cut:
            self.error("truncated-pack", f"{rel_pack} is cut short ({size} bytes): it ends inside block {cut[0]}; "
                       f"blocks {cut[0]} to {nblocks - 1} ({sum(lost[b][1] for b in cut)} object(s)) cannot be read",
                       file=rel_pack, block=cut[0])
        for b, (why, count) in sorted(lost.items()):
            if why is not None:
                self.error("bad-block", f"{why}; its {count} object(s) cannot be read from it", file=rel_pack, block=b)
        self.counts["objects"] += objects
        self.counts["packed"] += objects
        self.counts["bytes"] += hashed

    def _mark_unsound(self, raw: bytes, bits: int, why: str) -> None:
        for space in _SPACES:
            if bits & SPACE_BITS[space]:
                self.unsound.setdefault((space, raw), why)

    def _sidecars(self, content: bytes, data: bytes) -> None:
        found = tuple(dict.fromkeys(binascii.unhexlify(m) for m in _SIDECAR.findall(data)))
        if found:
            self.sidecars[content] = found

    def _parse_envelope(self, raw: bytes, data: bytes, where: str) -> bool:
        """Parse an envelope that is not in the canonical fast form; report it if it is none."""
        why = None
        try:
            env = loads(data)
        except (ValueError, AgentSessionError) as exc:
            env, why = None, f"not JSON ({exc})"
        if why is None and not isinstance(env, dict):
            why = "not a JSON object"
        if why is None:
            content, parent, type_ = env.get("content"), env.get("parent"), env.get("type")
            if not is_hash(content):
                why = "its 'content' is not a content hash"
            elif parent is not None and not is_hash(parent):
                why = "its 'parent' is neither an entry id nor null"
            elif not isinstance(type_, str):
                why = "its 'type' is not a string"
        if why is not None:
            name = _name(raw)
            self.error(
                "bad-envelope",
                f"entries object {name} in {where} hashes to its name but is not an envelope: {why}",
                object=name, space="entries", file=where,
            )
            self.unsound.setdefault(("entries", raw), f"its copy in {where} is not an envelope")
            self.env.pop(raw, None)
            return False
        self.env[raw] = (_raw(content), _raw(parent) if parent is not None else None, type_ == "label")
        if env.get("parents") is not None:
            self.env_parents[raw] = env.get("parents")
        return True

    # -- objects: loose files -------------------------------------------------------

    def walk_loose(self, space: str) -> None:
        base = os.path.join(self.root, "objects", space)
        try:
            fans = sorted(os.scandir(base), key=lambda e: e.name)
        except FileNotFoundError:
            self.warn("missing-directory", f"the store has no objects/{space}/ directory", file=f"objects/{space}")
            return
        except OSError as exc:
            self.error("unreadable", f"objects/{space} cannot be listed: {exc.strerror or exc}; nothing in it was "
                       "checked", file=f"objects/{space}")
            return
        bit = SPACE_BITS[space]
        sound = self.sound[space]
        sha = hashlib.sha256
        env_match = _ENVELOPE.fullmatch
        for i, fan in enumerate(fans):
            if i % 16 == 0:
                self.say(f"loose {space}: {fan.name}/ ({i}/{len(fans)})")
            if not _FAN.fullmatch(fan.name) or not fan.is_dir(follow_symlinks=False):
                self.stray(fan.path, f"not a fan-out directory of objects/{space}/ (two lowercase hex digits)")
                continue
            try:
                files = sorted(os.scandir(fan.path), key=lambda e: e.name)
            except OSError as exc:
                self.error("unreadable", f"{self.rel(fan.path)} cannot be listed: {exc.strerror or exc}", file=self.rel(fan.path))
                continue
            for f in files:
                if not _REST.fullmatch(f.name) or not f.is_file(follow_symlinks=False):
                    self.stray(f.path, "not an object file (62 lowercase hex digits, a regular file)")
                    continue
                raw = binascii.unhexlify(fan.name + f.name)
                try:
                    big = f.stat(follow_symlinks=False).st_size > HASH_FIRST
                    if big and space != "blobs" and has_hole(f.path):
                        # Canonical JSON never holds a run of NULs: a hole is damage, found
                        # without reading (or hashing twice) a gigabyte of nothing.
                        rel = self.rel(f.path)
                        self.corrupt_loose.append((space, raw, rel, "holds a hole of a megabyte or more (never written)"))
                        self.unsound.setdefault((space, raw), f"its loose copy {rel} is corrupt")
                        continue
                    if space == "blobs" or big:
                        # Hashed in chunks: a big file (a sparse one of gigabytes put there)
                        # is read whole only once it proves to be the object it is named for.
                        digest, size = hash_file(f.path)
                        data = read_whole(f.path) if space != "blobs" and digest == raw else b""
                    else:
                        data = read_whole(f.path)
                        digest, size = sha(data).digest(), len(data)
                except FileNotFoundError:
                    continue  # packed (or swept) since it was listed
                except OSError as exc:
                    rel = self.rel(f.path)
                    self.error("unreadable", f"{space} object {_name(raw)} ({rel}) cannot be read: {exc.strerror or exc}",
                               object=_name(raw), space=space, file=rel)
                    self.unsound.setdefault((space, raw), f"{rel} cannot be read")
                    continue
                if digest != raw:
                    # Where a writer creates a loose object in place (no hard links): a second look.
                    try:
                        again, size = hash_file(f.path)
                    except OSError:
                        continue
                    if again != raw:
                        # Judged at the end: a copy some log still carries (no checkpoint
                        # covers its append) is a checkpoint cut short, not damage.
                        rel = self.rel(f.path)
                        self.corrupt_loose.append((space, raw, rel, "is empty" if not size else "does not hash to its name"))
                        self.unsound.setdefault((space, raw), f"its loose copy {rel} is corrupt")
                        continue
                    data = read_whole(f.path) if space != "blobs" else b""
                self.counts["objects"] += 1
                self.counts["loose"] += 1
                self.counts["bytes"] += size
                if bit == _BIT_E:
                    m = env_match(data)
                    if m is not None and m.group(3) is None:
                        parent = m.group(2)
                        self.env[raw] = (
                            binascii.unhexlify(m.group(1)),
                            binascii.unhexlify(parent) if parent is not None else None,
                            m.group(4) == b"label",
                        )
                    elif not self._parse_envelope(raw, data, self.rel(f.path)):
                        continue
                elif bit == _BIT_C and b"sidecar:" in data:
                    self._sidecars(raw, data)
                sound.add(raw)

    # -- looking again ----------------------------------------------------------------

    def confirm(self, space: str, raw: bytes) -> bool:
        """Whether the object is sound after all, asked through the store's own reads:
        a pack or a checkpoint in another process may have moved or written it since
        the walk listed the files. Found sound, it joins the walk's sets."""
        if raw in self.sound[space]:
            return True
        key = (space, raw)
        if key in self._absent:
            return False
        try:
            data = self.objects.get(space, _name(raw))
        except (NoSuchObjectError, CorruptObjectError, CorruptPackError, OSError):
            self._absent.add(key)
            return False
        if space == "entries" and raw not in self.env:
            if not self._parse_envelope(raw, data, "objects/"):
                self._absent.add(key)
                return False
        if space == "contents" and b"sidecar:" in data:
            self._sidecars(raw, data)
        self.sound[space].add(raw)
        return True

    def envelope(self, raw: bytes) -> tuple[bytes, bytes | None, bool] | None:
        info = self.env.get(raw)
        if info is not None and raw in self.sound["entries"]:
            return info
        if self.confirm("entries", raw):
            return self.env.get(raw)
        return None

    def why_unsound(self, space: str, raw: bytes) -> str:
        why = self.unsound.get((space, raw))
        return f"no sound copy: {why}" if why else "no copy: not in objects/ (no loose file, no pack holds it)"

    def walk_chain(self, start: bytes) -> tuple[str, bytes, str] | None:
        """The path from ``start`` to the root, checked once per entry for the whole
        store (forks share their prefixes): None when every entry on it is sound with
        its content, else (code, the first entry that is not, why)."""
        memo = self.chain
        path: list[bytes] = []
        on_path: set[bytes] = set()
        cur: bytes | None = start
        result: tuple[str, bytes, str] | None = None
        while cur is not None:
            if cur in memo:
                result = memo[cur]
                break
            if cur in on_path:
                result = ("broken-chain", cur, "it is its own ancestor (the parents loop)")
                break
            info = self.envelope(cur)
            if info is None:
                result = ("missing-object", cur, self.why_unsound("entries", cur))
                break
            path.append(cur)
            on_path.add(cur)
            if not self.confirm("contents", info[0]):
                result = ("missing-content", cur, f"its content {_name(info[0])} has {self.why_unsound('contents', info[0])}")
                break
            cur = info[1]
        for p in path:
            memo[p] = result
        return result

    # -- sessions -----------------------------------------------------------------------

    def walk_sessions(self) -> None:
        base = os.path.join(self.root, "sessions")
        names = self.listing(base)
        if names is None:
            return
        for i, name in enumerate(names, start=1):
            self.say(f"session {i}/{len(names)}: {name}")
            path = os.path.join(base, name)
            try:
                check_session_id(name)
            except BadNameError:
                self.stray(path, "not a session id")
                continue
            if not os.path.isdir(path):
                self.stray(path, "not a session directory")
                continue
            self.check_session(name, path)

    def check_session(self, sid: str, sdir: str) -> None:
        rel = f"sessions/{sid}"
        try:
            present = set(os.listdir(sdir))
        except FileNotFoundError:
            return  # deleted since it was listed
        if not present.intersection(SESSION_FILES):
            self.stray(sdir, "a directory in sessions/ that holds no session files")
            return
        for name in sorted(present):
            if name in SESSION_FILES:
                continue
            if name.startswith(_DAMAGED_LOG):
                self.note("damaged-log-kept", f"session {sid}: {name} is a damaged log `repair` kept aside; remove it once read",
                          session=sid, file=f"{rel}/{name}")
                # What of it reads retains its objects while it is kept, as a sweep counts it.
                kept = _read_or_none(os.path.join(sdir, name))
                if kept is not None:
                    self.retention.add(retention_source(ln.record for ln in scan_log(kept) if ln.record is not None))
            elif name.startswith(ATOMIC_TMP):
                self.note("temporary", f"session {sid}: {name} is a temporary file (a write in progress, or a crash's leftover)",
                          session=sid, file=f"{rel}/{name}")
            else:
                self.stray(os.path.join(sdir, name), f"not a file of session {sid}")
        # The indexes first, then the log: a writer rewrites an index from the log as it
        # stands, so read this way the index can lag the log but never lead it.
        head_file = _read_or_none(os.path.join(sdir, "HEAD"), _INDEX_LIMIT)
        mark_file = _read_or_none(os.path.join(sdir, "mark"), _INDEX_LIMIT)
        summary = kept_summary(sdir)
        header_bytes = _read_or_none(os.path.join(sdir, "header"), HEADER_LIMIT)
        data = _read_or_none(os.path.join(sdir, "log"))
        if header_bytes is None and data is None and not os.path.isdir(sdir):
            return  # deleted since it was listed
        self.counts["sessions"] += 1
        media = "inline"
        # The log holds the header (create and header records): the file is its index. The
        # log is parsed once, here, for this and for everything below.
        lr = read_log(data) if data is not None else None
        if data is not None and "ids" in present:
            self.check_snapshot_ids(sid, sdir, data)
        logged = header_of(lr.records + lr.cut_records) if lr is not None else None
        if logged is not None:
            held = canonical_bytes(logged) + b"\n"
            if header_bytes is not None and header_bytes != held:
                self.warn("stale-header", f"session {sid}: its header file differs from the header its log holds; the "
                          "log's is served, and the next writing open rewrites the file", session=sid, file=f"{rel}/header")
            if header_bytes is None:
                self.error("missing-header", f"session {sid} has no header file ({rel}/header); the store does not list "
                           f"it (its log holds the header: `agentsession repair {sid}` writes the file again)", session=sid, file=f"{rel}/header")
            media = self.check_header(sid, held, rel) or media
        elif header_bytes is None:
            self.error("missing-header", f"session {sid} has no header ({rel}/header); the store does not list it", session=sid, file=f"{rel}/header")
        else:
            media = self.check_header(sid, header_bytes, rel) or media
        if data is None or lr is None:
            self.error("missing-log", f"session {sid} has no log ({rel}/log): nothing says what it holds", session=sid, file=f"{rel}/log")
            return
        self.counts["log_records"] += len(lr.records) + len(lr.cut_records)
        logrel = f"{rel}/log"
        if lr.damage:
            for d in lr.damage:
                self.error("log-damage", f"session {sid}: log line {d.line} (offset {d.offset}): {d.reason}",
                           session=sid, file=logrel, line=d.line, offset=d.offset)
            self.damaged_session(sid, data, logrel)
            return
        records = lr.records
        self.retention.add(retention_source(records + lr.cut_records))  # (a tail a writing open drops still holds its objects)
        if not records or records[0].op != "create":
            what = "is empty" if not data else "does not open with its create record"
            self.error("log-damage", f"session {sid}: its log {what}", session=sid, file=logrel, line=1, offset=0)
            return
        if lr.cut is not None:
            c = lr.cut
            self.note(
                "log-tail",
                f"session {sid}: log line {c.line} (offset {c.offset}): {c.reason}: a tail after the last commit "
                f"({1 + len(lr.cut_records)} line(s)), a writer in progress or a crash's loss; the next writing open drops it",
                session=sid, file=logrel, line=c.line, offset=c.offset,
            )
        self.check_log(sid, records, logrel, media, head_file, mark_file, sdir, len(data), summary)

    def check_header(self, sid: str, raw: bytes, rel: str) -> str | None:
        where = dict(session=sid, file=f"{rel}/header")
        try:
            header = loads(raw)
        except (ValueError, AgentSessionError) as exc:
            self.error("bad-header", f"session {sid}: its header is not JSON: {exc}", **where)
            return None
        if not isinstance(header, dict) or header.get("type") != "session":
            self.error("bad-header", f"session {sid}: its header is not a session header object", **where)
            return None
        if header.get("id") != sid:
            self.error("bad-header", f"session {sid}: its header names session {header.get('id')!r}", **where)
        media = header.get("media")
        return media if isinstance(media, str) else "inline"

    def damaged_session(self, sid: str, data: bytes, logrel: str) -> None:
        """A damaged log: the entries its readable records name are still checked (and
        retained); the rules are not, since the damage may hide any record."""
        records = [ln.record for ln in scan_log(data) if ln.record is not None]
        self.retention.add(retention_source(records))
        last_commit = max((i for i, r in enumerate(records) if r.op in COMMIT_POINTS), default=-1)
        for i, r in enumerate(records):
            if r.op == "append" and i <= last_commit and _is_hash(r.get("entry")):
                sound, info = self.entry_sound(_raw(r.get("entry")))
                if not sound and not (r.payload is not None and self.payload_env(r, _raw(r.get("entry")), {}, logrel)):
                    self.report_missing(sid, r, info, logrel)
            elif r.op == "create" and _is_hash(r.get("base")):
                self.report_chain(sid, _raw(r.get("base")), logrel)
        self.note("not-checked", f"session {sid}: the parent, base and head rules and HEAD were not checked: "
                  f"its log is damaged (`agentsession repair {sid}`)", session=sid, file=logrel)

    def entry_sound(self, raw: bytes) -> tuple[bool, tuple[bytes, bytes | None, bool] | None]:
        """Whether an entry's envelope and content are both sound, and its envelope."""
        info = self.envelope(raw)
        if info is None:
            return False, None
        return self.confirm("contents", info[0]), info

    def report_missing(self, sid: str, r: Record, info: tuple | None, logrel: str) -> None:
        entry = r.get("entry")
        where = dict(session=sid, object=entry, file=logrel, line=r.line, offset=r.offset)
        if info is None:
            self.error("missing-object", f"session {sid}: log line {r.line} needs entry {entry}, which has "
                       f"{self.why_unsound('entries', _raw(entry))}", space="entries", **where)
        else:
            self.error("missing-content", f"session {sid}: log line {r.line} needs entry {entry}, whose content "
                       f"{_name(info[0])} has {self.why_unsound('contents', info[0])}", space="contents", **where)

    def payload_env(self, r: Record, raw: bytes, into: dict[bytes, tuple[bytes, bytes | None, bool]], logrel: str) -> bool:
        """An append's payload, when it holds the entry whole (as recovery would restore it)."""
        checked = payload_entry(r.get("entry"), r.payload)  # type: ignore[arg-type]
        if checked is None:
            return False
        env = checked[0]
        parent = env.get("parent")
        into[raw] = (_raw(env["content"]), _raw(parent) if isinstance(parent, str) and _is_hash(parent) else None,
                     env.get("type") == "label")
        if env.get("parents") is not None:
            self.env_parents.setdefault(raw, env["parents"])
        content = r.payload[0] if r.payload is not None else b""  # (payload_entry found one)
        if b"sidecar:" in content:  # (the log alone may hold this content: its blobs are read here)
            self._sidecars(into[raw][0], content)
        self.counts["in_log_only"] += 1
        self.carried.setdefault(("entries", raw), logrel)
        self.carried.setdefault(("contents", into[raw][0]), logrel)
        return True

    def report_chain(self, sid: str, base: bytes, logrel: str) -> bool:
        failed = self.walk_chain(base)
        if failed is None:
            return True
        code, at, why = failed
        what = "the base itself" if at == base else f"entry {_name(at)} on its prefix"
        self.error(code if code != "broken-chain" else "broken-chain",
                   f"session {sid}: the path from its base {_name(base)} to the root is broken at {what}: {why}",
                   session=sid, object=_name(at), file=logrel)
        return False

    def check_log(
        self, sid: str, records: list[Record], logrel: str, media: str,
        head_file: bytes | None, mark_file: bytes | None, sdir: str, log_size: int,
        summary: dict[str, Any] | None = None,
    ) -> None:
        """One pass over the records a reader keeps: the objects each append needs and the
        parent and ``parents`` rules; then the state the log replays to (the domain's
        :func:`replay`), the base and head rules, and the indexes against it."""
        create = records[0].data
        if create.get("session") != sid:
            self.error("bad-log", f"session {sid}: its create record names session {create.get('session')!r}",
                       session=sid, file=logrel, line=records[0].line)
        base: str | None = create.get("base")
        base_raw: bytes | None = None
        rules = True
        if base is not None:
            if _is_hash(base):
                base_raw = _raw(base)
                self.report_chain(sid, base_raw, logrel)
            else:
                self.error("bad-log", f"session {sid}: its create record's base {base!r} is not an entry id",
                           session=sid, file=logrel, line=records[0].line)
                rules = False
        ops = [r.data["op"] for r in records]
        last_commit = max(i for i, op in enumerate(ops) if op in COMMIT_POINTS)
        # Appends a checkpoint record covers (by sequence number: a checkpoint runs beside
        # later appends) have their objects in objects/; the others only in their payloads.
        covered = _checkpoint_covers((r.op, r.get("seq")) for r in records) if "checkpoint" in ops else 0
        env, sound_c, sidecars, env_parents = self.env, self.sound["contents"], self.sidecars, self.env_parents
        unhex, hash_match = binascii.unhexlify, _HASH.fullmatch
        own: set[bytes] = set()  # own entries, in the order they are met
        own_add = own.add
        seqs: list[int] = []
        payload_envs: dict[bytes, tuple[bytes, bytes | None, bool]] = {}
        # The tree rules (format/rules.py), fed the own entries in log order; the prefix
        # is looked up in the objects only when an entry names something not own.
        tree: TreeState | None = None
        unclean = False  # the last writer is open or did not close: appends no checkpoint covers
        cut_at = len(records)
        for i, r in enumerate(records):
            d = r.data
            op = ops[i]
            if op != "append":
                continue
            entry = d.get("entry")
            if type(entry) is not str or hash_match(entry) is None:
                self.error("bad-log", f"session {sid}: log line {r.line}: an append record names no entry id",
                           session=sid, file=logrel, line=r.line, offset=r.offset)
                continue
            seq = d.get("seq")
            if type(seq) is int:
                seqs.append(seq)
            raw = unhex(entry[7:])
            held_in_log = r.payload is not None and not (type(seq) is int and seq <= covered)
            if held_in_log:
                unclean = True
            info = env.get(raw)
            if info is None or info[0] not in sound_c:
                sound, info = self.entry_sound(raw)
                if not sound:
                    if held_in_log and self.payload_env(r, raw, payload_envs, logrel):
                        info = payload_envs[raw]  # in the log until the next checkpoint writes it to objects/
                    elif i > last_commit:
                        self.note(
                            "dropped-on-open",
                            f"session {sid}: log line {r.line}: an uncommitted append of {entry} whose objects are "
                            "not sound; the next writing open drops it and every record after it",
                            session=sid, object=entry, file=logrel, line=r.line, offset=r.offset,
                        )
                        cut_at = i
                        break
                    elif held_in_log:
                        self.error("bad-payload", f"session {sid}: log line {r.line}: the payload of {entry} does not "
                                   "hold it whole, and objects/ does not either", session=sid, object=entry,
                                   file=logrel, line=r.line, offset=r.offset)
                    else:
                        self.report_missing(sid, r, info, logrel)
            if raw not in own:
                if info is not None and rules:
                    if tree is None:
                        above = _Prefix(self, base_raw) if base_raw is not None else None
                        tree = TreeState(Header({"type": "session", "id": sid, "base": base}), above=above)
                    parent = info[1]
                    data: dict[str, Any] = {"parent": _name(parent) if parent is not None else None}
                    if env_parents and raw in env_parents:
                        data["parents"] = env_parents[raw]
                    for p in tree.add(Entry(data, computed_id=entry, content_hash=_name(info[0]), line=r.line)):
                        self.error(p.code, f"session {sid}: log line {r.line}: entry {entry}: {p.message}",
                                   session=sid, object=entry, file=logrel, line=r.line, offset=r.offset)
                    if sidecars and info[0] in sidecars:
                        self.check_sidecars(sid, r, sidecars[info[0]], logrel)
                elif tree is not None:
                    tree.mark_broken(entry)
                own_add(raw)
        owner = self.owner
        for raw in own:
            owner.setdefault(raw, sid)
        if len(set(seqs)) != len(seqs):
            self.report_seqs(sid, records, logrel)
        if cut_at < len(records) or any(op != "checkpoint" for op in ops[last_commit + 1 : cut_at]):
            unclean = True
        self.sessions.append(_SessionState(sid, base_raw, media, rules))
        if rules and base_raw is not None:
            info = env.get(base_raw)
            if info is not None and info[2] and self.is_leaf_label(info[0]):
                self.error("bad-base", f"session {sid}: its base {base} is a leaf label; a fork's base is its first head",
                           session=sid, object=base, file=logrel)
        # The state is what the one replay of the domain says (open, repair and exchange
        # read a log the same way); its contradictions are damage.
        state = replay([r.data for r in records[:cut_at]])
        for code, why in state.damage:
            self.error(code, f"session {sid}: {why}", session=sid, file=logrel)
        if state.damage:
            return  # the indexes cannot be judged against a log that contradicts itself
        head, mark = state.head, state.mark
        stale = None
        if head_file is not None:
            head_index = head_file.decode("ascii", "replace").strip()
            lost = index_damage(state, head_index)
            if lost is not None:
                self.error("log-cut", f"session {sid}: {lost}; `agentsession repair {sid}` takes back what HEAD proves",
                           session=sid, file=f"sessions/{sid}/HEAD")
                return
            # A HEAD where no head rests (a leaf label) is no writer's lag: stale however the session is held.
            stale = stale_head(state, head_index)
        lost = index_damage(state, None, summary=summary)
        if lost is not None:
            self.error("log-cut", f"session {sid}: {lost}; `agentsession repair {sid}` gives none of the lost numbers "
                       "out again", session=sid, file=f"sessions/{sid}/summary")
            return
        self.check_indexes(sid, head, mark, head_file, mark_file, sdir, log_size, unclean, stale=stale)
        self.check_summary(sid, state)

    def check_snapshot_ids(self, sid: str, sdir: str, log: bytes) -> None:
        """``ids`` holds a compacted log's snapshot ids raw, and an open takes them from it
        instead of the log when it names the log's snapshot line: one that does so but
        holds other ids would give the session wrong entries. Stale (naming another
        line) or unreadable, it is only unused (no finding)."""
        data = _read_or_none(os.path.join(sdir, "ids"))
        kept = read_snapshot_ids(data) if data is not None else None
        if kept is not None and snapshot_ids_disagree(log, kept):
            self.warn("stale-ids", f"session {sid}: its ids file names the snapshot line of its log but not the ids "
                      "that line holds; an open would use it; removing the file is safe (an index, rewritten at "
                      "the next compaction)", session=sid, file=f"sessions/{sid}/ids")

    def check_summary(self, sid: str, state: Any) -> None:
        """``summary`` is what ``list`` shows without reading the log: one that says it
        describes the log as it is now (its identity) but disagrees with it (count, last
        entry, head, mark) would show a person the wrong session. Stale or unreadable,
        it is only rebuilt (no finding)."""
        kept = self.store.backend.sessions.summary(sid)
        if kept is None or not kept[1]:
            return
        s = kept[0]
        order = state.log_order
        expect = {"id": sid, "entries": len(order), "last_entry": order[-1] if order else None,
                  "head": state.head, "mark": state.mark, "base": state.base}
        wrong = [k for k, v in expect.items() if s.get(k) != v]
        if wrong:
            self.warn("stale-summary", f"session {sid}: its summary disagrees with the log ({', '.join(wrong)}); "
                      "`list` shows it until the session is next written; removing the file is safe (an index, "
                      "rebuilt from the log)", session=sid, file=f"sessions/{sid}/summary")

    def report_seqs(self, sid: str, records: list[Record], logrel: str) -> None:
        """Sequence numbers given out twice (a writer never reuses one, a lost append's included)."""
        first: dict[int, int] = {}
        for r in records:
            seq = r.data.get("seq")
            if r.data["op"] != "append" or type(seq) is not int:
                continue
            if seq in first:
                self.error("bad-log", f"session {sid}: log line {r.line}: sequence number {seq} was given out "
                           f"already at line {first[seq]}", session=sid, file=logrel, line=r.line, offset=r.offset)
            else:
                first[seq] = r.line

    def check_sidecars(self, sid: str, r: Record, blobs: tuple[bytes, ...], logrel: str) -> None:
        """A sidecar blob an entry names and the store lacks: RFC 0002 lets an append
        name one (reported as unresolved, never refused), so it is a warning. One the
        store holds only damaged is an error naming the session, ``corrupt-object`` as
        ``verify ID`` says (maintenance/check.py), beside the walk's finding on the object."""
        for blob in blobs:
            if self.confirm("blobs", blob):
                continue
            held = ("blobs", blob) in self.unsound  # (a copy, damaged)
            self.report.add("error" if held else "warning", "corrupt-object" if held else "missing-blob",
                            f"session {sid}: entry {r.get('entry')} (log line {r.line}) names sidecar blob "
                            f"{_name(blob)}, which has {self.why_unsound('blobs', blob)}",
                            session=sid, object=_name(blob), space="blobs", file=logrel, line=r.line)

    def prefix_ids(self, base: bytes) -> set[str]:
        """The ids on the path to ``base``, base included, once per base (forks share)."""
        ids = self.prefixes.get(base)
        if ids is None:
            ids = self.prefixes[base] = {_name(raw) for raw in self.prefix_of(base)}
        return ids

    def prefix_of(self, base: bytes | None) -> set[bytes]:
        out: set[bytes] = set()
        cur = base
        while cur is not None and cur not in out:
            out.add(cur)
            info = self.env.get(cur)
            cur = info[1] if info is not None else None
        return out

    def is_leaf_label(self, content: bytes) -> bool:
        try:
            body = loads(self.store.objects.get("contents", _name(content)))
        except (AgentSessionError, ValueError, OSError):
            return False
        return isinstance(body, dict) and body.get("label") == LEAF_LABEL

    def check_indexes(
        self, sid: str, head: object, mark: object, head_file: bytes | None, mark_file: bytes | None,
        sdir: str, log_size: int, unclean: bool, stale: str | None = None,
    ) -> None:
        """``HEAD`` and ``mark`` are indexes of the log, rewritten by a writer at commits,
        head moves, marks and close (not at every append). A difference is a lag, not
        damage, while a writer holds the session or when the log shows its last writer
        did not close (appends no checkpoint covers); otherwise it is stale. A ``HEAD``
        that is ``stale`` (why: it names where no head rests, :func:`~...store.state.stale_head`)
        is stale either way."""
        expect = {"HEAD": f"{head if isinstance(head, str) else ''}\n".encode(), "mark": f"{mark}\n".encode()}
        found = {"HEAD": head_file, "mark": mark_file}
        wrong = [n for n in ("HEAD", "mark") if found[n] != expect[n]]
        if not wrong:
            return
        held = writer_holds(self.root, sid)
        if not held:
            # Read again: a writer that opened and closed meanwhile changed the log or the index.
            again = {n: _read_or_none(os.path.join(sdir, n), _INDEX_LIMIT) for n in ("HEAD", "mark")}
            try:
                size_now = os.path.getsize(os.path.join(sdir, "log"))
            except OSError:
                size_now = -1
            if again != found or size_now != log_size:
                held = True
        for n in wrong:
            code = "stale-head" if n == "HEAD" else "stale-mark"
            what = "head" if n == "HEAD" else "mark"
            text = found[n]
            # Shown as it is, less one final newline: a stray byte around the value is what is stale.
            shown = "" if text is None else text.decode("utf-8", "replace").removesuffix("\n")
            says = "is missing" if text is None else f"says {shown or 'no head'!r}"
            should = expect[n].decode().strip() or "no head"
            where = dict(session=sid, file=f"sessions/{sid}/{n}")
            if n == "HEAD" and stale is not None:
                self.error(code, f"session {sid}: {stale} (`agentsession repair {sid}` or the next writing open rewrites it)",
                           **where)
            elif held:
                self.note("index-lag", f"session {sid}: {n} {says}, the log's {what} is {should}: a writer holds the "
                          "session and rewrites it at its next commit or close", **where)
            elif unclean:
                self.note("index-lag", f"session {sid}: {n} {says}, the log's {what} is {should}: its last writer did "
                          "not close (a crash, or a writer fsck cannot see); the next writing open rewrites it", **where)
            elif held is None:
                self.warn(code, f"session {sid}: {n} {says}, but the log's {what} is {should} (whether a writer "
                          "holds the session cannot be told here)", **where)
            else:
                self.error(code, f"session {sid}: {n} {says}, but the log's {what} is {should}; no writer holds "
                           f"the session (`agentsession repair {sid}` or the next writing open rewrites it)", **where)

    # -- staged sessions, refs, locks ---------------------------------------------------

    def walk_staged(self) -> None:
        """tmp/ holds what writers are writing (objects, packs, sessions being staged),
        or what a crash left there; a staged session's log retains its objects."""
        base = os.path.join(self.root, "tmp")
        names = self.listing(base)
        if names is None:
            return
        staged = 0
        for name in names:
            data = _read_or_none(os.path.join(base, name, "log"))
            if data is not None:
                staged += 1
                lr = read_log(data)
                self.retention.add(retention_source(lr.records + lr.cut_records, staged=True))
        if names:
            self.note("temporary", f"tmp/ holds {len(names)} temporary file(s) or director(ies)"
                      + (f", {staged} of them session(s) being staged" if staged else "")
                      + " (writes in progress, or a crash's leftovers)", file="tmp")

    def walk_refs(self) -> None:
        from ...store.refs import Refs, check_ref_name

        base = os.path.join(self.root, "refs")
        files = self.listing(base)
        if files is None:
            return
        refs = Refs(self.store)
        for file_name in files:
            path = os.path.join(base, file_name)
            try:
                name = check_ref_name(file_name.replace("%", "/"))
            except BadNameError:
                self.stray(path, "not a ref file name")
                continue
            try:
                ref = refs.get(name)
            except StoreError as exc:
                self.error("bad-ref", _short(exc, self.root), file=self.rel(path))
                continue
            if ref is None:
                continue
            self.counts["refs"] += 1
            state = refs.state(ref)
            if state != "ok":
                what = "is not in the store" if state == "dangling" else "was deleted and another created under its id"
                self.note(f"{state}-ref", f"ref {name} names session {ref.session}, which {what}",
                          session=ref.session, file=self.rel(path))

    def walk_refs_log(self) -> None:
        """``refs.log`` read as a ref's log reads it (refs.py ``read_refs_log``, the one
        rule): each line that does not read is an error (every ref's log fails on it), a
        torn last line a note (an append a crash cut, which no read takes)."""
        try:
            log = read_refs_log(self.root)
        except StoreError as exc:
            self.error("bad-refs-log", _short(exc, self.root), file="refs.log")
            return
        for n in log.bad:
            self.error("bad-refs-log", f"{_short(log.damage(n), self.root)}: reading any ref's history fails on it",
                       file="refs.log", line=n)
        if log.torn is not None:
            self.note("log-tail", f"refs.log line {log.torn} is torn (an append a crash cut); no read takes it",
                      file="refs.log", line=log.torn)

    def walk_locks(self) -> None:
        base = os.path.join(self.root, "locks")
        names = self.listing(base)
        if names is None:
            return
        for name in names:
            if name.endswith(".lock"):
                continue
            try:
                check_session_id(name)  # the earlier layout's session lock, which `migrate` keeps
            except BadNameError:
                self.stray(os.path.join(base, name), "not a lock file")

    # -- the end: media, retention, leftovers ---------------------------------------------

    def finish(self) -> None:
        for space, raw, rel, what in self.corrupt_loose:
            # Read once more: where loose objects are written in place (no hard links), one
            # the walk read half written is whole by now if its checkpoint was done.
            path = os.path.join(self.root, rel)
            try:
                if not (space != "blobs" and has_hole(path)) and hash_file(path)[0] == raw:
                    continue
            except FileNotFoundError:
                continue  # packed since, or swept: its sessions were checked through the store
            except OSError:
                pass
            carrier = self.carried.get((space, raw))
            name = _name(raw)
            if carrier is not None:
                self.note("torn-object", f"{space} object {name} {what} ({rel}): a checkpoint cut short by a crash or "
                          f"in progress; {carrier} still carries it whole, and the next writing open rewrites it",
                          object=name, space=space, file=rel)
            else:
                self.error("corrupt-object", f"{space} object {name} {what} ({rel})", object=name, space=space, file=rel)
        headers: dict[str, str] = {s.id: s.media for s in self.sessions}
        for s in self.sessions:
            if s.base is None or not s.rules_checked:
                continue
            owner = self.owner.get(s.base)
            if owner is not None and owner != s.id and headers.get(owner) != s.media:
                self.error("bad-base", f"session {s.id}: its media {s.media!r} differs from {headers.get(owner)!r} of "
                           f"session {owner}, which holds its base {_name(s.base)}",
                           session=s.id, object=_name(s.base), file=f"sessions/{s.id}/header")
        # What nothing retains, by the sweep's rule over the logs the walk read (each added
        # as it was read), reading the objects as the walk found them (nothing is read twice).
        self.say("counting unreferenced objects")
        spaces = self.counts["spaces"] = {}  # (filled after: the rule's reads may confirm objects moved meanwhile)
        sound = {space: RawNames(self.sound[space]) for space in _SPACES}
        self.counts["unreferenced"] = self.retention.unreferenced(sound, _Read(self))
        spaces.update((s, len(self.sound[s])) for s in _SPACES)
        pack_dir = os.path.join(self.root, "objects", "pack")
        for key in self.orphan_packs:
            if not os.path.exists(os.path.join(pack_dir, key + ".idx")) and os.path.exists(os.path.join(pack_dir, key + ".pack")):
                self.pack_without_index(os.path.join(pack_dir, key + ".pack"))

    def pack_without_index(self, path: str) -> None:
        """A pack no index lists (still so at the end of the walk): read from the pack
        itself (bounded, every object hashed), what it holds that an error of the walk
        found missing is named there, and the pack is an error when it holds any (a lost
        index: `pack` writes it again), else a warning (a pack being written or removed,
        or a crash's leftover, whose objects have other copies)."""
        rel = self.rel(path)
        unread: list[str] = []
        held = {HASH_PREFIX + raw.hex() for raw, _, _ in salvage_pack(path, unread)}
        if os.path.exists(path[: -len(".pack")] + ".idx"):
            return  # its writer published the index meanwhile
        needed = [p for p in self.report.errors if p.object in held]
        for p in needed:
            p.message += f"; {rel}, which has no index, holds it"
        damaged = f"; it does not read whole ({_short(ValueError(unread[0]), self.root)})" if unread else ""
        if needed:
            n = len({p.object for p in needed})
            self.error("missing-index", f"{rel} has no index, so no read finds the {len(held):,} object(s) it holds, "
                       f"{n:,} of them needed and found nowhere else{damaged}; `agentsession pack` rebuilds its index "
                       "from the pack", file=rel)
        else:
            self.warn("pack-without-index", f"{rel} has no index: no read finds its objects, none of which a session "
                      f"lacks (a pack being written or removed, or a crash's leftover){damaged}", file=rel)


def _place(p: FsckProblem) -> int:
    f = p.file or ""
    return 0 if f.startswith("objects") else 1 if f.startswith("sessions") else 2


def _short(exc: BaseException, root: str) -> str:
    """An error's message with the store's root taken out of the paths it names."""
    return store_relative(str(exc), root)


def fsck_files(store: Store, *, progress: Callable[[str], None] | None = None) -> FsckReport:
    """Walk the whole store directory and return what is wrong with it (see the module
    docstring). ``progress`` is called with a short phase now and then. Reads only."""
    # The walk allocates a few acyclic objects per object and per record; the cyclic
    # collector would otherwise rescan the growing sets many times (as reads pause it).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _Walk(store, progress).run()
    finally:
        if collecting:
            gc.enable()
