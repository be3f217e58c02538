"""The PostgreSQL store's tables, their version, and upgrading an older version in one transaction.

A store is one PostgreSQL schema (``agentsession`` unless the URL's ``schema=``
names another), so several stores can share a database. Its ``meta`` table
says which version of the tables it holds; this release writes
:data:`SCHEMA_VERSION`, opens nothing else, and upgrades an older version
only when asked (``agentsession migrate``), running every step of
:data:`UPGRADES` inside one transaction, so a failed upgrade leaves the
older schema exactly as it was.

Hashes are kept as their 32 raw bytes (``bytea``), not as ``sha256:<hex>``
text: half the size in the tables and their indexes.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from ...lean import dataclass

__all__ = ["SCHEMA_VERSION", "UPGRADES", "SPACE_CODES", "MigrationPlan", "create_statements", "plan_upgrade", "sound"]

#: The version of the tables this release creates and reads. Version 2: no ``sum`` column
#: (every reader hashes what it decoded against the name), one index on ``edges``, and
#: the ``dictionaries`` of codec 2 (see :mod:`.compression`). Version 3: the ``blocks``
#: of codec 3. Version 4: the ``states`` a writer leaves at close. Version 5: the
#: ``states`` of kind 2, a snapshot of the replayed log that an open starts from.
SCHEMA_VERSION = 5

#: The three hash spaces, as the ``space`` column holds them.
SPACE_CODES: dict[str, int] = {"entries": 0, "contents": 1, "blobs": 2}



def create_statements(schema: str) -> list[str]:
    """The statements that create every table of a store in ``schema`` (quoted by the caller)."""
    s = schema
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL)",
        # Objects of the three spaces, by space and hash. ``data`` is the object's bytes
        # as ``codec`` says (0: as they are; 1: a zstd frame of them; 2: a zstd frame made
        # with one of the ``dictionaries``), checked against the name by every reader;
        # ``born`` is when the object was last written or held (what a sweep's grace
        # counts from).
        f"""CREATE TABLE {s}.objects (
            space smallint NOT NULL,
            hash bytea NOT NULL,
            codec smallint NOT NULL,
            data bytea NOT NULL,
            born timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (space, hash))""",
        # The values are compressed already: TOAST need not try again.
        f"ALTER TABLE {s}.objects ALTER COLUMN data SET STORAGE EXTERNAL",
        # RFC 0002's "edges": every envelope stored adds a row per parent it names
        # (``parent`` and ``parents``); ``first`` marks its ``parent``. Its one index, on
        # (child, parent), is what the backend asks of it: a walk up the ``parent`` links
        # (a fork's prefix read in a few queries, not one per entry) and a sweep's removal
        # by child. A search for the children of an entry scans it.
        f"""CREATE TABLE {s}.edges (
            parent bytea NOT NULL,
            child bytea NOT NULL,
            first boolean NOT NULL,
            PRIMARY KEY (child, parent))""",
        DICTIONARIES.format(schema=s),
        *(b.format(schema=s) for b in BLOCKS),
        # One row per session incarnation: ``key`` is never reused, so a session deleted
        # and made again is another row and another log. ``last_pos`` is the log's length
        # (every write is a conditional update on it and on ``fence``, the token of the
        # writer that holds the session, which only ever grows).
        f"""CREATE TABLE {s}.sessions (
            key bigserial PRIMARY KEY,
            id text NOT NULL UNIQUE,
            header bytea NOT NULL,
            base text,
            head text,
            mark text NOT NULL CHECK (mark IN ('record', 'mirror')),
            last_pos integer NOT NULL,
            fence bigint NOT NULL DEFAULT 0,
            holder text,
            created timestamptz NOT NULL DEFAULT clock_timestamp())""",
        # The per-session log: one row per record, in order (``pos``); the record's op,
        # its entry's sequence number and hash, and the entry's content hash where the
        # writer knew it, as columns for SQL and for a sweep; the record's JSON as written.
        f"""CREATE TABLE {s}.log (
            session bigint NOT NULL,
            pos integer NOT NULL,
            op text NOT NULL,
            seq integer,
            hash bytea,
            content bytea,
            record text NOT NULL,
            PRIMARY KEY (session, pos))""",
        # The rows of a log a repair replaced, kept aside (as the file backend keeps a
        # damaged log file): a sweep still honours what they name.
        f"""CREATE TABLE {s}.log_aside (
            session bigint NOT NULL,
            id text NOT NULL,
            kept timestamptz NOT NULL,
            pos integer NOT NULL,
            record text NOT NULL,
            PRIMARY KEY (session, kept, pos))""",
        f"""CREATE TABLE {s}.refs (
            name text PRIMARY KEY,
            record text NOT NULL)""",
        f"""CREATE TABLE {s}.remotes (
            url text NOT NULL,
            kind text NOT NULL,
            name text NOT NULL,
            record text NOT NULL,
            PRIMARY KEY (url, kind, name))""",
        # A fork's hold on its prefix (root..base), one row per fork made: a sweep keeps
        # the prefix of every hold younger than its grace, as it keeps a touched file.
        f"""CREATE TABLE {s}.holds (
            id bigserial PRIMARY KEY,
            base text NOT NULL,
            at timestamptz NOT NULL DEFAULT clock_timestamp())""",
        STATES.format(schema=s),
        APPEND_FUNCTION.format(schema=s, replace=REPLACE),
    ]


#: What a writer leaves at close so the next reader need not read the session (the file
#: backend's ``summary`` and ``rules`` files): kind 0 the summary ``list`` shows, kind 1
#: the append rules' state, each the domain's JSON object in canonical bytes (TOAST
#: compresses the big ones), with ``pos``, the log's length it describes; kind 2 the
#: log's first ``pos`` records as the file backend compacts them (its ``create`` and
#: ``snapshot`` lines, checksummed: :mod:`.sessions`), which an open replays with the
#: rows after ``pos``. Indexes: a row lost or stale is rebuilt from the log, and each is
#: checked against the log before it is trusted. Keyed by the session's incarnation, so
#: a session made again never finds the last one's.
STATES = """CREATE TABLE {schema}.states (
            session bigint NOT NULL,
            kind smallint NOT NULL CHECK (kind IN (0, 1, 2)),
            pos integer NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (session, kind))"""


#: The zstd dictionaries of codec 2, one per space once trained (:mod:`.compression`),
#: by the id zstd writes in each frame made with it. Never deleted: rows name them.
DICTIONARIES = """CREATE TABLE {schema}.dictionaries (
            id integer PRIMARY KEY,
            space smallint NOT NULL,
            data bytea NOT NULL,
            made timestamptz NOT NULL DEFAULT clock_timestamp())"""


def sound(table: str) -> str:
    """What the server can tell of a row of ``table``: raw bytes (codec 0) hash to the
    object's name. (Bytes that did not hash to their name when stored are always stored
    raw, so the test finds them; a compressed row is checked by every reader, after
    decompressing.)"""
    return f"({table}.codec <> 0 OR sha256({table}.data) = {table}.hash)"


#: An upsert's ``ON CONFLICT`` update (the row already held is ``objects``, the one
#: written ``EXCLUDED``): the object's ``born`` freshened, and its bytes replaced only
#: where the row held is not known sound and the one written is (a corrupt row repaired
#: by storing the sound bytes again, and a sound one never replaced by a corrupt put).
#: Bytes equal to those held keep the row's stored value (no new TOAST).
REPLACE = """born = clock_timestamp(),
            codec = CASE WHEN objects.data = EXCLUDED.data OR (objects.codec = 0 AND sha256(objects.data) = objects.hash)
                              OR NOT {incoming} THEN objects.codec ELSE EXCLUDED.codec END,
            data = CASE WHEN objects.data = EXCLUDED.data OR (objects.codec = 0 AND sha256(objects.data) = objects.hash)
                             OR NOT {incoming} THEN objects.data ELSE EXCLUDED.data END""".format(
    incoming=sound("EXCLUDED"))


#: An append as one statement (one round trip, its own transaction): the conditional
#: update of the session's row (its fencing token and log length), then the objects, the
#: edges and the log rows. False, with nothing written, when the row did not match.
APPEND_FUNCTION = """CREATE FUNCTION {schema}.append_records(
    p_key bigint, p_fence bigint, p_from integer, p_head text, p_mark text, p_lazy boolean, p_barrier bigint,
    o_space smallint[], o_hash bytea[], o_codec smallint[], o_data bytea[],
    e_parent bytea[], e_child bytea[], e_first boolean[],
    l_op text[], l_seq integer[], l_hash bytea[], l_content bytea[], l_record text[]) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF p_lazy THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM pg_advisory_xact_lock_shared(p_barrier);
    UPDATE sessions SET last_pos = p_from + cardinality(l_op), head = p_head, mark = p_mark
     WHERE key = p_key AND fence = p_fence AND last_pos = p_from;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO objects (space, hash, codec, data) SELECT * FROM unnest(o_space, o_hash, o_codec, o_data)
        ON CONFLICT (space, hash) DO UPDATE SET {replace};
    INSERT INTO edges (parent, child, first) SELECT * FROM unnest(e_parent, e_child, e_first) ON CONFLICT DO NOTHING;
    INSERT INTO log (session, pos, op, seq, hash, content, record)
        SELECT p_key, p_from + t.n, t.op, t.seq, t.hash, t.content, t.record
          FROM unnest(l_op, l_seq, l_hash, l_content, l_record) WITH ORDINALITY AS t(op, seq, hash, content, record, n);
    RETURN true;
