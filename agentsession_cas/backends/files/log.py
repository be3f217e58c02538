"""The session log: one checksummed record per line, the session's write-ahead log and record.

A line is ``<checksum> SP <link> SP <record> [TAB <content> TAB <envelope>]
LF``: the checksum is the first 16 hex digits (64 bits) of the BLAKE3 hash of
every byte between the first space and the LF; the link is the checksum of
the line before (16 zeros on the first line), so the lines form a chain and a
record removed, inserted or moved breaks it where it was; the record is a
canonical JSON object whose ``op`` says what happened; a durable append also
carries its two objects (the payload), so the log alone can restore them.
Logs written before the chain have no link (``<checksum> SP <record> ...``,
the checksum over the record and payload); they are read as they are, and a
line without a link after one with a link is out of place:

* ``create`` - the session began (``session``, ``base``, ``mark``);
* ``append`` - an entry joined the log (``seq``, ``entry``, ``head``: where
  the head is after it, ``lazy``: acknowledged before committed);
* ``head`` - a head move (``head``, null for no head);
* ``mark`` - the record mark set (``mark``: ``record`` or ``mirror``);
* ``commit`` - every record before it is durable;
* ``checkpoint`` - the objects of every append before it are durable in
  ``objects/``, so recovery need not restore them from their payloads;
* ``loss`` - recovery dropped an uncommitted append (``entry``, ``seq``), or
  a torn line after the last commit (``line``, ``offset``, ``reason``, and
  ``entry`` when the torn bytes still name one, else null).
* ``repair`` - ``agentsession repair`` rewrote a damaged log (``at``,
  ``damaged_log``: the name the damaged log was kept under, ``damage``: its
  lines that did not read, ``dropped``: appends it could not keep, ``seq``:
  every sequence number up to it is spent); see ``docs/repair.md``.
* ``header`` - the session's header changed (``header``: the whole new header);
  the ``create`` record carries the first one the same way, so the log holds the
  header and the ``header`` file is an index of it (see ``header_of``);
* ``snapshot`` - what a compaction left of the records it replaced: the own
  entries in log order (raw ids, base64), their sequence numbers as runs,
  the leaf labels, the head and mark after them, the highest sequence
  number spent, and the other records (head moves, marks, losses, repairs)
  with where they fell. It stands right after ``create``, is committed, and
  every append it names is checkpointed (see ``docs/storage-format.md``).

:func:`read_log` parses a log and tells a crash's loss from damage: a torn
last line, or a bad line after the last commit, is uncommitted working
state; a bad line before it is damage.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import field
from typing import Any

import blake3

from ...format.canonical import canonical_bytes
from ...lean import dataclass
from ..base import COMMIT_POINTS, Append
from ..digests import EntryDigests, SeqRuns

__all__ = [
    "Record", "encode_record", "read_log", "scan_log", "LogRead", "LogDamage", "LogLine", "CHECKSUM_HEX",
    "make_snapshot", "expand_snapshot", "read_tail", "checksummed_line", "checked_body", "frame", "chain", "chain_one",
    "encode_log",
    "record_body", "append_body", "line_checksum", "ZERO_LINK", "header_of", "line_bodies", "LINE_OVERHEAD",
    "SnapshotIds", "snapshot_ids_file", "read_snapshot_ids", "snapshot_raw", "snapshot_ids_disagree",
    "with_digests", "spelled_snapshot_ids", "spelled_snapshot_head", "spelled_snapshot_seqs", "snapshot_id_room",
]

#: Hex digits of the BLAKE3 checksum each line carries.
CHECKSUM_HEX = 16
_DECODE = json.JSONDecoder().raw_decode
_OPS = frozenset({"create", "append", "head", "mark", "commit", "checkpoint", "loss", "repair", "snapshot", "header"})
#: Records a snapshot keeps as they were (besides its appends); commits and
#: checkpoints it replaces say nothing a snapshot does not (it is both).
_SNAPSHOT_KEEPS = frozenset({"head", "mark", "loss", "repair", "header"})
#: What a snapshot's other records may be: those, and an append of an entry it holds
#: already (a repeat, whose sequence number is spent all the same).
_SNAPSHOT_OTHERS = _SNAPSHOT_KEEPS | {"append"}



_blake3 = blake3.blake3


_CHECKSUM_BYTES = CHECKSUM_HEX // 2


def _checksum(data: bytes | memoryview) -> str:
    return _blake3(data).digest(_CHECKSUM_BYTES).hex()


def _framed(covered: bytes) -> tuple[bytes, bytes]:
    """The line of ``covered`` (its checksum, a space, it, LF) and the checksum, as
    bytes: what :func:`frame`, :func:`chain` and :func:`chain_one` share (the next
    line's link is the checksum's ASCII, never decoded and encoded again between lines)."""
    c = _checksum(covered).encode("ascii")
    return b"".join((c, b" ", covered, b"\n")), c


#: The link of a log's first line: the checksum of no line.
ZERO_LINK = "0" * CHECKSUM_HEX
_HEX = frozenset(b"0123456789abcdef")


def frame(body: bytes, prev: str | None) -> bytes:
    """A record's bytes (and payload) as a log line: chained to ``prev`` (the checksum of
    the line before, :data:`ZERO_LINK` for the first), or, ``prev=None``, a line with no
    link (the form of index files, and of logs written before the chain)."""
    if prev is not None:
        body = b"".join((prev.encode("ascii"), b" ", body))
    return _framed(body)[0]


def line_checksum(line: bytes) -> str:
    """The checksum a framed line states (what the next line links to)."""
    return line[:CHECKSUM_HEX].decode("ascii")


#: Bytes a chained line adds to its record's: checksum, space, link, space, newline.
LINE_OVERHEAD = 2 * CHECKSUM_HEX + 3


def line_bodies(data: bytes) -> list[bytes] | None:
    """The records' bytes of whole log lines (chained or not), each line's checksum
    checked; None when a line is torn or fails its checksum. What a writer copies
    when it re-frames lines it wrote (compaction): nothing damaged is copied."""
    out: list[bytes] = []
    lines = data.split(b"\n")
    if lines.pop() != b"":
        return None  # the last line has no newline
    for raw in lines:
        if len(raw) < CHECKSUM_HEX + 2 or raw[CHECKSUM_HEX : CHECKSUM_HEX + 1] != b" ":
            return None
        covered = raw[CHECKSUM_HEX + 1 :]
        if raw[:CHECKSUM_HEX] != _checksum(covered).encode("ascii"):
            return None
        out.append(covered[CHECKSUM_HEX + 1 :] if _link_of(raw) is not None else covered)
    return out


def chain(bodies: Iterable[bytes], prev: str = ZERO_LINK) -> tuple[bytes, str]:
    """Records' bytes framed as consecutive chained lines after ``prev``: (the lines,
    the checksum of the last, which the next line links to)."""
    link = prev.encode("ascii")
    out = []
    for body in bodies:
        line, link = chain_one(body, link)
        out.append(line)
    return (out[0] if len(out) == 1 else b"".join(out)), link.decode("ascii")


def chain_one(body: bytes, prev: bytes) -> tuple[bytes, bytes]:
    """One record's bytes framed as the line after the line whose checksum is ``prev``
    (ASCII): (the line, its checksum, which the next line links to). What :func:`chain`
    does for each of its records, and a writer's lone append does alone."""
    return _framed(b"".join((prev, b" ", body)))


