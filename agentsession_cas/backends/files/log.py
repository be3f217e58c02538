"""The session log: one checksummed record per line, the session's write-ahead log and record.

A line is ``<checksum> SP <record> [TAB <content> TAB <envelope>] LF``: the
checksum is the first 16 hex digits (64 bits) of the BLAKE3 hash of every
byte between the space and the LF; the record is a canonical JSON object
whose ``op`` says what happened; a durable append also carries its two
objects (the payload), so the log alone can restore them:

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

:func:`read_log` parses a log and tells a crash's loss from damage: a torn
last line, or a bad line after the last commit, is uncommitted working
state; a bad line before it is damage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import blake3

from ...format.canonical import canonical_bytes

__all__ = ["Record", "encode_record", "read_log", "scan_log", "LogRead", "LogDamage", "LogLine", "CHECKSUM_HEX"]

#: Hex digits of the BLAKE3 checksum each line carries.
CHECKSUM_HEX = 16
_DECODE = json.JSONDecoder().raw_decode
_OPS = frozenset({"create", "append", "head", "mark", "commit", "checkpoint", "loss", "repair"})


def _checksum(data: bytes) -> str:
    return blake3.blake3(data).hexdigest(length=CHECKSUM_HEX // 2)


def encode_record(record: dict[str, Any], payload: tuple[bytes, bytes] | None = None) -> bytes:
    """One log line, LF included.

    ``payload`` is an append's two objects (content bytes, envelope bytes),
    carried after the record, each after a TAB, so recovery can restore them;
    canonical JSON never holds a raw TAB, so the split is unambiguous.
    """
    # Records hold only the store's own members: short ASCII strings, small
    # integers, booleans and null, which the fast encoder writes canonically.
    body = canonical_bytes(record, parsed=True, careful=False)
    if payload is not None:
        body = body + b"\t" + payload[0] + b"\t" + payload[1]
    return _checksum(body).encode("ascii") + b" " + body + b"\n"


def encode_append(
    seq: int,
    entry: str,
    head: str | None,
    *,
    head_moved: bool,
    leaf_label: bool,
    lazy: bool,
    payload: tuple[bytes, bytes] | None,
) -> bytes:
    """An ``append`` record's line, written straight in canonical member order (the
    hot path of every append); the same bytes :func:`encode_record` gives (tested).
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
        body = body + b"\t" + payload[0] + b"\t" + payload[1]
    return _checksum(body).encode("ascii") + b" " + body + b"\n"


@dataclass
class Record:
    """One record as read: its line number (1-based), byte offset and members."""

    line: int
    offset: int
    data: dict[str, Any]
    #: An append's objects carried in the line (content bytes, envelope bytes), if any.
    payload: tuple[bytes, bytes] | None = None

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


def _parse_line(raw: bytes) -> tuple[dict[str, Any], tuple[bytes, bytes] | None] | str:
    """The record of a line (and its payload), or why it is not one."""
    if len(raw) < CHECKSUM_HEX + 2 or raw[CHECKSUM_HEX : CHECKSUM_HEX + 1] != b" ":
        return "not a checksummed record"
    stated = raw[:CHECKSUM_HEX]
    body = raw[CHECKSUM_HEX + 1 :]
    try:
        if stated.decode("ascii") != _checksum(body):
            return "checksum mismatch"
    except UnicodeDecodeError:
        return "checksum mismatch"
    payload = None
    tab = body.find(b"\t")
    if tab >= 0:
        parts = body[tab + 1 :].split(b"\t")
        if len(parts) != 2:
            return "checksum matches but the payload is not two objects"
        payload = (parts[0], parts[1])
        body = body[:tab]
    try:
        # A record is canonical JSON: UTF-8, no whitespace. Parse that text directly (what
        # json.loads does after sniffing the encoding and skipping whitespace, at half the
        # cost per line); anything else goes to json.loads, so the result is the same.
        text = body.decode("utf-8", "surrogatepass")
        data, end = _DECODE(text)
        if end != len(text):
            raise ValueError("not one canonical value")
    except ValueError:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return "checksum matches but the record is not JSON"
    if not isinstance(data, dict) or data.get("op") not in _OPS:
        return "not a known record"
    return data, payload


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


def scan_log(data: bytes) -> list[LogLine]:
    """Every line of a log in order, each with its record or why it has none; unlike
    :func:`read_log` it does not stop at the first bad line or say what is damage."""
    lines, parsed, crash_like = _scan(data)
    out = []
    for i, ((number, offset, raw, terminated), (_, _, result, _)) in enumerate(zip(lines, parsed)):
        if isinstance(result, tuple):
            out.append(LogLine(number, offset, raw, terminated, Record(number, offset, result[0], result[1]), None, False))
        else:
            out.append(LogLine(number, offset, raw, terminated, None, result, i in crash_like))
    return out


def _scan(data: bytes) -> tuple[list[tuple[int, int, bytes, bool]], list[tuple[int, int, Any, int]], set[int]]:
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
    for i, (number, offset, raw, terminated) in enumerate(lines):
        if not terminated:
            result: tuple[dict[str, Any], tuple[bytes, bytes] | None] | str = "torn: the last line has no newline"
            crash_like.add(i)
        else:
            result = _parse_line(raw)
            if isinstance(result, str) and b"\x00" in raw:
                result += " (holds zero bytes: blocks a crash left unwritten)"
                crash_like.add(i)
        parsed.append((number, offset, result, offset + len(raw) + (1 if terminated else 0)))
    return lines, parsed, crash_like


def read_log(data: bytes) -> LogRead:
    """Parse a whole log and classify what does not read."""
    out = LogRead(size=len(data))
    _, parsed, crash_like = _scan(data)
    last_commit = -1
    for i, (_, _, result, _) in enumerate(parsed):
        if isinstance(result, tuple) and result[0]["op"] in ("commit", "create"):
            last_commit = i
    first_bad = next((i for i, p in enumerate(parsed) if isinstance(p[2], str)), None)
    if first_bad is None:
        out.records = [Record(n, o, r[0], r[1]) for n, o, r, _ in parsed]
        out.sound_bytes = len(data)
        return out
    for i, (number, offset, result, end) in enumerate(parsed):
        if i < first_bad:
            out.records.append(Record(number, offset, result[0], result[1]))
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
    out.cut_records = [Record(n, o, r[0], r[1]) for n, o, r, _ in parsed[first_bad + 1 :] if isinstance(r, tuple)]
    return out
