"""Repair: rewrite a damaged session log from what still reads, keeping the damaged log aside.

A session's log is its only record, so a line that fails its checksum where
a crash cannot explain it is damage: the session refuses to open until it is
repaired (:class:`~.errors.SessionDamagedError`). Repair is the one tool that
changes such a log, and it changes it the way a database restores a damaged
page: from what can be proved.

* Every record that reads is kept, in order, unless what it names cannot be.
* An append is kept when its two objects are whole (from ``objects/`` or from
  a payload that hashes to its id) and its parent (and every ``parents``
  entry of this session) is kept or the base. An append that cannot be kept
  is dropped and reported, with the entry it depends on; nothing is invented.
* What the damage hid is recovered only where objects prove it: a damaged
  line whose record, or whose payload, still reads whole gives its entry
  (*salvaged*), and a kept record names an entry no record appends, whose
  objects are whole in ``objects/`` (*hidden*); either is kept only when its
  objects hash to its id and it hangs from what is kept.
* A head move to an entry that is not kept goes to that entry's nearest kept
  ancestor, or, when nothing whole says what it hangs from, is left out.
* Sequence numbers are never reused: the new log ends with a ``repair`` record
  whose ``seq`` spends every number the damaged log may have given out.
* The damaged log is kept beside the new one as ``log.damaged-<UTC time>``.

``docs/repair.md`` states the rules, the output and the exit codes.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ...errors import (
    AgentSessionError,
    NoSuchObjectError,
    NoSuchSessionError,
    SessionDamagedError,
    StoreError,
)
from ...format.canonical import canonical_bytes, loads
from ...format.entry import Entry, Header, short_id
from ...format.hashing import envelope_defect, is_hash, sha256_ref
from ...format.names import check_session_id
from ...format.reader import read_session_bytes
from ...format.rules import TreeState
from ...format.timestamps import now_ts
from ...fsutil import fsync_dir, read_dense, read_small, write_all, write_atomic
from ...lean import dataclass
from ...store.session import Session, entry_from_objects, parse_header
from ...store.state import index_damage, replay
from ..base import FsckProblem, Space
from . import FileBackend
from .log import (
    ZERO_LINK,
    LogLine,
    encode_log,
    encode_record,
    header_of,
    read_log,
    scan_log,
    snapshot_id_room,
    spelled_snapshot_head,
    spelled_snapshot_ids,
    spelled_snapshot_seqs,
)
from .sessions import HEADER_LIMIT, FileSessionLog, payload_entry, read_summary
from .sweep import REPAIR_PLAN_PREFIX, SESSION_FILES

if TYPE_CHECKING:
    from ...store.store import Store

__all__ = ["DamagedLine", "Dropped", "Recovered", "RepairReport", "plan_repair", "repair_session"]

#: The shortest line an append record can be: a damaged line of N bytes held at most
#: N // this + 1 appends, which bounds the sequence numbers it may have spent.
MIN_APPEND_LINE = len(encode_record({"entry": "sha256:" + "0" * 64, "op": "append", "seq": 1}, prev=ZERO_LINK))
#: Where a record may begin inside a damaged line: its checksum, a space, its link (which
#: the damage may have changed) and a space, or (a log from before the chain) none, and a brace.
_RECORD_START = re.compile(rb"[0-9a-f]{16} (?:[^ \t\n]{16} )?\{")
_DECODER = json.JSONDecoder()
_UNKNOWN = object()  # an answer the damage took
_APPEND_MEMBERS = frozenset({"op", "seq", "entry", "head", "leaf_label", "lazy"})
#: Prefix of the name a damaged log is kept under, beside the new one.
DAMAGED_PREFIX = "log.damaged-"


# -- the report ----------------------------------------------------------------------------


@dataclass
class DamagedLine:
    """A log line that does not read (or reads, but carries a payload that does not
    hash to its entry), and the entries its bytes still legibly name."""

    line: int
    offset: int
    length: int
    reason: str
    legible: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "offset": self.offset, "length": self.length, "reason": self.reason,
                "legible": list(self.legible)}


@dataclass
class Recovered:
    """An entry whose record the damage hid, kept because its objects prove it.

    ``how`` is ``salvaged`` (a damaged line still spells its append record),
    ``hidden`` (no line spells it; a kept record names it, and its objects
    are whole in ``objects/``), ``head`` (the ``HEAD`` index names it, or
    an entry below it, and no record does: the log lost committed records) or
    ``snapshot`` (PostgreSQL: a kept snapshot an open trusts names it, standing
    for log rows that were lost)."""

    entry: str
    seq: int
    how: str
    line: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "seq": self.seq, "how": self.how, "line": self.line}


@dataclass
class Dropped:
    """An entry the repaired log does not hold, why, and the entry it depended on.

    ``reason`` is a stable word: ``objects-missing``, ``objects-corrupt``,
    ``parent-dropped``, ``parent-missing``, ``parent-on-prefix``,
    ``root-in-fork``, ``converges-dropped``, ``converges-missing``, ``parents-rule`` (another
    ``parents`` rule: the parent repeated, an entry named twice), ``no-seq``."""

    entry: str
    reason: str
    message: str
    seq: int | None = None
    line: int | None = None
    because: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "seq": self.seq, "line": self.line, "reason": self.reason,
                "message": self.message, "because": self.because}


@dataclass
class RepairReport:
    """What a repair found, would do (a plan) or did.

    ``damaged`` False means the log reads whole and nothing is to be done.
    ``repaired`` is True once the new log is in place; ``damaged_log`` is then
    the path the damaged log was kept under. ``cancelled`` is True when the
    caller's confirmation declined."""

    session: str
    damaged: bool
    why: str = ""
    damage: list[DamagedLine] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    recovered: list[Recovered] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    head: str | None = None
    head_note: str = ""
    mark: str = ""
    seq: int = 0
    create_rebuilt: bool = False
    #: Remarks on the plan, each a finding of severity ``note`` with a code (docs/repair.md), as fsck's are.
    notes: list[FsckProblem] = field(default_factory=list)
    repaired: bool = False
    cancelled: bool = False
    damaged_log: str | None = None
    #: Of a log that reads whole: the index files (HEAD, mark) that disagree with it, as
    #: (name, what it says or None when missing, what the log says); and whether they
    #: were rewritten to the log's word (the log is the record; they only lead to it).
    stale_indexes: list[tuple[str, str | None, str]] = field(default_factory=list)
    indexes_fixed: bool = False
    #: Of a log that reads whole: objects its entries need that objects/ lacks or holds
    #: corrupt, with a whole copy in the log's payload, as (space, name); written back
    #: from that copy by the repair (``objects_restored``).
    restorable: list[tuple[str, str]] = field(default_factory=list)
    objects_restored: bool = False
    #: Of a log that reads whole: objects its entries need that objects/ lacks or holds
    #: corrupt and the log carries no copy of, as (space, name): a repair of the log
    #: cannot bring them back (another store holding the session can).
    unrestorable: list[tuple[str, str]] = field(default_factory=list)
    # What executing the plan writes (not part of the report's public shape).
    _create: dict[str, Any] = field(default_factory=dict, repr=False)
    _records: list[tuple[dict[str, Any], tuple[bytes, bytes] | None]] = field(default_factory=list, repr=False)
    _objects: list[tuple[Space, str, bytes]] = field(default_factory=list, repr=False)
    _header_bytes: bytes = field(default=b"", repr=False)
    #: The damaged log's bytes as the plan read them (None: there was no log file).
    _source: bytes | None = field(default=None, repr=False)
    #: The sequence number of each kept entry.
    _kept_seqs: dict[str, int] = field(default_factory=dict, repr=False)

    def note(self, code: str, message: str, **where: Any) -> None:
        """Add a remark on the plan, coded (``where``: ``file`` relative to the store, ``line``, ``object``...)."""
        self.notes.append(FsckProblem("note", code, message, session=self.session,
                                      space="entries" if where.get("object") else None, **where))

    def as_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "damaged": self.damaged,
            "why": self.why,
            "repaired": self.repaired,
            "cancelled": self.cancelled,
            "damage": [d.as_dict() for d in self.damage],
            "create_rebuilt": self.create_rebuilt,
            "kept": len(self.kept),
            "kept_entries": [{"entry": e, "seq": self._kept_seqs.get(e)} for e in self.kept],
            "recovered": [r.as_dict() for r in self.recovered],
            "dropped": [d.as_dict() for d in self.dropped],
            "head": self.head,
            "head_note": self.head_note,
            "mark": self.mark,
            "seq": self.seq,
            "notes": [n.as_dict() for n in self.notes],
            "damaged_log": self.damaged_log,
            "stale_indexes": [{"file": n, "said": said, "log": log} for n, said, log in self.stale_indexes],
            "indexes_fixed": self.indexes_fixed,
            "restorable": [{"space": s, "name": n} for s, n in self.restorable],
            "objects_restored": self.objects_restored,
            "unrestorable": [{"space": s, "name": n} for s, n in self.unrestorable],
        }