def encode_log(records: Iterable[dict[str, Any] | tuple[dict[str, Any], tuple[bytes, bytes] | None]]) -> bytes:
    """A whole log from its first line: each record (or (record, payload)), chained."""
    bodies = (record_body(*r) if isinstance(r, tuple) else record_body(r) for r in records)
    return chain(bodies)[0]


def checksummed_line(body: bytes) -> bytes:
    """``body`` as a line of the log's form with no link (checksum, space, body, LF):
    the small index files that carry a checksum (a session's ``summary``) use it."""
    return frame(body, None)


def checked_body(line: bytes) -> bytes | None:
    """The body of one such line (LF included), or None when its checksum fails."""
    if len(line) < CHECKSUM_HEX + 3 or not line.endswith(b"\n") or line[CHECKSUM_HEX : CHECKSUM_HEX + 1] != b" ":
        return None
    body = line[CHECKSUM_HEX + 1 : -1]
    return body if line[:CHECKSUM_HEX] == _checksum(body).encode("ascii") and b"\n" not in body else None


def encode_record(record: dict[str, Any], payload: tuple[bytes, bytes] | None = None, *, prev: str | None = None) -> bytes:
    """One log line, LF included, chained to ``prev`` (see :func:`frame`)."""
    return frame(record_body(record, payload), prev)


def record_body(record: dict[str, Any], payload: tuple[bytes, bytes] | None = None) -> bytes:
    """A record's bytes as a line carries them.

    ``payload`` is an append's two objects (content bytes, envelope bytes),
    carried after the record, each after a TAB, so recovery can restore them;
    canonical JSON never holds a raw TAB, so the split is unambiguous.
    """
    snapshot = record.get("op") == "snapshot"
    if snapshot:
        record = _snapshot_file_form(record)
    if snapshot or "header" in record:
        body = canonical_bytes(record)  # a session's header (kept by a snapshot too): any I-JSON, walked
    else:
        # The store's own members: short ASCII strings, small integers, booleans and
        # null, which the fast encoder writes canonically.
        body = canonical_bytes(record, parsed=True, careful=False)
    if payload is not None:
        body = body + b"\t" + payload[0] + b"\t" + payload[1]
    return body


def append_body(
    seq: int,
    entry: str,
    head: str | None,
    head_moved: bool,
    leaf_label: bool,
    lazy: bool,
    payload: tuple[bytes, bytes] | None,
) -> bytes:
    """An ``append`` record's bytes, written straight in canonical member order (the
    hot path of every append); the same bytes :func:`record_body` gives (tested).
    ``entry`` and ``head`` are entry ids the store computed (ASCII, no escapes)."""
    text = '{"entry":"' + entry + '"'
    if head_moved:
        text += ',"head":null' if head is None else ',"head":"' + head + '"'
    if lazy:
        text += ',"lazy":true'
    if leaf_label:
        text += ',"leaf_label":true'
    body = (text + ',"op":"append","seq":' + str(seq) + "}").encode("ascii")
    if payload is not None:
        return b"\t".join((body, *payload))
    return body


