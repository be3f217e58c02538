"""Connections to the store's database: the URL, the pool, and errors turned into the store's.

A store URL is a libpq URL (``postgresql://user@host:port/dbname?host=/socket/dir``)
with one member of ours, ``schema=NAME`` (default ``agentsession``): the
PostgreSQL schema the store's tables live in, so that one database can hold
several stores. It is taken off before the rest reaches libpq. Every
connection sets its ``search_path`` to that schema and ``synchronous_commit``
to ``on``, so a durable append waits for the commit to reach the disk (and
any synchronous standby) whatever the server's default is.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import LayoutError, StoreError, UnsupportedError

try:  # the ``postgresql`` extra
    import psycopg
    from psycopg import pq, sql
    from psycopg_pool import ConnectionPool
except ImportError:  # pragma: no cover - exercised only where the extra is not installed
    psycopg = None  # type: ignore[assignment]
    pq = None  # type: ignore[assignment]
    sql = None  # type: ignore[assignment]
    ConnectionPool = None  # type: ignore[assignment,misc]

__all__ = ["DEFAULT_SCHEMA", "Database", "checked", "parse_url", "public_url", "require_driver"]

DEFAULT_SCHEMA = "agentsession"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: Connections one store's pool may open: every open writer holds one for as long as it
#: holds its session (the advisory lock lives on it), the rest serve reads.
POOL_MAX = 64


def require_driver() -> None:
    """Refuse clearly where psycopg is not installed."""
    if psycopg is None:
        raise UnsupportedError(
            "a postgresql:// store needs psycopg 3 and psycopg-pool: pip install 'agentsession-cas[postgresql]'"
        )


def parse_url(url: str) -> tuple[str, str]:
    """(libpq conninfo URL, schema) of a store URL; UnsupportedError for a bad ``schema=``."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [v for k, v in query if k == "schema"]
    rest = [(k, v) for k, v in query if k != "schema"]
    schema = schemas[-1] if schemas else DEFAULT_SCHEMA
    if not _SCHEMA_NAME.fullmatch(schema):
        raise UnsupportedError(
            f"store {public_url(url)!r}: schema={schema!r} is not a schema name this store uses "
            "(lower-case letters, digits and _, not starting with a digit, at most 63)"
        )
    scheme = "postgresql"
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(rest), "")), schema


def public_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class Database:
    """One store's pool of connections to its database and schema."""

    def __init__(self, url: str):
        require_driver()
        self.url = url
        self.conninfo, self.schema = parse_url(url)
        self.public = public_url(url)
        self._pool: Any = None
        self._lock = threading.Lock()
        self._keys: dict[str, int] = {}

    # -- connections ------------------------------------------------------------------

    def _configure(self, conn: Any) -> None:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        conn.execute("SET synchronous_commit TO on")

    def connect(self) -> Any:
        """A new connection of its own (not from the pool), configured."""
        try:
            conn = psycopg.connect(self.conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to {self.public}: {_message(exc)}") from None
        self._configure(conn)
        return conn

    @property
    def pool(self) -> Any:
        with self._lock:
            if self._pool is None:
                # Check the server answers before starting the pool's threads, so a bad
                # URL fails at once with libpq's reason rather than after the pool's timeout.
                self.connect().close()
                self._pool = ConnectionPool(
                    self.conninfo, min_size=1, max_size=POOL_MAX, kwargs={"autocommit": True},
                    configure=self._configure, open=True, timeout=60.0, name=f"agentsession {self.schema}",
                )
            return self._pool

    def getconn(self) -> Any:
        try:
            return self.pool.getconn()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to {self.public}: {_message(exc)}") from None

    def putconn(self, conn: Any) -> None:
        pool = self._pool
        if pool is None:
            conn.close()
            return
        pool.putconn(conn)

    @contextmanager
    def conn(self) -> Iterator[Any]:
        """A pooled connection for the length of the block (autocommit: a transaction is
        ``with conn.transaction()``); a database error leaves as a StoreError."""
        c = self.getconn()
        try:
            with translate(self.public):
                yield c
        finally:
            self.putconn(c)

    def query(self, statement: Any, params: Any = None, *, binary: bool = False) -> list[tuple[Any, ...]]:
        with self.conn() as c:
            return c.execute(statement, params, binary=binary).fetchall()

    def lock_key(self, name: str) -> int:
        """The advisory lock key of ``name`` within this store (a 64-bit hash of the
        schema and the name, computed by the server so every client agrees)."""
        key = self._keys.get(name)
        if key is None:
            rows = self.query("SELECT hashtextextended(%s, 0)", [f"agentsession:{self.schema}:{name}"])
            key = self._keys[name] = int(rows[0][0])
        return key

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- the schema -------------------------------------------------------------------

    def version(self) -> int | None:
        """The schema version the store's ``meta`` says, or None when there is no store."""
        with self.conn() as c:
            found = c.execute(
                "SELECT 1 FROM pg_namespace n JOIN pg_class r ON r.relnamespace = n.oid "
                "WHERE n.nspname = %s AND r.relname = 'meta'", [self.schema]
            ).fetchone()
            if found is None:
                return None
            row = c.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        if row is None:
            raise LayoutError(f"{self.describe()}: its meta table names no schema version")
        return int(row[0])

    def describe(self) -> str:
        return f"the PostgreSQL store at {self.public}"


def checked(conn: Any, res: Any) -> Any:
    """A result libpq gave for a statement run on ``conn`` through its ``pgconn`` (the hot
    paths: no psycopg adaptation or wait loop), when it succeeded; else psycopg's error
    for it, OperationalError where the connection is gone."""
    if res.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
        return res
    if conn.pgconn.status != pq.ConnStatus.OK:
        raise psycopg.OperationalError(conn.pgconn.get_error_message() or "the connection to the server was lost")
    raise psycopg.errors.error_from_result(res, encoding=conn.info.encoding)


def _message(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@contextmanager
def translate(where: str) -> Iterator[None]:
    """A database error inside the block becomes the store's StoreError, naming the database."""
    if psycopg is None:  # pragma: no cover
        yield
        return
    try:
        yield
    except psycopg.Error as exc:
        raise StoreError(f"{where}: database error: {_message(exc)}") from exc
