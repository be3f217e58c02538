"""fsck, sweep, pack and migrate on a PostgreSQL store: the physical half of what
:mod:`agentsession_cas.maintenance` decides.

- **sweep** decides over the objects older than the grace, read after the
  sweep barrier (see :mod:`.objects`), then deletes the unretained ones in
  small transactions of their own, each re-checking ``born``, so writers are
  never blocked for longer than one batch's rows and an object a writer
  freshened meanwhile stays. What a log names is retained by the domain's
  rule; a fork made within the grace holds its prefix with one ``holds``
  row (no row of the prefix rewritten), added by the same rule's walk
  (:func:`agentsession_cas.maintenance.sweep.retain_prefixes`).
  A write committed after the logs were read either wrote its objects (a
  ``born`` after the barrier) or is a fork, whose base's session may have
  been deleted before the logs were read: each delete batch takes the
  barrier whole and reads the ``holds`` again, walking the prefix of a fork
  committed since, and a fork not committed yet checks its prefix is there
  after the batch (blobs, which it does not check, go in the last batches).
  So it loses nothing. Then it deletes the blocks no row names any more (all their objects
  swept, or stored again elsewhere) and made before the cut-off: a block is
  written in the transaction of the rows that name it, and no row is ever made
  to name a block written before, so one no row names stays so.
- **fsck** is :mod:`.fsck`.
- **pack** has nothing to do: PostgreSQL keeps its own storage (TOAST
  compresses objects over about 2 kB; autovacuum reclaims dead rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..base import RepackResult, Retained
from .database import sql
from .objects import hash_name
from .schema import SCHEMA_VERSION, SPACE_CODES, MigrationPlan, plan_upgrade

if TYPE_CHECKING:
    from . import PostgresBackend
    from .database import Database

__all__ = ["storage_report", "sweep_objects", "plan_migration", "migrate_schema"]

#: Rows a sweep deletes per transaction.
SWEEP_BATCH = 500
#: The objects' count and the bytes they are stored in: their rows' ``data``, and the blocks
#: (codec 3) the block-coded rows point into.
_STORED = "count(*), coalesce(sum(octet_length(data)), 0) + (SELECT coalesce(sum(octet_length(data)), 0) FROM blocks)"
#: Whether an object's row names block ``b`` (codec 3: the block's id in its first 8 bytes).
_NAMED = "SELECT 1 FROM objects o WHERE o.codec = 3 AND substr(o.data, 1, 8) = int8send(b.id)"


def sweep_objects(
    backend: PostgresBackend, compute: Callable[[bool], Retained], *, grace: float, dry_run: bool,
    progress: Callable[[int, int], None] | None,
) -> tuple[RepackResult, int, list[str], Retained]:
    db = backend.db
    with db.conn() as c:
        with c.transaction():
            # The barrier: every write that touched an object before now has committed
            # (its log rows are read below); every later one stamps a younger ``born``.
            c.execute("SELECT pg_advisory_xact_lock(%s)", [db.lock_key("sweep")])
            cutoff = c.execute("SELECT clock_timestamp() - make_interval(secs => %s)", [grace]).fetchone()[0]
        # (the bytes stored: the rows' own and the blocks' that block-coded rows point into)
        total, size = c.execute(f"SELECT {_STORED} FROM objects").fetchone()
        old = c.execute("SELECT space, hash, octet_length(data) FROM objects WHERE born < %s", [cutoff]).fetchall()
        holds = _holds(c, cutoff, set())
    blobs = any(space == SPACE_CODES["blobs"] for space, _, _ in old)
    ret = compute(blobs)
    # Forks made within the grace hold theirs, by the domain's rule (it sits above the backends).
    from ...maintenance.sweep import StoredObjects, retain_prefixes

    def hold(bases: list[str]) -> None:
        retain_prefixes(ret, bases, StoredObjects(backend.objects), blobs=blobs)

    hold(list(holds.values()))
    retained = {SPACE_CODES["entries"]: ret.envelopes.raws, SPACE_CODES["contents"]: ret.contents.raws,
                SPACE_CODES["blobs"]: ret.blobs.raws}
    # (blobs last: a fork's create checks its prefix's envelopes and contents are there, not
    # the blobs they name, so a batch of blobs comes after every batch that could refuse it)
    drop = sorted(((space, bytes(raw), n) for space, raw, n in old if bytes(raw) not in retained[space]),
                  key=lambda d: d[0] == SPACE_CODES["blobs"])
    result = RepackResult(dry_run=dry_run, loose_before=int(total), bytes_before=int(size))
    removed = 0
    removed_bytes = 0
    block_bytes = 0
    names: set[str] = set()
    for i in range(0, len(drop), SWEEP_BATCH):
        batch = drop[i:i + SWEEP_BATCH]
        if dry_run:
            gone = [(s, r) for s, r, _ in batch]
        else:
            gone = []
            while True:
                # A fork committed since the holds were read (its origin deleted before the
                # logs were read, its own log after) holds its prefix: walked here, outside
                # the barrier (a walk of a long prefix under it stopped every write of the
                # store), its objects then retained for this batch and every later one.
                with db.conn() as c:
                    new = _holds(c, cutoff, set(holds))
                if new:
                    holds.update(new)
                    hold(list(new.values()))
                with db.conn() as c, c.transaction():
                    # Under the barrier, taken whole: no fork commits meanwhile, so the holds
                    # read again here are all there are (one committed since the walk: walked
                    # first, then this again); one not committed yet checks its prefix is
                    # still here once this batch has gone (_hold_prefix) and refuses if not.
                    c.execute("SELECT pg_advisory_xact_lock(%s)", [db.lock_key("sweep")])
                    if _holds(c, cutoff, set(holds)):
                        continue
                    batch = [d for d in batch if d[1] not in retained[d[0]]]
                    for space in {s for s, _, _ in batch}:
                        raws = [r for s, r, _ in batch if s == space]
                        rows = c.execute(
                            "DELETE FROM objects WHERE space = %s AND hash = ANY(%s) AND born < %s RETURNING hash",
                            [space, raws, cutoff],
                        ).fetchall()
                        gone.extend((space, bytes(r[0])) for r in rows)
                        if space == SPACE_CODES["entries"] and rows:
                            c.execute("DELETE FROM edges WHERE child = ANY(%s)", [[bytes(r[0]) for r in rows]])
                break
        sizes = {(s, r): n for s, r, n in batch}
        for key in gone:
            removed += 1
            removed_bytes += int(sizes[key])
            names.add(hash_name(key[1]))
        if progress:
            progress(min(i + SWEEP_BATCH, len(drop)), len(drop))
    if not dry_run:
        with db.conn() as c:
            c.execute("DELETE FROM holds WHERE at < %s", [cutoff])
            blocks, block_bytes = c.execute(
                f"WITH gone AS (DELETE FROM blocks b WHERE b.made < %s AND NOT EXISTS ({_NAMED}) RETURNING octet_length(data) AS n) "
                "SELECT count(*), coalesce(sum(n), 0) FROM gone", [cutoff]).fetchone()
        if blocks:
            result.note("blocks-removed", f"{blocks} block(s) no object is read from any more were removed ({int(block_bytes):,} bytes)")
    kept = len(drop) - removed
    if kept and not dry_run:
        result.note("kept-touched", f"{kept} object(s) were written or held again while the sweep ran, and were kept")
    result.dropped = len(names)
    result.dropped_names = sorted(names)
    result.dropped_bytes = removed_bytes
    result.objects = int(total) - removed
    result.bytes_after = int(size) - removed_bytes - int(block_bytes)
    return result, int(total) - len(old), [], ret


def _holds(conn: Any, cutoff: Any, seen: set[int]) -> dict[int, str]:
    """The ``holds`` rows younger than the cut-off not in ``seen`` (id -> base)."""
    rows = conn.execute("SELECT id, base FROM holds WHERE at >= %s", [cutoff]).fetchall()
    return {int(i): b for i, b in rows if int(i) not in seen}


def storage_report(backend: PostgresBackend) -> RepackResult:
    """``pack`` on this backend: nothing moves; the report says what the tables hold."""
    rows = backend.db.query(
        f"SELECT {_STORED}, pg_total_relation_size('objects') + pg_total_relation_size('blocks') FROM objects"
    )
    count, raw, on_disk = rows[0]
    res = RepackResult(bytes_before=int(on_disk), bytes_after=int(on_disk))
    res.note(
        "own-storage", f"{backend.describe()} keeps its own storage (TOAST compresses large objects, autovacuum reclaims "
        f"space): nothing to pack; {int(count):,} objects of {int(raw):,} bytes take {int(on_disk):,} bytes with indexes"
    )
    return res


# -- migrate -----------------------------------------------------------------------------


def plan_migration(db: Database) -> MigrationPlan:
    """What ``agentsession migrate`` would do to this database's store; writes nothing."""
    found = db.version()
    plan = MigrationPlan(db.public, found)
    if found is None:
        plan.status = "no-store"
    elif found > SCHEMA_VERSION:
        plan.status = "newer"
    elif found < SCHEMA_VERSION:
        with db.conn() as c:
            quoted = sql.Identifier(db.schema).as_string(c)
        plan.statements = plan_upgrade(found, quoted)
        plan.status = "upgrade"
    return plan


def migrate_schema(db: Database, *, dry_run: bool = False) -> MigrationPlan:
    """Upgrade the store's schema to this release's version in one transaction (a failed
    step rolls all of it back); a dry run only plans. Serialised with any other migrate
    or init by an advisory lock, and re-planned under it."""
    plan = plan_migration(db)
    if dry_run or plan.status != "upgrade":
        if dry_run and plan.status == "upgrade":
            plan.status = "dry-run"
        return plan
    with db.conn() as c, c.transaction():
        c.execute("SELECT pg_advisory_xact_lock(%s)", [db.lock_key("init")])
        row = c.execute("SELECT value FROM meta WHERE key = 'version' FOR UPDATE").fetchone()
        if row is None or int(row[0]) != plan.found:
            plan.status = "changed"
            return plan
        for statement in plan.statements:
            c.execute(statement.encode())
        c.execute("UPDATE meta SET value = %s WHERE key = 'version'", [str(SCHEMA_VERSION)])
    plan.status = "migrated"
    return plan