@dataclass
class Record:
    """One record as read: its line number (1-based), byte offset and members."""

    line: int
    offset: int
    data: dict[str, Any]
    #: An append's objects carried in the line (content bytes, envelope bytes), if any.
    payload: tuple[bytes, bytes] | None = None
    #: The checksum the line states (what the next line links to).
    checksum: str = ZERO_LINK

    @property
    def op(self) -> str:
        return self.data["op"]

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default)


@dataclass
class LogDamage:
    """A line that is no good record."""

    line: int
    offset: int
    reason: str


@dataclass
class LogRead:
    """A log as parsed: the good records up to the first bad line, and what was wrong.

    ``records`` holds every good record in order, stopping at the first bad
    line. ``damage`` lists every bad line when one lies before the last
    commit, or is not what a crash leaves (a torn last line, or a line
    holding zero bytes). ``cut`` is set when the log must be cut from a bad
    line after the last commit that a crash explains (a crash's loss);
    ``cut_records`` then holds the good records that followed the bad one,
    which are dropped with it.
    """

    records: list[Record] = field(default_factory=list)
    damage: list[LogDamage] = field(default_factory=list)
    cut: LogDamage | None = None
    cut_records: list[Record] = field(default_factory=list)
    size: int = 0
    #: Byte length of the records kept (the prefix of the file that is sound).
    sound_bytes: int = 0


def _link_of(raw: bytes) -> str | None:
    """The link a line's bytes hold (None for a line of the form with no link)."""
    n = CHECKSUM_HEX
    if len(raw) > 2 * n + 2 and raw[n : n + 1] == b" " and raw[2 * n + 1 : 2 * n + 2] == b" " \
            and _HEX.issuperset(raw[n + 1 : 2 * n + 1]):
        return raw[n + 1 : 2 * n + 1].decode("ascii")
    return None


def _stated(raw: bytes) -> str | None:
    """The checksum a line states when it has the shape of one (even if it fails)."""
    head = raw[:CHECKSUM_HEX]
    return head.decode("ascii") if len(head) == CHECKSUM_HEX and _HEX.issuperset(head) else None


def _parse_line(
    raw: bytes, *, sliced: bool = True, known: SnapshotIds | None = None,
) -> tuple[dict[str, Any], tuple[bytes, bytes] | None, str] | str:
    """The record of a line (and its payload), or why it is not one; the link is the
    caller's to check. A snapshot's ids are cut out of the line's bytes rather than read
    as a JSON string (``sliced``; they are most of an open's bytes); where that does not
    apply the line is parsed whole, to the same record. ``known``: the ids of a snapshot
    line as its side file holds them, used when that line is this one."""
    if len(raw) < CHECKSUM_HEX + 2 or raw[CHECKSUM_HEX : CHECKSUM_HEX + 1] != b" ":
        return "not a checksummed record"
    stated = raw[:CHECKSUM_HEX]
    # The line's parts are read through a view, not copied out of it: a snapshot's line
    # holds a session's ids, and each copy of it counted in an open's peak memory.
    view = memoryview(raw)
    try:
        if stated.decode("ascii") != _checksum(view[CHECKSUM_HEX + 1 :]):
            return "checksum mismatch"
    except UnicodeDecodeError:
        return "checksum mismatch"
    start = 2 * CHECKSUM_HEX + 2 if _link_of(raw) is not None else CHECKSUM_HEX + 1
    stop = len(raw)
    payload = None
    tab = raw.find(b"\t", start)
    if tab >= 0:
        parts = raw[tab + 1 :].split(b"\t")
        if len(parts) != 2:
            return "checksum matches but the payload is not two objects"
        payload = (parts[0], parts[1])
        stop = tab
    ids = _snapshot_ids(raw, start, stop) if sliced else None
    if ids is not None:
        start = ids[1] - 1  # (the rest of the record, its opening brace kept: see below)
    try:
        # A record is canonical JSON: UTF-8, no whitespace. Parse that text directly (what
        # json.loads does after sniffing the encoding and skipping whitespace, at half the
        # cost per line); anything else goes to json.loads, so the result is the same.
        text = str(view[start:stop], "utf-8", "surrogatepass")
        if ids is not None:
            text = "{" + text[1:]
        data, end = _DECODE(text)
        if end != len(text):
            raise ValueError("not one canonical value")
    except ValueError:
        if ids is not None:  # (the whole line, as any other: the same verdict)
            return _parse_line(raw, sliced=False, known=known)
        try:
            data = json.loads(raw[start:stop])
        except (ValueError, UnicodeDecodeError):
            return "checksum matches but the record is not JSON"
    text = ""  # (let go before a snapshot is decoded)
    if ids is not None:
        if not isinstance(data, dict) or "entries" in data:
            return _parse_line(raw, sliced=False, known=known)
        data["entries"] = view[ids[0] : ids[1] - 2]
    if not isinstance(data, dict) or data.get("op") not in _OPS:
        return "not a known record"
    if data["op"] == "snapshot":
        if payload is not None:
            return "checksum matches but a snapshot record carries a payload"
        kept = known.raw if known is not None and known.line == stated.decode("ascii") else None
        decoded = _decode_snapshot(data, kept)
        if isinstance(decoded, str):
            return f"checksum matches but the snapshot record {decoded}"
        data = decoded
    return data, payload, stated.decode("ascii")


