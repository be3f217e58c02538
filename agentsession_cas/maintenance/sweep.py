"""Sweeping a store: removing what nothing retained names (RFC 0002 "Deletion and retention").

Retention follows references all the way down, as git's collector follows a
commit to its tree to its blobs, and never reachability from heads:

- an **envelope** is retained while any session's log names it (every
  append record, abandoned branches and uncommitted appends included) or it
  lies on a session's prefix (root..base);
- a **content** while a retained envelope names it;
- a **blob** while a retained content names it by a ``sidecar:`` URL.

Logs are read from ``sessions/`` and also from sessions being staged in
``tmp/`` (an import writes its staged log before its objects, so a sweep
running meanwhile sees what those objects are for). Nothing younger than
the grace period goes, whatever names it: a file (loose object or pack)
written or touched within it is left as it is, not even rewritten, so the
unretained objects in it go on ageing. What is kept of the older files is
repacked into one pack; what is dropped is removed only after that pack is
durable.

Safety beside writers in other processes:

- a sweep holds the store's pack lock (``locks/pack.lock``), so it never
  runs beside another sweep, a ``pack`` or a writer's pack merge;
- it decides over a snapshot of the packs and loose files taken first, and
  reads the logs after it: an append whose record reaches a log before the
  logs are read is retained, and one after it lands its objects in a new
  pack (checkpoints write whole packs) or a new loose file, neither of which
  is in the snapshot;
- while a pass over the logs finds a session deleted before its log could be
  read, it lists ``tmp/`` and ``sessions/`` again and reads every directory
  it has not read yet: a fork made of that session meanwhile holds the only
  log naming its prefix, and is read before anything is decided;
- a writer that finds an object already present touches ("freshens") the
  file holding it, as git does; a sweep does not remove a file whose mtime
  changed since the snapshot, so the object survives even with ``--grace 0``.
  The sweep first moves the file aside and reads its mtime there: a touch
  before the move is seen (the file is put back), and a writer touching it
  after the move finds it gone and writes the object again.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..backends.files.log import read_log, scan_log
from ..backends.files.objects import RepackResult, Snapshot
from ..backends.files.packs import SPACE_BITS
from ..errors import AgentSessionError, CorruptObjectError, NoSuchObjectError, StoreError
from ..format.hashing import is_hash

__all__ = ["DEFAULT_GRACE", "SweepResult", "parse_duration", "retained", "sweep"]

#: Two weeks, as git's gc.pruneExpire.
DEFAULT_GRACE = 14 * 24 * 3600.0
#: Leftovers in tmp/ (a crashed import's stage, a pack never finished) go once
#: older than the grace period, and never younger than this.
TMP_MIN_AGE = 3600.0

_DURATION = re.compile(r"(\d+)([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIDECAR = re.compile(rb"sidecar:(sha256:[0-9a-f]{64})")
_ENV_CONTENT = b'{"content":"'


def parse_duration(text: str) -> float:
    """Seconds in ``0``, ``90s``, ``15m``, ``12h``, ``14d``, ``2w`` (a bare number is seconds)."""
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a duration (such as 0, 90s, 15m, 12h, 14d, 2w)")
    return float(int(m.group(1)) * _UNITS[m.group(2)])


@dataclass
class Retained:
    """What the logs and prefixes of a store retain, and where it was read."""

    envelopes: set[str] = field(default_factory=set)
    contents: set[str] = field(default_factory=set)
    blobs: set[str] = field(default_factory=set)
    sessions: int = 0
    staged: int = 0


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
            path = os.path.join(base, name)
            yield path, staged, os.path.isfile(os.path.join(path, "log"))


def _identity(path: str) -> tuple[str, int, int] | None:
    """What tells one session directory from another: its path and its inode (a session
    deleted and created again under its id is another directory). None when it is gone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return path, st.st_dev, st.st_ino


