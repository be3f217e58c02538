"""Entries and headers as lossless wrappers over the JSON objects a line holds.

An :class:`Entry` keeps the object exactly as parsed (every member the
format does not define, at any depth, namespaced types included) and adds
typed accessors for what the reader, the tree and the store need. Writing
an entry back is canonical JSON of that same object, so nothing a tool
preserves can change.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from ..errors import EntryError, Problem, SessionFormatError
from ..lean import dataclass
from .canonical import canonical_bytes, needs_careful
from .hashing import ENVELOPE_MEMBERS, RESERVED_MEMBERS, entry_hashes, is_hash
from .timestamps import check_ts, format_ts, is_rfc3339, now_ts

__all__ = [
    "CORE_TYPES",
    "HEADER_MEMBERS",
    "Entry",
    "ENTRY_ID",
    "Header",
    "ParentRef",
    "FORMAT_WRITTEN",
    "LEAF_LABEL",
    "SYNTHETIC_RULE",
    "header_member_problem",
    "is_entry_type",
    "make_entry",
    "short_id",
    "shown_id",
    "shown_value",
    "parse_format",
]

#: The format minor this package writes.
FORMAT_MAJOR, FORMAT_MINOR = 0, 14
#: The first minor that defines the header's ``redacted_from``.
REDACTED_FROM_MINOR = 13
FORMAT_WRITTEN = f"agentsession/{FORMAT_MAJOR}.{FORMAT_MINOR}"
#: The earliest minor read as it stands; earlier ones are migrated in memory.
FIRST_HASHED_MINOR = 5
#: The label value that marks the branch a reader resumes on.
LEAF_LABEL = "leaf"
#: RFC 0002 Projection: why a store holds no label carrying ``synthetic``. The rule's one
#: wording, which the rule table lists and every refusal (append, import, push) quotes.
SYNTHETIC_RULE = "a label carrying 'synthetic' is a projection's marker, never an entry of record (RFC 0002 Projection)"

#: Entry types RFC 0001 defines; any other type must be namespaced (``ns:type``).
CORE_TYPES = frozenset(
    {"item", "response", "config", "compaction", "branch_summary", "run", "dispatch",
     "decision", "queued", "label", "info", "env", "outcome", "link", "custom"}
)

_FORMAT = re.compile(r"agentsession/([0-9]+)\.([0-9]+)")


def is_entry_type(value: object) -> bool:
    """Whether ``value`` names an entry type RFC 0001 admits, a core type or a namespaced
    one (``ns:type``): the ``type`` rule's test, and what a header's ``records`` lists."""
    return isinstance(value, str) and (value in CORE_TYPES or ":" in value)


def parse_format(value: object) -> tuple[int, int] | None:
    """``agentsession/<major>.<minor>`` as a tuple, or None when not that shape."""
    if not isinstance(value, str):
        return None
    m = _FORMAT.fullmatch(value)
    return (int(m.group(1)), int(m.group(2))) if m else None


def short_id(entry_id: str | None) -> str:
    """A ``sha256:`` id as its first 12 hex digits (as git shortens); anything else as is."""
    if entry_id is None:
        return "-"
    if is_hash(entry_id):
        return entry_id[7:19]
    return entry_id


def shown_id(value: object) -> str:
    """An entry id for a one-line message: a ``sha256:`` id as its short form, anything
    else (an id a line claims, untrusted) JSON-quoted, so it cannot break the line."""
    if isinstance(value, str) and is_hash(value):
        return value[7:19]
    return json.dumps(value)


def shown_value(value: object) -> str:
    """An untrusted value for a one-line message: a hash as is, anything else
    JSON-quoted, so a newline or an escape sequence cannot break the line."""
    if isinstance(value, str) and is_hash(value):
        return value
    text = json.dumps(value)
    if len(text) > _SHOW_MAX:  # a 10 MB value is still a one-line message
        size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters as JSON"
        return f"{text[:_SHOW_MAX]}... ({size})"
    return text


#: How much of an untrusted value a message quotes.
_SHOW_MAX = 120


@dataclass(frozen=True)
class ParentRef:
    """One element of ``parents``: an entry by hash, and the session holding it if named."""

    entry: str
    session: str | None = None


class Entry:
    """One entry line: the object as read, its computed hashes and where it was read.

    ``id`` is the id the entry is known by: the line's own when it has one,
    else the computed one. ``computed_id`` and ``content_hash`` are always
    what the line's members hash to.
    """

    __slots__ = ("data", "id", "computed_id", "content_hash", "line", "careful", "objects", "item_bytes", "_wake")

    def __init__(
        self,
        data: dict[str, Any],
        *,
        computed_id: str,
        content_hash: str,
        line: int | None = None,
    ):
        self.data = data
        stated = data.get("id")
        self.id: str = stated if isinstance(stated, str) else computed_id
        self.computed_id = computed_id
        self.content_hash = content_hash
        self.line = line
        #: Whether the data holds anything needing the careful serialiser (see
        #: canonical.loads_flagged); None when unknown, and the output is scanned.
        self.careful: bool | None = None
        #: (content bytes, envelope bytes) when the reader was asked to keep them.
        self.objects: tuple[bytes, bytes] | None = None
        #: The canonical bytes of ``item``, when hashing the entry made them: the context
        #: builder takes them (once) for the request hash instead of encoding again.
        self.item_bytes: bytes | None = None
        self._wake: Callable[[Entry], dict[str, Any]] | None = None

    # -- parking ------------------------------------------------------------

    def park(self, wake: Callable[[Entry], dict[str, Any]]) -> None:
        """Drop the parsed object, which ``wake(entry)`` gives again (read once more from
        where the entry came from) the next time ``data`` is asked for. A one-pass check
        parks the entries of a long path it may still have to consult (a compaction's
        kept range, a request rebuilt under new settings), so its memory holds ids and
        line numbers, not the session; the rules read ``data`` as ever."""
        self._wake = wake
        # (its content hash too: only an entry's own add reads it, the context hash's step)
        self.objects = self.item_bytes = None
        self.content_hash = ""
        _DATA.__set__(self, None)
        self.__class__ = _ParkedEntry

    @property
    def parked(self) -> bool:
        return self.__class__ is _ParkedEntry

    # -- construction -----------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, line: int | None = None) -> Entry:
        """Wrap an object, computing its hashes; a stated ``id`` that differs is refused."""
        data = dict(data)
        # One walk finds what the serialiser needs; the flag is kept, so a store
        # appending this entry need not walk it again.
        careful = needs_careful(data)
        computed, chash = entry_hashes(data, parsed=True, careful=careful)
        stated = data.get("id")
        if stated is not None and stated != computed:
            raise EntryError(f"id {stated} does not match the entry's hash {computed}")
        data["id"] = computed
        entry = cls(data, computed_id=computed, content_hash=chash, line=line)
        entry.careful = careful
        return entry

    # -- envelope ---------------------------------------------------------

    @property
    def type(self) -> str:
        return self.data.get("type")  # type: ignore[return-value]

    @property
    def parent(self) -> str | None:
        p = self.data.get("parent")
        # the hot path of every tree walk: the exact-type test answers almost every call
        return p if p.__class__ is str or isinstance(p, str) else None

    @property
    def parents(self) -> list[ParentRef]:
        """The ``parents`` references naming an entry by a string. A reference names this
        file only when it omits ``session`` (or names this session): one whose ``session``
        is present and no string names another session, as the tree rule reads it
        (``rules.TreeState``), and is kept as its JSON text in angle brackets (``<5>``),
        which no session id can be (ids hold none of ``<>``), so it never equals this
        session's id (a session named ``5``) nor any other's."""
        out = []
        for ref in self.data.get("parents") or ():
            if isinstance(ref, dict) and isinstance(ref.get("entry"), str):
                session = ref.get("session")
                if session is not None and not isinstance(session, str):
                    session = f"<{json.dumps(session)}>"
                out.append(ParentRef(ref["entry"], session))
        return out

    @property
    def ts(self) -> str:
        return self.data.get("ts")  # type: ignore[return-value]

    @property
    def body(self) -> dict[str, Any]:
        """The content: every member outside the envelope."""
        return {k: v for k, v in self.data.items() if k not in ENVELOPE_MEMBERS}

    @property
    def verified(self) -> bool:
        """True when the line's own id is the hash of its members."""
        return self.data.get("id") == self.computed_id

    # -- typed accessors ----------------------------------------------------

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default)

    @property
    def is_extension(self) -> bool:
        """A namespaced (``ns:type``) entry: preserved, never in context unless known."""
        return ":" in (self.type or "")

    @property
    def label(self) -> str | None:
        v = self.data.get("label")
        return v if isinstance(v, str) else None

    @property
    def target(self) -> str | None:
        v = self.data.get("target")
        return v if isinstance(v, str) else None

    @property
    def synthetic(self) -> bool:
        return self.data.get("synthetic") is True

    @property
    def is_leaf_label(self) -> bool:
        return self.type == "label" and self.data.get("label") == LEAF_LABEL

    @property
    def legacy_id(self) -> str | None:
        v = self.data.get("legacy_id")
        return v if isinstance(v, str) else None

    # -- output -------------------------------------------------------------

    def canonical_line(self) -> bytes:
        """The entry as one canonical JSON line, LF included."""
        return canonical_bytes(self.data, parsed=True, careful=self.careful) + b"\n"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)

    def __repr__(self) -> str:
        return f"Entry({self.type!r}, {short_id(self.id)}, parent={short_id(self.parent)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Entry) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.id)


