"""Repair of a damaged session: rewrite its log from what can be proved, keeping the damaged one aside.

The rules (what is kept, recovered and dropped, and why) are stated in
``docs/repair.md``; reading a damaged log line by line is the backend's, since
only it knows its bytes (:mod:`agentsession_cas.backends.files.repair` for a
store directory, :mod:`agentsession_cas.backends.postgresql.repair` for a database). A backend without a repair of its own has nothing a crash
can damage beyond what opening recovers: its sessions are reported whole, or
the repair is refused saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..backends.files import FileBackend
from ..backends.files import repair as file_repair
from ..backends.files.repair import RepairReport
from ..errors import (
    CorruptObjectError,
    CorruptPackError,
    NoSuchObjectError,
    NoSuchSessionError,
    SessionDamagedError,
    StoreError,
    UnsupportedError,
)
from ..format.hashing import envelope_content

if TYPE_CHECKING:
    from ..store.store import Store

__all__ = ["plan_repair", "repair_session", "repair_target"]


def repair_target(store: Store, name: str) -> str:
    """The session ``name`` names (an id, a ref, a prefix), or a session the store holds
    but no longer lists, named by its id: one whose header file is gone while its log
    holds the header (fsck's ``missing-header``), which only a repair brings back."""
    from ..store.names import resolve_session

    try:
        return resolve_session(store, name)
    except (NoSuchSessionError, SessionDamagedError) as exc:  # (the latter: its header is lost)
        # The session the error names (a prefix or a ref resolved to it), else the name given.
        sid = exc.session if isinstance(exc, SessionDamagedError) and exc.session else name
        if file_repair.lost_header(store, sid) is not None:
            return sid
        if isinstance(exc, SessionDamagedError):  # and no record of its log that reads holds it: its advice is this
            raise StoreError(
                f"session {exc.session}: its header cannot be read (its file {exc.path} is gone, and no record of its "
                "log that reads holds the header); repair needs it: put the file back (from a copy, or from another "
                "store holding the session), then run repair again"
            ) from None
        raise


def plan_repair(store: Store, session_id: str, *, progress: Callable[[str], None] | None = None) -> RepairReport:
    """What a repair of the session would keep, recover and drop; writes nothing."""
    report: RepairReport = _backend_repair(store, "plan_repair")(store, session_id, progress=progress)
    return _name_unrestorable(store, report)


def repair_session(
    store: Store,
    session_id: str,
    *,
    confirm: Callable[[RepairReport], bool] | None = None,
    progress: Callable[[str], None] | None = None,
) -> RepairReport:
    """Repair a damaged session (a whole one is left as it is); see the module docstring."""
    report: RepairReport = _backend_repair(store, "repair_session")(store, session_id, confirm=confirm, progress=progress)
    return _name_unrestorable(store, report)


def _name_unrestorable(store: Store, report: RepairReport) -> RepairReport:
    """Of a session whose log reads whole, whatever the backend: the objects its entries
    need that the store does not hold soundly and no copy in the log restores. A repair
    of the log cannot bring them back, so the report names them (``unrestorable``)
    rather than call the session sound; a damaged log's plan says what it drops."""
    if report.damaged:
        return report
    restorable = set(report.restorable) if not report.objects_restored else set()
    objects = store.objects
    for entry in report.kept:
        try:
            content = envelope_content(objects.get("entries", entry))
        except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
            if ("entries", entry) not in restorable:
                report.unrestorable.append(("entries", entry))
            continue
        if content and ("contents", content) not in restorable and not objects.is_sound("contents", content):
            report.unrestorable.append(("contents", content))
    return report


def _backend_repair(store: Store, what: str) -> Any:
    if isinstance(store.backend, FileBackend):
        return getattr(file_repair, what)
    if store.url.startswith(("postgresql:", "postgres:")):
        from ..backends.postgresql import repair as postgresql_repair  # loaded only for such a store

        return getattr(postgresql_repair, what)
    return lambda st, sid, **kw: _whole_or_refused(st, sid)


def _whole_or_refused(store: Store, session_id: str) -> RepairReport:
    try:
        s = store.read(session_id)
    except SessionDamagedError as exc:
        raise UnsupportedError(f"{store.describe()} cannot repair session {session_id}: {exc}") from None
    s.close()
    return RepairReport(
        session=session_id, damaged=False, why="its log reads whole", kept=list(s.log_order),
        head=s.head, mark=s.mark, seq=s.state.max_seq, head_note="as the log names it", _kept_seqs=dict(s.own),
    )
