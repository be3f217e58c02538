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

from ..backends.base import SEVERITIES, SPACES, FsckProblem, FsckReport, Severity
from ..errors import AgentSessionError, CorruptObjectError, NoSuchSessionError
from ..store.store import Store
from ..store.url import open_store
from .check import check_sessions, verify_stored
from .sweep import unreferenced

__all__ = ["SEVERITIES", "FsckProblem", "FsckReport", "Severity", "fsck"]

def fsck(
    store: Store | str | os.PathLike[str], *, deep: bool = False, progress: Callable[[str], None] | None = None
) -> FsckReport:
    """Check the whole store and return what is wrong with it.

    ``store`` is a :class:`~agentsession_cas.store.Store` or a store URL or path
    (opened read-only, and closed again). ``deep`` also verifies every session the
    walk found no error in as ``verify ID`` does (its projection read as a file,
    request hashes and record rules included). ``progress`` is called with a short
    phase now and then. Reads only: no hold is taken, nothing is rewritten."""
    st = store if isinstance(store, Store) else open_store(store, readonly=True)
    try:
        walk = getattr(st.backend, "fsck", None)
        if walk is not None:
            report: FsckReport = walk(st, progress=progress)
        else:
            report = FsckReport(st.root or st.url)
            sound = _objects(st, report, progress) if st.backend.capabilities.sweep else None
            check_sessions(st, report, progress=progress)
            if sound is not None:
                report.counts["unreferenced"] = unreferenced(st, sound, progress=progress)
        _kept_headers(st, report)
        if deep:
            report.counts["deep_checked"] = _deep(st, report, progress)
        return report
    finally:
        if st is not store:
            st.close()


def _kept_headers(store: Store, report: FsckReport) -> None:
    """A warning for each header member of another form than RFC 0001's (store policy
    ``keep``: ``header-member``), which a store kept from before the rule or from an
    import, push or fetch: what the session holds, never damage. Said here, for every
    backend (``verify_stored`` leaves it to this pass); a header that does not read is
    the walk's to say."""
    for sid in store.list():
        try:
            header = store.header(sid)
        except (AgentSessionError, ValueError):
            continue
        for p in header.member_problems():
            report.add("warning", p.code, f"session {sid}: {p.message}; kept as written", session=sid)


def _objects(store: Store, report: FsckReport, progress: Callable[[str], None] | None) -> dict[str, list[str]]:
    """Every object read as the store reads it (verified against its name), for a backend
    whose walk is not its own (the memory store): counted per space as a PostgreSQL store's
    walk counts them, one that does not read an error, and the sound ones returned for the
    count of what nothing retains. They are listed before the logs are read, as a sweep
    lists them, so an append landing meanwhile is never counted unreferenced."""
    if progress:
        progress("reading every object")
    sound: dict[str, list[str]] = {space: [] for space in SPACES}
    counts = report.counts
    counts.update(objects=0, **{space: 0 for space in SPACES})
    for space, name, data in store.objects.read_all(SPACES):
        counts[space] += 1
        if isinstance(data, bytes):
            sound[space].append(name)
        elif isinstance(data, CorruptObjectError):
            report.add("error", "corrupt-object", f"{space} object {name} does not hash to its name", object=name,
                       space=space)
        else:
            report.add("error", "unreadable", f"{space} object {name} cannot be read: {data}", object=name, space=space)
    counts["objects"] = sum(counts[space] for space in SPACES)
    return sound


def _deep(store: Store, report: FsckReport, progress: Callable[[str], None] | None) -> int:
    """Verify every session the walk found no error in as ``verify ID`` does; the number checked."""
    failed = {p.session for p in report.errors if p.session}
    said: dict[str, set[tuple[str, str | None]]] = {}
    for w in report.warnings:
        if w.session:
            said.setdefault(w.session, set()).add((w.code, w.object))
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
                       session=sid, object=p.get("entry") or p.get("object"), file=p.get("file"))
        for n in check.notes:
            if n["severity"] == "warning" and (n["code"], n.get("object")) in said.get(sid, ()):
                continue  # (a warning the walk gave already: a missing sidecar blob)
            report.add(n["severity"], n["code"], f"session {sid}: {' '.join(str(n['message']).splitlines())}", session=sid,
                       file=n.get("file"), object=n.get("object"), space=n.get("space"))
    return checked