#: The slot an entry's parsed object lives in, reached under a parked entry's ``data``.
_DATA: Any = Entry.__dict__["data"]


class _ParkedEntry(Entry):
    """An entry whose parsed object was dropped (:meth:`Entry.park`): the first read of
    ``data`` wakes it, reading the object again, and it is a plain :class:`Entry` from
    then on. Same slots as :class:`Entry`, so an instance changes class in place."""

    __slots__ = ()

    @property
    def data(self) -> dict[str, Any]:  # type: ignore[override]  # Entry's slot, behind a wake-up
        wake = self._wake
        assert wake is not None
        data = wake(self)
        _DATA.__set__(self, data)
        self._wake = None
        self.__class__ = Entry  # type: ignore[assignment]  # the same slots: it is an Entry again
        return data


class Header:
    """The header line: the session's id, format, payload profile, base, media and more.

    Lossless like :class:`Entry`: unknown members are kept and written back.
    """

    __slots__ = ("data",)

    def __init__(self, data: dict[str, Any]):
        self.data = data

    @classmethod
    def new(
        cls,
        session_id: str,
        *,
        payload: str = "openresponses/2026-04-24",
        created_at: str | None = None,
        harness: Mapping[str, str] | None = None,
        records: Iterable[str] | None = None,
        base: str | None = None,
        media: str | None = None,
        **extra: Any,
    ) -> Header:
        """A header for a new session, in the format this package writes."""
        data: dict[str, Any] = {
            "type": "session",
            "format": FORMAT_WRITTEN,
            "id": session_id,
            "created_at": created_at or now_ts(),
            "payload": payload,
        }
        if harness is not None:
            data["harness"] = dict(harness)
        if records is not None:
            data["records"] = list(records)
        if base is not None:
            data["base"] = base
        if media is not None:
            data["media"] = media
        data.update(extra)
        return cls(data)

    @property
    def id(self) -> str:
        return self.data.get("id")  # type: ignore[return-value]

    @property
    def format(self) -> str:
        return self.data.get("format")  # type: ignore[return-value]

    @property
    def format_version(self) -> tuple[int, int] | None:
        return parse_format(self.data.get("format"))

    @property
    def is_legacy(self) -> bool:
        """A format before 0.5, whose ids are not hashes and which is migrated on read."""
        v = self.format_version
        return v is not None and v[0] == 0 and v[1] < FIRST_HASHED_MINOR

    @property
    def payload(self) -> str | None:
        return self.data.get("payload")

    @property
    def base(self) -> str | None:
        v = self.data.get("base")
        return v if isinstance(v, str) else None

    @property
    def media(self) -> str:
        v = self.data.get("media")
        return v if isinstance(v, str) else "inline"

    @property
    def records(self) -> list[str]:
        v = self.data.get("records")
        return [r for r in v if isinstance(r, str)] if isinstance(v, list) else []

    @property
    def created_at(self) -> str | None:
        return self.data.get("created_at")

    @property
    def harness(self) -> dict[str, Any] | None:
        v = self.data.get("harness")
        return v if isinstance(v, dict) else None

    def canonical_line(self) -> bytes:
        return canonical_bytes(self.data, parsed=True) + b"\n"

    def problems(self) -> list[Problem]:
        """What is wrong with this header as RFC 0001 defines it (line 1)."""
        # The rules' table is loaded where a header is checked, not by head or list,
        # which read headers and check none.
        from .codes import problem

        out: list[Problem] = []
        d = self.data
        if d.get("type") != "session":
            out.append(problem(1, "header", "the first line is not a header: its type is not \"session\""))
            return out
        version = parse_format(d.get("format"))
        if version is None:
            out.append(problem(1, "format", f"header format {json.dumps(d.get('format'))} is not agentsession/<major>.<minor>"))
        elif version[0] != FORMAT_MAJOR or version[1] > FORMAT_MINOR:
            out.append(
                problem(1, "format", f"unsupported format {d.get('format')}: this reader reads agentsession/0.1 to {FORMAT_WRITTEN}")
            )
        if not isinstance(d.get("id"), str) or not d.get("id"):
            out.append(problem(1, "header", "header has no session id"))
        for name in ("created_at", "payload"):
            if not isinstance(d.get(name), str) or not d.get(name):
                out.append(problem(1, "header", f"header has no {name}, which RFC 0001 requires"))
        if "base" in d and not is_hash(d.get("base")):
            out.append(problem(1, "header", f"header base {json.dumps(d.get('base'))} is not a sha256: hash"))
        media = d.get("media", "inline")
        if media not in ("inline", "sidecar"):
            out.append(problem(1, "header", f"header media {json.dumps(media)} is neither 'inline' nor 'sidecar'"))
        return out + self._redaction_problems(version)

    def member_problems(self) -> list[Problem]:
        """Every ``header-member`` problem of this header (:func:`header_member_problem`
        of each of :data:`HEADER_MEMBERS` it has): apart from :meth:`problems`, since the
        rule's store policy is ``keep``: a store refuses such a header only where it makes
        one (``check_new_header(made=True)``) and keeps one a session already has."""
        d = self.data
        found = (header_member_problem(name, d[name]) for name in HEADER_MEMBERS if name in d)
        return [p for p in found if p is not None]

    def _redaction_problems(self, version: tuple[int, int] | None) -> list[Problem]:
        """RFC 0001's ``redacted`` is true when bodies were changed after they were
        written; from 0.13 ``redacted_from`` names the original, and only a redacted
        session has one, never naming itself. Before 0.13 ``redacted_from`` is a member
        that minor does not define, kept as written and not read."""
        from .codes import problem

        d = self.data
        out: list[Problem] = []
        redacted = d.get("redacted")
        if "redacted" in d and not isinstance(redacted, bool):
            out.append(problem(1, "header", f"header redacted {json.dumps(redacted)} is not a boolean"))
        if "redacted_from" not in d or version is None or version < (0, REDACTED_FROM_MINOR):
            return out
        origin = d["redacted_from"]
        if redacted is not True:
            out.append(problem(1, "header", "header carries redacted_from without redacted: true; only a redacted "
                                            "session names an original"))
        if not isinstance(origin, dict) or not isinstance(origin.get("session"), str) or not origin.get("session"):
            out.append(problem(1, "header", f"header redacted_from {json.dumps(origin)} is not an object naming the "
                                            "original's session"))
        elif origin["session"] == d.get("id"):
            out.append(problem(1, "header", "header redacted_from names the session itself; a redacted session has an "
                                            "id of its own"))
        return out

    def __repr__(self) -> str:
        return f"Header({self.id!r}, {self.format!r})"


