#!/usr/bin/env python3
"""Benchmark: the CPU of one durable append on PostgreSQL, against the floor of one
durable PostgreSQL transaction and against the file backend's append (issue 13).

The appends figure of ``bench_postgresql.py`` (16 writers on two shared cores)
follows the CPU an append costs. This says where that CPU goes, one writer at a
time, each figure the median of ``--rounds`` rounds run in turn:

1. an append through the API (sync ``always``), on the file backend (the writer's
   CPU) and on PostgreSQL (the writer's CPU, and the server's: the CPU of the server
   process serving the writer's connection, from ``/proc/<pid>/stat``);
2. on one connection, statements prepared once and run ``--count`` times each:
   a ``SELECT $1`` (a round trip: no transaction id, nothing to flush); a one-row
   ``UPDATE`` committed synchronously (the least a durable transaction is: one
   row, its WAL record and the flush), and the same committed asynchronously (the
   flush left to the WAL writer); and ``append_records`` with no rows to write (its
   parameters received and the session's conditional update, nothing else).

The server's CPU includes the kernel time of the WAL flushes its process makes.
Clock ticks (10 ms) count the server's CPU, so a count of a few thousand is needed.

Run: ``.venv/bin/python tests/bench/pg_append_floor.py [--count N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE), str(HERE.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

import psycopg  # noqa: E402
from psycopg import pq  # noqa: E402

import pg_server  # noqa: E402
from agentsession_cas import Header  # noqa: E402
from agentsession_cas.backends.postgresql import arrays  # noqa: E402
from agentsession_cas.backends.postgresql.database import parse_url  # noqa: E402
from agentsession_cas.backends.postgresql.sessions import _APPEND_SQL  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402
from agentsession_cas.store.url import open_store  # noqa: E402
from bench_pack import CREATED, _body  # noqa: E402
from bench_verify import generate  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user and system) a process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(count: int, step: Callable[[int], None], server_pid: int | None) -> tuple[float, float]:
    """(this process's CPU, the server process's CPU) per call of ``step``, in ms."""
    c0 = own_cpu()
    s0 = process_cpu(server_pid) if server_pid else 0.0
    for i in range(count):
        step(i)
    client = own_cpu() - c0
    server = process_cpu(server_pid) - s0 if server_pid else 0.0
    return client / count * 1e3, server / count * 1e3


def appends(target: str, bodies: list[dict], start: int, count: int) -> tuple[float, float]:
    """CPU per durable append through the API (the server's: its process for the writer)."""
    with open_store(target, sync="always") as st:
        s = st.create(Header.new(f"floor-{start}", created_at=CREATED))
        conn = getattr(s.log, "conn", None)
        for i in range(20):  # warm: the statement prepared, the caches filled
            s.append(bodies[start + i])
        out = timed(count, lambda i: s.append(bodies[start + 20 + i]), conn.info.backend_pid if conn else None)
        s.close()
    return out


def statements(url: str, count: int) -> dict[str, tuple[float, float]]:
    """CPU per call of each floor statement, on one connection of the store's schema."""
    conninfo, schema = parse_url(url)
    out = {}
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute(f"SET search_path TO {schema}")
        c.execute("SET synchronous_commit TO on")
        c.execute("CREATE TABLE IF NOT EXISTS floor (k integer PRIMARY KEY, n integer NOT NULL)")
        c.execute("INSERT INTO floor VALUES (1, 0) ON CONFLICT DO NOTHING")
        key, fence, last = c.execute("SELECT key, fence, last_pos FROM sessions ORDER BY key LIMIT 1").fetchone()
        empty = {oid: maker([]) for oid, maker in (("i2", arrays.int2_array), ("b", arrays.bytea_array),
                                                    ("bool", arrays.bool_array), ("t", arrays.text_array),
                                                    ("i4", arrays.int4_array))}
        cases = {
            "a round trip (SELECT $1)": (b"SELECT $1::bigint", [arrays.int8(1)]),
            "a durable one-row UPDATE": (b"UPDATE floor SET n = n + 1 WHERE k = $1::integer", [arrays.int4(1)]),
            "the UPDATE, committed asynchronously": (b"UPDATE floor SET n = n + 1 WHERE k = $1::integer", [arrays.int4(1)]),
            "append_records, no rows": (_APPEND_SQL, [
                arrays.int8(key), arrays.int8(fence), arrays.int4(last), None, b"record", arrays.boolean(False), arrays.int8(0),
                empty["i2"], empty["b"], empty["i2"], empty["b"], empty["b"], empty["b"], empty["bool"],
                empty["t"], empty["i4"], empty["b"], empty["b"], empty["t"]]),
        }
        pg = c.pgconn
        for i, (label, (statement, params)) in enumerate(cases.items()):
            name = f"floor{i}".encode()
            if pg.prepare(name, statement).status != pq.ExecStatus.COMMAND_OK:
                raise SystemExit(f"{label}: {pg.get_error_message()!r}")
            formats = [1] * len(params)

            def run(_: int, name: bytes = name, params: list = params, formats: list = formats) -> None:
                res = pg.exec_prepared(name, params, formats)
                if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
                    raise SystemExit(res.error_message.decode())

            c.execute(f"SET synchronous_commit TO {'off' if 'asynchronously' in label else 'on'}")
            run(0)
            out[label] = timed(count, run, c.info.backend_pid)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=2000, help="appends (and calls of each statement) a round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    # Bodies that each round's sessions take in turn (a call id is one call in a session).
    need = args.rounds * 2 * (args.count + 20)
    _, entries, _ = generate(need * 2, 20260917)
    bodies = [_body(e) for e in entries if e.type in ("item", "response")][:need]
    if len(bodies) < need:
        raise SystemExit("too few bodies generated")
    base = ROOT / ".bench-tmp"
    base.mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="pg-append-floor-", dir=base)
    os.chmod(tmp, 0o755)
    server = pg_server.PgServer(durable=True, base=tmp)
    print(f"pg_append_floor: {args.rounds} rounds of {args.count:,}, PostgreSQL with fsync on in {server.dir}", flush=True)
    try:
        url = server.store_url("floor")
        open_store(url, create=True).close()
        files = os.path.join(tmp, "files")
        Store.init(files).close()
        rows: dict[str, list[tuple[float, float]]] = {}
        at = 0
        for _ in range(args.rounds):
            for label, target in (("append, file backend", files), ("append, PostgreSQL", url)):
                rows.setdefault(label, []).append(appends(target, bodies, at, args.count))
                at += args.count + 20
            for label, figures in statements(url, args.count).items():
                rows.setdefault(label, []).append(figures)
        print(f"{'CPU per call, ms (median of rounds)':40} {'client':>8} {'server':>8} {'both':>8}")
        for label, figures in rows.items():
            client = statistics.median(f[0] for f in figures)
            srv = statistics.median(f[1] for f in figures)
            print(f"{label:40} {client:8.3f} {srv:8.3f} {client + srv:8.3f}")
    finally:
        server.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
