#!/usr/bin/env python3
"""Benchmark: the store's write, import, export and open paths against same-run baselines.

Reuses the deterministic coding-agent session of ``bench_verify.py``
(:func:`bench_verify.generate`) and times, in one process, four things,
each as a ratio against a baseline measured in the same run:

1. **durable append** (sync policy ``always``): appends per second through
   ``Session.append``, against appending one ~300-byte line to a file opened
   ``O_APPEND`` and fsyncing it, on the same filesystem. Target >= 1/3 of
   that rate.
2. **lazy append** (policy ``never``, one ``commit`` at the end, then
   close): entries per second, against verify of the same entries' bytes
   with every rule an append runs (``verify_bytes``: the line, tree, record
   and context rules, request hashes included, as ``verify FILE`` runs them).
   Target >= 40% of that verify's rate. (The target was set when an append
   ran the line and tree rules only, against ``read_session_bytes``, which
   runs those; since the one rule set (issue 10) an append also runs the
   record and context rules, which ``read_session_bytes`` never ran. Its
   ratio is still printed, as information.)
3. **import** of the session file (``Store.import_file``) and **export** of
   it back (``Store(..., readonly=True).export``), each against verify's
   rate on the same file. Target >= 40% each.
4. **open** one session in a store of many sessions against one of 10:
   ``Store(path).session(id)`` + close, and ``Store(path,
   readonly=True).read(id)``, median over many repetitions. Target: the same
   cost (ratio <= 1.5).

Stores live in a temp directory under ``<repo>/.bench-tmp`` (the same
filesystem as the repository; checked), removed at the end unless ``--keep``.
A missed target is a measurement, not a failure: the exit status is 0
either way; 1 only when the generated session does not verify clean or an
export does not give back the imported bytes, 2 on bad arguments.

Run: ``.venv/bin/python tests/bench/bench_store.py [--quick | --entries N]
[--appends N] [--sessions N] [--only durable,lazy,import,open] [--profile [N]]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import agentsession_cas  # noqa: E402
from agentsession_cas import Header, read_session_bytes  # noqa: E402
from agentsession_cas.format.reader import verify_bytes  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402
from bench_verify import SESSION_ID, generate  # noqa: E402

DEFAULT_ENTRIES, QUICK_ENTRIES = 100_000, 10_000
DEFAULT_APPENDS, QUICK_APPENDS = 3_000, 300
DEFAULT_SESSIONS, QUICK_SESSIONS = 10_000, 1_000
SMALL_STORE = 10
TARGET_DURABLE = 1 / 3  # of the raw O_APPEND+fsync rate
TARGET_VERIFY = 0.40  # of verify's entries/s
TARGET_OPEN = 1.5  # big store / small store, at most
BENCHES = ("durable", "lazy", "import", "open")


# ---------------------------------------------------------------------------
# Helpers


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def _timed(fn, *args, **kw):
    gc.collect()
    t0 = time.perf_counter()
    result = fn(*args, **kw)
    return time.perf_counter() - t0, result


def _best_of(fn, arg, repeat: int):
    best, result = float("inf"), None
    for _ in range(repeat):
        result = None
        dt, result = _timed(fn, arg)
        best = min(best, dt)
    return best, result


def _du(path: str) -> tuple[int, int]:
    """(files, bytes) under path."""
    files = size = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            files += 1
            try:
                size += os.lstat(os.path.join(dirpath, n)).st_size
            except FileNotFoundError:
                pass
    return files, size


class Results:
    def __init__(self):
        self.rows: list[tuple[str, float, str, bool]] = []

    def add(self, name: str, value: float, target: str, met: bool) -> None:
        self.rows.append((name, value, target, met))
        print(f"  RESULT {name}: {'MET' if met else 'NOT MET'} ({value:.3f}, target {target})")


# ---------------------------------------------------------------------------
# 1. durable append


def raw_append_fsync(directory: str, n: int, lines: list[bytes] | None = None) -> float:
    """Seconds for n x (write one line to an O_APPEND file; fsync). The lines are the
    given ones (cycled), else one 300-byte line."""
    path = os.path.join(directory, f"raw-{os.urandom(4).hex()}.log")
    if not lines:
        line = (b"0123456789abcdef " + b'{"op":"append","seq":1,"entry":"sha256:' + b"0" * 64 + b'"}')
        lines = [(line + b" " * 300)[:299] + b"\n"]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for i in range(max(10, n // 10)):  # warm-up, untimed
            os.write(fd, lines[i % len(lines)])
            os.fsync(fd)
        gc.collect()
        t0 = time.perf_counter()
        for i in range(n):
            os.write(fd, lines[i % len(lines)])
            os.fsync(fd)
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return dt


def store_appends(store_dir: str, session_id: str, entries: list, sync: str) -> tuple[float, float, int]:
    """Create a session and append entries under ``sync``; commit, close.

    Returns (seconds for the appends, seconds for commit+close, appends reported durable).
    The session is created before the clock starts."""
    store = Store.init(store_dir, sync=sync)
    session = store.create(Header.new(session_id, created_at="2026-09-17T12:00:00Z"))
    append = session.append
    durable = 0
    gc.collect()
    t0 = time.perf_counter()
    for e in entries:
        if append(e).durable:
            durable += 1
    t1 = time.perf_counter()
    session.commit()
    store.close()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, durable


def bench_durable(tmp: str, entries: list, n: int, res: Results) -> None:
    print(f"\n[1] durable append (policy 'always'), {n} appends of the generated entries")
    sizes = [len(e.canonical_line()) for e in entries[:n]]
    print(f"    entry lines: mean {statistics.mean(sizes):,.0f} B, median {statistics.median(sizes):,.0f} B, "
          f"max {max(sizes):,} B")
    raw_dir = os.path.join(tmp, "raw")
    os.makedirs(raw_dir, exist_ok=True)
    # The baseline a store is held to: a plain JSONL writer appending the same entry
    # lines, one write and one fsync each. A fixed 300-byte line is shown beside it.
    lines = [e.canonical_line() for e in entries[:n]]
    b1 = raw_append_fsync(raw_dir, n, lines)
    small = raw_append_fsync(raw_dir, n)
    app_s, close_s, durable = store_appends(os.path.join(tmp, "durable"), "bench-durable", entries[:n], "always")
    b2 = raw_append_fsync(raw_dir, n, lines)
    raw_rate = (_rate(n, b1) + _rate(n, b2)) / 2
    st_rate = _rate(n, app_s)
    ratio = st_rate / raw_rate
    print(f"    baseline  same lines + fsync (O_APPEND): {_rate(n, b1):>9,.0f} /s before, {_rate(n, b2):>9,.0f} /s after, "
          f"mean {raw_rate:,.0f} /s ({1e6 / raw_rate:,.0f} us each)")
    print(f"    (for scale: a 300-byte line + fsync    : {_rate(n, small):>9,.0f} /s; store ratio to it "
          f"{_rate(n, app_s) / _rate(n, small):.3f})")
    print(f"    store     Session.append, 'always'     : {st_rate:>9,.0f} /s ({1e6 * app_s / n:,.0f} us each; "
          f"{durable}/{n} reported durable; close {close_s * 1000:.1f} ms)")
    print(f"    ratio     store / baseline             : {ratio:9.3f}   (target >= {TARGET_DURABLE:.3f})")
    if durable != n:
        print(f"    WARNING: only {durable} of {n} appends reported durable under 'always'")
    res.add("durable append vs raw append+fsync", ratio, f">= {TARGET_DURABLE:.3f}", ratio >= TARGET_DURABLE)


# ---------------------------------------------------------------------------
# 2. lazy append


def bench_lazy(tmp: str, entries: list, ver_rate: float, all_rate: float, res: Results) -> None:
    n = len(entries)
    print(f"\n[2] lazy append (policy 'never', one commit at the end), {n:,} entries")
    store_dir = os.path.join(tmp, "lazy")
    app_s, close_s, durable = store_appends(store_dir, "bench-lazy", entries, "never")
    total = app_s + close_s
    rate = _rate(n, total)
    ratio = rate / all_rate
    files, size = _du(os.path.join(store_dir, "objects"))
    print(f"    store     appends {app_s:8.2f} s + commit/close {close_s:6.2f} s = {total:8.2f} s: {rate:>9,.0f} entries/s "
          f"({durable} reported durable; {files:,} object files, {size / 1e6:,.1f} MB)")
    print(f"    verify, every rule an append runs (verify_bytes)            : {all_rate:>9,.0f} entries/s")
    print(f"    ratio     lazy append / verify : {ratio:7.3f}   (target >= {TARGET_VERIFY:.2f})")
    print(f"    (information: / read_session_bytes, the line and tree rules only, {ver_rate:,.0f} entries/s: "
          f"{rate / ver_rate:.3f})")
    res.add("lazy append vs verify", ratio, f">= {TARGET_VERIFY:.2f}", ratio >= TARGET_VERIFY)
    shutil.rmtree(store_dir, ignore_errors=True)


# ---------------------------------------------------------------------------
# 3. import and export


def bench_import_export(tmp: str, data: bytes, n: int, ver_rate: float, repeat: int, res: Results) -> bool:
    print(f"\n[3] import of a {n:,}-entry file ({len(data) / 1e6:.1f} MB) and export of it back")
    path = os.path.join(tmp, "session.jsonl")
    with open(path, "wb") as f:
        f.write(data)
    store_dir = os.path.join(tmp, "import")
    Store.init(store_dir).close()

    def do_import(p):
        with Store(store_dir) as st:
            s = st.import_file(p)
            return len(s)

    imp_s, held = _timed(do_import, path)
    imp_rate = _rate(n, imp_s)

    def do_export(sid):
        return Store(store_dir, readonly=True).export(sid)

    exp_s, out = _best_of(do_export, SESSION_ID, repeat)
    exp_rate = _rate(n, exp_s)
    same = out == data
    print(f"    import    Store.import_file          : {imp_s:8.2f} s  {imp_rate:>9,.0f} entries/s  ({held:,} own entries)")
    print(f"    export    Store(ro).export, best of {repeat}: {exp_s:8.2f} s  {exp_rate:>9,.0f} entries/s  "
          f"(bytes {'identical to' if same else 'DIFFER from'} the imported file)")
    print(f"    verify                               :             {ver_rate:>9,.0f} entries/s")
    print(f"    ratio     import / verify : {imp_rate / ver_rate:7.3f}   (target >= {TARGET_VERIFY:.2f})")
    print(f"    ratio     export / verify : {exp_rate / ver_rate:7.3f}   (target >= {TARGET_VERIFY:.2f})")
    res.add("import vs verify", imp_rate / ver_rate, f">= {TARGET_VERIFY:.2f}", imp_rate / ver_rate >= TARGET_VERIFY)
    res.add("export vs verify", exp_rate / ver_rate, f">= {TARGET_VERIFY:.2f}", exp_rate / ver_rate >= TARGET_VERIFY)
    shutil.rmtree(store_dir, ignore_errors=True)
    os.unlink(path)
    return same


# ---------------------------------------------------------------------------
# 4. open in a big store vs a small one

TARGET_SESSION = "target-session"


def _fill_session(store: Store, sid: str, k: int) -> None:
    s = store.create(Header.new(sid, created_at="2026-09-17T12:00:00Z"))
    for j in range(k):
        s.append({
            "type": "item",
            "ts": f"2026-09-17T12:00:{j:02d}Z",
            "item": {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": f"session {sid}, message {j}: hello there"}]},
        })
    s.close()


def build_store(path: str, count: int, threads: int = 8) -> float:
    """A store of ``count`` sessions of 1-3 entries (plus the target session, 3 entries)."""
    t0 = time.perf_counter()
    Store.init(path, sync="never").close()
    ids = [f"s{i:06d}" for i in range(count - 1)]

    def work(chunk: list[str]) -> None:
        with Store(path, sync="never") as st:
            for sid in chunk:
                _fill_session(st, sid, 1 + int(sid[1:]) % 3)

    chunks = [ids[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(work, chunks))
    with Store(path, sync="never") as st:
        _fill_session(st, TARGET_SESSION, 3)
    return time.perf_counter() - t0


def _open_close(path: str, sid: str) -> None:
    st = Store(path)
    s = st.session(sid)
    s.close()
    st.close()


def _read_ro(path: str, sid: str) -> None:
    Store(path, readonly=True).read(sid)


def _time_ops(fn, paths: list[str], sid: str, reps: int) -> list[list[float]]:
    """Per-path op times, interleaving the paths so drift hits both alike."""
    out: list[list[float]] = [[] for _ in paths]
    for p in paths:  # warm-up
        for _ in range(5):
            fn(p, sid)
    gc.collect()
    pc = time.perf_counter
    for _ in range(reps):
        for i, p in enumerate(paths):
            t0 = pc()
            fn(p, sid)
            out[i].append(pc() - t0)
    return out


def bench_open(tmp: str, sessions: int, reps: int, res: Results) -> None:
    print(f"\n[4] opening one session: a store of {sessions:,} sessions vs one of {SMALL_STORE}")
    small, big = os.path.join(tmp, "open-small"), os.path.join(tmp, "open-big")
    ts = build_store(small, SMALL_STORE)
    tb = build_store(big, sessions)
    os.sync()  # let the build's writeback finish before timing opens
    time.sleep(1)
    nb = len(Store(big, readonly=True).list())
    ns = len(Store(small, readonly=True).list())
    files, size = _du(big)
    print(f"    built: small {ns} sessions in {ts:.1f} s; big {nb:,} sessions in {tb:.1f} s "
          f"({files:,} files, {size / 1e6:.1f} MB)")
    for label, fn in (("Store(path).session(id) + close", _open_close), ("Store(path, readonly).read(id) ", _read_ro)):
        t_small, t_big = _time_ops(fn, [small, big], TARGET_SESSION, reps)
        ms, mb = statistics.median(t_small), statistics.median(t_big)
        q = lambda xs: sorted(xs)[int(len(xs) * 0.9)]  # noqa: E731
        ratio = mb / ms
        print(f"    {label}: small median {ms * 1e6:8.1f} us (p90 {q(t_small) * 1e6:8.1f}), "
              f"big median {mb * 1e6:8.1f} us (p90 {q(t_big) * 1e6:8.1f}); ratio {ratio:.3f}   "
              f"(target <= {TARGET_OPEN})")
        res.add(f"open: {label.strip()} big/small", ratio, f"<= {TARGET_OPEN}", ratio <= TARGET_OPEN)
    # A few other sessions of the big store, for spread.
    others = [f"s{i:06d}" for i in (0, sessions // 3, sessions // 2, sessions - 2) if 0 <= i < sessions - 1]
    t = [min(_time_ops(_open_close, [big], sid, 20)[0]) for sid in others]
    print("    other sessions of the big store, open+close best of 20: "
          + ", ".join(f"{sid} {x * 1e6:.0f} us" for sid, x in zip(others, t)))
    shutil.rmtree(small, ignore_errors=True)
    shutil.rmtree(big, ignore_errors=True)


# ---------------------------------------------------------------------------
# Profiling


def profile_all(tmp: str, entries: list, data_for, top: int, benches: tuple[str, ...]) -> None:
    import cProfile
    import pstats

    def show(title: str, fn) -> None:
        prof = cProfile.Profile()
        prof.enable()
        fn()
        prof.disable()
        print(f"\n--- profile: {title} (cProfile adds overhead), top {top} by tottime")
        pstats.Stats(prof, stream=sys.stdout).strip_dirs().sort_stats("tottime").print_stats(top)

    pdir = os.path.join(tmp, "profile")
    os.makedirs(pdir, exist_ok=True)
    if "durable" in benches:
        n = min(300, len(entries))
        show(f"durable append x{n}", lambda: store_appends(os.path.join(pdir, "d"), "p-durable", entries[:n], "always"))
    n = min(QUICK_ENTRIES, len(entries))
    if "lazy" in benches:
        show(f"lazy append x{n} + commit", lambda: store_appends(os.path.join(pdir, "l"), "p-lazy", entries[:n], "never"))
    if "import" in benches:
        data = data_for(n)
        path = os.path.join(pdir, "s.jsonl")
        with open(path, "wb") as f:
            f.write(data)
        sdir = os.path.join(pdir, "i")
        Store.init(sdir).close()

        def imp():
            with Store(sdir) as st:
                st.import_file(path)

        show(f"import x{n}", imp)
        show(f"export x{n}", lambda: Store(sdir, readonly=True).export(SESSION_ID))
    if "open" in benches:
        sdir = os.path.join(pdir, "o")
        build_store(sdir, QUICK_SESSIONS)
        os.sync()
        show(f"open+close x300 in a store of {QUICK_SESSIONS:,} sessions",
             lambda: [_open_close(sdir, TARGET_SESSION) for _ in range(300)])
    shutil.rmtree(pdir, ignore_errors=True)


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_ENTRIES:,} entries, {QUICK_APPENDS} durable appends, {QUICK_SESSIONS:,} sessions")
    ap.add_argument("--entries", type=int, default=None, help=f"entries for lazy append, import, export (default {DEFAULT_ENTRIES:,})")
    ap.add_argument("--appends", type=int, default=None, help=f"durable appends (default {DEFAULT_APPENDS:,})")
    ap.add_argument("--sessions", type=int, default=None, help=f"sessions in the big store (default {DEFAULT_SESSIONS:,})")
    ap.add_argument("--open-reps", type=int, default=None, help="repetitions of each open (default 500, 200 with --quick)")
    ap.add_argument("--repeat", type=int, default=None, help="best-of repetitions for verify and export (default 3, 5 with --quick)")
    ap.add_argument("--seed", type=int, default=20260917, help="generator seed")
    ap.add_argument("--only", default=",".join(BENCHES), help=f"comma-separated subset of {','.join(BENCHES)}")
    ap.add_argument("--profile", type=int, nargs="?", const=25, metavar="N",
                    help="after timing, cProfile each selected store path (at --quick sizes) and print the top N by tottime")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    args = ap.parse_args(argv)
    q = args.quick
    count = args.entries if args.entries is not None else (QUICK_ENTRIES if q else DEFAULT_ENTRIES)
    appends = args.appends if args.appends is not None else (QUICK_APPENDS if q else DEFAULT_APPENDS)
    sessions = args.sessions if args.sessions is not None else (QUICK_SESSIONS if q else DEFAULT_SESSIONS)
    reps = args.open_reps or (200 if q else 500)
    repeat = args.repeat or (5 if count <= QUICK_ENTRIES else 3)
    benches = tuple(b.strip() for b in args.only.split(",") if b.strip())
    bad = [b for b in benches if b not in BENCHES]
    if bad:
        ap.error(f"--only: unknown {', '.join(bad)}")
    if count < 1 or appends < 1 or sessions < SMALL_STORE or reps < 1 or repeat < 1:
        ap.error(f"sizes must be positive, and --sessions at least {SMALL_STORE}")

    print(f"bench_store: agentsession-cas {agentsession_cas.__version__}, Python {platform.python_version()} "
          f"({platform.python_implementation()}), {platform.machine()}, {os.cpu_count()} CPUs")
    base = ROOT / ".bench-tmp"
    base.mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-store-", dir=base)
    same_fs = os.stat(tmp).st_dev == os.stat(ROOT).st_dev
    print(f"temp dir: {tmp} ({'same filesystem as the repository' if same_fs else 'WARNING: not the repository filesystem'})")
    t_start = time.perf_counter()
    ok = True
    try:
        need = max(count if set(benches) & {"lazy", "import"} else 0, appends if "durable" in benches else 0, 1)
        t0 = time.perf_counter()
        data_all, entries, _ = generate(need, args.seed)
        header_line = data_all[: data_all.index(b"\n") + 1]

        def data_for(n: int) -> bytes:
            if n == len(entries):
                return data_all
            return header_line + b"".join(e.canonical_line() for e in entries[:n])

        data = data_for(min(count, len(entries)))
        if set(benches) & {"durable", "lazy", "import"}:
            print(f"session: {need:,} entries generated in {time.perf_counter() - t0:.1f}s (seed {args.seed}); "
                  f"{count:,} entries = {len(data) / 1e6:.1f} MB")
        res = Results()

        ver_rate = None
        if set(benches) & {"lazy", "import"}:
            sf = read_session_bytes(data, source="<bench>")
            if sf.all_problems() or len(sf.entries) != count:
                print(f"INVALID: the generated session does not verify clean ({len(sf.all_problems())} problems)")
                return 1
            del sf
            ver_s, _ = _best_of(lambda d: read_session_bytes(d, source="<bench>"), data, repeat)
            ver_rate = _rate(count, ver_s)
            print(f"\nverify (read_session_bytes), best of {repeat}: {ver_s * 1000:,.1f} ms, {ver_rate:,.0f} entries/s, "
                  f"{len(data) / 1e6 / ver_s:.1f} MB/s")

        if "durable" in benches:
            bench_durable(tmp, entries, min(appends, len(entries)), res)
        if "lazy" in benches:
            all_s, report = _best_of(lambda d: verify_bytes(d, source="<bench>"), data, repeat)
            if report.problems:
                print(f"INVALID: verify_bytes finds {len(report.problems)} problems in the generated session")
                return 1
            all_rate = _rate(count, all_s)
            print(f"verify with every rule (verify_bytes), best of {repeat}: {all_s * 1000:,.1f} ms, {all_rate:,.0f} entries/s")
            bench_lazy(tmp, entries[:count], ver_rate, all_rate, res)
        if "import" in benches:
            if not bench_import_export(tmp, data, count, ver_rate, repeat, res):
                print("    ERROR: export did not give back the imported file's bytes")
                ok = False
        if "open" in benches:
            bench_open(tmp, sessions, reps, res)

        print(f"\nSUMMARY ({time.perf_counter() - t_start:.0f} s; entries {count:,}, durable appends {appends:,}, "
              f"big store {sessions:,} sessions)")
        for name, value, target, met in res.rows:
            print(f"  {'MET    ' if met else 'NOT MET'}  {name:<55} {value:8.3f}  (target {target})")
        print(f"  {sum(m for *_, m in res.rows)} of {len(res.rows)} targets met")

        if args.profile:
            profile_all(tmp, entries, data_for, args.profile, benches)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                base.rmdir()
            except OSError:
                pass
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
