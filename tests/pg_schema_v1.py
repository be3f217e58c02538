"""Version 1 of the PostgreSQL store's tables, as the release before version 2 created
them (``create_statements`` of agentsession_cas/backends/postgresql/schema.py at that
release, with ``{schema}`` left to fill in): the upgrade test makes a store of that
version with them, so that ``migrate`` is tested on the real thing. History, not a
rule: never changed.
"""

VERSION = 1

STATEMENTS: list[str] = [
    'CREATE SCHEMA IF NOT EXISTS {schema}',
    'CREATE TABLE {schema}.meta (key text PRIMARY KEY, value text NOT NULL)',
    'CREATE TABLE {schema}.objects (\n            space smallint NOT NULL,\n            hash bytea NOT NULL,\n            codec smallint NOT NULL,\n            sum bytea NOT NULL,\n            data bytea NOT NULL,\n            born timestamptz NOT NULL DEFAULT clock_timestamp(),\n            PRIMARY KEY (space, hash))',
    'ALTER TABLE {schema}.objects ALTER COLUMN data SET STORAGE EXTERNAL',
    'CREATE TABLE {schema}.edges (\n            parent bytea NOT NULL,\n            child bytea NOT NULL,\n            first boolean NOT NULL,\n            PRIMARY KEY (parent, child))',
    'CREATE INDEX edges_up ON {schema}.edges (child) INCLUDE (parent) WHERE first',
    "CREATE TABLE {schema}.sessions (\n            key bigserial PRIMARY KEY,\n            id text NOT NULL UNIQUE,\n            header bytea NOT NULL,\n            base text,\n            head text,\n            mark text NOT NULL CHECK (mark IN ('record', 'mirror')),\n            last_pos integer NOT NULL,\n            fence bigint NOT NULL DEFAULT 0,\n            holder text,\n            created timestamptz NOT NULL DEFAULT clock_timestamp())",
    'CREATE TABLE {schema}.log (\n            session bigint NOT NULL,\n            pos integer NOT NULL,\n            op text NOT NULL,\n            seq integer,\n            hash bytea,\n            content bytea,\n            record text NOT NULL,\n            PRIMARY KEY (session, pos))',
    'CREATE TABLE {schema}.log_aside (\n            session bigint NOT NULL,\n            id text NOT NULL,\n            kept timestamptz NOT NULL,\n            pos integer NOT NULL,\n            record text NOT NULL,\n            PRIMARY KEY (session, kept, pos))',
    'CREATE TABLE {schema}.refs (\n            name text PRIMARY KEY,\n            record text NOT NULL)',
    'CREATE TABLE {schema}.remotes (\n            url text NOT NULL,\n            kind text NOT NULL,\n            name text NOT NULL,\n            record text NOT NULL,\n            PRIMARY KEY (url, kind, name))',
    'CREATE TABLE {schema}.holds (\n            id bigserial PRIMARY KEY,\n            base text NOT NULL,\n            at timestamptz NOT NULL DEFAULT clock_timestamp())',
    "CREATE FUNCTION {schema}.append_records(\n    p_key bigint, p_fence bigint, p_from integer, p_head text, p_mark text, p_lazy boolean, p_barrier bigint,\n    o_space smallint[], o_hash bytea[], o_codec smallint[], o_sum bytea[], o_data bytea[],\n    e_parent bytea[], e_child bytea[], e_first boolean[],\n    l_op text[], l_seq integer[], l_hash bytea[], l_content bytea[], l_record text[]) RETURNS boolean\nLANGUAGE plpgsql SET search_path FROM CURRENT AS $$\nBEGIN\n    IF p_lazy THEN\n        PERFORM set_config('synchronous_commit', 'off', true);\n    END IF;\n    PERFORM pg_advisory_xact_lock_shared(p_barrier);\n    UPDATE sessions SET last_pos = p_from + cardinality(l_op), head = p_head, mark = p_mark\n     WHERE key = p_key AND fence = p_fence AND last_pos = p_from;\n    IF NOT FOUND THEN\n        RETURN false;\n    END IF;\n    INSERT INTO objects (space, hash, codec, sum, data) SELECT * FROM unnest(o_space, o_hash, o_codec, o_sum, o_data)\n        ON CONFLICT (space, hash) DO UPDATE SET born = clock_timestamp(),\n            codec = CASE WHEN (sha256(objects.data) = objects.sum AND (objects.codec = 1 OR objects.sum = objects.hash)) THEN objects.codec ELSE EXCLUDED.codec END,\n            sum = CASE WHEN (sha256(objects.data) = objects.sum AND (objects.codec = 1 OR objects.sum = objects.hash)) THEN objects.sum ELSE EXCLUDED.sum END,\n            data = CASE WHEN (sha256(objects.data) = objects.sum AND (objects.codec = 1 OR objects.sum = objects.hash)) THEN objects.data ELSE EXCLUDED.data END;\n    INSERT INTO edges (parent, child, first) SELECT * FROM unnest(e_parent, e_child, e_first) ON CONFLICT DO NOTHING;\n    INSERT INTO log (session, pos, op, seq, hash, content, record)\n        SELECT p_key, p_from + t.n, t.op, t.seq, t.hash, t.content, t.record\n          FROM unnest(l_op, l_seq, l_hash, l_content, l_record) WITH ORDINALITY AS t(op, seq, hash, content, record, n);\n    RETURN true;\nEND\n$$",
]