def _read_logs(path: str) -> list | None:
    """The records of a session's log (torn tail included) and of the logs ``repair`` set
    aside beside it; None when the session went meanwhile. Raises ``_Damaged`` for a log
    with damage."""
    try:
        with open(os.path.join(path, "log"), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None  # deleted or renamed into place meanwhile: read where it went, or gone
    logread = read_log(data)
    if logread.damage:
        raise _Damaged(logread.damage[0])
    records = logread.records + logread.cut_records
    # A log repair set aside (log.damaged-*) still names entries someone may want
    # back: what of it reads is retained too, as long as the file is kept.
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return records  # deleted since its log was read: what it named is kept this once
    for name in names:
        if name.startswith("log.damaged"):
            try:
                with open(os.path.join(path, name), "rb") as f:
                    records = records + [ln.record for ln in scan_log(f.read()) if ln.record is not None]
            except FileNotFoundError:
                continue
    return records


class _Damaged(Exception):
    """A log with damage (carries the first damaged line)."""

    def __init__(self, first) -> None:
        super().__init__(first.reason)
        self.first = first


def retained(store, *, progress: Callable[[str], None] | None = None, blobs: bool = True) -> Retained:
    """Read every log (and staged log) and follow references down to blobs.

    A log with damage stops the sweep (``StoreError``): its unreadable records
    may name entries, and a sweep never guesses. Repair the session first.
    ``blobs=False`` (the store holds no blob) skips reading contents for
    ``sidecar:`` URLs.
    """
    objects = store.objects
    ret = Retained()
    envelopes = ret.envelopes
    contents = ret.contents
    bases: list[str] = []
    said: set[str] = set()  # envelopes whose content their record's payload gave
    # A session deleted before its log was read may have been forked meanwhile, and
    # its fork's prefix is then named by no log read so far: so while a pass finds a
    # session gone, the directories are listed again and any not read yet is read,
    # before anything is decided. (A session created while the logs are read needs no
    # reading otherwise: what it names is in a log read, or was written or touched
    # after the snapshot.)
    seen: set[tuple[str, int, int]] = set()
    again = True
    while again:
        again = False
        for path, staged, has_log in _session_dirs(store.root):
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
                records = _read_logs(path)
            except _Damaged as exc:
                raise StoreError(
                    f"{os.path.relpath(path, store.root)} has a damaged log (line {exc.first.line}: {exc.first.reason}); "
                    "a sweep cannot tell what its unreadable records name: repair the session first "
                    f"(agentsession repair {os.path.basename(path)})"
                ) from None
            if records is None:
                again = again or not staged
                continue
            for r in records:
                op = r.data.get("op")
                if op == "append":
                    entry = r.data.get("entry")
                    if isinstance(entry, str):
                        envelopes.add(entry)
                        if r.payload is not None:
                            c = _content_of(r.payload[1])
                            if c:
                                contents.add(c)
                                said.add(entry)
                elif op == "create" and isinstance(r.data.get("base"), str):
                    bases.append(r.data["base"])
            if staged:
                ret.staged += 1
            else:
                ret.sessions += 1
            if progress and (ret.sessions + ret.staged) % 256 == 0:
                progress(f"reading logs: {ret.sessions + ret.staged:,} read")
    if progress:
        progress(f"read {ret.sessions} session log(s), {ret.staged} staged")
    # Prefixes: walk up from each base until an entry already retained, whose
    # ancestors its own session's log and prefix retain in turn.
    for base in bases:
        current: str | None = base
        while current is not None and current not in envelopes:
            envelopes.add(current)
            try:
                env = _envelope(objects, current)
            except NoSuchObjectError:
                break  # missing: fsck's business; nothing above it can be read either
            current = env.get("parent") if isinstance(env.get("parent"), str) else None
    # Contents of retained envelopes (those whose payload did not already say).
    unsaid = envelopes - said
    if progress and unsaid:
        progress(f"reading {len(unsaid):,} envelope(s) for their contents")
    for name in _read_order(objects, unsaid):
        try:
            data = objects.get("entries", name)
        except (NoSuchObjectError, CorruptObjectError):
            continue
        c = _content_of(data)
        if c:
            contents.add(c)
    # Blobs: any retained content may name one (RFC 0002 sets no condition on the
    # session's media), so contents are read whenever the store holds a blob.
    if blobs:
        if progress and contents:
            progress(f"reading {len(contents):,} content(s) for the blobs they name")
        for name in _read_order(objects, contents):
            try:
                data = objects.get("contents", name)
            except (NoSuchObjectError, CorruptObjectError):
                continue
            if b"sidecar:" in data:
                ret.blobs.update(m.decode() for m in _SIDECAR.findall(data))
    return ret


def _read_order(objects, names: set[str]) -> list[str]:
    """``names`` in the order their bytes lie (pack, block, offset; loose ones last),
    so reading them all decompresses each block once, not once per object."""
    packs = objects.packs
    rank = {p.name: i for i, p in enumerate(packs.packs)}

    def where(name: str) -> tuple:
        found = packs.locate(name)
        if found is None:
            return (len(rank), 0, 0, name)
        pack, loc = found
        return (rank.get(pack.name, len(rank)), loc.block, loc.offset, name)

    return sorted(names, key=where)


def _content_of(envelope: bytes) -> str | None:
    """The content hash an envelope names (its first member, in canonical form)."""
    if envelope.startswith(_ENV_CONTENT):
        name = envelope[12:83].decode("ascii", "replace")
        if is_hash(name):
            return name
    try:
        from ..format.canonical import loads

        env = loads(envelope)
    except (ValueError, AgentSessionError):
        return None
    c = env.get("content") if isinstance(env, dict) else None
    return c if is_hash(c) else None


def _envelope(objects, name: str) -> dict:
    from ..format.canonical import loads

    try:
        env = loads(objects.get("entries", name))
    except CorruptObjectError as exc:
        raise NoSuchObjectError(str(exc)) from None
    return env if isinstance(env, dict) else {}


@dataclass
class SweepResult:
    """What a sweep removed (or, dry, would remove), and what it kept."""

    repack: RepackResult
    grace: float
    sessions: int
    staged: int
    retained_envelopes: int
    retained_contents: int
    retained_blobs: int
    tmp_removed: list[str] = field(default_factory=list)
    #: Files younger than the grace period, left as they were.
    young_files: int = 0

    def as_dict(self) -> dict:
        d = self.repack.as_dict()
        d.update(
            grace_seconds=self.grace,
            sessions=self.sessions,
            staged=self.staged,
            retained={"entries": self.retained_envelopes, "contents": self.retained_contents, "blobs": self.retained_blobs},
            tmp_removed=self.tmp_removed,
            young_files=self.young_files,
        )
        return d


def sweep(
    store,
    *,
    grace: float = DEFAULT_GRACE,
    dry_run: bool = False,
    wait: float = 60.0,
    progress: Callable[[int, int], None] | None = None,
    phase: Callable[[str], None] | None = None,
) -> SweepResult:
    """Remove every object nothing retained names and older than ``grace`` seconds,
    repacking what stays into one pack. See the module docstring for why it is
    safe beside writers. ``progress(done, total)`` is called as objects are copied,
    ``phase(text)`` as retention is read (logs, envelopes, contents) before that."""
    if store.readonly and not dry_run:
        raise StoreError("the store is open read-only; a sweep removes objects")
    objects = store.objects
    with objects.exclusive(wait):
        return _sweep_locked(store, grace=grace, dry_run=dry_run, progress=progress, phase=phase)


def _sweep_locked(store, *, grace, dry_run, progress, phase) -> SweepResult:
    """The sweep itself; the caller holds the store's pack lock."""
    objects = store.objects
    # The snapshot first, the logs after it (see the module docstring).
    snapshot = objects.snapshot()
    now = time.time()
    # Files younger than the grace period are left as they are, not rewritten:
    # a rewrite would make the unretained objects in them young again, and
    # sweeps more frequent than the grace period would then never remove them.
    old, young = _split_by_age(snapshot, now - grace)
    ret = retained(store, blobs=_holds_blobs(old), progress=phase)
    env_bit, con_bit, blob_bit = SPACE_BITS["entries"], SPACE_BITS["contents"], SPACE_BITS["blobs"]

    def keep(name: str, spaces: int, mtime: float) -> bool:
        if now - mtime < grace:
            return True
        if spaces & env_bit and name in ret.envelopes:
            return True
        if spaces & con_bit and name in ret.contents:
            return True
        if spaces & blob_bit and name in ret.blobs:
            return True
        return False

    result = objects._repack(keep, dry_run, snapshot=old, progress=progress)
    # The figures before count every file, those left alone too.
    result.packs_before += len(young.packs)
    result.loose_before += len(young.loose)
    result.bytes_before += young.size()
    tmp_removed = [] if dry_run else _clean_tmp(store.root, max(grace, TMP_MIN_AGE), now)
    return SweepResult(
        repack=result,
        grace=grace,
        sessions=ret.sessions,
        staged=ret.staged,
        retained_envelopes=len(ret.envelopes),
        retained_contents=len(ret.contents),
        retained_blobs=len(ret.blobs),
        tmp_removed=tmp_removed,
        young_files=len(young.packs) + len(young.loose),
    )


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


def _clean_tmp(root: str, age: float, now: float) -> list[str]:
    """Remove leftovers in tmp/ older than ``age`` (a crashed writer's)."""
    import shutil

    base = os.path.join(root, "tmp")
    removed = []
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return removed
    for name in sorted(names):
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if now - st.st_mtime < age:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
        removed.append(os.path.join("tmp", name))
    return removed
