"""What ``list`` shows of a session, kept beside its log so listing reads no log.

A :class:`SessionSummary` is derived from a session's header and own entries
(title, model, harness, working directory, created and last-activity times,
counts, head, mark). A writer keeps one current as it appends (each entry fed
once, as it is written) and hands it to the backend when the session closes;
the backend keeps it with what identifies the log it describes, so a reader
can tell a current summary from a stale one without reading the log. A stale
one is not thrown away: its entries are a prefix of the session's (a summary
is written only once everything it counts is committed), so bringing it up to
date reads only the entries appended since.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import TimestampError
from ..format.entry import Entry, Header
from ..format.links import REL_CONTINUED_IN
from ..format.timestamps import normalise_ts
from ..lean import dataclass

__all__ = ["SessionSummary", "SummaryBuilder", "parse_when", "seconds", "select"]


def seconds(ts: str | None) -> str | None:
    """A ``ts`` or a header's ``created_at`` to the second, in UTC (``2026-01-02T03:04:05Z``):
    what a person reads in a list. Any RFC 3339 spelling names its instant (an offset
    converted to UTC, as :func:`~..format.timestamps.normalise_ts` converts it); what is
    none (a ``created_at`` of another form, a store kept) is shown as written."""
    if not isinstance(ts, str):
        return ts
    try:
        return normalise_ts(ts)[:19] + "Z"
    except TimestampError:
        return ts


@dataclass
class SessionSummary:
    """One session as ``list`` shows it (``--json`` carries these members)."""

    id: str
    title: str | None = None
    model: str | None = None
    harness: str | None = None
    cwd: str | None = None
    created: str | None = None
    last_activity: str | None = None
    entries: int = 0
    head: str | None = None
    base: str | None = None
    mark: str = "mirror"
    #: The successor the session was continued in (its last ``continued_in`` link).
    continued_in: str | None = None
    #: The last own entry counted, and the highest sequence number then: what ties a
    #: stale summary to the prefix of the log it describes.
    last_entry: str | None = None
    seq: int = 0

    def as_dict(self) -> dict[str, Any]:
        # Every member is a string, an int or None: a copy of the members, not asdict's
        # deep walk (list calls this once per session of the store).
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionSummary | None:
        """A summary as a backend kept it, or None when it is not one (a damaged or
        foreign file is only a summary to rebuild, never an error). One from before
        summaries named the successor (no ``continued_in`` member) is rebuilt, since
        it cannot say whether the session was continued."""
        if "continued_in" not in data:
            return None
        get = data.get  # checked before the summary is made (list reads one per session)
        if not isinstance(get("id"), str):
            return None
        for name in _TEXT:
            v = get(name)
            if v is not None and not isinstance(v, str):
                return None
        for name in ("entries", "seq"):
            v = get(name, 0)
            if not isinstance(v, int) or isinstance(v, bool):
                return None
        return cls(**{name: data[name] for name in _FIELDS if name in data})


#: The entry types that set a member of the summary besides the last activity.
_TITLED = frozenset({"config", "info", "env", "link"})

#: The members of a summary, in order.
_FIELDS = tuple(f.name for f in fields(SessionSummary))
#: The members that are a string or None.
_TEXT = ("title", "model", "harness", "cwd", "created", "last_activity", "head", "base", "last_entry", "continued_in")


def summary_form(entry: Entry) -> Entry:
    """What :meth:`SummaryBuilder.feed` reads of an entry, as a small entry of its own: its
    id, type and ``ts``, and the members a titled type sets. A caller that walks many
    entries and feeds them later (an admission checks a push whole before it writes it)
    keeps this rather than the entries."""
    data = entry.data
    t = data.get("type")
    slim = dict(data) if t in _TITLED else {"type": t, "ts": data.get("ts")}
    return Entry(slim, computed_id=entry.id, content_hash=entry.content_hash)


class SummaryBuilder:
    """Feeds own entries, in log order, into a summary: the latest ``info`` name is the
    title, the latest ``config`` model the model, the latest ``env`` cwd the working
    directory (the header's until one comes), the last entry's ``ts`` the last activity."""

    def __init__(self, header: Header, base: SessionSummary | None = None):
        h = header.data
        harness = h.get("harness")
        name = None
        if isinstance(harness, Mapping) and isinstance(harness.get("name"), str):
            name = harness["name"] + (f" {harness['version']}" if isinstance(harness.get("version"), str) else "")
        cwd = h.get("cwd")
        created = seconds(h.get("created_at") if isinstance(h.get("created_at"), str) else None)
        self.summary = base if base is not None else SessionSummary(
            id=str(h.get("id")), harness=name, cwd=cwd if isinstance(cwd, str) else None, created=created,
        )
        # (from the header even over a kept summary: one kept before session 41 cut an
        # offset's time to Z, and the next write puts the instant right)
        self.summary.created = created
        self.count = self.summary.entries
        #: The last entry fed since :meth:`finish` (its ``ts`` and id are read there).
        self._last: Entry | None = None

    def feed(self, entry: Entry) -> None:
        data = entry.data
        t = data.get("type")
        if t in _TITLED:  # (most entries change nothing but the last activity)
            s = self.summary
            if t == "config" and isinstance(data.get("model"), str):
                s.model = data["model"]
            elif t == "info" and isinstance(data.get("name"), str):
                s.title = data["name"]
            elif t == "env" and isinstance(data.get("cwd"), str):
                s.cwd = data["cwd"]
            elif t == "link" and data.get("rel") == REL_CONTINUED_IN and isinstance(data.get("session"), str):
                s.continued_in = data["session"]
        self._last = entry
        self.count += 1

    def finish(self, *, head: str | None, base: str | None, mark: str, seq: int) -> SessionSummary:
        s = self.summary
        last = self._last
        if last is not None:  # the last entry fed sets the last activity, read once here
            s.last_activity = seconds(last.data.get("ts"))
            s.last_entry = last.id
            self._last = None
        s.entries, s.head, s.base, s.mark, s.seq = self.count, head, base, mark, seq
        return s


_WHEN = re.compile(r"(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?Z?)?")
_AGO = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(text: str, *, now: datetime | None = None) -> str:
    """A moment a person types, as a ``ts`` to the second (UTC): ``2026-01-02``,
    ``2026-01-02T03:04[:05][Z]``, or an age such as ``90m``, ``12h``, ``3d``, ``2w``
    (that long before now). ValueError names what was given otherwise."""
    t = text.strip()
    m = _AGO.fullmatch(t)
    if m:
        at = (now or datetime.now(UTC)) - timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])
        return at.strftime("%Y-%m-%dT%H:%M:%SZ")
    m = _WHEN.fullmatch(t)
    if m:
        date, hh, mm, ss = m.groups()
        try:
            at = datetime.strptime(f"{date}T{hh or '00'}:{mm or '00'}:{ss or '00'}", "%Y-%m-%dT%H:%M:%S")
        except ValueError:
            pass
        else:
            return at.strftime("%Y-%m-%dT%H:%M:%SZ")
    raise ValueError(f"{text!r} is not a date (2026-01-02, 2026-01-02T03:04:05Z) or an age (90m, 12h, 3d, 2w)")


def _under(path: str | None, top: str) -> bool:
    if path is None:
        return False
    top = top.rstrip("/") or "/"
    return path == top or path.startswith(top if top.endswith("/") else top + "/")


def select(
    summaries: Iterable[SessionSummary],
    *,
    harness: str | None = None,
    cwd: str | None = None,
    after: str | None = None,
    before: str | None = None,
    limit: int | None = None,
    current: bool = False,
) -> list[SessionSummary]:
    """The summaries ``list`` shows, newest activity first (a session with none by its
    creation; ties by id): those whose harness is named ``harness`` (its name, or name
    and version), whose working directory is ``cwd`` or below it, and whose last
    activity is at or after ``after`` and before ``before`` (``ts`` to the second),
    and, with ``current``, that were not continued in a successor; at most ``limit``
    of them."""
    out = []
    for s in summaries:
        when = s.last_activity or s.created or ""
        if harness is not None and s.harness != harness and (s.harness or "").split(" ")[0] != harness:
            continue
        if cwd is not None and not _under(s.cwd, cwd):
            continue
        if current and s.continued_in is not None:
            continue
        if after is not None and when[:19] < after[:19]:
            continue
        if before is not None and not when[:19] < before[:19]:
            continue
        out.append(s)
    out.sort(key=lambda s: s.id)
    out.sort(key=lambda s: (s.last_activity or s.created or "")[:19], reverse=True)
    return out if limit is None else out[:limit]
