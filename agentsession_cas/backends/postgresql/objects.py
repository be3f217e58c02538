"""Objects in the ``objects`` table, by space and hash, each verified when read.

A put of an object already held freshens its ``born`` (what a sweep's grace
counts from, as the file backend touches a file) and replaces a copy that no
longer hashes to its name, so storing the sound bytes over a corrupt row
repairs it, as it does a file. Every write transaction first takes the store's
sweep barrier in shared mode (:meth:`PgObjects.barrier`): a sweep takes it
exclusively for an instant before it reads the logs, so every write that
touched an object before then is committed and visible to it, and every write
after it stamps a ``born`` the sweep's cut-off excludes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ...errors import CorruptObjectError, NoSuchObjectError
from ...format.canonical import loads
from ..base import ObjectStore, Space
from .schema import SPACE_CODES

if TYPE_CHECKING:
    from . import PostgresBackend

__all__ = ["PgObjects", "raw_hash", "hash_name", "envelope_parents"]

_PREFIX = "sha256:"
_BATCH = 500

_UPSERT = (
    "INSERT INTO objects (space, hash, data) VALUES (%s, %s, %s) "
    "ON CONFLICT (space, hash) DO UPDATE SET born = clock_timestamp(), "
    "data = CASE WHEN sha256(objects.data) = objects.hash THEN objects.data ELSE EXCLUDED.data END"
)
_EDGE = "INSERT INTO edges (parent, child) VALUES (%s, %s) ON CONFLICT DO NOTHING"


def raw_hash(name: str) -> bytes | None:
    """The 32 bytes of a ``sha256:<hex>`` name, or None when it is not one."""
    if len(name) != 71 or not name.startswith(_PREFIX):
        return None
    try:
        raw = bytes.fromhex(name[7:])
    except ValueError:
        return None
    return raw if name[7:].islower() or name[7:].isdigit() else None


def hash_name(raw: bytes) -> str:
    return _PREFIX + bytes(raw).hex()


def envelope_parents(env: bytes) -> list[bytes]:
    """The parents an envelope names (``parent`` and ``parents``), as raw hashes, for the
    edges index; nothing for bytes that are not an envelope (a corrupt put)."""
    try:
        data = loads(env)
    except (ValueError, UnicodeDecodeError):
        return []
    if not isinstance(data, dict):
        return []
    names: list[Any] = [data.get("parent")]
    parents = data.get("parents")
    if isinstance(parents, list):
        names.extend(p.get("entry") for p in parents if isinstance(p, dict))
    out = []
    for n in names:
        raw = raw_hash(n) if isinstance(n, str) else None
        if raw is not None and raw not in out:
            out.append(raw)
    return out


def object_rows(items: Iterable[tuple[Space, str, bytes]]) -> tuple[list[tuple[int, bytes, bytes]], list[tuple[bytes, bytes]]]:
    """The ``objects`` rows and ``edges`` rows of some objects (a name that is no hash is
    stored under nothing: NoSuchObjectError)."""
    rows: list[tuple[int, bytes, bytes]] = []
    edges: list[tuple[bytes, bytes]] = []
    for space, name, data in items:
        raw = raw_hash(name)
        if raw is None:
            raise NoSuchObjectError(f"{name!r} is not an object name (sha256:<64 hex>)")
        rows.append((SPACE_CODES[space], raw, bytes(data)))
        if space == "entries":
            edges.extend((p, raw) for p in envelope_parents(data))
    return rows, edges


class PgObjects(ObjectStore):
    def __init__(self, backend: PostgresBackend):
        self.backend = backend
        self.db = backend.db

    def barrier(self, conn: Any) -> None:
        """Inside a write transaction: the sweep barrier, shared (see the module)."""
        conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", [self.db.lock_key("sweep")])

    def write_rows(self, conn: Any, items: Iterable[tuple[Space, str, bytes]]) -> None:
        """Store objects inside the caller's transaction (barrier taken)."""
        rows, edges = object_rows(items)
        if rows:
            with conn.cursor() as cur:
                cur.executemany(_UPSERT, rows)
                if edges:
                    cur.executemany(_EDGE, edges)

    def get(self, space: Space, name: str) -> bytes:
        raw = raw_hash(name)
        row = None
        if raw is not None:
            rows = self.db.query("SELECT data FROM objects WHERE space = %s AND hash = %s", [SPACE_CODES[space], raw])
            row = rows[0] if rows else None
        if row is None:
            raise NoSuchObjectError(f"no {space} object {name} in {self.backend.describe()}")
        data = bytes(row[0])
        if raw != hashlib.sha256(data).digest():
            raise CorruptObjectError(
                f"corrupt object: {space} object {name} does not hash to its name (in {self.where(space, name)})",
                space=space, name=name, path=self.where(space, name),
            )
        return data

    def get_many(self, space: Space, names: Iterable[str]) -> dict[str, bytes]:
        """Several objects in one query, each verified; absent ones are left out, a
        corrupt one raises (a projection reads a session's objects this way)."""
        wanted = {raw: n for n in names if (raw := raw_hash(n)) is not None}
        out: dict[str, bytes] = {}
        keys = list(wanted)
        for i in range(0, len(keys), 2000):
            rows = self.db.query(
                "SELECT hash, data FROM objects WHERE space = %s AND hash = ANY(%s)", [SPACE_CODES[space], keys[i:i + 2000]]
            )
            for raw, data in rows:
                raw, data = bytes(raw), bytes(data)
                name = wanted[raw]
                if hashlib.sha256(data).digest() != raw:
                    raise CorruptObjectError(
                        f"corrupt object: {space} object {name} does not hash to its name (in {self.where(space, name)})",
                        space=space, name=name, path=self.where(space, name),
                    )
                out[name] = data
        return out

    def exists(self, space: Space, name: str) -> bool:
        raw = raw_hash(name)
        if raw is None:
            return False
        return bool(self.db.query("SELECT 1 FROM objects WHERE space = %s AND hash = %s", [SPACE_CODES[space], raw]))

    def held(self, space: Space, name: str) -> bool:
        return self.is_sound(space, name)

    def put(self, space: Space, name: str, data: bytes, *, durable: bool = True) -> None:
        self.backend.require_writable()
        with self.db.conn() as c, c.transaction():
            if not durable:
                c.execute("SET LOCAL synchronous_commit TO off")
            self.barrier(c)
            self.write_rows(c, [(space, name, data)])

    def put_many(self, items: Iterable[tuple[Space, str, bytes]], *, count: int | None = None) -> None:
        self.backend.require_writable()
        batch: list[tuple[Space, str, bytes]] = []
        size = 0
        for item in items:
            batch.append(item)
            size += len(item[2])
            if len(batch) >= 4 * _BATCH or size >= 8 << 20:
                self._put_batch(batch)
                batch, size = [], 0
        if batch:
            self._put_batch(batch)

    def _put_batch(self, batch: list[tuple[Space, str, bytes]]) -> None:
        with self.db.conn() as c, c.transaction():
            self.barrier(c)
            self.write_rows(c, batch)

    def hold(self, names: Iterable[tuple[Space, str]], *, written: set[str] = frozenset()) -> list[tuple[Space, str]]:  # type: ignore[assignment]
        by_space: dict[Space, list[str]] = {}
        for space, name in names:
            by_space.setdefault(space, []).append(name)
        if not by_space:
            return []
        missing: list[tuple[Space, str]] = []
        with self.db.conn() as c, c.transaction():
            self.barrier(c)
            for space, wanted in by_space.items():
                raws = [r for n in wanted if (r := raw_hash(n)) is not None]
                rows = c.execute(
                    "UPDATE objects SET born = clock_timestamp() WHERE space = %s AND hash = ANY(%s) "
                    "AND sha256(data) = hash RETURNING hash", [SPACE_CODES[space], raws]
                ).fetchall()
                found = {hash_name(bytes(r[0])) for r in rows}
                missing.extend((space, n) for n in wanted if n not in found)
        return missing

    def names(self, space: Space) -> Iterator[str]:
        rows = self.db.query("SELECT hash FROM objects WHERE space = %s", [SPACE_CODES[space]])
        for (raw,) in rows:
            yield hash_name(bytes(raw))

    def where(self, space: Space, name: str) -> str:
        return f"{self.backend.describe()}, table objects ({space})"
