"""The file backend's half of a sweep: which logs retain objects, and removing the rest.

The rule is the domain's (:func:`agentsession_cas.maintenance.sweep.retained`);
this module reads the logs it needs (``sessions/``, sessions being staged in
``tmp/``, logs ``repair`` kept aside) and removes, under the store's pack lock,
what nothing retains from the files older than the grace period. See the
docstring of :mod:`agentsession_cas.maintenance.sweep` for why it is safe
beside writers in other processes.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator

from ...errors import CorruptPackError, StoreError, SweepRefusedError
from ...format.hashing import envelope_content
from ...format.media import sidecar_names
from ...fsutil import ATOMIC_TMP, read_dense, read_small
from ..base import RepackResult, Retained, RetentionSource
from .log import LogDamage, Record, read_log, scan_log
from .objects import DROPPED_LOOSE, DROPPED_PACK, FileObjects, Snapshot
from .packs import SPACE_BITS

__all__ = ["SESSION_FILES", "TMP_MIN_AGE", "retention_source", "retention_sources", "sweep_objects", "writers_holding"]

#: The files of a session directory: one holding any of them is a session's.
SESSION_FILES = ("header", "log", "HEAD", "mark", "summary", "rules", "ids")

#: Leftovers in tmp/ (a crashed import's stage, a pack never finished) go once
#: older than the grace period, and never younger than this.
TMP_MIN_AGE = 3600.0


#: A repair's plan of a session whose header file is lost opens the session from a
#: directory in ``tmp/`` of this name holding links to its files (backends/files/repair.py):
#: nothing a sweep must honour beyond the session itself, and one a killed repair left is
#: a leftover like any other (removed once old), never a stage that stops the sweep.
REPAIR_PLAN_PREFIX = "repair-plan-"


def _session_dirs(root: str) -> Iterator[tuple[str, bool, bool]]:
    """Every name in ``tmp/`` and ``sessions/``: (path, staged, holds a log). A directory
    holding a log is one a sweep must honour.

    ``tmp/`` is listed and its logs read before ``sessions/`` is listed: an
    import renames its stage from the one to the other, so a stage that moves
    while the sweep reads is found in ``sessions/`` (had ``sessions/`` been
    listed first, the move could fall between the two listings and be missed)."""
    for parent, staged in (("tmp", True), ("sessions", False)):
        base = os.path.join(root, parent)
        try:
            names = sorted(os.listdir(base))
        except FileNotFoundError:
            continue
        for name in names:
            if staged and name.startswith(REPAIR_PLAN_PREFIX):
                continue  # links to a session's own files, for a repair's plan: no stage
            path = os.path.join(base, name)
            # lexists, not isfile: a log that is no regular file (a FIFO, a link) is a
            # session whose records cannot be read, never one without a log.
            yield path, staged, os.path.lexists(os.path.join(path, "log"))


def _identity(path: str) -> tuple[str, int, int] | None:
    """What tells one session directory from another: its path and its inode (a session
    deleted and created again under its id is another directory). None when it is gone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return path, st.st_dev, st.st_ino


