"""Version 4 of the PostgreSQL store's tables, as the release before version 5 created
them (``create_statements`` of agentsession_cas/backends/postgresql/schema.py at that
release, with ``{schema}`` left to fill in): the upgrade test makes a store of that
version with them, so that ``migrate`` is tested on the real thing. History, not a
rule: never changed.
"""

VERSION = 4

STATEMENTS: list[str] = [
    'CREATE SCHEMA IF NOT EXISTS {schema}',
    'CREATE TABLE {schema}.meta (key text PRIMARY KEY, value text NOT NULL)',
    """CREATE TABLE {schema}.objects (
            space smallint NOT NULL,
            hash bytea NOT NULL,
            codec smallint NOT NULL,
            data bytea NOT NULL,
            born timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (space, hash))""",
    'ALTER TABLE {schema}.objects ALTER COLUMN data SET STORAGE EXTERNAL',
    """CREATE TABLE {schema}.edges (
            parent bytea NOT NULL,
            child bytea NOT NULL,
            first boolean NOT NULL,
            PRIMARY KEY (child, parent))""",
    """CREATE TABLE {schema}.dictionaries (
            id integer PRIMARY KEY,
            space smallint NOT NULL,
            data bytea NOT NULL,
            made timestamptz NOT NULL DEFAULT clock_timestamp())""",
    """CREATE TABLE {schema}.blocks (
            id bigserial PRIMARY KEY,
            data bytea NOT NULL,
            made timestamptz NOT NULL DEFAULT clock_timestamp())""",
    'ALTER TABLE {schema}.blocks ALTER COLUMN data SET STORAGE EXTERNAL',
    """CREATE TABLE {schema}.sessions (
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
    """CREATE TABLE {schema}.log (
            session bigint NOT NULL,
            pos integer NOT NULL,
            op text NOT NULL,
            seq integer,
            hash bytea,
            content bytea,
            record text NOT NULL,
            PRIMARY KEY (session, pos))""",
    """CREATE TABLE {schema}.log_aside (
            session bigint NOT NULL,
            id text NOT NULL,
            kept timestamptz NOT NULL,
            pos integer NOT NULL,
            record text NOT NULL,
            PRIMARY KEY (session, kept, pos))""",
    """CREATE TABLE {schema}.refs (
            name text PRIMARY KEY,
            record text NOT NULL)""",
    """CREATE TABLE {schema}.remotes (
            url text NOT NULL,
            kind text NOT NULL,
            name text NOT NULL,
            record text NOT NULL,
            PRIMARY KEY (url, kind, name))""",
    """CREATE TABLE {schema}.holds (
            id bigserial PRIMARY KEY,
            base text NOT NULL,
            at timestamptz NOT NULL DEFAULT clock_timestamp())""",
    """CREATE TABLE {schema}.states (
            session bigint NOT NULL,
            kind smallint NOT NULL CHECK (kind IN (0, 1)),
            pos integer NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (session, kind))""",
    """CREATE FUNCTION {schema}.append_records(
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
        ON CONFLICT (space, hash) DO UPDATE SET born = clock_timestamp(),
            codec = CASE WHEN objects.data = EXCLUDED.data OR (objects.codec = 0 AND sha256(objects.data) = objects.hash)
                              OR NOT (EXCLUDED.codec <> 0 OR sha256(EXCLUDED.data) = EXCLUDED.hash) THEN objects.codec ELSE EXCLUDED.codec END,
            data = CASE WHEN objects.data = EXCLUDED.data OR (objects.codec = 0 AND sha256(objects.data) = objects.hash)
                             OR NOT (EXCLUDED.codec <> 0 OR sha256(EXCLUDED.data) = EXCLUDED.hash) THEN objects.data ELSE EXCLUDED.data END;
    INSERT INTO edges (parent, child, first) SELECT * FROM unnest(e_parent, e_child, e_first) ON CONFLICT DO NOTHING;
    INSERT INTO log (session, pos, op, seq, hash, content, record)
        SELECT p_key, p_from + t.n, t.op, t.seq, t.hash, t.content, t.record
          FROM unnest(l_op, l_seq, l_hash, l_content, l_record) WITH ORDINALITY AS t(op, seq, hash, content, record, n);
    RETURN true;
END
$$""",
]