@dataclass
class LogLine:
    """One line of a log as :func:`scan_log` found it, good or not: repair needs every
    line, with where it lies and what its bytes still say."""

    line: int
    offset: int
    #: The line's bytes, LF excluded.
    raw: bytes
    terminated: bool
    #: The record when the line reads, else None.
    record: Record | None
    #: Why the line is no record (None when it reads).
    reason: str | None
    #: A bad line a crash can leave: the torn last line, or one holding zero bytes.
    crash_like: bool

    @property
    def end(self) -> int:
        return self.offset + len(self.raw) + (1 if self.terminated else 0)



def scan_log(data: bytes, *, expand: bool = True) -> list[LogLine]:
    """Every line of a log in order, each with its record or why it has none; unlike
    :func:`read_log` it does not stop at the first bad line or say what is damage.
    A snapshot line is given as one line per record it stands for (each with the
    snapshot's place; the first with its bytes), or, ``expand=False``, as itself."""
    lines, parsed, crash_like = _scan(data)
    out = []
    for i, ((number, offset, raw, terminated), (_, _, result, _)) in enumerate(zip(lines, parsed)):
        if isinstance(result, tuple):
            for k, rec in enumerate(_records(number, offset, result, expand)):
                out.append(LogLine(number, offset, raw if k == 0 else b"", terminated, rec, None, False))
        else:
            out.append(LogLine(number, offset, raw, terminated, None, result, i in crash_like))
    return out


def _scan(data: bytes, known: SnapshotIds | None = None) -> tuple[list[tuple[int, int, bytes, bool]], list[tuple[int, int, Any, int]], set[int]]:
    """Split a log on LF and parse each line: (lines, parsed, indexes of crash-like bad lines)."""
    lines: list[tuple[int, int, bytes, bool]] = []  # (line, offset, bytes, terminated)
    offset = 0
    number = 0
    while offset < len(data):
        number += 1
        end = data.find(b"\n", offset)
        if end < 0:
            lines.append((number, offset, data[offset:], False))
            break
        lines.append((number, offset, data[offset:end], True))
        offset = end + 1
    parsed: list[tuple[int, int, Any, int]] = []
    crash_like: set[int] = set()  # bad lines a crash can leave: torn, or holding unwritten (zero) blocks
    # The chain: each linked line must link to the checksum the line before it states,
    # when that line reads (a bad line's own checksum may be what is damaged, or a crash
    # zeroed it: the link after it is not judged); once a line is linked, every later
    # one must be.
    before: str | None = ZERO_LINK
    linked = False
    for i, (number, offset, raw, terminated) in enumerate(lines):
        link = _link_of(raw)
        if not terminated:
            result: tuple[dict[str, Any], tuple[bytes, bytes] | None, str] | str = "torn: the last line has no newline"
            crash_like.add(i)
        else:
            result = _parse_line(raw, known=known)
            if isinstance(result, str) and b"\x00" in raw:
                result += " (holds zero bytes: blocks a crash left unwritten)"
                crash_like.add(i)
            elif isinstance(result, tuple):
                if link is None and linked:
                    result = "out of place: a line with no link after linked ones (a record inserted?)"
                elif link is not None and before is not None and link != before:
                    result = "out of place: it does not follow the line before it (a record removed, inserted or moved)"
        linked = linked or link is not None
        before = _stated(raw) if isinstance(result, tuple) else None
        parsed.append((number, offset, result, offset + len(raw) + (1 if terminated else 0)))
    return lines, parsed, crash_like


def _records(number: int, offset: int, result: tuple[dict[str, Any], Any, str], expand: bool) -> list[Record]:
    data, payload, checksum = result
    if expand and data["op"] == "snapshot":
        return [Record(number, offset, d, None, checksum) for d in expand_snapshot(data)]
    return [Record(number, offset, data, payload, checksum)]


def read_tail(data: bytes, link: str) -> tuple[list[dict[str, Any]], int, str] | None:
    """The records of the whole lines of ``data``, bytes of a log after a line whose
    checksum is ``link``: (records, bytes of the lines read, the last one's checksum).
    None unless every line reads, is chained after the one before and is no snapshot:
    then only a whole read (:func:`read_log`) says what the log holds."""
    end = data.rfind(b"\n") + 1
    out: list[dict[str, Any]] = []
    before = link
    for raw in data[:end].split(b"\n")[:-1]:
        result = _parse_line(raw)
        if isinstance(result, str) or _link_of(raw) != before or result[0]["op"] == "snapshot":
            return None
        out.append(result[0])
        before = result[2]
    return out, end, before