END
$$"""


#: Blocks of objects stored together (codec 3, :mod:`.compression`): a big write's objects,
#: about 256 KiB of them in one zstd frame, each object's row naming its block and slot.
#: ``made`` is what a sweep's grace counts from for a block no row names any more. The
#: frames are compressed already: TOAST need not try again.
BLOCKS = [
    """CREATE TABLE {schema}.blocks (
            id bigserial PRIMARY KEY,
            data bytea NOT NULL,
            made timestamptz NOT NULL DEFAULT clock_timestamp())""",
    "ALTER TABLE {schema}.blocks ALTER COLUMN data SET STORAGE EXTERNAL",
]


#: Statements that take version N to N + 1, keyed by N (``{schema}`` filled in by
#: :func:`plan_upgrade`): each list runs inside the one transaction of an upgrade.
UPGRADES: dict[int, list[str]] = {
    # 1 -> 2. Rows keep their codecs (0 and 1 read as before). The dropped ``sum``
    # column's bytes go as PostgreSQL rewrites rows (``VACUUM FULL {schema}.objects``,
    # outside the upgrade, to have them back at once).
    1: [
        "DROP FUNCTION {schema}.append_records(bigint, bigint, integer, text, text, boolean, bigint, smallint[], "
        "bytea[], smallint[], bytea[], bytea[], bytea[], bytea[], boolean[], text[], integer[], bytea[], bytea[], text[])",
        "ALTER TABLE {schema}.objects DROP COLUMN sum",
        "DROP INDEX {schema}.edges_up",
        "ALTER TABLE {schema}.edges DROP CONSTRAINT edges_pkey",
        "ALTER TABLE {schema}.edges ADD PRIMARY KEY (child, parent)",
        DICTIONARIES,
        APPEND_FUNCTION.replace("{replace}", REPLACE),
    ],
    # 2 -> 3. Rows keep their codecs; objects written after it may name blocks.
    2: BLOCKS,
    # 3 -> 4. No row changes: each session's states are written at its next close (until
    # then its readers read its log, as before). (The table made here takes kind 2 too,
    # which the step to 5 allows again.)
    3: [STATES],
    # 4 -> 5. No row changes: a session's snapshot (kind 2) is kept once a writer's close
    # finds enough records since the last one (until then its opens read its log, as before).
    4: [
        "ALTER TABLE {schema}.states DROP CONSTRAINT states_kind_check",
        "ALTER TABLE {schema}.states ADD CONSTRAINT states_kind_check CHECK (kind IN (0, 1, 2))",
    ],
}


@dataclass
class MigrationPlan:
    """What ``migrate`` would do to a store's schema: from which version to which, with
    the statements it would run (all in one transaction)."""

    url: str
    found: int | None
    target: int = SCHEMA_VERSION
    statements: list[str] = field(default_factory=list)
    status: str = "current"

    def as_dict(self) -> dict[str, Any]:
        return {"store": self.url, "found": self.found, "target": self.target, "status": self.status,
                "statements": list(self.statements)}


def plan_upgrade(found: int, schema: str) -> list[str]:
    """The statements that take a schema of version ``found`` to :data:`SCHEMA_VERSION`,
    with ``{schema}`` filled in; ValueError where a step is missing."""
    out: list[str] = []
    for version in range(found, SCHEMA_VERSION):
        steps = UPGRADES.get(version)
        if steps is None:
            raise ValueError(f"no upgrade from schema version {version} to {version + 1}")
        out.extend(step.format(schema=schema) for step in steps)
    return out