def _read_logs(path: str, staged: bool) -> list | None:
    """The records of a session's log (torn tail included) and of the logs ``repair`` set
    aside beside it; None when the session went meanwhile. Raises ``_Damaged`` for a log
    with damage, and for a session's log that lost what its HEAD names (empty, without its
    create record, or cut short at a record boundary: every line left reads), whose lost
    entries ``repair`` takes back from objects/ while they are there."""
    from .sessions import kept_summary  # (sessions imports this module)

    head = None if staged else _head_index(path)  # before the log: HEAD may lag it, never lead it
    summary = None if staged else kept_summary(path)  # (so may the summary)
    try:
        data = read_dense(os.path.join(path, "log"))
    except FileNotFoundError:
        return None  # deleted or renamed into place meanwhile: read where it went, or gone
    except OSError as exc:  # a FIFO, a link, a directory where the log should be
        raise _Damaged(LogDamage(1, 0, f"the log cannot be read ({exc.strerror or exc})")) from None
    logread = read_log(data)
    if logread.damage:
        raise _Damaged(logread.damage[0])
    records = logread.records + logread.cut_records
    if not staged:  # (a stage is a session being written: its log may not be whole yet)
        from ...store.state import log_loss  # the domain's rule (it sits above the backends)

        lost = log_loss([r.data for r in logread.records], head, summary=summary)
        if lost is not None:
            where = (len(logread.records) + 1, len(data)) if logread.records and logread.records[0].op == "create" else (1, 0)
            raise _Damaged(LogDamage(*where, lost))
    # A log repair set aside (log.damaged-*) still names entries someone may want
    # back: what of it reads is retained too, as long as the file is kept.
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return records  # deleted since its log was read: what it named is kept this once
    for name in names:
        if name.startswith("log.damaged"):
            try:
                kept = read_dense(os.path.join(path, name))
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _Damaged(LogDamage(1, 0, f"{name} cannot be read ({exc.strerror or exc})")) from None
            records = records + [ln.record for ln in scan_log(kept) if ln.record is not None]
    return records


def _head_index(path: str) -> str | None:
    try:
        return read_small(os.path.join(path, "HEAD"), 256).decode("ascii", "replace").strip()
    except OSError:
        return None


def _holds_a_session(path: str) -> bool:
    try:
        return any(name in SESSION_FILES for name in os.listdir(path))
    except OSError:
        return False


class _Damaged(Exception):
    """A log with damage (carries the first damaged line)."""

    def __init__(self, first) -> None:
        super().__init__(first.reason)
        self.first = first


def retention_sources(root: str) -> Iterator[RetentionSource]:
    """Every log a sweep must honour, read as it stands (torn tail included).

    A session deleted before its log was read may have been forked meanwhile, and
    its fork's prefix is then named by no log read so far: so while a pass finds a
    session gone, the directories are listed again and any not read yet is read,
    before anything is decided. (A session created while the logs are read needs no
    reading otherwise: what it names is in a log read, or was written or touched
    after the snapshot.) A log with damage stops the sweep: its unreadable records
    may name entries, and a sweep never guesses."""
    seen: set[tuple[str, int, int]] = set()
    again = True
    while again:
        again = False
        for path, staged, has_log in _session_dirs(root):
            if not has_log and not staged and _holds_a_session(path):
                # A session directory without its log (sessions are renamed into sessions/
                # whole, and out of it whole): what its lost log named is not known.
                raise SweepRefusedError(
                    f"{os.path.relpath(os.path.join(path, 'log'), root)} is missing; a sweep cannot tell what it "
                    f"named: repair the session first (agentsession repair {os.path.basename(path)})",
                    session=os.path.basename(path),
                )
            ident = _identity(path) if has_log else None
            if ident is None:
                # Gone since it was listed: a stage renamed into sessions/ (found there,
                # listed next) or a session deleted (list everything again).
                again = again or (not staged and not os.path.isdir(path))
                continue
            if ident in seen:
                continue
            seen.add(ident)
            try:
                records = _read_logs(path, staged)
            except _Damaged as exc:
                raise SweepRefusedError(
                    f"{os.path.relpath(os.path.join(path, 'log'), root)} is damaged (line {exc.first.line}: {exc.first.reason}); "
                    "a sweep cannot tell what its unreadable records name: repair the session first "
                    f"(agentsession repair {os.path.basename(path)})", session=os.path.basename(path)
                ) from None
            if records is None:
                again = again or not staged
                continue
            yield retention_source(records, staged)


def retention_source(records: Iterable[Record], staged: bool = False) -> RetentionSource:
    """A log's records (and those repair kept aside beside it) as the retention rule
    reads them, for a sweep and for fsck's walk alike: with each append's own copy of
    its objects, the content it names and the blobs that content names."""
    contents: dict[str, str] = {}
    blobs: set[str] = set()
    datas = []
    for r in records:
        datas.append(r.data)
        if r.payload is not None and r.data.get("op") == "append" and isinstance(r.data.get("entry"), str):
            c = envelope_content(r.payload[1])
            if c:
                contents[r.data["entry"]] = c
                # Until a checkpoint writes it out, the log alone holds the content:
                # the blobs it names are read here, not from objects/ (nor another
                # process's view of this log), or they would go with the writer open.
                blobs.update(sidecar_names(r.payload[0]))
    return RetentionSource(datas, contents, staged, blobs)


