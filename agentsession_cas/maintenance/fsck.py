"""fsck: check a whole store and report what is wrong, as ``git fsck --full`` does.

The verdicts are the domain's: a session's state is what :func:`replay` of its
log says, and its entries are held to the one rule set
(:mod:`agentsession_cas.format.rules`); the walk over storage (every object,
pack and file) is the backend's (:mod:`agentsession_cas.backends.files.fsck`
for a store directory). ``docs/fsck.md`` lists the checks and their codes.

Each finding is a :class:`FsckProblem` of severity ``error`` (the store is
damaged: exit 1), ``warning`` (something to look at that loses nothing) or
``note`` (a remark, such as a writer's uncommitted tail).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ..store.store import Store

__all__ = ["SEVERITIES", "FsckProblem", "FsckReport", "fsck"]

#: Severities, from the one that fails the check to the one that only informs.
Severity = Literal["error", "warning", "note"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "note")


@dataclass
class FsckProblem:
    """One finding: what (``code``, ``message``), how bad (``severity``), and what it
    concerns: a session, an object (``object`` in ``space``), a file (relative to
    the store's root) and a place in it (a log ``line`` and byte ``offset``, a
    pack ``block``)."""

    severity: str
    code: str
    message: str
    session: str | None = None
    object: str | None = None
    space: str | None = None
    file: str | None = None
    line: int | None = None
    offset: int | None = None
    block: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
            "session": self.session,
            "object": self.object,
            "space": self.space,
            "file": self.file,
            "line": self.line,
            "offset": self.offset,
            "block": self.block,
        }

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass
class FsckReport:
    """Everything one walk found, and what it looked at (``counts``)."""

    root: str
    problems: list[FsckProblem] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> list[FsckProblem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[FsckProblem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def notes(self) -> list[FsckProblem]:
        return [p for p in self.problems if p.severity == "note"]

    @property
    def ok(self) -> bool:
        """True when nothing is damaged (warnings and notes do not count)."""
        return not self.errors

    def add(self, severity: str, code: str, message: str, **where: Any) -> FsckProblem:
        if severity not in SEVERITIES:
            raise ValueError(f"unknown severity {severity!r}")
        p = FsckProblem(severity, code, message, **where)
        self.problems.append(p)
        return p

    def as_dict(self) -> dict[str, Any]:
        return {
            "store": self.root,
            "ok": self.ok,
            "problems": [p.as_dict() for p in self.errors],
            "warnings": [p.as_dict() for p in self.warnings],
            "notes": [p.as_dict() for p in self.notes],
            "counts": self.counts,
        }



def fsck(
    store: Store | str | os.PathLike[str], *, deep: bool = False, progress: Callable[[str], None] | None = None
) -> FsckReport:
    """Check the whole store and return what is wrong with it.

    ``store`` is a :class:`~agentsession_cas.store.Store` or a store URL or path
    (opened read-only, and closed again). ``deep`` also verifies every session the
    walk found no error in as ``verify ID`` does (its projection read as a file,
    request hashes and record rules included). ``progress`` is called with a short
    phase now and then. Reads only: no hold is taken, nothing is rewritten."""
    from ..store.store import Store
    from ..store.url import open_store

    own = not isinstance(store, Store)
    st = open_store(store, readonly=True) if own else store  # type: ignore[arg-type]
    try:
        walk = getattr(st.backend, "fsck", None)
        if walk is not None:
            report: FsckReport = walk(st, progress=progress)
        else:
            from .check import check_sessions

            report = FsckReport(st.root or st.url)
            check_sessions(st, report, progress=progress)
        if deep:
            report.counts["deep_checked"] = _deep(st, report, progress)
        return report
    finally:
        if own:
            st.close()


def _deep(store: Store, report: FsckReport, progress: Callable[[str], None] | None) -> int:
    """Verify every session the walk found no error in as ``verify ID`` does; the number checked."""
    from ..errors import NoSuchSessionError
    from .check import verify_stored

    failed = {p.session for p in report.errors if p.session}
    checked = 0
    sids = [s for s in store.list() if s not in failed]
    for i, sid in enumerate(sids, start=1):
        if progress:
            progress(f"deep: session {i}/{len(sids)}: {sid}")
        try:
            check = verify_stored(store, sid)
        except NoSuchSessionError:
            continue  # deleted since the walk
        checked += 1
        for p in check.problems:
            where = f"{p['where']} line {p['line']}: " if p.get("line") is not None and p.get("where") == "projection" else ""
            message = " ".join(str(p["message"]).splitlines())
            report.add("error", p.get("code") or "verify", f"session {sid}: {where}{message}",
                       session=sid, object=p.get("entry") or p.get("object"))
        for n in check.notes:
            report.add("note", "verify", f"session {sid}: {' '.join(n.splitlines())}", session=sid)
    return checked