#: The header members RFC 0001 types beyond what :meth:`Header.problems` holds, whose
#: form is the ``header-member`` rule, in the order they are reported.
HEADER_MEMBERS = ("created_at", "parent_session", "spawned_by", "cwd", "records", "harness")


def kept_member_note(where: str, p: Problem) -> str:
    """The one line an import, push or fetch says of a ``header-member`` problem it
    carried through rather than refused (store policy ``keep``): a warning, the member
    kept byte for byte."""
    return f"{where}: {p.message}; kept as written (warning: {p.code})"


def header_member_problem(name: str, value: Any) -> Problem | None:
    """The ``header-member`` problem of a header holding ``value`` as member ``name``, or
    None when it is of its RFC 0001 form (or ``name`` is none of :data:`HEADER_MEMBERS`):
    ``created_at`` an RFC 3339 date-time; ``parent_session`` (a session id), ``spawned_by``
    (a call_id, never empty) and ``cwd`` (a path) non-empty strings; ``records`` a list of
    entry types; ``harness`` an object whose ``name`` and ``version``, where given, are
    strings. The message names the member and its value."""
    if name == "created_at":
        fits = is_rfc3339(value)
        form = "an RFC 3339 date-time"
    elif name in ("parent_session", "spawned_by", "cwd"):
        fits = isinstance(value, str) and bool(value)
        form = "a non-empty string"
    elif name == "records":
        fits = isinstance(value, list) and all(is_entry_type(t) for t in value)
        form = "a list of entry types (core or ns:type)"
    elif name == "harness":
        fits = isinstance(value, dict) and all(isinstance(value[k], str) for k in ("name", "version") if k in value)
        form = "an object whose name and version are strings"
    else:
        return None
    if fits:
        return None
    from .codes import problem  # (the table: loaded where a header is checked, as in Header.problems)

    return problem(1, "header-member", f"header {name} {shown_value(value)} is not {form} (RFC 0001 Header)")