def sweep_objects(
    objects: FileObjects,
    root: str,
    compute: Callable[[bool], Retained],
    *,
    grace: float,
    dry_run: bool,
    wait: float,
    progress: Callable[[int, int], None] | None,
) -> tuple[RepackResult, int, list[str], Retained]:
    """Under the pack lock: snapshot the files, then learn what is retained (``compute``
    reads the logs), then repack the files older than ``grace``, keeping what is
    retained. Returns (what the repack did, files left young, tmp/ leftovers removed,
    what was retained)."""
    _check_own_dir(root, "tmp")  # before anything is removed
    with objects.exclusive(wait):
        # A pack whose index was lost is indexed again first: else its objects are in
        # no snapshot, and the store stays broken after a sweep that says it is done.
        lost = objects.index_lost(dry_run)
        # The snapshot first, the logs after it (see the module docstring).
        snapshot = objects.snapshot()
        _refuse_unread_packs(root, lost, snapshot)
        now = time.time()
        # Files younger than the grace period are left as they are, not rewritten:
        # a rewrite would make the unretained objects in them young again, and
        # sweeps more frequent than the grace period would then never remove them.
        old, young = _split_by_age(snapshot, now - grace)
        ret = compute(_holds_blobs(old))
        env_bit, con_bit, blob_bit = SPACE_BITS["entries"], SPACE_BITS["contents"], SPACE_BITS["blobs"]
        envelopes, contents, blobs = ret.envelopes.raws, ret.contents.raws, ret.blobs.raws

        def keep(name: str, spaces: int, mtime: float) -> bool:
            if now - mtime < grace:
                return True
            raw = bytes.fromhex(name[7:])  # (an object's name, as the repack reads it)
            if spaces & env_bit and raw in envelopes:
                return True
            if spaces & con_bit and raw in contents:
                return True
            if spaces & blob_bit and raw in blobs:
                return True
            return False

        result = lost.joined(objects._repack(keep, dry_run, snapshot=old, progress=progress))
        # The figures before count every file, those left alone too.
        result.packs_before += len(young.packs)
        result.loose_before += len(young.loose)
        result.bytes_before += young.size()
        age = max(grace, TMP_MIN_AGE)
        tmp_removed = [] if dry_run else _clean_tmp(root, age, now) + _clean_atomic_temps(root, age, now)
        return result, len(young.packs) + len(young.loose), tmp_removed, ret


def _refuse_unread_packs(root: str, lost: RepackResult, snap: Snapshot) -> None:
    """Stop the sweep, before any log is read or any file removed, while a pack's index
    does not read (damaged: the pack set skips it) or a pack without one could not be
    indexed (it does not read whole). No read sees such a pack's objects, so the
    retention rule would read none of its envelopes: the contents and blobs they name
    would go as unretained (and a pack read without its index with them). A sweep never
    guesses: ``pack`` reads a pack whose index is damaged without it and copies what
    reads into a new pack, whose index the sweep then reads."""
    # (an index whose pack is gone holds nothing to lose: fsck names it, the sweep goes on)
    bad = {key: why for key, why in snap.bad.items() if os.path.lexists(os.path.join(root, "objects", "pack", key + ".pack"))}
    if bad:
        key, why = min(bad.items())
        raise CorruptPackError(
            f"{why}; a sweep cannot tell what the objects of its pack name, so it removed nothing: run "
            "`agentsession pack` first (it reads the pack without its index and copies what reads into a "
            f"new pack){_and_more(len(bad))}", path=os.path.join(root, "objects", "pack", key + ".idx"),
        )
    unindexed = [p for p in lost.problems if p.code == "bad-pack"]
    if unindexed:
        raise CorruptPackError(
            f"{unindexed[0].message}; a sweep cannot tell what the objects of that pack name, so it removed "
            "nothing: move the pack out of objects/pack/ (keep it for whoever can read it) or put its index "
            f"back, then sweep{_and_more(len(unindexed))}", path=os.path.join(root, unindexed[0].file or ""),
        )