# -- reading what the damage left ------------------------------------------------------------


@dataclass
class _Objects:
    """An entry's two objects, checked against its id, and whether objects/ lacks a sound copy."""

    entry: Entry
    content: bytes
    envelope: bytes
    write: list[tuple[Space, str, bytes]]


def _legible_records(raw: bytes) -> list[tuple[int, dict[str, Any], tuple[bytes, bytes] | None]]:
    """Records a damaged line still spells whole: (offset in the line, record, payload bytes
    as found). A record counts only when it begins as a record line does (16 hex digits, a
    space) and its bytes are exactly the canonical JSON of what they parse to, so a byte the
    damage changed in it, or a look-alike inside a string, is not taken for one. The payload
    is not checked here; its objects are checked against the record's entry later."""
    out = []
    for m in _RECORD_START.finditer(raw):
        start = m.end() - 1
        tab = raw.find(b"\t", start)
        seg = raw[start : tab if tab >= 0 else len(raw)]
        text = seg.decode("utf-8", "surrogateescape")
        try:
            obj, end = _DECODER.raw_decode(text)
            if not isinstance(obj, dict) or canonical_bytes(obj) != text[:end].encode("utf-8", "surrogateescape"):
                continue
        except (ValueError, TypeError, AgentSessionError, UnicodeEncodeError):
            continue
        payload = None
        if obj.get("op") == "append" and tab >= 0 and end == len(text):
            rest = raw[tab + 1 :]
            second = rest.find(b"\t")
            if second >= 0:
                env_text = rest[second + 1 :].decode("utf-8", "surrogateescape")
                try:
                    _, env_end = _DECODER.raw_decode(env_text)
                    env = env_text[:env_end].encode("utf-8", "surrogateescape")
                except ValueError:
                    env = b""
                payload = (rest[:second], env)
        out.append((start, obj, payload))
    return out


def _payload_pieces(raw: bytes) -> dict[str, bytes]:
    """Objects a damaged line may still carry whole, by their hash: every TAB-separated part
    of it (an append's content and envelope), and the JSON value each part begins with (in
    case the damage ran lines together). Only a piece whose hash is asked for is ever used,
    so a piece the damage changed is simply never found."""
    pieces: dict[str, bytes] = {}
    for part in raw.split(b"\t")[1:]:
        pieces[sha256_ref(part)] = part
        text = part.decode("utf-8", "surrogateescape")
        try:
            _, end = _DECODER.raw_decode(text)
        except ValueError:
            continue
        whole = text[:end].encode("utf-8", "surrogateescape")
        pieces[sha256_ref(whole)] = whole
    return pieces


def _append_shape(data: dict[str, Any]) -> bool:
    """Is a legible record a well-formed append (so its members may be trusted)?"""
    if data.get("op") != "append" or not set(data) <= _APPEND_MEMBERS:
        return False
    seq = data.get("seq")
    head = data.get("head", None)
    return (
        is_hash(data.get("entry"))
        and isinstance(seq, int) and not isinstance(seq, bool) and seq > 0
        and (head is None or is_hash(head))
        and data.get("leaf_label", True) is True
        and data.get("lazy", True) is True
    )


def _seq_of(data: dict[str, Any]) -> int | None:
    seq = data.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


# -- the plan ------------------------------------------------------------------------------