def read_log(data: bytes, *, expand: bool = True, known: SnapshotIds | None = None) -> LogRead:
    """Parse a whole log and classify what does not read.

    A ``snapshot`` record is given as the records it stands for (``expand``, what
    every reader of history wants), or as itself, decoded (``expand=False``: an open,
    which loads the state it holds at once). ``known``: a snapshot's ids as its side file
    holds them (:func:`read_snapshot_ids`), read instead of the line's base64 when they
    are that line's."""
    out = LogRead(size=len(data))
    _, parsed, crash_like = _scan(data, known)
    last_commit = -1
    for i, (_, _, result, _) in enumerate(parsed):
        if isinstance(result, tuple) and result[0]["op"] in COMMIT_POINTS:
            last_commit = i
    first_bad = next((i for i, p in enumerate(parsed) if isinstance(p[2], str)), None)
    if first_bad is None:
        out.records = [rec for n, o, r, _ in parsed for rec in _records(n, o, r, expand)]
        out.sound_bytes = len(data)
        return out
    for i, (number, offset, result, end) in enumerate(parsed):
        if i < first_bad:
            out.records.extend(_records(number, offset, result, expand))
            out.sound_bytes = end
    bad_number, bad_offset, bad_reason, _ = parsed[first_bad]
    bad_after = [i for i in range(first_bad, len(parsed)) if isinstance(parsed[i][2], str)]
    # A crash damages only the uncommitted tail, and only by cutting it short or
    # leaving blocks unwritten; any other bad line is damage, never dropped silently.
    if first_bad < last_commit or any(i not in crash_like for i in bad_after):
        for number, offset, result, _ in parsed:
            if isinstance(result, str):
                out.damage.append(LogDamage(number, offset, result))
        return out
    out.cut = LogDamage(bad_number, bad_offset, bad_reason)
    out.cut_records = [
        rec for n, o, r, _ in parsed[first_bad + 1 :] if isinstance(r, tuple) for rec in _records(n, o, r, expand)
    ]
    return out


# -- snapshots: what compaction leaves of the records it replaced --------------------------

_HASH_PREFIX = "sha256:"
#: A snapshot's other records are few (head moves, marks, losses, repairs); more than this
#: many in a row of 32-byte ids is not what a writer of ours leaves.
_MAX_SNAPSHOT_ENTRIES = 1 << 26


#: An append as a writer holds it: the fields of :class:`~..base.Append` in order (sequence
#: number, entry, head, head moved, leaf label, lazy), more possibly after them. A tuple
#: of atomic values, which the collector stops tracking (a long log holds one per append).
AppendRow = tuple[Any, ...]


def make_snapshot(create: dict[str, Any], records: Iterable[dict[str, Any] | AppendRow]) -> dict[str, Any]:
    """The snapshot (decoded form) of the records after ``create`` that a compaction
    replaces: every one committed, every append's objects durable in objects/. Each
    record is its members, or an append as an :data:`AppendRow` (what a writer holds:
    no object is made of each of 100,000 appends to fold them).

    The head and mark are followed as the records set them (no rule is judged here:
    the domain holds the snapshot to the head rule when it replays it)."""
    entries: list[str] = []
    seqs: list[int] = []
    held: set[str] = set()
    leaf_labels: list[str] = []
    others: list[list[Any]] = []
    head = create.get("base")
    mark = create.get("mark")
    max_seq = 0
    count = 0
    data: dict[str, Any]  # a record's members (an append row has none: it is not read as such)
    op: Any
    for r in records:
        count += 1
        if isinstance(r, tuple):
            op, seq, entry, moved, new_head, leaf = "append", r[0], r[1], r[3], r[2], r[4]
        else:
            data = r
            op = data.get("op")
            stated = data.get("seq")
            if isinstance(stated, int) and not isinstance(stated, bool):
                seq = stated
            elif op == "append":
                seq = max_seq + 1  # as a replay numbers an append without one
            else:
                seq = 0
            if op == "append":
                entry, moved, new_head, leaf = data["entry"], "head" in data, data.get("head"), data.get("leaf_label")
        if seq > max_seq:  # (a comparison, not a call of max: once per record of a long log)
            max_seq = seq
        if op == "append":
            if entry not in held:
                held.add(entry)
                entries.append(entry)
                seqs.append(seq)
                if leaf:
                    leaf_labels.append(entry)
            else:  # the same entry again: its number is spent
                others.append([len(entries), Append(*r[:6]).as_record() if isinstance(r, tuple) else dict(data)])
            if moved:
                head = new_head
        elif op == "snapshot":
            # A log compacted before: its snapshot is the start of this one.
            for entry, s in zip(data["entries"], data["seqs"]):
                held.add(entry)
                entries.append(entry)
                seqs.append(s)
            leaf_labels.extend(data["leaf_labels"])
            others.extend([n + len(entries) - len(data["entries"]), o] for n, o in data["others"])
            head, mark = data["head"], data["mark"]
            max_seq = max(max_seq, data["seq"])
            count += data["records"] - 1
        elif op in _SNAPSHOT_KEEPS:
            others.append([len(entries), dict(data)])
            if op == "head":
                head = data.get("head")
            elif op == "mark":
                mark = data.get("mark")
    return {
        "op": "snapshot", "seq": max_seq, "records": count, "entries": entries, "seqs": seqs,
        "leaf_labels": leaf_labels, "head": head, "mark": mark, "others": others,
    }


