#!/usr/bin/env python3
"""Benchmark: the PostgreSQL backend against the file backend, measured in the same run.

Issue 13, "Figures". A PostgreSQL server of its own (tests/pg_server.py, with
``fsync`` on, its data directory on the repository's filesystem, as the file
stores are) and, on the same machine, the file backend:

1. **durable appends/s with 16 writers**: 16 threads, each with its own store
   handle and session, appending under sync policy ``always``; PostgreSQL's /
   the file backend's, the medians of three rounds run alternately. Each round
   also says the CPU an append took in the writers' process and in the server.
   Target **>= 1**.
2. **import** of the deterministic benchmark session (``bench_verify.generate``,
   100,000 entries by default) through ``Store.import_bytes``: PostgreSQL's time
   / the file backend's. Target **<= 2**.
3. **export** of it (``projection()`` of a read-only snapshot): PostgreSQL's time /
   the file backend's, the medians of three rounds run alternately. Target **<= 1.5**.
4. **size** of the session plus ``--forks`` forks (bases spread along its path,
   5 to 20 own entries each, as ``bench_pack.py`` builds them): every table and
   index of the store's schema (``pg_total_relation_size``, after a ``VACUUM``) /
   the file store's directory after ``Store.pack()``. Target **<= 3**. Then the
   objects' raw bytes are copied into tables left to PostgreSQL's own TOAST
   compression (pglz, lz4, a lower ``toast_tuple_target``), so the numbers say
   whether a compression setting would do what the backend's own does.
5. **open** of the imported session for writing, its first append and its close,
   then the same again (the second open follows a writer's close): the client's
   CPU and the server's, and the queries the open sent and the rows they returned
   (``--only open``, with ``import`` or on its own, which imports into PostgreSQL
   only). Issue 11: an open costs what changed since the last snapshot, not the
   session's length. No target: figures to compare between releases.
6. **fsck** of the PostgreSQL store holding the imported session (and its forks,
   after ``size``), ``FSCK_ROUNDS`` rounds: wall time, the client's CPU and the
   server's, and the part of each spent counting the unreferenced objects (from
   fsck's ``counting unreferenced objects`` phase to its end: the logs read in one
   statement and the sweep's retention rule over what the walk read). With
   ``import`` or on its own (``--only fsck``, which imports into PostgreSQL only).
   No target: the count's cost beside the walk's.

A missed target is a measurement, not a failure: the exit status is 0 either
way; 1 when an export does not give back the imported bytes or a store fails.

Run: ``.venv/bin/python tests/bench/bench_postgresql.py [--quick | --entries N]
[--forks N] [--appends N] [--only appends,import,size,open,fsck] [--keep]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE), str(HERE.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

import psycopg  # noqa: E402

import agentsession_cas  # noqa: E402
import pg_server  # noqa: E402
from agentsession_cas import Header  # noqa: E402
from agentsession_cas.backends.postgresql.database import parse_url  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402
from agentsession_cas.store.url import open_store  # noqa: E402
from bench_pack import CREATED, _body, fork_plan, resume_path  # noqa: E402
from bench_verify import generate  # noqa: E402

DEFAULT_ENTRIES, QUICK_ENTRIES = 100_000, 10_000
DEFAULT_FORKS, QUICK_FORKS = 100, 10
DEFAULT_APPENDS, QUICK_APPENDS = 200, 30  # per writer
WRITERS = 16
#: Rounds of the appends figure, files and PostgreSQL alternating; the medians are compared.
APPEND_ROUNDS = 3
#: Rounds of the export figure (an export reads and writes nothing, so it can be repeated).
EXPORT_ROUNDS = 3
TARGET_APPENDS = 1.0
TARGET_IMPORT = 2.0
TARGET_EXPORT = 1.5
TARGET_SIZE = 3.0
BENCHES = ("appends", "import", "size", "open", "fsck")
#: Rounds of the open figure (open, one append, close), one after the other.
OPEN_ROUNDS = 3
#: Rounds of the fsck figure (fsck reads and writes nothing).
FSCK_ROUNDS = 3


def say(*args: object) -> None:
    print(*args, flush=True)


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def _du(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


class Results:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, str, bool]] = []

    def add(self, name: str, value: float, target: str, met: bool) -> None:
        self.rows.append((name, value, target, met))
        say(f"  RESULT {name}: {'MET' if met else 'NOT MET'} ({value:.3f}, target {target})")


class BenchError(Exception):
    pass


def _sql(url: str, statement: str) -> list[tuple]:
    conninfo, schema = parse_url(url)
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute(f"SET search_path TO {schema}")
        cur = c.execute(statement.encode())
        return cur.fetchall() if cur.description is not None else []


# ---------------------------------------------------------------------------
# 1. durable appends with 16 writers


def concurrent_appends(target: str, bodies: list[dict], per_writer: int, server: pg_server.PgServer | None = None,
                       ) -> tuple[float, float, float]:
    """(durable appends per second, this process's CPU per append, the PostgreSQL
    server's CPU per append) with WRITERS threads each appending to its own session
    through its own store handle (all started together)."""
    stores = [open_store(target, sync="always") for _ in range(WRITERS)]
    sessions = [st.create(Header.new(f"writer-{i:02d}-{os.getpid()}-{time.monotonic_ns()}", created_at=CREATED))
                for i, st in enumerate(stores)]
    start = threading.Barrier(WRITERS + 1)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            start.wait()
            for j in range(per_writer):
                r = sessions[i].append(bodies[(i * per_writer + j) % len(bodies)])
                if not r.durable:
                    raise BenchError("an append under 'always' was not durable")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    server_cpu = _server_cpu(server)
    cpu = time.process_time()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu
    server_cpu = _server_cpu(server) - server_cpu
    for st in stores:
        st.close()
    if errors:
        raise BenchError(f"a writer failed: {errors[0]!r}")
    n = WRITERS * per_writer
    return n / seconds, cpu / n, server_cpu / n


def _server_cpu(server: pg_server.PgServer | None) -> float:
    """CPU seconds the server's processes have used (user and system; children the
    postmaster reaped included); 0 without a server."""
    if server is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    postmaster = server.pid()
    kids = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
    total = 0
    for pid in [postmaster, *map(int, kids)]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if pid == postmaster else 0)
    return total / tick


def bench_appends(files_root: str, pg_url: str, server: pg_server.PgServer, bodies: list[dict], per_writer: int,
                  res: Results) -> None:
    say(f"\n[1] durable appends/s, {WRITERS} writers x {per_writer} appends, each its own session, "
        f"{APPEND_ROUNDS} rounds alternating (the machine's load moves between them)")
    Store.init(files_root).close()
    f_rates, p_rates = [], []
    for r in range(APPEND_ROUNDS):
        f_rate, f_cpu, _ = concurrent_appends(files_root, bodies, per_writer)
        p_rate, p_cpu, p_server = concurrent_appends(pg_url, bodies, per_writer, server)
        f_rates.append(f_rate)
        p_rates.append(p_rate)
        say(f"    round {r + 1}: files {f_rate:,.0f}/s ({f_cpu * 1e3:.2f} ms CPU per append); PostgreSQL {p_rate:,.0f}/s "
            f"({p_cpu * 1e3:.2f} ms CPU in the writers' process, {p_server * 1e3:.2f} ms in the server, per append)")
    f_mid, p_mid = statistics.median(f_rates), statistics.median(p_rates)
    say(f"    medians: files {f_mid:,.0f}/s, PostgreSQL {p_mid:,.0f}/s")
    res.add("durable appends/s, PostgreSQL / files", p_mid / f_mid, f">= {TARGET_APPENDS}", p_mid / f_mid >= TARGET_APPENDS)


# ---------------------------------------------------------------------------
# 2, 3. import and export


def _import(target: str, data: bytes, server: pg_server.PgServer | None = None) -> tuple[float, float, str]:
    """(seconds, CPU seconds of this process and the server, session id)."""
    with open_store(target, sync="never") as st:
        gc.collect()
        t0, c0, s0 = time.perf_counter(), time.process_time(), _server_cpu(server)
        sid = st.import_bytes(data, source="<bench>").id
        return time.perf_counter() - t0, time.process_time() - c0 + _server_cpu(server) - s0, sid


def _export(target: str, sid: str, server: pg_server.PgServer | None = None) -> tuple[float, float, bytes]:
    """(seconds, CPU seconds of this process and the server, the projection)."""
    with open_store(target, readonly=True) as st:
        gc.collect()
        t0, c0, s0 = time.perf_counter(), time.process_time(), _server_cpu(server)
        snap = st.read(sid)
        out = snap.projection()
        snap.close()
        return time.perf_counter() - t0, time.process_time() - c0 + _server_cpu(server) - s0, out


def bench_import_export(files_root: str, pg_url: str, server: pg_server.PgServer, data: bytes, res: Results) -> str:
    say(f"\n[2,3] import and export of the {len(data) / 1e6:.1f} MB session")
    Store.init(files_root).close()
    f_imp, f_icpu, sid = _import(files_root, data)
    p_imp, p_icpu, sid2 = _import(pg_url, data, server)
    if sid != sid2:
        raise BenchError("the two stores imported different session ids")
    f_times, p_times, f_cpus, p_cpus = [], [], [], []
    for _ in range(EXPORT_ROUNDS):  # alternating: the machine's load moves between them
        f_exp, f_cpu, f_out = _export(files_root, sid)
        p_exp, p_cpu, p_out = _export(pg_url, sid, server)
        if f_out != data or p_out != data:
            raise BenchError("an export did not give back the imported bytes")
        f_times.append(f_exp)
        p_times.append(p_exp)
        f_cpus.append(f_cpu)
        p_cpus.append(p_cpu)
    f_exp, p_exp = statistics.median(f_times), statistics.median(p_times)
    say(f"    import: files {f_imp:.2f} s, PostgreSQL {p_imp:.2f} s; export (median of {EXPORT_ROUNDS}, alternating): "
        f"files {f_exp:.2f} s, PostgreSQL {p_exp:.2f} s (rounds: files {', '.join(f'{t:.2f}' for t in f_times)}; "
        f"PostgreSQL {', '.join(f'{t:.2f}' for t in p_times)}; each byte-identical to the file imported)")
    # CPU (this process, and the server's processes for PostgreSQL): what the machine's load moves least.
    f_ecpu, p_ecpu = statistics.median(f_cpus), statistics.median(p_cpus)
    say(f"    CPU: import files {f_icpu:.2f} s, PostgreSQL {p_icpu:.2f} s ({p_icpu / f_icpu:.2f} x); export (medians) "
        f"files {f_ecpu:.2f} s, PostgreSQL {p_ecpu:.2f} s ({p_ecpu / f_ecpu:.2f} x), the server's included")
    res.add("import time, PostgreSQL / files", p_imp / f_imp, f"<= {TARGET_IMPORT}", p_imp / f_imp <= TARGET_IMPORT)
    res.add("export time, PostgreSQL / files", p_exp / f_exp, f"<= {TARGET_EXPORT}", p_exp / f_exp <= TARGET_EXPORT)
    return sid


# ---------------------------------------------------------------------------
# 4. size


def _add_forks(target: str, plan, label: str) -> None:
    """Create and fill each fork through the API; says how long it took (each fork checks its
    prefix, root to base, against the rules: the step's cost grows with the bases' depth)."""
    t0 = time.perf_counter()
    with open_store(target, sync="never") as st:
        for fid, base, own in plan:
            f = st.create(Header.new(fid, created_at=CREATED, base=base))
            for body in own:
                f.append(body)
            f.close()
    say(f"    {len(plan)} forks made in the {label} store in {time.perf_counter() - t0:.1f} s")


def _schema_bytes(url: str) -> int:
    _, schema = parse_url(url)
    _sql(url, "VACUUM ANALYZE")
    rows = _sql(url, f"SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                     f"JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{schema}' AND c.relkind = 'r'")
    return int(rows[0][0])


def _objects_variant(url: str, label: str, settings: list[str]) -> int:
    """The objects' raw bytes (decompressed) copied into a table of (hash, data) with other
    TOAST settings: its total size, to see what PostgreSQL's own compression would do."""
    conninfo, schema = parse_url(url)
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute(f"SET search_path TO {schema}")
        c.execute("DROP TABLE IF EXISTS objects_variant")
        c.execute("CREATE TABLE objects_variant (space smallint, hash bytea, data bytea, PRIMARY KEY (space, hash))")
        for st in settings:
            c.execute(st.format(table="objects_variant").encode())
        # The rows of a block together: each block read and decompressed once.
        rows = c.execute("SELECT space, hash, codec, data FROM objects ORDER BY CASE WHEN codec = 3 THEN data END NULLS FIRST").fetchall()
        with open_store(url, readonly=True) as st, c.cursor() as cur, \
                cur.copy("COPY objects_variant (space, hash, data) FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types(["int2", "bytea", "bytea"])
            for space, raw, codec, data in rows:
                cp.write_row((space, raw, st.backend.objects.codecs.decode(codec, bytes(data))))
        c.execute("VACUUM ANALYZE objects_variant")
        size = int(c.execute("SELECT pg_total_relation_size('objects_variant')").fetchone()[0])
        c.execute("DROP TABLE objects_variant")
    return size


def bench_size(files_root: str, pg_url: str, entries: list, leaf: str, forks: int, seed: int, res: Results) -> None:
    say(f"\n[4] size: the session + {forks} forks, PostgreSQL's tables / the file store packed")
    path = resume_path(entries, leaf)
    fork_src = generate(max(40, 20 * forks), seed + 1)[1]
    bodies = [_body(e) for e in fork_src if e.type in ("item", "response")]
    plan = fork_plan(path, forks, seed, bodies)
    _add_forks(files_root, plan, "file")
    _add_forks(pg_url, plan, "PostgreSQL")
    with Store(files_root) as st:
        st.pack()
    f_size = _du(files_root)
    p_size = _schema_bytes(pg_url)
    count, stored, zstd, zdict, blocked = _sql(
        pg_url, "SELECT count(*), sum(octet_length(data)) + (SELECT coalesce(sum(octet_length(data)), 0) FROM blocks), "
                "count(*) FILTER (WHERE codec = 1), count(*) FILTER (WHERE codec = 2), count(*) FILTER (WHERE codec = 3) FROM objects")[0]
    blocks = int(_sql(pg_url, "SELECT count(*) FROM blocks")[0][0])
    objects_size = int(_sql(pg_url, "SELECT pg_total_relation_size('objects') + pg_total_relation_size('blocks')")[0][0])
    say(f"    objects: {int(count):,}, {blocked:,} of them in {blocks:,} blocks, {zdict:,} stored as zstd frames made with "
        f"the store's dictionaries, {zstd:,} as frames of their own, {_mb(int(stored))} stored")
    say(f"    files packed {_mb(f_size)}; PostgreSQL schema {_mb(p_size)} (objects and blocks tables with their TOAST and "
        f"indexes {_mb(objects_size)})")
    _, schema = parse_url(pg_url)
    tables = _sql(pg_url, "SELECT c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid) FROM pg_class c "
                          f"JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{schema}' AND c.relkind = 'r' "
                          "ORDER BY pg_total_relation_size(c.oid) DESC LIMIT 4")
    say("    by table (rows and TOAST + indexes): " + ", ".join(f"{name} {_mb(int(t))} + {_mb(int(i))}" for name, t, i in tables))
    res.add("size, PostgreSQL / files packed", p_size / f_size, f"<= {TARGET_SIZE}", p_size / f_size <= TARGET_SIZE)
    say("    the same objects stored raw, left to PostgreSQL's TOAST compression (a table of space, hash, data):")
    variants = [
        ("pglz (the default)", []),
        ("lz4", ["ALTER TABLE {table} ALTER COLUMN data SET COMPRESSION lz4"]),
        ("pglz, toast_tuple_target=128", ["ALTER TABLE {table} SET (toast_tuple_target = 128)"]),
    ]
    for label, settings in variants:
        try:
            size = _objects_variant(pg_url, label, settings)
        except psycopg.Error as exc:
            say(f"      {label}: not available here ({' '.join(str(exc).split())[:120]})")
            continue
        say(f"      {label}: {_mb(size)} ({size / objects_size:.2f} x the objects and blocks tables as this backend keeps them)")


# ---------------------------------------------------------------------------
# 5. open, first append, close


class _Counted:
    """The statements sent through psycopg's ``Connection.execute`` while counting, and
    the rows each returned (an append, sent through libpq itself, is not among them)."""

    def __init__(self) -> None:
        self.on = False
        self.calls: list[tuple[str, int]] = []
        real = psycopg.Connection.execute

        def execute(conn: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            cur = real(conn, query, *args, **kwargs)
            if self.on:
                text = query.decode() if isinstance(query, bytes) else str(query)
                self.calls.append((" ".join(text.split())[:60], max(cur.rowcount, 0) if cur.description else 0))
            return cur

        psycopg.Connection.execute = execute  # type: ignore[method-assign]

    def take(self) -> tuple[int, int]:
        """(queries, rows returned) since the last take."""
        calls, self.calls = self.calls, []
        return len(calls), sum(n for _, n in calls)


def bench_open(pg_url: str, server: pg_server.PgServer, sid: str, body: dict) -> None:
    say(f"\n[5] open of the imported session for writing, its first append, its close ({OPEN_ROUNDS} rounds)")
    counted = _Counted()
    with open_store(pg_url) as st:
        for r in range(OPEN_ROUNDS + 1):
            gc.collect()
            marks = []
            counted.on = True
            for step in ("open", "append" if r else "set_mark", "close"):
                c0, s0, t0 = time.process_time(), _server_cpu(server), time.perf_counter()
                if step == "open":
                    s = st.session(sid)
                elif step == "append":
                    s.append(body)
                elif step == "set_mark":  # (an import is a mirror: round 0 makes it a record)
                    s.set_mark("record")
                else:
                    s.close()
                marks.append((step, time.process_time() - c0, _server_cpu(server) - s0, time.perf_counter() - t0,
                               *counted.take()))
            counted.on = False
            say(f"    round {r}: " + "; ".join(
                f"{step} {cpu:.3f} s CPU + {srv:.3f} s in the server ({wall:.3f} s), {q} queries, {rows:,} rows"
                for step, cpu, srv, wall, q, rows in marks))


def bench_fsck(pg_url: str, server: pg_server.PgServer) -> None:
    from agentsession_cas.maintenance.fsck import fsck

    say(f"\n[6] fsck of the PostgreSQL store ({FSCK_ROUNDS} rounds): the whole walk, and its count of unreferenced objects")
    rows = []
    for r in range(FSCK_ROUNDS):
        gc.collect()
        at: list[tuple[float, float, float]] = []

        def phase(text: str, at: list[tuple[float, float, float]] = at) -> None:
            if text.startswith("counting unreferenced") and not at:
                at.append((time.perf_counter(), time.process_time(), _server_cpu(server)))

        with open_store(pg_url, readonly=True) as st:
            t0, c0, s0 = time.perf_counter(), time.process_time(), _server_cpu(server)
            report = fsck(st, progress=phase)
            t1, c1, s1 = time.perf_counter(), time.process_time(), _server_cpu(server)
        if not report.ok or not at:
            raise BenchError(f"fsck found the store damaged or did not count: {[p.message for p in report.errors][:3]}")
        ta, ca, sa = at[0]
        rows.append((t1 - t0, c1 - c0, s1 - s0, t1 - ta, c1 - ca, s1 - sa))
        u = report.counts["unreferenced"]
        say(f"    round {r + 1}: {t1 - t0:.2f} s ({c1 - c0:.2f} s CPU + {s1 - s0:.2f} s in the server); counting unreferenced "
            f"{t1 - ta:.2f} s ({c1 - ca:.2f} s CPU + {s1 - sa:.2f} s in the server) of {report.counts['objects']:,} objects, "
            f"{report.counts['log_records']:,} log records; unreferenced {u}")
    med = [statistics.median(col) for col in zip(*rows)]
    say(f"    medians: fsck {med[0]:.2f} s ({med[1]:.2f} s CPU + {med[2]:.2f} s in the server); of it, counting unreferenced "
        f"{med[3]:.2f} s ({med[4]:.2f} s CPU + {med[5]:.2f} s in the server): {med[3] / med[0]:.0%} of the time")


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"{QUICK_ENTRIES:,} entries, {QUICK_FORKS} forks, "
                      f"{QUICK_APPENDS} appends per writer")
    size.add_argument("--entries", type=int, default=None, help=f"entries of the session (default {DEFAULT_ENTRIES:,})")
    ap.add_argument("--forks", type=int, default=None, help=f"forks (default {DEFAULT_FORKS})")
    ap.add_argument("--appends", type=int, default=None, help=f"appends per writer (default {DEFAULT_APPENDS})")
    ap.add_argument("--seed", type=int, default=20260917, help="generator seed")
    ap.add_argument("--only", default=",".join(BENCHES), help=f"comma-separated subset of {','.join(BENCHES)}")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory (and stop the server)")
    args = ap.parse_args(argv)
    q = args.quick
    count = QUICK_ENTRIES if q else (args.entries or DEFAULT_ENTRIES)
    forks = args.forks or (QUICK_FORKS if q else DEFAULT_FORKS)
    per_writer = args.appends or (QUICK_APPENDS if q else DEFAULT_APPENDS)
    benches = tuple(b.strip() for b in args.only.split(",") if b.strip())
    bad = [b for b in benches if b not in BENCHES]
    if bad:
        ap.error(f"--only: unknown {', '.join(bad)}")
    if "size" in benches and "import" not in benches:
        ap.error("--only: size needs import (it measures the imported session and its forks)")
    say(f"bench_postgresql: agentsession-cas {agentsession_cas.__version__}, Python {platform.python_version()}, "
        f"psycopg {psycopg.__version__}, {platform.machine()}, {os.cpu_count()} CPUs (shared: times vary)")
    base = ROOT / ".bench-tmp"
    base.mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-postgresql-", dir=base)
    os.chmod(tmp, 0o755)
    server = pg_server.PgServer(durable=True, base=tmp)
    version = _sql(server.store_url("x").replace("schema=x", "schema=public"), "SHOW server_version")[0][0]
    say(f"PostgreSQL {version} with fsync on, data in {server.dir}; file stores in {tmp} (the same filesystem)")
    res = Results()
    try:
        data, entries, leaf = generate(count, args.seed)
        if "appends" in benches:
            bodies = [_body(e) for e in entries[:2000] if e.type in ("item", "response")]
            pg_url = server.store_url("appends")
            open_store(pg_url, create=True).close()
            bench_appends(os.path.join(tmp, "files-appends"), pg_url, server, bodies, per_writer, res)
        if "import" in benches:
            pg_url = server.store_url("session")
            open_store(pg_url, create=True).close()
            files_root = os.path.join(tmp, "files-session")
            sid = bench_import_export(files_root, pg_url, server, data, res)
            if "size" in benches:
                bench_size(files_root, pg_url, entries, leaf, forks, args.seed, res)
        if "open" in benches:
            body = next(_body(e) for e in entries if e.type == "item")
            if "import" not in benches:
                pg_url = server.store_url("session")
                open_store(pg_url, create=True).close()
                _, cpu, sid = _import(pg_url, data, server)
                say(f"\n    imported the {len(data) / 1e6:.1f} MB session into PostgreSQL ({cpu:.2f} s CPU, the server's included)")
            bench_open(pg_url, server, sid, body)
        if "fsck" in benches:
            if "import" not in benches and "open" not in benches:
                pg_url = server.store_url("session")
                open_store(pg_url, create=True).close()
                _, cpu, sid = _import(pg_url, data, server)
                say(f"\n    imported the {len(data) / 1e6:.1f} MB session into PostgreSQL ({cpu:.2f} s CPU, the server's included)")
            bench_fsck(pg_url, server)
    except BenchError as exc:
        say(f"FAILED: {exc}")
        return 1
    finally:
        server.remove()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    say("\nsummary:")
    for name, value, target, met in res.rows:
        say(f"  {'MET    ' if met else 'NOT MET'} {name}: {value:.3f} (target {target})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