class RepairPlanner:
    """Works out a repair from the header, the log's bytes and the objects; writes nothing."""

    def __init__(
        self, store: Store, session_id: str, header: Header, header_bytes: bytes, data: bytes, why: str,
        progress: Callable[[str], None] | None = None,
    ):
        self.progress = progress or (lambda message: None)
        self.store = store
        self.sid = session_id
        self.header = header
        self.lines: list[LogLine] = scan_log(data)
        self.report = RepairReport(session=session_id, damaged=True, why=why, _header_bytes=header_bytes)
        self._objs: dict[str, _Objects | tuple[str, str]] = {}
        #: Whole objects found in the payload parts of damaged lines, by hash.
        self.pieces: dict[str, bytes] = {}
        self.kept: dict[str, int] = {}
        self.dropped: dict[str, Dropped] = {}
        self.head: str | None = None
        self.base: str | None = None
        self.prefix: frozenset[str] = frozenset()
        #: The tree rules (format/rules.py), fed each entry kept: whether an append can be
        #: kept, and where the head may rest, are their verdicts, as verify's and fsck's.
        self.tree = self._tree()
        self.mark = "mirror"
        self.out: list[tuple[dict[str, Any], tuple[bytes, bytes] | None]] = []
        self.damage_by_line: dict[int, DamagedLine] = {}
        self.head_skipped: str | None = None
        self.head_fallback = ""
        self.last_head_read = -1  # index of the last line whose head move was read (or -1: the create)
        self.last_mark_read = -1  # index of the last line whose mark was read (0: the create's)
        self.last_bad = -1  # index of the last damaged line after the create (set by run)

    # placing recovered entries

    def _deps(self, x: str, salvaged: dict[str, Any]) -> list[str]:
        """What entry ``x`` hangs from in this session (its parent and converged entries)."""
        objs = self.objects(x, salvaged[x][1] if x in salvaged else None)
        if isinstance(objs, tuple):
            return []
        out = [objs.entry.parent] if objs.entry.parent is not None else []
        out += [ref.entry for ref in objs.entry.parents if ref.session in (None, self.sid)]
        return out

    def _emit(self, x: str, salvaged: dict[str, Any], hidden: frozenset[str], emitted: set[str],
              plan: list[tuple[str, Any]]) -> None:
        """Place x after every entry of its region it hangs from (iteratively: a long
        hidden chain must not exhaust the stack)."""
        todo: list[tuple[str, bool]] = [(x, False)]
        pending: set[str] = set()
        while todo:
            node, ready = todo.pop()
            if node in emitted:
                continue
            if ready:
                emitted.add(node)
                pending.discard(node)
                plan.append(("append", node))
                continue
            if node in pending:
                continue  # a cycle (objects can be forged to make one): stop here
            pending.add(node)
            todo.append((node, True))
            for dep in reversed(self._deps(node, salvaged)):
                if (dep in salvaged or dep in hidden) and dep not in emitted and dep not in pending:
                    todo.append((dep, False))

    # objects

    def objects(self, entry_id: str, payload: tuple[bytes, bytes] | None) -> _Objects | tuple[str, str]:
        """The entry's objects from its payload where that hashes to it, else from a damaged
        line's payload parts, else from objects/; or (reason, message) saying why none holds
        them whole."""
        cached = self._objs.get(entry_id)
        if cached is not None and (not isinstance(cached, tuple) or payload is None):
            return cached  # whole objects are the same bytes whichever copy they came from
        objs = self.store.objects
        write: list[tuple[Space, str, bytes]] = []
        result: _Objects | tuple[str, str]
        try:
            if payload is not None and sha256_ref(payload[1]) == entry_id:
                env_bytes = payload[1]
                if not objs.is_sound("entries", entry_id):
                    write.append(("entries", entry_id, env_bytes))
            elif entry_id in self.pieces and not objs.is_sound("entries", entry_id):
                env_bytes = self.pieces[entry_id]
                write.append(("entries", entry_id, env_bytes))
            else:
                env_bytes = objs.get("entries", entry_id)
            env = loads(env_bytes)
            if not isinstance(env, dict) or not is_hash(env.get("content")):
                raise ValueError("its envelope is not an envelope")
            chash = env["content"]
            if payload is not None and sha256_ref(payload[0]) == chash:
                content = payload[0]
                if not objs.is_sound("contents", chash):
                    write.append(("contents", chash, content))
            elif chash in self.pieces and not objs.is_sound("contents", chash):
                content = self.pieces[chash]
                write.append(("contents", chash, content))
            else:
                content = objs.get("contents", chash)
            body = loads(content)
            if not isinstance(body, dict):
                raise ValueError("its content is not an object")
            result = _Objects(entry_from_objects(entry_id, env, body), content, env_bytes, write)
        except NoSuchObjectError as exc:
            result = ("objects-missing", f"neither objects/ nor a payload in the log holds its objects whole ({exc})")
        except (AgentSessionError, ValueError) as exc:
            result = ("objects-corrupt", f"its objects do not read: {exc}")
        self._objs[entry_id] = result
        return result

    # the walk

    def _tree(self) -> TreeState:
        above = self.prefix | {self.base} if self.base is not None else None
        return TreeState(Header({"type": "session", "id": self.sid, "base": self.base}), above=above)

    def may_hold(self, target: object) -> bool:
        return (target is None or isinstance(target, str)) and self.tree.head_allowed(target)

    def drop(self, entry_id: str, reason: str, message: str, *, seq: int | None, line: int | None, because: str | None = None) -> None:
        if entry_id not in self.dropped and entry_id not in self.kept:
            self.dropped[entry_id] = Dropped(entry_id, reason, message, seq=seq, line=line, because=because)

    def take_append(
        self,
        entry_id: str,
        seq: int | None,
        record: dict[str, Any] | None,
        payload: tuple[bytes, bytes] | None,
        *,
        line: int | None,
        index: int,
        how: str | None,
    ) -> None:
        """Keep an append if it can be kept; else drop it, saying why. ``record`` is the
        append record as read (None for an entry only its objects prove); ``how`` is None
        for a record that reads, else how the entry was recovered."""
        if entry_id in self.kept:
            if how is None and record is not None:
                # A second append of a kept entry (a re-append after a loss): it reads,
                # so it stays, and its head move counts as the store's replay counts it.
                self.apply_head(dict(record), index, payload=None)
            return
        objs = self.objects(entry_id, payload)
        if how is None and payload is not None and (isinstance(objs, tuple) or (objs.content, objs.envelope) != payload):
            ln = self.lines[index]
            if ln.line not in self.damage_by_line:
                self.damage_by_line[ln.line] = DamagedLine(
                    ln.line, ln.offset, len(ln.raw), f"carries a payload that does not hash to entry {entry_id}"
                )
                if not isinstance(objs, tuple):
                    self.report.note(
                        "bad-payload", f"log line {ln.line}: its payload does not hash to entry {short_id(entry_id)}; "
                        "the whole objects in objects/ take its place", object=entry_id, line=ln.line, offset=ln.offset,
                    )
        refusal = self.refusal(entry_id, seq, objs)
        if refusal is not None:
            reason, message, because = refusal
            if how == "salvaged" and reason.startswith("objects-"):
                message = f"damaged line {line} still spells this id, but {message}; the damage may have changed the id itself"
            self.drop(entry_id, reason, message, seq=seq, line=line, because=because)
            if record is not None and "head" in record and (how is None or how == "salvaged"):
                # Where it moved the head still says where the session was: move it to the
                # nearest kept ancestor of that entry, by a head record in its place.
                before = self.head
                went = self.move_head(record["head"], index, f"the append of {short_id(entry_id)}", quiet=True)
                if went is not _UNKNOWN and went != before:
                    self.out.append(({"op": "head", "head": went}, None))
            return
        assert not isinstance(objs, tuple) and seq is not None
        e = objs.entry
        self.kept[entry_id] = seq
        self.tree.add(e)
        self.report.kept.append(entry_id)
        self.report._objects.extend(objs.write)
        if how is not None:
            self.report.recovered.append(Recovered(entry_id, seq, how, line))
        if record is None:
            # No record says where the head went: apply the store's append rule to the
            # head as replayed so far.
            rec: dict[str, Any] = {"op": "append", "seq": seq, "entry": entry_id}
            if e.is_leaf_label:
                rec["leaf_label"] = True
                if "target" in e.data and self.may_hold(e.data.get("target")):
                    rec["head"] = e.data.get("target")
            elif e.parent == self.head:
                rec["head"] = entry_id
            if "head" in rec:
                self.head = rec["head"]
            self.out.append((rec, (objs.content, objs.envelope)))
            return
        rec = dict(record)
        rec["seq"] = seq
        self.apply_head(rec, index, payload=(objs.content, objs.envelope) if payload is not None or how else None)

    def refusal(self, entry_id: str, seq: int | None, objs: _Objects | tuple[str, str]) -> tuple[str, str, str | None] | None:
        """Why an append cannot be kept, as (reason, message, the entry it depends on), or None."""
        if isinstance(objs, tuple):
            return objs[0], objs[1], None
        e = objs.entry
        problems = self.tree.check(e)
        if problems:
            # The rule set's verdict; the words say what this repair did to cause it.
            p, parent = problems[0], e.parent
            if p.code == "base":
                if parent is None:
                    return "root-in-fork", "a root (parent null) in a session with a base", None
                return "parent-on-prefix", f"its parent {parent} is on the prefix above the base", parent
            if p.code == "parent" and isinstance(parent, str):
                if parent in self.dropped:
                    return "parent-dropped", f"its parent {parent} was dropped", parent
                return (
                    "parent-missing",
                    f"its parent {parent} is not held: no record that reads appends it, and no whole objects prove it",
                    parent,
                )
            for ref in e.parents:
                t = ref.entry
                if (ref.session is None or ref.session == self.sid) and t != self.base and t not in self.prefix and t not in self.kept:
                    word = "converges-dropped" if t in self.dropped else "converges-missing"
                    return word, f"its 'parents' names {t} of this session, which is not kept", t
            return f"{p.code}-rule", p.message, None
        if seq is None:
            return "no-seq", "no sequence number is free at its place in the log", None
        return None

    def parent_of(self, entry_id: str) -> str | None | object:
        """An entry's parent as its envelope names it (the content is not needed), or
        _UNKNOWN when no whole envelope is to be had."""
        cached = self._objs.get(entry_id)
        if cached is not None and not isinstance(cached, tuple):
            return cached.entry.parent
        env_bytes = self.pieces.get(entry_id)
        if env_bytes is None:
            try:
                env_bytes = self.store.objects.get("entries", entry_id)
            except (AgentSessionError, ValueError):
                return _UNKNOWN
        try:
            env = loads(env_bytes)
        except (AgentSessionError, ValueError):
            return _UNKNOWN
        parent = env.get("parent") if isinstance(env, dict) else _UNKNOWN
        return parent if parent is None or is_hash(parent) else _UNKNOWN

    def move_head(self, target: object, index: int, what: str, *, quiet: bool = False) -> object:
        """Apply a head move that reads: to its target when that may hold the head, else to
        the target's nearest ancestor that may (the path to it, cut where the repair cut it),
        else nowhere. Returns where the head went, or _UNKNOWN when it did not move."""
        self.last_head_read = index  # a move read, whether or not it can be kept as it is
        if self.may_hold(target):
            self.head = target  # type: ignore[assignment]
            self.head_skipped = None
            return target
        self.head_skipped = target  # type: ignore[assignment]
        t: object = target
        seen: set[object] = set()
        while not self.may_hold(t):
            if t is None or t in seen or not is_hash(t):
                t = _UNKNOWN
                break
            seen.add(t)
            t = self.parent_of(t)
            if t is _UNKNOWN:
                break
        if t is _UNKNOWN:
            self.head_fallback = "where the last kept move put it"
            if not quiet:
                self.report.note(
                    "head-left-out",
                    f"{what} moved the head to {short_id(target) if target else 'none'}, which is not kept, and what "  # type: ignore[arg-type]
                    "it hangs from cannot be followed to a kept entry: that move is left out and the head stays at "
                    f"{short_id(self.head) if self.head else 'none'}", object=target,
                )
            return _UNKNOWN
        self.head = t  # type: ignore[assignment]
        self.head_fallback = "its nearest ancestor that is kept"
        if not quiet:
            self.report.note(
                "head-to-ancestor",
                f"{what} moved the head to {short_id(target) if target else 'none'}, which is not kept; "  # type: ignore[arg-type]
                f"it moves it to {short_id(t) if t else 'none'} instead, the nearest ancestor of it that is kept",  # type: ignore[arg-type]
                object=target,
            )
        return t

    def apply_head(self, rec: dict[str, Any], index: int, payload: tuple[bytes, bytes] | None) -> None:
        """Write an append record, its head move adjusted (see :meth:`move_head`)."""
        if "head" in rec:
            went = self.move_head(rec["head"], index, f"the append of {short_id(rec.get('entry'))}")
            if went is _UNKNOWN:
                del rec["head"]
            else:
                rec["head"] = went
        self.out.append((rec, payload))

    # the whole plan

    def run(self) -> RepairReport:
        rep = self.report
        lines = self.lines
        header = self.header
        # -- the create record, or one rebuilt from the header
        first = lines[0] if lines else None
        start = 0
        create: dict[str, Any] | None = None
        if first is not None and first.record is not None and first.record.op == "create":
            create = dict(first.record.data)
            start = 1
            self.last_mark_read = 0
        else:
            legible_create = None
            if first is not None and first.record is None:
                for _, data, _ in _legible_records(first.raw):
                    if data.get("op") == "create" and data.get("session") == self.sid and data.get("base") == header.base:
                        legible_create = data
                        break
            mark = None
            if legible_create is not None and legible_create.get("mark") in ("record", "mirror"):
                mark, how = legible_create["mark"], "its damaged create record still reads it"
            else:
                mark, how = self.mark_index()
            create = {"op": "create", "session": self.sid, "base": header.base, "mark": mark}
            rep.create_rebuilt = True
            what = "is damaged" if first is not None and first.record is None else "is missing"
            rep.note(
                "create-rebuilt", f"the create record {what}; it is rebuilt from the header (base {short_id(header.base) if header.base else 'none'}) "
                f"with mark {mark} ({how}), unless a later mark record reads"
            )
        self.base = create.get("base")
        if self.base is not None:
            try:
                self.prefix = frozenset(e.id for e in self.store.path_to(self.base))
            except AgentSessionError as exc:
                raise StoreError(
                    f"session {self.sid} cannot be repaired: the prefix above its base {self.base} cannot be read ({exc}); "
                    "repair rewrites the session's log and cannot restore the entries of the prefix"
                ) from None
        self.tree = self._tree()
        self.head = self.base
        mark = create.get("mark")
        self.mark = mark if isinstance(mark, str) and mark in ("record", "mirror") else "mirror"
        rep._create = create

        # -- damaged lines: regions of consecutive bad lines, and what they still spell
        regions: list[list[int]] = []
        for i, ln in enumerate(lines):
            if ln.record is not None:
                continue
            if regions and regions[-1][-1] == i - 1:
                regions[-1].append(i)
            else:
                regions.append([i])
            d = DamagedLine(ln.line, ln.offset, len(ln.raw), ln.reason or "does not read")
            self.damage_by_line[ln.line] = d
        region_of = {i: r for r, idxs in enumerate(regions) for i in idxs}
        legible: dict[int, list[tuple[dict[str, Any], tuple[bytes, bytes] | None, int]]] = {}
        line_pieces: dict[int, dict[str, bytes]] = {}
        snapshot_ids: dict[int, list[tuple[int, str]]] = {}
        snapshot_seqs: dict[int, list[int]] = {}  # (each held id's number, where the line's seqs read)
        snapshot_seq: dict[str, int] = {}  # (a spelled id's number, so read)
        snapshot_held: dict[int, int] = {}  # (how many ids a snapshot line held, read or not)
        for idxs in regions:
            for i in idxs:
                line_pieces[i] = _payload_pieces(lines[i].raw)
                self.pieces.update(line_pieces[i])
                snapshot_ids[i] = spelled_snapshot_ids(lines[i].raw)
                snapshot_held[i] = max(snapshot_id_room(lines[i].raw), len(snapshot_ids[i]))
                seqs = spelled_snapshot_seqs(lines[i].raw) if snapshot_ids[i] else None
                if seqs is not None:
                    snapshot_seqs[i] = seqs
        for r, idxs in enumerate(regions):
            items = []
            for i in idxs:
                for _, data, payload in _legible_records(lines[i].raw):
                    op = data.get("op")
                    if op == "append" and _append_shape(data):
                        items.append((data, payload, i))
                        self.damage_by_line[lines[i].line].legible.append(data["entry"])
                    elif op == "head" and set(data) == {"op", "head"} and (data["head"] is None or is_hash(data["head"])):
                        items.append((data, None, i))
                    elif op == "mark" and set(data) == {"op", "mark"} and data["mark"] in ("record", "mirror"):
                        items.append((data, None, i))
            legible[r] = items

        # -- which entries are appended by a record that reads, or one still legible
        appended: set[str] = set()
        for ln in lines[start:]:
            if ln.record is not None and ln.record.op == "append" and is_hash(ln.record.get("entry")):
                appended.add(ln.record.get("entry"))
        readable_appended = frozenset(appended)
        for items in legible.values():
            for data, _, _ in items:
                if data["op"] == "append" and data["entry"] not in appended:
                    appended.add(data["entry"])
        # An envelope whole in a damaged line's payload, with its content whole too, is an
        # append of this session (only appends carry payloads) even when its record is gone.
        # A line carries one append: where its record still reads, an envelope there that is
        # not that record's entry is what the damage made of it (another ts, another type),
        # an entry nobody wrote, and is never taken for one.
        # A damaged snapshot line (a compaction's: every id it folded, in log order) still
        # spells most of its ids: each one objects/ proves whole is an append of it too.
        spelled = {i for items in legible.values() for data, _, i in items if data["op"] == "append"}
        payload_only: dict[int, dict[str, int]] = {r: {} for r in range(len(regions))}
        for r, idxs in enumerate(regions):
            for i in idxs:
                if i in spelled:
                    continue
                for h, piece in line_pieces[i].items():
                    if h in appended or h == self.base or h in self.prefix:
                        continue
                    try:
                        env = loads(piece)
                    except (ValueError, AgentSessionError):
                        continue
                    if envelope_defect(env) is None:
                        if not isinstance(self.objects(h, None), tuple):
                            payload_only[r][h] = i
                            appended.add(h)
                numbers = snapshot_seqs.get(i, [])
                proved = 0
                for place, h in snapshot_ids.get(i, ()):
                    if h in appended or h == self.base or h in self.prefix:
                        proved += 1
                    elif not isinstance(self.objects(h, None), tuple):
                        proved += 1
                        payload_only[r][h] = i
                        appended.add(h)
                        if place < len(numbers):
                            snapshot_seq[h] = numbers[place]
                held = snapshot_held[i]
                if held > proved:
                    ln = lines[i]
                    rep.note(
                        "snapshot-ids-unread",
                        f"log line {ln.line}: a damaged snapshot held {held} entr{'y' if held == 1 else 'ies'}, and "
                        f"{held - proved} of their ids no longer read or name no whole objects: such an entry is taken "
                        "back only where a kept entry or HEAD names it; what objects/ holds of it stays until a sweep",
                        line=ln.line, offset=ln.offset)

        # -- hidden entries: named by a kept record (parent, parents, head) but appended by
        # no record that reads; anchored at the last damaged region before the first name.
        anchor: dict[str, int] = {}
        order_found: list[str] = []

        region_ends = [idxs[-1] for idxs in regions]

        def region_before(i: int) -> int | None:
            """The damaged region holding line index i, else the last one before it."""
            if i in region_of:
                return region_of[i]
            r = bisect.bisect_left(region_ends, i) - 1
            return r if r >= 0 else None

        def refs_of(data: dict[str, Any], payload: tuple[bytes, bytes] | None) -> list[str]:
            out: list[str] = []
            if data.get("op") == "append":
                objs = self.objects(data["entry"], payload)
                if not isinstance(objs, tuple):
                    e = objs.entry
                    if e.parent is not None:
                        out.append(e.parent)
                    out.extend(ref.entry for ref in e.parents if ref.session in (None, self.sid))
            if is_hash(data.get("head")) and data.get("head") != data.get("entry"):
                out.append(data["head"])
            return out

        def name(target: str, r: int | None) -> None:
            if r is None or target in appended or target == self.base or target in self.prefix:
                return
            if target not in anchor:
                anchor[target] = r
                order_found.append(target)
            elif r < anchor[target]:
                anchor[target] = r

        positions: list[tuple[int, dict[str, Any], tuple[bytes, bytes] | None]] = []
        for i in range(start, len(lines)):
            ln = lines[i]
            if ln.record is not None:
                positions.append((i, ln.record.data, ln.record.payload))
            elif i == regions[region_of[i]][0]:
                r = region_of[i]
                for data, payload, j in legible[r]:
                    positions.append((j, data, payload))
                for h, j in payload_only[r].items():
                    positions.append((j, {"op": "append", "entry": h}, None))
        for k, (i, data, payload) in enumerate(positions):
            if k % 2000 == 0:
                self.progress(f"checking objects: {k}/{len(positions)} records")
            for target in refs_of(data, payload):
                name(target, region_before(i))
        self.progress("placing what the damage hid")
        # Their ancestors the damage also hid join them, at the same place or earlier.
        hidden_failed: dict[str, tuple[str, str]] = {}
        queue = list(order_found)
        while queue:
            h = queue.pop(0)
            objs = self.objects(h, None)
            if isinstance(objs, tuple):
                hidden_failed[h] = objs
                continue
            needs = [objs.entry.parent] if objs.entry.parent is not None else []
            needs += [ref.entry for ref in objs.entry.parents if ref.session in (None, self.sid)]
            for t in needs:
                if t in appended or t == self.base or t in self.prefix:
                    continue
                if t not in anchor:
                    anchor[t] = anchor[h]
                    order_found.append(t)
                    queue.append(t)
                elif anchor[t] > anchor[h]:
                    anchor[t] = anchor[h]  # it must come before h: move it, and its own ancestors
                    queue.append(t)

        # -- each region's items in the order they are written: legible records in line
        # order, every recovered entry after the ones it hangs from.
        plans: dict[int, list[tuple[str, Any]]] = {}
        hidden_by_region: dict[int, list[str]] = {}
        for h in order_found:
            if h not in hidden_failed:
                hidden_by_region.setdefault(anchor[h], []).append(h)
        for r in range(len(regions)):
            hidden_here = hidden_by_region.get(r, [])
            salvaged_here: dict[str, tuple[dict[str, Any] | None, tuple[bytes, bytes] | None, int]] = {
                d["entry"]: (d, p, j) for d, p, j in legible[r] if d["op"] == "append" and d["entry"] not in readable_appended
            }
            for h, j in payload_only[r].items():
                salvaged_here.setdefault(h, (None, None, j))
            hidden_set = frozenset(hidden_here)
            emitted: set[str] = set()
            plan: list[tuple[str, Any]] = []

            def emit(x: str, salvaged: dict[str, Any] = salvaged_here, hidden: frozenset[str] = hidden_set,
                     done: set[str] = emitted, into: list[tuple[str, Any]] = plan) -> None:
                self._emit(x, salvaged, hidden, done, into)

            # What the region's lines still say, in line order: legible records and
            # payload-only appends; then what it hid.
            said: list[tuple[int, int, dict[str, Any] | None, str | None]] = [
                (j, k, data, None) for k, (data, _, j) in enumerate(legible[r])
            ]
            said += [(j, len(said) + k, None, h) for k, (h, j) in enumerate(payload_only[r].items())]
            # A snapshot line's entries taken back each continue the head as an append
            # does, but the records the snapshot replaced may have left it elsewhere (a
            # head moved back, then a branch): where its own head member still reads, the
            # head goes there after them, at the line's own place (before later lines).
            for j in regions[r]:
                left = spelled_snapshot_head(lines[j].raw) if snapshot_ids.get(j) else None
                if left is not None:
                    said.append((j, len(said) + len(lines[j].raw), {"op": "head", "head": left}, None))
            said.sort(key=lambda t: (t[0], t[1]))
            for j, _, said_data, said_h in said:
                if said_data is None:
                    assert said_h is not None
                    emit(said_h)
                elif said_data["op"] == "append":
                    if said_data["entry"] in salvaged_here:
                        emit(said_data["entry"])
                else:
                    if said_data["op"] == "head" and said_data["head"] in hidden_set:
                        emit(said_data["head"])
                    plan.append((said_data["op"], (said_data, j)))
            for h in hidden_here:
                emit(h)
            plans[r] = [(kind, x if kind != "append" else (x, salvaged_here.get(x))) for kind, x in plan]

        # -- sequence numbers: each recovered append takes one the damaged region may have
        # held, below the next readable one; never one a record that reads holds.
        readable_seqs: set[int] = set()
        for ln in lines:
            if ln.record is not None and ln.record.op in ("append", "loss"):
                s = _seq_of(ln.record.data)
                if s is not None:
                    readable_seqs.add(s)
        spent = 0
        for ln in lines:
            if ln.record is not None and ln.record.op in ("append", "loss", "repair"):
                spent = max(spent, _seq_of(ln.record.data) or 0)
        # Highest number given out before each line, lowest given out after it.
        n = len(lines)
        max_before = [0] * (n + 1)
        for i, ln in enumerate(lines):
            s_i = _seq_of(ln.record.data) if ln.record is not None and ln.record.op in ("append", "loss", "repair") else None
            max_before[i + 1] = max(max_before[i], s_i or 0)
        min_after: list[int | None] = [None] * (n + 1)
        for i in range(n - 1, -1, -1):
            ln = lines[i]
            s_i = _seq_of(ln.record.data) if ln.record is not None and ln.record.op in ("append", "loss") else None
            nxt = min_after[i + 1]
            min_after[i] = s_i if nxt is None else (nxt if s_i is None else min(s_i, nxt))
        assigned: dict[tuple[int, str], int] = {}
        prev_top = 0
        for r, idxs in enumerate(regions):
            lo = max(prev_top, max_before[idxs[0]])
            after = min_after[idxs[-1] + 1]
            if after is not None:
                hi = after
            else:
                # Nothing after says where numbering went on: the lines may have held as
                # many appends as their bytes allow, and every one of those numbers is spent.
                # (a snapshot line holds an append in the 43 bytes of its id's base64,
                # each id it held counted, spelled or not)
                hi = lo + sum(snapshot_held[i] or len(lines[i].raw) // MIN_APPEND_LINE + 1 for i in idxs) + 1
                hi = max([hi, *(max(snapshot_seqs[i], default=0) + 1 for i in idxs if i in snapshot_seqs)])
                spent = max(spent, hi - 1)
            ceiling = hi
            used: set[int] = set()
            for kind, x in reversed(plans[r]):
                if kind != "append":
                    continue
                entry_id, salv = x
                want = salv[0]["seq"] if salv is not None and salv[0] is not None else snapshot_seq.get(entry_id)
                if want is not None and lo < want < ceiling and want not in readable_seqs and want not in used:
                    s = want
                else:
                    s = ceiling - 1
                    while s > lo and (s in readable_seqs or s in used):
                        s -= 1
                    if s <= lo:
                        continue
                used.add(s)
                assigned[(r, entry_id)] = s
                ceiling = s
            prev_top = max(lo, hi - 1) if after is None else lo
        # -- the walk: every record in order, damaged regions in their place
        self.progress("deciding what is kept")
        for i in range(start, len(lines)):
            ln = lines[i]
            if ln.record is None:
                r = region_of[i]
                if i != regions[r][0]:
                    continue
                for kind, x in plans[r]:
                    if kind == "append":
                        entry_id, salv = x
                        seq = assigned.get((r, entry_id))
                        if salv is not None:
                            data, payload, j = salv
                            self.take_append(entry_id, seq, data, payload, line=lines[j].line, index=j, how="salvaged")
                        else:
                            self.take_append(entry_id, seq, None, None, line=None, index=i, how="hidden")
                    elif kind == "head":
                        data, j = x
                        if self.may_hold(data["head"]):
                            self.head = data["head"]
                            self.last_head_read = j
                            self.out.append((dict(data), None))
                    elif kind == "mark":
                        data, j = x
                        self.mark = data["mark"]
                        self.last_mark_read = j
                        self.out.append((dict(data), None))
                continue
            rec = ln.record
            op = rec.op
            if op == "append":
                entry_id = rec.get("entry")
                if not is_hash(entry_id):
                    rep.note("bad-record", f"log line {ln.line}: an append record naming no entry id is left out",
                             line=ln.line, offset=ln.offset)
                    continue
                self.take_append(entry_id, _seq_of(rec.data), rec.data, rec.payload, line=ln.line, index=i, how=None)
            elif op == "head":
                went = self.move_head(rec.get("head"), i, f"log line {ln.line}, a head record,")
                if went is not _UNKNOWN:
                    self.out.append(({"op": "head", "head": went}, None))
            elif op == "mark":
                if rec.get("mark") in ("record", "mirror"):
                    self.mark = rec.get("mark")
                    self.last_mark_read = i
                self.out.append((dict(rec.data), None))
            elif op == "create":
                rep.note("log-order", f"log line {ln.line}: a second create record (only line 1 may hold one) is left out",
                         line=ln.line, offset=ln.offset)
            else:  # commit, checkpoint, loss, repair: kept as they read
                self.out.append((dict(rec.data), rec.payload))
        # Entries named as hidden whose objects do not prove them: say so once, by name.
        for h in order_found:
            if h in hidden_failed and any(d.because == h for d in self.dropped.values()):
                reason, message = hidden_failed[h]
                self.drop(h, reason, f"named by a record that reads, but its own record is damaged; {message}",
                          seq=None, line=None)
        for (_r, entry_id), s in assigned.items():
            if entry_id in self.kept:
                spent = max(spent, s)
        claimed, last = self.summary_index()
        spent = self.recover_from_head(spent, len(lines), claimed, last)
        if claimed > spent:
            rep.note("seq-from-summary", f"the session's summary says its log gave out sequence numbers up to {claimed}; "
                     f"none after {spent} is given out again (entries the log lost may hold them)", file=f"sessions/{self.sid}/summary")
            spent = claimed
        rep.seq = spent
        rep._kept_seqs = dict(self.kept)
        rep.head = self.head
        rep.mark = self.mark
        # Entries no record holds first (the causes), then the log's order.
        rep.dropped = sorted(self.dropped.values(), key=lambda d: (d.seq is not None, d.seq or 0, d.entry))
        rep.damage = [self.damage_by_line[k] for k in sorted(self.damage_by_line)]
        rep._records = self.out
        # A damaged create line sets no head: only later damaged lines make the head uncertain.
        self.last_bad = max((i for i, ln in enumerate(lines) if ln.record is None and i > 0), default=-1)
        if self.last_bad > self.last_head_read:
            rep.head_note = (
                "the last head the repair could read; a damaged line after it may have moved the head "
                "or appended entries the repair cannot name"
            )
        elif self.head_skipped is not None:
            rep.head_note = (
                f"{self.head_fallback}; the log last named {short_id(self.head_skipped)}, which is not kept"
            )
        else:
            rep.head_note = "as the log last named it"
        return rep

    def recover_from_head(self, spent: int, index: int, claimed: int = 0, last: str | None = None) -> int:
        """What the head index proves. A log cut short at a record boundary (committed
        appends gone, every remaining record sound) leaves HEAD naming an entry no record
        holds; the entries from it up to what is kept (or the base, or a root) are taken
        back from objects/, each under a sequence number after every one the log spent,
        and the head goes back to where HEAD says. Returns the last number spent.

        ``claimed`` is the highest number the summary says the log gave out, and
        ``last`` the entry it gave that number. When the entries taken back are exactly
        as many as the numbers after ``spent`` up to it, and the last of them (HEAD's) is
        ``last``, they are those appends (each spent one, a child after its parent), so
        they take those numbers back. Otherwise the lost numbers may belong to others (a
        branch off HEAD's path, a repeat), or the summary is older than the log (written
        at an earlier close: entries after it are unknown), and the entries are
        numbered after ``claimed``."""
        target = self.head_index()
        if target is None or target == self.base or target in self.kept:
            return spent
        chain: list[str] = []
        t: str | None = target
        seen: set[str] = set()
        while t is not None and t != self.base and t not in self.kept:
            if t in seen:
                self.report.note("broken-chain", f"HEAD names {short_id(target)}, whose parents loop: nothing is taken "
                                 "from it", object=target, file=self.head_file())
                return spent
            seen.add(t)
            objs = self.objects(t, None)
            if isinstance(objs, tuple) and t == target:
                self.report.note(
                    "head-unproved",
                    f"HEAD names {short_id(target)}, which no record holds and no object proves ({objs[1]}): HEAD "
                    "itself may be damaged (a changed byte), or the log lost records whose objects went with them; "
                    "nothing is taken from it, and the head is where the log puts it", object=target, file=self.head_file(),
                )
                return spent
            if isinstance(objs, tuple):
                self.report.note(
                    "missing-object",
                    f"HEAD names {short_id(target)}, which no record holds; its ancestor {short_id(t)} cannot be read "
                    f"({objs[1]}), so the entries between are lost", object=t, file=self.head_file(),
                )
                return spent
            chain.append(t)
            t = objs.entry.parent
        if t is None and self.base is not None:
            self.report.note("head-unproved", f"HEAD names {short_id(target)}, which hangs from no entry of this fork: "
                             "not taken", object=target, file=self.head_file())
            return spent
        if claimed > spent and (len(chain) != claimed - spent or last != target):
            self.report.note(
                "seq-from-summary", f"the session's summary says its log gave out sequence numbers up to {claimed}; "
                f"the {len(chain)} entr{'y' if len(chain) == 1 else 'ies'} HEAD proves are numbered after them (of the "
                f"{claimed - spent} numbers the log lost, which each holds cannot be told)",
                file=f"sessions/{self.sid}/summary")
            spent = claimed
        for eid in reversed(chain):
            spent += 1
            self.take_append(eid, spent, None, None, line=None, index=index, how="head")
        if target in self.kept and self.head != target and self.may_hold(target):
            self.head = target
            self.out.append(({"op": "head", "head": target}, None))
        if target in self.kept:
            self.report.note(
                "log-cut", f"HEAD names {short_id(target)}, which no record of the log holds (the log lost committed records): "
                f"{len(chain)} entr{'y' if len(chain) == 1 else 'ies'} from it up to what the log holds are taken "
                "back from objects/", object=target, file=self.head_file(),
            )
            self.last_head_read = index
        return spent

    def summary_index(self) -> tuple[int, str | None]:
        """The highest sequence number the session's ``summary`` (an index, used only when
        its checksum holds) says the log gave out (else 0: more numbers spent than the
        damage shows costs nothing, one given again could name two entries), and the
        entry it says it gave that number (the last it counted), when it names one."""
        kept = read_summary(_files(self.store).sessions.dir(self.sid))
        data = kept[0] if kept is not None else {}
        seq, last = data.get("seq"), data.get("last_entry")
        return (seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else 0,
                last if isinstance(last, str) else None)

    def head_file(self) -> str:
        """Where the head index lies, relative to the store (what a note on it names)."""
        return f"sessions/{self.sid}/HEAD"

    def head_index(self) -> str | None:
        """What the ``HEAD`` index file names, when it names an entry."""
        try:
            text = read_small(os.path.join(_files(self.store).sessions.dir(self.sid), "HEAD"), 200).decode("ascii", "replace").strip()
        except OSError:
            return None
        return text if is_hash(text) else None

    def mark_index(self) -> tuple[str, str]:
        """The mark when the create record is lost: the ``mark`` index file when it says
        one, else ``mirror`` (which refuses local writes rather than risk them)."""
        try:
            text = read_small(os.path.join(_files(self.store).sessions.dir(self.sid), "mark"), 200).decode("ascii", "replace").strip()
        except OSError:
            text = ""
        if text in ("record", "mirror"):
            return text, "from the mark index file"
        return "mirror", "the mark index file says neither, so the safer mirror"


# -- the entry points ------------------------------------------------------------------------


def _files(store: Store) -> FileBackend:
    backend = store.backend
    assert isinstance(backend, FileBackend), "repair of this module is the file backend's"
    return backend


def _damaged_log_name() -> str:
    return DAMAGED_PREFIX + datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def plan_repair(
    store: Store, session_id: str, *, progress: Callable[[str], None] | None = None
) -> RepairReport:
    """What a repair of the session would keep, recover and drop, reading only: no lock is
    taken and nothing is written (``--dry-run``). A session whose log reads is reported
    not damaged. ``progress`` is called with a short phase now and then (a long log)."""
    check_session_id(session_id)
    if session_id not in store:
        lost = lost_header(store, session_id)
        if lost is None:
            raise NoSuchSessionError(f"no such session: {session_id}")
        lost_report = RepairReport(
            session=session_id, damaged=False, why="its header file is missing, and its log holds the header",
            stale_indexes=[("header", None, lost.decode("utf-8").strip())],
        )
        lost_report.note("missing-header", "the rest of the session is planned when the repair runs, from the header "
                         "its log holds (the file is written with the rest)", file=f"sessions/{session_id}/header")
        return lost_report
    try:
        probe = Session._open(store, session_id, writable=False)
    except SessionDamagedError as exc:
        return _plan_damaged(store, session_id, exc.why, progress)  # (the report names the session itself)
    try:
        # The read-only open reads a torn line's number back from its bytes; the log as
        # fsck, a sweep and the writing open read it (without its torn tail, against the
        # kept summary) may have lost committed records all the same: repaired as they
        # see it, or the session and every sweep stayed refused with nothing to repair.
        cut = next((p.message for p in store.history(session_id).damage if p.code == "log-cut"), None)
        if cut is not None:
            return _plan_damaged(store, session_id, cut, progress)
        return _plan_sound(store, probe)
    finally:
        probe.close()


def _plan_sound(store: Store, probe: Session) -> RepairReport:
    """The report on a session whose log reads whole (``probe``, opened read-only): its
    index files that disagree with the log, and the objects only the log holds."""
    sdir = _files(store).sessions.dir(probe.id)
    report = RepairReport(
        session=probe.id, damaged=False, why="its log reads whole", kept=list(probe.log_order),
        head=probe.head, mark=probe.mark, seq=probe.state.max_seq, head_note="as the log names it",
        _kept_seqs=dict(probe.own),
        stale_indexes=_stale_indexes(sdir, probe.head, probe.mark),
    )
    try:
        logged = _logged_header(read_dense(os.path.join(sdir, "log")))
    except OSError:
        logged = None
    if logged is not None:
        # The log holds the header: a header file that differs (garbled, edited, lost) is a stale
        # index of it (fsck's stale-header, missing-header), already served from the log.
        report.stale_indexes[:0] = _stale_indexes(sdir, header=logged)
    report._objects = _restorable_objects(store, sdir)
    report.restorable = [(space, name) for space, name, _ in report._objects]
    return report


def _plan_damaged(store: Store, session_id: str, why: str, progress: Callable[[str], None] | None) -> RepairReport:
    """The plan for a session whose open found it damaged (``why``), from its log's bytes,
    the header its log holds (else its header file) and the objects."""
    sdir = _files(store).sessions.dir(session_id)
    source: bytes | None
    try:
        source = read_dense(os.path.join(sdir, "log"))  # a FIFO or a link there is refused, never waited on; holes are not read
    except FileNotFoundError:
        source = None
    except OSError as exc:
        raise StoreError(f"session {session_id}: its log cannot be read ({exc}); repair needs it") from None
    # The log holds the header (its create record, later header records): a line of it
    # that reads is worth more than the header file, which may be what is damaged.
    logged = _logged_header(source or b"")
    if logged is not None:
        header_bytes = logged
    else:
        try:
            header_bytes = read_small(os.path.join(sdir, "header"), HEADER_LIMIT)
        except OSError as exc:
            raise StoreError(f"session {session_id}: its header cannot be read ({exc}); repair needs it") from None
    header = parse_header(session_id, header_bytes)
    report = RepairPlanner(store, session_id, header, header_bytes, source or b"", why, progress).run()
    report._source = source
    if report._create:
        report._create = dict(report._create, header=header.data)  # the log keeps holding it
    return report


def _plan_lost_header(
    store: Store, session_id: str, lost: bytes, progress: Callable[[str], None] | None
) -> RepairReport:
    """The plan for a session whose header file is gone, from the header its log holds
    (``lost``), held in memory: nothing is written in the session directory. Its files
    are opened as the store opens them (the log, its replay, its indexes) from a stage in
    ``tmp/`` holding hard links to them and the header, removed before this returns; the
    header file is written by the repair with the rest (after a confirmation, where one
    is asked), or not at all."""
    backend = _files(store)
    sdir = backend.sessions.dir(session_id)
    stage = os.path.join(backend.root, "tmp", f"{REPAIR_PLAN_PREFIX}{session_id}-{os.getpid()}-{os.urandom(4).hex()}")
    os.makedirs(stage)
    try:
        for name in os.listdir(sdir):
            # Regular files only: the open takes an index that is no file as absent, and
            # a log that is none as the damage the plan then reads from the session itself.
            if name in SESSION_FILES and stat.S_ISREG(os.lstat(os.path.join(sdir, name)).st_mode):
                _link_or_copy(os.path.join(sdir, name), os.path.join(stage, name))
        with open(os.path.join(stage, "header"), "wb") as f:
            f.write(lost)
        try:
            with _staged_session(store, session_id, stage) as (probe, damage):
                if not damage:
                    return _plan_sound(store, probe)
                why = damage[0]
        except SessionDamagedError as exc:
            why = exc.why
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    report = _plan_damaged(store, session_id, why, progress)
    report.stale_indexes.insert(0, ("header", None, lost.decode("utf-8").strip()))
    return report


def build_log(report: RepairReport, damaged_log: str | None) -> bytes:
    repair: dict[str, Any] = {
        "op": "repair",
        "at": now_ts(),
        "damaged_log": damaged_log,
        "damage": [{"line": d.line, "offset": d.offset, "reason": d.reason} for d in report.damage],
        "dropped": [{"entry": d.entry, "seq": d.seq, "reason": d.reason} for d in report.dropped],
        "recovered": [{"entry": r.entry, "seq": r.seq, "how": r.how} for r in report.recovered],
        "seq": report.seq,
    }
    records: list[dict[str, Any] | tuple[dict[str, Any], tuple[bytes, bytes] | None]] = [report._create]
    records.extend((data, payload) for data, payload in report._records)
    records.append(repair)
    records.append({"op": "commit"})
    records.append({"op": "checkpoint"})  # every kept entry's objects are in objects/ first
    return encode_log(records)


@contextmanager
def _staged_session(store: Store, session_id: str, stage: str) -> Iterator[tuple[Session, list[str]]]:
    """The session whose files are in ``stage`` opened read-only, as an open from the
    store would (the log read and recovered as a snapshot, replayed, its ``HEAD`` held to
    it), and why it is damaged: the replay's faults, then an index that leads the log.
    A log that does not read raises :class:`SessionDamagedError`, as the open does."""
    backend = store.backend
    assert isinstance(backend, FileBackend)
    log = FileSessionLog(backend, session_id)
    log.dir = stage
    try:
        opened = log._open(False)
        state = replay(opened.records)
        damage = [why for _, why in state.damage]
        lead = index_damage(state, opened.head_index, opened.length_index)
        if lead is not None:
            damage.append(lead)
        s = Session(store, session_id, log, Header(loads(opened.header)), state)
        s.recovered = list(opened.recovered)
        yield s, damage
    finally:
        log.close()


def _check_staged(store: Store, session_id: str, stage: str, report: RepairReport) -> None:
    """Open the new log as the store would (from a staging directory) and project it: the
    repaired session must open, replay to the plan, and verify, before it replaces anything."""
    try:
        with _staged_session(store, session_id, stage) as (s, problems):
            state = s.state
            if state.log_order != report.kept:
                problems.append("the entries it replays differ from the plan")
            if state.head != report.head or state.mark != report.mark:
                problems.append("its head or mark differ from the plan")
            assert isinstance(s.log, FileSessionLog)
            if s.recovered or s.log.payloads:
                problems.append("it would need recovery when opened")
            sf = read_session_bytes(s.projection(), source=session_id)
            problems.extend(str(p) for p in sf.all_problems())
    except AgentSessionError as exc:
        problems = [str(exc)]
    if problems:
        raise StoreError(
            f"session {session_id} was not repaired: the log the repair built does not read back ({problems[0]}); "
            "nothing was changed (please report this)"
        )


def _link_or_copy(src: str, dst: str) -> None:
    """``src`` under the name ``dst`` too: a hard link where the filesystem allows (no
    copy; a link or a FIFO is linked as it is, never followed or read), else a copy of a
    regular file, fsynced (in pieces: a sparse log of gigabytes is never held)."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        if not stat.S_ISREG(os.lstat(src).st_mode):
            raise
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with open(src, "rb") as f:
                while chunk := f.read(1 << 22):
                    write_all(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)


def _keep_aside(log_path: str, aside: str) -> None:
    """The damaged log under its new name, durably, before anything replaces it."""
    _link_or_copy(log_path, aside)
    fsync_dir(os.path.dirname(log_path))


def _existing_aside(sdir: str, log_path: str, data: bytes) -> str | None:
    """The name of a kept copy of this very log, left by a repair interrupted before it
    replaced the log: a re-run reuses it rather than keep a second copy."""
    for name in sorted(os.listdir(sdir)):
        if not name.startswith(DAMAGED_PREFIX):
            continue
        path = os.path.join(sdir, name)
        try:
            if os.path.samefile(path, log_path):
                return name
            if os.path.getsize(path) == len(data):
                if read_dense(path) == data:
                    return name
        except OSError:
            continue
    return None


def _restorable_objects(store: Store, sdir: str) -> list[tuple[Space, str, bytes]]:
    """The objects a whole log's appends carry in their payloads (checked against the
    entry id) that objects/ lacks or holds corrupt: nothing else holds them, so a
    repair writes them back rather than leave the session unreadable."""
    try:
        records = read_log(read_dense(os.path.join(sdir, "log"))).records
    except OSError:
        return []
    objects = _files(store).objects
    out: list[tuple[Space, str, bytes]] = []
    seen: set[tuple[str, str]] = set()
    for r in records:
        entry = r.get("entry")
        if r.op != "append" or r.payload is None or not isinstance(entry, str):
            continue
        if payload_entry(entry, r.payload) is None:
            continue  # a payload that does not prove itself restores nothing
        content, env = r.payload
        pair: tuple[tuple[Space, str, bytes], ...] = (("entries", entry, env), ("contents", sha256_ref(content), content))
        for space, name, data in pair:
            if (space, name) not in seen and not objects.is_sound_here(space, name):
                out.append((space, name, data))
            seen.add((space, name))
    return out


def _stale_indexes(
    sdir: str, head: str | None = None, mark: str | None = None, *, header: bytes | None = None
) -> list[tuple[str, str | None, str]]:
    """The index files of a session directory that disagree with its log's head and mark
    (or, given ``header``, the header file with the header the log holds): byte for byte,
    as fsck compares them (a stray byte around the value is stale too)."""
    out: list[tuple[str, str | None, str]] = []
    files = [("header", header.decode("utf-8").strip(), HEADER_LIMIT)] if header is not None else []
    if mark is not None:
        files += [("HEAD", head or "", 4096), ("mark", mark, 4096)]
    for name, value, limit in files:
        try:
            raw: bytes | None = read_small(os.path.join(sdir, name), limit)
        except OSError:
            raw = None
        if raw != f"{value}\n".encode():
            said = None if raw is None else raw.decode("utf-8", "replace").strip()
            out.append((name, said, value))
    return out


def check_repairable(store: Store, session_id: str, *, held: bool = False) -> None:
    """What any backend's repair refuses before taking the session: a read-only store, a
    bad id, a session this process has open, an absent one (``held``: the backend holds
    it all the same, unlisted: see :func:`lost_header`)."""
    store._require_writable()
    check_session_id(session_id)
    if store.opened(session_id) is not None:
        raise StoreError(f"session {session_id} is open in this process; close it before repairing it")
    if session_id not in store and not held:
        raise NoSuchSessionError(f"no such session: {session_id}")


def lost_header(store: Store, session_id: str) -> bytes | None:
    """The header a session's log holds, when its header file is gone (fsck's
    ``missing-header``: the store lists it no more). The file is an index of the log,
    which repair writes again; None when the file is there or no log holds a header."""
    if not isinstance(store.backend, FileBackend):
        return None
    sdir = _files(store).sessions.dir(session_id)
    if os.path.lexists(os.path.join(sdir, "header")):
        return None
    try:
        source = read_dense(os.path.join(sdir, "log"))
    except OSError:
        return None
    return _logged_header(source)


def _logged_header(log: bytes) -> bytes | None:
    """The header a log's records hold (its create record, later header records), as the
    header file holds it; None when none reads. Worth more than the file, its index."""
    logged = header_of(ln.record for ln in scan_log(log) if ln.record is not None)
    return None if logged is None else canonical_bytes(logged) + b"\n"


def repair_session(
    store: Store,
    session_id: str,
    *,
    confirm: Callable[[RepairReport], bool] | None = None,
    progress: Callable[[str], None] | None = None,
) -> RepairReport:
    """Repair a damaged session under its lock (see the module's docstring for the rules).

    ``confirm`` is called with the plan, with the lock held, before anything is
    written; returning False cancels (``cancelled`` is then True). A session that
    is not damaged is left as it is. Raises :class:`SessionLockedError` when
    another process holds the session."""
    lost = lost_header(store, session_id) if session_id not in store else None
    check_repairable(store, session_id, held=lost is not None)
    lock = _files(store).sessions.lock(session_id)
    try:
        # A lost header file is planned from the header the log holds, in memory: it is
        # written with the rest (a stale index), after the confirmation, never before.
        report = (plan_repair(store, session_id, progress=progress) if lost is None
                  else _plan_lost_header(store, session_id, lost, progress))
        if not report.damaged:
            if report._objects:
                store.objects.put_many(report._objects)
                report.objects_restored = True
            if report.stale_indexes:
                # Under the lock, no writer can be about to rewrite them: the log's word.
                sdir = _files(store).sessions.dir(session_id)
                for name, _, value in report.stale_indexes:
                    write_atomic(os.path.join(sdir, name), (value + "\n").encode(), durable=True)
                report.indexes_fixed = True
            return report
        if confirm is not None and not confirm(report):
            report.cancelled = True
            return report
        sdir = _files(store).sessions.dir(session_id)
        log_path = os.path.join(sdir, "log")
        before = report._source
        # 1. Objects first: every kept entry's objects are then in objects/, durably.
        say = progress or (lambda message: None)
        if report._objects:
            say(f"writing {len(report._objects)} objects the log alone held")
            store.objects.put_many(list({(s, n): (s, n, b) for s, n, b in report._objects}.values()))
        # 2. The new log, staged and checked before it replaces anything.
        aside_name = None
        if before is not None:
            aside_name = _existing_aside(sdir, log_path, before) or _damaged_log_name()
        data = build_log(report, aside_name)
        stage = os.path.join(_files(store).root, "tmp", f"repair-{session_id}-{os.getpid()}-{os.urandom(4).hex()}")
        os.makedirs(stage)
        try:
            with open(os.path.join(stage, "header"), "wb") as f:
                f.write(report._header_bytes)
            staged_log = os.path.join(stage, "log")
            fd = os.open(staged_log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            say("checking the new log")
            _check_staged(store, session_id, stage, report)
            # 3. The damaged log kept aside, durably; then the new one renamed over it.
            aside = os.path.join(sdir, aside_name) if aside_name else None
            made_aside = aside is not None and not os.path.exists(aside)
            if made_aside:
                _keep_aside(log_path, aside)  # type: ignore[arg-type]
            try:
                now = read_dense(log_path)
            except FileNotFoundError:
                now = None
            if now != before:
                if made_aside:
                    os.unlink(aside)  # type: ignore[arg-type]
                raise StoreError(f"session {session_id} was not repaired: its log changed while the repair read it")
            # The append rules' state stood for the old log: gone before the new one is
            # in place, so no crash leaves it beside the log it does not describe.
            try:
                os.unlink(os.path.join(sdir, "rules"))
            except FileNotFoundError:
                pass
            os.replace(staged_log, log_path)
            fsync_dir(sdir)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        report.repaired = True
        report.damaged_log = aside
        # 4. The indexes, as the new log (checked above to replay to the plan) says, and the
        # header file as the log holds it (the file may be what was damaged).
        for name, text in (("HEAD", report.head or ""), ("mark", report.mark)):
            write_atomic(os.path.join(sdir, name), (text + "\n").encode(), durable=False)
        header_path = os.path.join(sdir, "header")
        try:
            same = read_small(header_path, HEADER_LIMIT) == report._header_bytes
        except OSError:
            same = False
        if not same:
            write_atomic(header_path, report._header_bytes, durable=True)
        report.indexes_fixed = report.indexes_fixed or lost is not None
        return report
    finally:
        lock.release()