def _and_more(count: int) -> str:
    return f" ({count - 1} more pack(s) like it: `agentsession fsck` names them)" if count > 1 else ""


def _split_by_age(snap: Snapshot, cutoff: float) -> tuple[Snapshot, Snapshot]:
    """(files last written at or before ``cutoff``, files written after it)."""
    old = Snapshot([], [], dict(snap.bad))
    young = Snapshot([], [], {})
    for pm in snap.packs:
        (old if pm[1] / 1e9 <= cutoff else young).packs.append(pm)
    for item in snap.loose:
        (old if item[3].st_mtime <= cutoff else young).loose.append(item)
    return old, young


def _holds_blobs(snap: Snapshot) -> bool:
    """Whether any file a sweep decides over holds a blob (else no content need be
    read for the blobs it names)."""
    if any(space == "blobs" for space, *_ in snap.loose):
        return True
    bit = SPACE_BITS["blobs"]
    return any(spaces & bit for pack, _ in snap.packs for _, (_, _, _, spaces) in pack.records())


def _check_own_dir(root: str, name: str) -> None:
    """A store directory a sweep removes old files from must be the store's own: a
    symbolic link there (to a directory outside) would have them removed where they
    belong to someone else. Refused, naming it, before anything is removed."""
    path = os.path.join(root, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(
            f"{path} is a symbolic link (to {os.readlink(path)}), not the store's own directory; "
            "sweep removes old files there, so it refuses to run: put a directory back in its place"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{path} is not a directory; sweep refuses to run until it is the store's own directory")


def _clean_tmp(root: str, age: float, now: float) -> list[str]:
    """Remove leftovers in tmp/ older than ``age`` (a crashed writer's)."""
    base = os.path.join(root, "tmp")
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return removed
    for name in sorted(names):
        if DROPPED_LOOSE.fullmatch(name) or DROPPED_PACK.fullmatch(name):
            # A drop a killed sweep left (its mtime the object's own, so it looks old): it
            # may be the one copy of what a writer touched; only a put-back moves it.
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if now - st.st_mtime < age:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            import shutil  # (imported here: head and list load this module, not its sweep)

            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
        removed.append(os.path.join("tmp", name))
    return removed


def _clean_atomic_temps(root: str, age: float, now: float) -> list[str]:
    """Remove ``.tmp-*`` files older than ``age`` in the session directories: what a crash
    between :func:`~agentsession_cas.fsutil.write_atomic`'s write and its rename left
    beside a header, summary, rules file or log (nothing reads them; a write in
    progress keeps its file's mtime young)."""
    removed: list[str] = []
    sessions = os.path.join(root, "sessions")
    try:
        sids = sorted(os.listdir(sessions))
    except OSError:
        return removed
    for sid in sids:
        try:
            names = sorted(n for n in os.listdir(os.path.join(sessions, sid)) if n.startswith(ATOMIC_TMP))
        except OSError:
            continue  # not a directory, or gone meanwhile
        for name in names:
            path = os.path.join(sessions, sid, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < age:
                    continue
                os.unlink(path)
            except FileNotFoundError:
                continue
            removed.append(os.path.join("sessions", sid, name))
    return removed


def writers_holding(root: str) -> list[str] | None:
    """The sessions whose writer lock (``locks/<id>.lock``) a process holds now, read
    from the kernel's lock table without taking any lock (taking one to test it would
    make a writer opening that moment fail); None where that table cannot be read."""
    from .fsck import _proc_locks  # the one reader of /proc/locks

    held = _proc_locks()
    if held is None:
        return None
    locks = os.path.join(root, "locks")
    try:
        names = sorted(os.listdir(locks))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if not name.endswith(".lock"):
            continue
        try:
            st = os.stat(os.path.join(locks, name))
        except OSError:
            continue
        if (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in held:
            out.append(name[: -len(".lock")])
    return out