def make_entry(
    type_: str,
    parent: str | None,
    *,
    ts: str | datetime | None = None,
    parents: Iterable[ParentRef | Mapping[str, str]] | None = None,
    **body: Any,
) -> Entry:
    """Build a new entry with its hashes computed, for writers.

    ``ts`` defaults to now; a datetime is spelled the admitted way. A body
    member with a reserved name is refused; ``parents`` are sorted as the
    format requires (by session, those without one first, then by entry).
    """
    for name in body:
        if name in RESERVED_MEMBERS:
            raise EntryError(f"body member {name!r} is reserved by the envelope")
    if ts is None:
        ts = now_ts()
    elif isinstance(ts, datetime):
        ts = format_ts(ts)
    check_ts(ts)
    data: dict[str, Any] = {"type": type_, "parent": parent, "ts": ts}
    if parents:
        refs = []
        for ref in parents:
            if isinstance(ref, ParentRef):
                d = {"entry": ref.entry}
                if ref.session is not None:
                    d["session"] = ref.session
            else:
                d = dict(ref)
            refs.append(d)
        refs.sort(key=_reference_order)
        data["parents"] = refs
    data.update(body)
    return Entry.from_dict(data)


def _reference_order(ref: Mapping[str, Any]) -> tuple[bool, str, str]:
    """Where a ``parents`` reference sorts (RFC 0001 Convergence): by ``session``, those
    without one first, then by ``entry``. A total order over any reference a reader
    admits: a ``session`` that is no string (no other session's id) sorts by its JSON."""
    session = ref.get("session")
    return session is not None, session if isinstance(session, str) else json.dumps(session), ref["entry"]


def header_or_error(obj: Any, source: str) -> Header:
    """Wrap a parsed first line as a header, raising when it cannot be one."""
    if not isinstance(obj, dict):
        from .codes import problem

        raise SessionFormatError(source, [problem(1, "header", "the first line is not a JSON object")])
    header = Header(obj)
    problems = header.problems()
    if problems:
        raise SessionFormatError(source, problems)
    return header


#: An entry's id, as a function (``map`` over a path: the ids of many entries in one step).
ENTRY_ID: Callable[[Entry], str] = operator.attrgetter("id")