def run_snapshot(
    create: dict[str, Any], ids: EntryDigests, leaf_labels: Collection[str], after: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """:func:`make_snapshot` of the records after ``create`` of a session created whole: an
    append of each of ``ids`` (numbered from 1, not moving the head; those in
    ``leaf_labels`` leaf labels), then the records ``after``. When no id stands twice and
    nothing after appends, it is the snapshot of the records after alone with the ids put
    before them as they are (their digests, their numbers one run): no row per append."""
    if ids.repeated() is not None or any(r.get("op") in ("append", "snapshot") for r in after):
        rows = ((seq, eid, None, False, eid in leaf_labels, False) for seq, eid in enumerate(ids, start=1))
        return make_snapshot(create, itertools.chain(rows, after))
    n = len(ids)
    rest = make_snapshot(create, after)
    return dict(
        rest, seq=max(rest["seq"], n), records=rest["records"] + n, entries=ids, seqs=SeqRuns([[1, n]]) if n else [],
        leaf_labels=sorted((eid for eid in leaf_labels if eid in ids), key=ids.position),
        others=[[at + n, other] for at, other in rest["others"]],
    )


def header_of(records: Iterable[Any]) -> dict[str, Any] | None:
    """The session header the log holds last (the ``create`` record's, or a later
    ``header`` record's, a snapshot's kept ones included), or None for a log written
    before logs held it; ``records`` as read (:class:`Record`) or their data."""
    found = None
    for r in records:
        data = r.data if isinstance(r, Record) else r
        op = data.get("op")
        if op in ("create", "header") and isinstance(data.get("header"), dict):
            found = data["header"]
        elif op == "snapshot":
            for _, other in data.get("others", ()):
                if other.get("op") == "header" and isinstance(other.get("header"), dict):
                    found = other["header"]
    return found


def expand_snapshot(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """Records that replay to the state a snapshot (decoded form) stands for: its appends
    in order with the other records where they fell, a head move to where the head
    was left, and a commit. What history, fsck, sweep and repair read."""
    out: list[dict[str, Any]] = []
    labels = set(snapshot["leaf_labels"])
    others = snapshot["others"]
    k = 0
    for i, (entry, seq) in enumerate(zip(snapshot["entries"], snapshot["seqs"])):
        while k < len(others) and others[k][0] <= i:
            out.append(dict(others[k][1]))
            k += 1
        rec: dict[str, Any] = {"entry": entry, "op": "append", "seq": seq}
        if entry in labels:
            rec["leaf_label"] = True
        out.append(rec)
    out.extend(dict(o) for _, o in others[k:])
    out.append({"head": snapshot["head"], "op": "head"})
    if snapshot["mark"] is not None:
        out.append({"mark": snapshot["mark"], "op": "mark"})
    out.append({"op": "commit"})
    return out


@dataclass(frozen=True)
class SnapshotIds:
    """A snapshot line's ids as raw digests, kept beside the log so an open does not
    decode them from base64 (the largest part of opening a big session for one append):
    ``line`` is the checksum of the snapshot line they belong to."""

    line: str
    raw: bytes


def snapshot_ids_file(line: str, raw: bytes | EntryDigests) -> bytes | None:
    """The side file of a snapshot line (checksum ``line``) naming the digests ``raw``,
    or None when a digest stands twice there (the file vouches that none does, so an
    open need not look: a snapshot must not name an entry twice). Given as
    :class:`EntryDigests`, their own verdict on a repeat is the one asked (and kept)."""
    digests = raw if isinstance(raw, EntryDigests) else EntryDigests(raw)
    if digests.repeated() is not None:
        return None
    body = f"{line} {len(digests)}\n".encode("ascii") + digests.raw
    return _checksum(body).encode("ascii") + b" " + body


def read_snapshot_ids(data: bytes) -> SnapshotIds | None:
    """What a side file written by :func:`snapshot_ids_file` holds, or None when it does
    not read whole (an index: the log's base64 is decoded instead)."""
    n = CHECKSUM_HEX
    nl = data.find(b"\n", n + 1, n + 64)
    if nl < 0 or data[n : n + 1] != b" " or data[:n] != _checksum(memoryview(data)[n + 1 :]).encode("ascii"):
        return None
    try:
        line, count = data[n + 1 : nl].decode("ascii").split(" ")
        if len(line) != n or not _HEX.issuperset(line.encode("ascii")) or int(count) * 32 != len(data) - nl - 1:
            return None
    except ValueError:
        return None
    return SnapshotIds(line, data[nl + 1 :])


def snapshot_ids_disagree(log: bytes, kept: SnapshotIds) -> bool:
    """Whether ``kept`` names the log's snapshot line (by its checksum) but not the ids
    that line spells, or names one twice: an open would trust it (fsck's question; a
    file naming another line is only stale, and unused)."""
    first = log.find(b"\n")
    end = log.find(b"\n", first + 1)
    line = log[first + 1 : end] if first >= 0 and end > first else b""
    if _stated(line) != kept.line:
        return False
    result = _parse_line(line)
    if isinstance(result, str) or result[0]["op"] != "snapshot":
        return False  # (the line's own damage is the log's finding)
    return bool(result[0]["entries"].raw != kept.raw or EntryDigests(kept.raw).repeated() is not None)


def with_digests(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A decoded snapshot whose ids are held as :class:`EntryDigests` (spelled out once),
    so its line, its ``ids`` file and a replay of it share one copy of the digests."""
    entries = snapshot["entries"]
    return snapshot if isinstance(entries, EntryDigests) else dict(snapshot, entries=EntryDigests(snapshot_raw(entries)))


def snapshot_raw(entries: Sequence[str]) -> bytes:
    """A snapshot's own entry ids as the concatenation of their digests."""
    if isinstance(entries, EntryDigests):
        return entries.raw
    return bytes.fromhex("".join(e[len(_HASH_PREFIX):] for e in entries))


def _runs(seqs: Sequence[int]) -> list[list[int]]:
    """Sequence numbers as [first, count] runs of consecutive numbers."""
    if isinstance(seqs, SeqRuns):
        return seqs.runs()
    runs: list[list[int]] = []
    for s in seqs:
        if runs and runs[-1][0] + runs[-1][1] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    return runs


def _snapshot_file_form(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The decoded form as a log line holds it: ids as raw bytes in base64, sequence
    numbers as runs, leaf labels as indexes into the ids."""
    entries = snapshot["entries"]
    raw = snapshot_raw(entries)
    index = {e: i for i, e in enumerate(entries)} if snapshot["leaf_labels"] else {}
    return {
        "entries": base64.b64encode(raw).decode("ascii"),
        "head": snapshot["head"],
        "leaf_labels": sorted(index[e] for e in snapshot["leaf_labels"]),
        "mark": snapshot["mark"],
        "op": "snapshot",
        "others": snapshot["others"],
        "records": snapshot["records"],
        "seq": snapshot["seq"],
        "seqs": _runs(snapshot["seqs"]),
    }


#: How a snapshot record's text begins: canonical JSON sorts ``entries`` first.
_SNAPSHOT_START = b'{"entries":"'


def _snapshot_ids(raw: bytes, start: int, stop: int) -> tuple[int, int] | None:
    """Where a snapshot record's base64 ids lie in a line, ``(first byte, the byte after
    the comma that ends them)``, or None when the record does not start as a snapshot's
    does. Base64 holds no quote or backslash, so the first quote ends the string; the
    caller parses the rest and falls back to the whole line on any doubt."""
    if not raw.startswith(_SNAPSHOT_START, start):
        return None
    first = start + len(_SNAPSHOT_START)
    end = raw.find(b'"', first, stop)
    if end < 0 or raw.find(b"\\", first, end) >= 0 or raw[end + 1 : end + 2] != b",":
        return None
    return first, end + 2


def _snapshot_start(raw: bytes) -> int | None:
    """Where a damaged line's snapshot record starts (after its checksum and link), or
    None when its record does not start as a snapshot's."""
    return next((n for n in (2 * CHECKSUM_HEX + 2, CHECKSUM_HEX + 1) if raw.startswith(_SNAPSHOT_START, n)), None)


def _snapshot_text(raw: bytes) -> bytes | None:
    """A damaged snapshot line's base64 ids, up to the quote that ends them."""
    at = _snapshot_start(raw)
    if at is None:
        return None
    first = at + len(_SNAPSHOT_START)
    end = raw.find(b'"', first)
    return raw[first : end if end >= 0 else len(raw)]


def snapshot_id_room(raw: bytes) -> int:
    """How many ids a damaged snapshot line held, by its base64's length (each id 32
    bytes), whether or not each still spells: the appends it stands for, each of which
    spent a sequence number. 0 when the line is no snapshot's."""
    text = _snapshot_text(raw)
    return 0 if text is None else len(text) * 3 // 4 // 32  # (floor: the padding's bytes are none)


def spelled_snapshot_ids(raw: bytes) -> list[tuple[int, str]]:
    """The entry ids a damaged line still spells, each with its place among the line's
    ids (from 0), where it holds a snapshot's base64 ids
    (its record starts as a snapshot's does): each 4-character group of the base64 read
    on its own, so a byte the damage changed (or zeroed) costs only the ids its group
    lies in. An id a changed byte made into another is spelled too: a caller keeps only
    what its objects prove. Empty when the line's record does not start as a snapshot's
    (where a record stands in a line, after its checksum and link: never inside an
    append's payload, whose text might spell the same)."""
    text = _snapshot_text(raw)
    if text is None:
        return []
    out: list[tuple[int, str]] = []
    digest = bytearray()
    place = 0
    sound = True  # whether every byte of the digest being gathered decoded
    for i in range(0, len(text) - len(text) % 4, 4):
        try:
            got = binascii.a2b_base64(text[i : i + 4], strict_mode=True)
        except (binascii.Error, ValueError):
            got, whole = b"\0\0\0", False
        else:
            whole = len(got) == 3 or i + 4 >= len(text)
        for b in got:
            digest.append(b)
            sound = sound and whole
            if len(digest) == 32:
                if sound:
                    out.append((place, _HASH_PREFIX + digest.hex()))
                digest.clear()
                place += 1
                sound = True
    return out


#: A snapshot's ``seqs`` member (runs of ``[first, count]``), where it still reads.
_SNAPSHOT_SEQS = re.compile(rb'"records":[0-9]+,"seq":[0-9]+,"seqs":(\[\[[0-9]+,[0-9]+\](?:,\[[0-9]+,[0-9]+\])*\])\}')


def spelled_snapshot_seqs(raw: bytes) -> list[int] | None:
    """The sequence number of each id a damaged snapshot line held, in order, from its
    ``seqs`` runs where they still read (None when they do not, or the line is no
    snapshot's): what an id taken back from the line is numbered."""
    at = _snapshot_start(raw)
    m = _SNAPSHOT_SEQS.search(raw, at) if at is not None else None
    if m is None:
        return None
    try:
        runs = json.loads(m.group(1))
    except ValueError:
        return None
    return [first + k for first, count in runs for k in range(count)]


#: A snapshot record's own ``head`` member, as canonical JSON writes it: after its
#: ``entries`` and before its ``leaf_labels`` (a record kept in ``others`` has its ``op``
#: after its ``head``, so never matches).
_SNAPSHOT_HEAD = re.compile(rb'","head":"(sha256:[0-9a-f]{64})","leaf_labels":\[')


def spelled_snapshot_head(raw: bytes) -> str | None:
    """The head a damaged line still spells where it holds a snapshot (as
    :func:`spelled_snapshot_ids` finds one): where the log's records the snapshot
    replaced left the head. None when the line is no snapshot's, or its ``head`` member
    does not read (or is null)."""
    at = _snapshot_start(raw)
    if at is None:
        return None
    m = _SNAPSHOT_HEAD.search(raw, at + len(_SNAPSHOT_START))
    return m.group(1).decode("ascii") if m else None


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _decode_snapshot(data: dict[str, Any], known: bytes | None = None) -> dict[str, Any] | str:
    """The decoded form of a snapshot line's record, or what is wrong with it. ``known``:
    the ids the line's base64 spells, as its side file holds them (checked to be as many)."""
    text = data.get("entries")
    try:
        if not isinstance(text, (str, memoryview)):
            raise ValueError
        if known is not None and len(text) == 4 * ((len(known) + 2) // 3):
            raw = known
        else:
            # (the text itself, not an ASCII copy of it: a snapshot's ids are most of an open's bytes)
            raw = binascii.a2b_base64(text, strict_mode=True)
            known = None
    except (binascii.Error, ValueError):
        return "holds no base64 entry ids"
    if len(raw) % 32 or len(raw) // 32 > _MAX_SNAPSHOT_ENTRIES:
        return "holds entry ids of the wrong length"
    n = len(raw) // 32
    # Held as the digests (32 bytes an id) and the numbers as their runs, not as a string
    # and an int each: an open of a big session makes no object per entry (issue 11).
    entries = EntryDigests(raw, unrepeated=known is not None)
    runs = data.get("seqs")
    if not isinstance(runs, list):
        return "holds no sequence numbers"
    last = held = 0
    for run in runs:
        if not (isinstance(run, list) and len(run) == 2 and _is_count(run[0]) and _is_count(run[1])):
            return "holds a sequence run that is not [first, count]"
        first, count = run
        if first <= last or count < 1 or held + count > n:
            return "holds sequence numbers out of order or too many"
        held += count
        last = first + count - 1
    if held != n:
        return f"holds {held} sequence numbers for {n} entries"
    seqs = SeqRuns(runs)  # (as runs, not a number each: one run, most often)
    labels = data.get("leaf_labels")
    if not isinstance(labels, list) or not all(_is_count(i) and i < n for i in labels):
        return "holds leaf labels that are not indexes of its entries"
    others = data.get("others")
    if not isinstance(others, list) or not all(
        isinstance(o, list) and len(o) == 2 and _is_count(o[0]) and o[0] <= n
        and isinstance(o[1], dict) and o[1].get("op") in _SNAPSHOT_OTHERS
        for o in others
    ) or any(a[0] > b[0] for a, b in zip(others, others[1:])):
        return "holds other records that are not in order or of a kind it keeps"
    head = data.get("head")
    seq = data.get("seq")
    if head is not None and not (isinstance(head, str) and head.startswith(_HASH_PREFIX)):
        return "names a head that is not an entry id"
    if data.get("mark") not in ("record", "mirror", None):
        return "names a mark that is neither record nor mirror"
    if not isinstance(seq, int) or not _is_count(seq) or seq < last or not _is_count(data.get("records")):
        return "holds a sequence number below its appends' or no record count"
    return {
        "op": "snapshot", "seq": seq, "records": data["records"], "entries": entries, "seqs": seqs,
        "leaf_labels": [entries[i] for i in labels], "head": head, "mark": data.get("mark"), "others": others,
    }
