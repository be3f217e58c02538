#!/usr/bin/env python3
"""Benchmark: push between two stores, incremental and full, against same-run baselines.

Reuses the deterministic coding-agent session of ``bench_verify.py``
(:func:`bench_verify.generate`) and measures, in one process, two things
from RFC 0002's exchange as ``agentsession_cas.exchange.operations.push`` does it
between stores reachable as paths (``LocalTransport``):

1. **full push** of the whole session to an empty store, from its open
   session through a new ``LocalTransport``, against ``Store.import_file``
   of the same file into an empty store (entries/s each, best of
   ``--full-repeat``). Target: push >= 40% of import's rate.
2. **incremental push** of ``--batch`` (100) new entries onto a remote that
   holds the ``--entries``-entry session (100,000) against the same onto a
   remote holding a ``--small``-entry session (1,000, the first entries of
   the same session). Each side is a local record session, imported with
   ``record=True`` and pushed whole once; then, per repetition, the same
   fresh entries (bodies of another ``generate()`` call, items, responses
   and configs, each appended with its parent the head) are appended to
   both, untimed, and the push is timed: the sender's commit
   (``Session.commit``, which ``push`` performs first anyway) plus
   ``exchange.push(store, transport, id, session=open_session)``, the
   recorder's flow: its session open, one ``LocalTransport`` kept across
   pushes. Median (and best) over the repetitions, big and small
   interleaved. Target: the time follows the 100 entries, not the session
   (median big / small <= 1.5).
3. For scale, not a target: the same push made cold, as the command makes
   it (a new ``Store``, the session opened here and at the remote).
4. **full fetch over HTTP** of the whole session from an ``agentsession serve``
   of the remote store (its own process, on loopback) into an empty store,
   against the same fetch from the remote store's path (best of
   ``--full-repeat`` each, alternated). Target: HTTP at most 1.5x the time
   (the server's reads and the framing; before the server's batch read, a
   GET an object took 20x). Skipped, with a note, without the ``server`` extra.

Stores live in a temp directory under ``<repo>/.bench-tmp`` (the same
filesystem as the repository; checked), removed at the end unless ``--keep``.
A missed target is a measurement, not a failure: the exit status is 0 either
way; 1 when something the numbers depend on fails (the generated session
does not verify, a push is refused, not incremental or admits other than
what was appended, a remote's export differs from the pushed session), 2 on
bad arguments. When a target is missed, or with ``--profile``, it prints a
cProfile of the push that missed it.

Run: ``.venv/bin/python tests/bench/bench_exchange.py [--quick | --entries N]
[--small N] [--batch N] [--reps N] [--cold-reps N] [--full-repeat N] [--profile [N]] [--keep]``.
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
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import agentsession_cas  # noqa: E402
from agentsession_cas import exchange, read_session_bytes  # noqa: E402
from agentsession_cas.backends.files.sessions import CHECKPOINT_ENTRIES  # noqa: E402 - after the sys.path set-up
from agentsession_cas.exchange.local import LocalTransport  # noqa: E402
from agentsession_cas.store import Session, Store  # noqa: E402
from bench_verify import SESSION_ID, generate  # noqa: E402

DEFAULT_ENTRIES, QUICK_ENTRIES = 100_000, 10_000
DEFAULT_SMALL = 1_000
DEFAULT_BATCH = 100
DEFAULT_REPS, QUICK_REPS = 21, 11
DEFAULT_COLD_REPS = 3
DEFAULT_FULL_REPEAT, QUICK_FULL_REPEAT = 1, 3
TARGET_INCREMENTAL = 1.5  # big / small, at most
TARGET_FULL = 0.40  # of import's entries/s, at least
TARGET_HTTP_FETCH = 1.5  # x a fetch from the store's path, at most
FRESH_TYPES = ("item", "response", "config")  # bodies that name no other entry


class BenchError(Exception):
    """Something the numbers depend on went wrong (exit 1)."""


# ---------------------------------------------------------------------------
# Helpers


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


#: A fetch (or a push, from a store no process holds open) made in a fresh interpreter,
#: which prints its CPU and peak resident set: the peak of this process would hold what
#: the benchmark keeps and what its allocator kept of the runs before. argv: op (fetch or
#: push), the sending store or URL, the receiving store, the session id. From a path, the
#: remote's reads are in the same process, and with them both exchange caches
#: (operations.SEND_CACHE_BYTES for a push, endpoint.SENT_KEPT_BYTES).
_MEASURED = """
import resource, sys, time
sys.path[:0] = {path!r}
from agentsession_cas import exchange
from agentsession_cas.exchange.local import LocalTransport
from agentsession_cas.store import Store
op, src, dst, sid = sys.argv[1:5]
c = time.process_time()
if op == "push":
    with Store(src) as st, LocalTransport(dst) as tr:
        exchange.push(st, tr, sid)
else:
    with Store(dst) as st:
        if src.startswith("http"):
            from agentsession_cas.exchange.http_client import HttpTransport
            with HttpTransport(src) as tr:
                exchange.fetch(st, tr, sid)
        else:
            exchange.fetch(st, src, sid)
# VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's size at the fork
hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")]
print(time.process_time() - c, int(hwm[0]) / 1024 if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def measured(op: str, src: str, dst: str) -> tuple[float, float]:
    """(CPU s, peak resident MB) of ``op`` (fetch or push) from ``src`` into the empty
    store ``dst``, made in a fresh interpreter (:data:`_MEASURED`)."""
    Store.init(dst).close()
    try:
        out = subprocess.run([sys.executable, "-c", _MEASURED.format(path=[str(ROOT)]), op, src, dst, SESSION_ID],
                             capture_output=True, text=True, check=True).stdout.split()
    except subprocess.CalledProcessError as exc:
        raise BenchError(f"the measured {op} failed: {exc.stderr[-500:]}") from None
    finally:
        shutil.rmtree(dst, ignore_errors=True)
    return float(out[0]), float(out[1])


class Results:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, str, bool | None]] = []

    def add(self, name: str, value: float, target: str, met: bool | None) -> None:
        """``met`` None: shown for scale, not a target."""
        self.rows.append((name, value, target, met))
        if met is not None:
            print(f"  RESULT {name}: {'MET' if met else 'NOT MET'} ({value:.3f}, target {target})")


def fresh_batches(count: int, size: int, seed: int) -> list[list[dict]]:
    """``count`` batches of ``size`` entry bodies from another generated session: items,
    responses and configs (none names another entry), without id or parent, so each
    is appended onto the head wherever it lands."""
    need = count * size
    n = need + need // 2 + 50
    while True:
        _, entries, _ = generate(n, seed)
        bodies = []
        for e in entries:
            if e.type in FRESH_TYPES:
                d = dict(e.data)
                d.pop("id", None)
                d.pop("parent", None)
                bodies.append(d)
        if len(bodies) >= need:
            return [bodies[i * size : (i + 1) * size] for i in range(count)]
        n *= 2


def append_batch(sess: Session, batch: list[dict]) -> float:
    t0 = time.perf_counter()
    for body in batch:
        sess.append(body)
    return time.perf_counter() - t0


def check_push(r: exchange.ExchangeResult, *, entries: int, complete: bool, what: str) -> None:
    problems = []
    if r.outcome != "fast-forward":
        problems.append(f"outcome {r.outcome!r} ({r.why})")
    if r.entries != entries:
        problems.append(f"{r.entries} entries admitted, not {entries}")
    if r.complete != complete:
        problems.append("the whole closure was named" if r.complete else "only the delta was named")
    if complete and not r.created:
        problems.append("the remote did not create the session")
    if not complete and not (entries <= r.objects <= 2 * entries):
        problems.append(f"{r.objects} objects sent for {entries} entries")
    if problems:
        raise BenchError(f"{what}: " + "; ".join(problems) + (f" (notes: {r.notes})" if r.notes else ""))


def _profile(title: str, fn, top: int) -> None:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    print(f"\n--- profile: {title} (cProfile adds overhead), top {top} by tottime")
    pstats.Stats(prof, stream=sys.stdout).strip_dirs().sort_stats("tottime").print_stats(top)
    print(f"--- same, top {top} by cumtime")
    pstats.Stats(prof, stream=sys.stdout).strip_dirs().sort_stats("cumtime").print_stats(top)


# ---------------------------------------------------------------------------
# The two sides of the incremental push: a local record session and its remote


class Side:
    """A local store holding the session as its record, open for appends, and a remote
    reached through one LocalTransport kept across pushes (a recorder's flow)."""

    def __init__(self, tmp: str, name: str, data: bytes):
        self.name = name
        self.entries = data.count(b"\n") - 1
        self.file = os.path.join(tmp, f"{name}.jsonl")
        with open(self.file, "wb") as f:
            f.write(data)
        self.local = os.path.join(tmp, f"{name}-local")
        self.remote = os.path.join(tmp, f"{name}-remote")
        Store.init(self.local, sync="never").close()
        Store.init(self.remote).close()
        self.store: Store | None = None
        self.sess: Session | None = None
        self.transport: LocalTransport | None = None
        self.import_s = self.open_s = self.push_s = 0.0

    def import_(self) -> None:
        """Import the file as this store's record (timed: it is the baseline of [1])."""
        gc.collect()
        t0 = time.perf_counter()
        with Store(self.local) as st:
            s = st.import_file(self.file, record=True)
            held = len(s)
        self.import_s = time.perf_counter() - t0
        if held != self.entries:
            raise BenchError(f"{self.name}: the import holds {held} entries, not {self.entries}")

    def open(self) -> None:
        t0 = time.perf_counter()
        self.store = Store(self.local, sync="never")
        self.sess = self.store.session(SESSION_ID)
        self.open_s = time.perf_counter() - t0
        if self.sess.mark != "record":
            raise BenchError(f"{self.name}: the imported session is a {self.sess.mark}, not the record")

    def push_full(self) -> exchange.ExchangeResult:
        assert self.store is not None
        gc.collect()
        t0 = time.perf_counter()
        self.transport = LocalTransport(self.remote)
        r = exchange.push(self.store, self.transport, SESSION_ID, session=self.sess)
        self.push_s = time.perf_counter() - t0
        check_push(r, entries=self.entries, complete=True, what=f"{self.name}: full push")
        return r

    def push_increment(self, batch: list[dict]) -> tuple[float, float, float, exchange.ExchangeResult]:
        """Append the batch (untimed), then time the sender's commit and the push.
        Returns (append s, commit s, push s, result)."""
        assert self.store is not None and self.sess is not None
        app_s = append_batch(self.sess, batch)
        gc.collect()
        t0 = time.perf_counter()
        self.sess.commit()
        t1 = time.perf_counter()
        r = exchange.push(self.store, self.transport, SESSION_ID, session=self.sess)
        t2 = time.perf_counter()
        check_push(r, entries=len(batch), complete=False, what=f"{self.name}: incremental push")
        if r.head_after != self.sess.head:
            raise BenchError(f"{self.name}: the remote head is {r.head_after}, not the pushed {self.sess.head}")
        return app_s, t1 - t0, t2 - t1, r

    def close(self) -> None:
        if self.sess is not None:
            self.sess.close()
            self.sess = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def cold_push(self, batch: list[dict]) -> tuple[float, exchange.ExchangeResult]:
        """As ``agentsession push ID REMOTE`` does it: append and close first (untimed),
        then, timed, a new Store, the session opened here and at the remote, the push."""
        with Store(self.local, sync="never") as st:
            s = st.session(SESSION_ID)
            append_batch(s, batch)
            s.close()
        gc.collect()
        t0 = time.perf_counter()
        with Store(self.local) as st:
            r = exchange.push(st, self.remote, SESSION_ID)
        dt = time.perf_counter() - t0
        check_push(r, entries=len(batch), complete=False, what=f"{self.name}: cold incremental push")
        return dt, r


# ---------------------------------------------------------------------------
# [1] full push vs import


def bench_full(tmp: str, big: Side, data: bytes, repeat: int, res: Results, profile: int | None) -> None:
    n = big.entries
    print(f"\n[1] full push of the {n:,}-entry session ({len(data) / 1e6:.1f} MB) to an empty store vs "
          f"Store.import_file into an empty store")
    imports, pushes = [big.import_s], [big.push_s]
    print(f"    run 1: import {big.import_s:7.2f} s ({_rate(n, big.import_s):>8,.0f} entries/s); "
          f"push {big.push_s:7.2f} s ({_rate(n, big.push_s):>8,.0f} entries/s); "
          f"(the sender's session opened in {big.open_s:.2f} s, untimed)")
    for i in range(1, repeat):
        imp_dir, rem_dir = os.path.join(tmp, f"full-import-{i}"), os.path.join(tmp, f"full-remote-{i}")
        Store.init(imp_dir).close()
        Store.init(rem_dir).close()
        gc.collect()
        t0 = time.perf_counter()
        with Store(imp_dir) as st:
            st.import_file(big.file)
        imports.append(time.perf_counter() - t0)
        shutil.rmtree(imp_dir, ignore_errors=True)
        gc.collect()
        t0 = time.perf_counter()
        with LocalTransport(rem_dir) as tr:
            r = exchange.push(big.store, tr, SESSION_ID, session=big.sess)
        pushes.append(time.perf_counter() - t0)
        check_push(r, entries=n, complete=True, what=f"full push, run {i + 1}")
        shutil.rmtree(rem_dir, ignore_errors=True)
        print(f"    run {i + 1}: import {imports[-1]:7.2f} s ({_rate(n, imports[-1]):>8,.0f} entries/s); "
              f"push {pushes[-1]:7.2f} s ({_rate(n, pushes[-1]):>8,.0f} entries/s)")
    imp_rate, push_rate = _rate(n, min(imports)), _rate(n, min(pushes))
    ratio = push_rate / imp_rate
    print(f"    import    Store.import_file, best of {repeat}         : {min(imports):7.2f} s  {imp_rate:>9,.0f} entries/s")
    print(f"    push      exchange.push to an empty store, best of {repeat}: {min(pushes):7.2f} s  {push_rate:>9,.0f} entries/s")
    incl = _rate(n, min(pushes) + big.open_s)
    print(f"    (for scale: the push with the sender's open included, {incl:,.0f} entries/s, {incl / imp_rate:.3f} of import)")
    print(f"    ratio     push / import : {ratio:7.3f}   (target >= {TARGET_FULL:.2f})")
    met = ratio >= TARGET_FULL
    res.add("full push vs import (entries/s)", ratio, f">= {TARGET_FULL:.2f}", met)

    if profile or not met:
        rem_dir = os.path.join(tmp, "full-remote-profile")
        Store.init(rem_dir).close()

        def run() -> None:
            with LocalTransport(rem_dir) as tr:
                exchange.push(big.store, tr, SESSION_ID, session=big.sess)

        _profile(f"full push of {n:,} entries to an empty store", run, profile or 30)
        shutil.rmtree(rem_dir, ignore_errors=True)


# ---------------------------------------------------------------------------
# [4] full fetch over HTTP vs from a path


def _serve(store_dir: str) -> tuple[subprocess.Popen[bytes], str]:
    """``agentsession serve`` of ``store_dir`` on a free loopback port: (process, URL)."""
    proc = subprocess.Popen([sys.executable, "-m", "agentsession_cas", "--store", store_dir, "serve", "--listen",
                             "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("listening on "):
        proc.kill()
        raise BenchError(f"the server did not start: {line!r}")
    return proc, line.split()[-1]


def bench_http_fetch(tmp: str, big: Side, repeat: int, res: Results) -> None:
    with Store(big.remote, readonly=True) as st:
        n = len(st.read(SESSION_ID))  # (the pushes of [2] and [3] made it longer)
    print(f"\n[4] full fetch of the {n:,}-entry session into an empty store: over HTTP (agentsession serve on "
          "loopback, its own process) vs from the store's path")
    try:
        from agentsession_cas.exchange.http_client import HttpTransport
    except ImportError as exc:
        print(f"    skipped: the server extra is not installed ({exc})")
        return
    proc, url = _serve(big.remote)
    try:
        times: dict[str, list[float]] = {"path": [], "http": []}
        for i in range(repeat):
            for how in ("path", "http"):
                dst = os.path.join(tmp, f"fetch-{how}-{i}")
                Store.init(dst).close()
                gc.collect()
                t0 = time.perf_counter()
                with Store(dst) as st:
                    if how == "http":
                        with HttpTransport(url) as tr:
                            r = exchange.fetch(st, tr, SESSION_ID)
                    else:
                        r = exchange.fetch(st, big.remote, SESSION_ID)
                times[how].append(time.perf_counter() - t0)
                if r.entries != n:
                    raise BenchError(f"the fetch {how} admitted {r.entries} entries, not {n}")
                shutil.rmtree(dst, ignore_errors=True)
                print(f"    run {i + 1}: {how:<4} {times[how][-1]:7.2f} s ({_rate(n, times[how][-1]):>8,.0f} entries/s)")
        for how, src in (("path", big.remote), ("http", url)):
            cpu, peak = measured("fetch", src, os.path.join(tmp, f"fetch-{how}-measured"))
            print(f"    peak      the fetch {how} in a fresh process: {peak:.0f} MB, CPU {cpu:.2f} s"
                  + (" (the remote's reads in it too)" if how == "path" else ""))
            res.add(f"full fetch {how}: peak resident set, fresh process (MB)", peak, "for scale", None)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    ratio = min(times["http"]) / min(times["path"])
    print(f"    ratio     HTTP / path : {ratio:7.3f}   (target <= {TARGET_HTTP_FETCH})")
    res.add("full fetch over HTTP / from a path (time)", ratio, f"<= {TARGET_HTTP_FETCH}", ratio <= TARGET_HTTP_FETCH)


# ---------------------------------------------------------------------------
# [2] incremental push, big remote session vs small


def bench_incremental(big: Side, small: Side, batches: list[list[dict]], reps: int, res: Results,
                      profile: int | None) -> None:
    batch = len(batches[0])
    print(f"\n[2] incremental push of {batch} new entries: remote session of {big.entries:,} entries vs "
          f"{small.entries:,}; {reps} repetitions after one warm-up, big and small interleaved")
    print("    timed: the sender's Session.commit of the appended entries, then exchange.push(store, transport, id, "
          "session=open session), one LocalTransport kept across pushes; the appends are not timed")
    times: dict[str, list[tuple[float, float, float]]] = {"big": [], "small": []}
    sides = {"big": big, "small": small}
    objects = bytes_ = 0
    for i, b in enumerate(batches[: reps + 1]):
        order = ("big", "small") if i % 2 == 0 else ("small", "big")
        for name in order:
            app_s, commit_s, push_s, r = sides[name].push_increment(b)
            if i > 0:  # the first is a warm-up
                times[name].append((app_s, commit_s, push_s))
            objects, bytes_ = r.objects, r.bytes
    print(f"    each push sent {objects} objects, {bytes_ / 1e3:,.0f} kB (the last; the sizes are the same for both)")
    medians = {}
    for name in ("big", "small"):
        ts = times[name]
        total = [c + p for _, c, p in ts]
        medians[name] = statistics.median(total)
        print(f"    {name:<5} ({sides[name].entries:>7,} entries there): commit+push median {_ms(medians[name])}, "
              f"best {_ms(min(total))}, worst {_ms(max(total))}; of which commit median "
              f"{_ms(statistics.median(c for _, c, _ in ts))}, push median {_ms(statistics.median(p for *_, p in ts))}; "
              f"(appends, untimed, median {_ms(statistics.median(a for a, _, _ in ts))})")
    best_ratio = min(c + p for _, c, p in times["big"]) / min(c + p for _, c, p in times["small"])
    ratio = medians["big"] / medians["small"]
    print(f"    ratio     big / small, medians : {ratio:7.3f}   (best / best {best_ratio:.3f}; target <= {TARGET_INCREMENTAL})")
    met = ratio <= TARGET_INCREMENTAL
    res.add(f"incremental push of {batch}: big/small session", ratio, f"<= {TARGET_INCREMENTAL}", met)
    if profile or not met:
        extra = batches[reps + 1]
        for side in (big, small):
            assert side.sess is not None
            append_batch(side.sess, extra)  # not profiled

            def run(side: Side = side) -> None:
                side.sess.commit()
                exchange.push(side.store, side.transport, SESSION_ID, session=side.sess)

            _profile(f"incremental push of {batch} entries onto the {side.entries:,}-entry remote session "
                     "(commit + push)", run, profile or 30)


def bench_cold(big: Side, small: Side, batches: list[list[dict]], res: Results) -> None:
    reps = len(batches)
    batch = len(batches[0])
    print(f"\n[3] for scale, not a target: the same {batch}-entry push as the command makes it, {reps} times each "
          "(timed: a new Store, the session opened here and at the remote, the push; the appends and close before it "
          "are not)")
    med = {}
    for side in (big, small):
        ts = [side.cold_push(b)[0] for b in batches]
        med[side.name] = statistics.median(ts)
        print(f"    {side.name:<5} ({side.entries:>7,} entries and the pushed ones there): median {_ms(med[side.name])}, best {_ms(min(ts))}")
    ratio = med["big"] / med["small"]
    print(f"    ratio     big / small, medians : {ratio:7.3f}   (opening a session reads its log, here and there)")
    for side in (big, small):
        opens = []
        for where in (side.local, side.remote):
            ts = []
            for _ in range(3):
                gc.collect()
                t0 = time.perf_counter()
                with Store(where) as st:
                    st.session(SESSION_ID).close()
                ts.append(time.perf_counter() - t0)
            opens.append(min(ts))
        print(f"    {side.name:<5}: of which Store(path).session(id) + close, best of 3: here {_ms(opens[0])}, "
              f"at the remote {_ms(opens[1])}")
    res.add(f"cold push of {batch} (command's way): big/small", ratio, "none, for scale", None)


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--entries", type=int, default=None,
                      help=f"entries of the big session (default {DEFAULT_ENTRIES:,})")
    size.add_argument("--quick", action="store_true",
                      help=f"{QUICK_ENTRIES:,} entries, {QUICK_REPS} repetitions, full push best of {QUICK_FULL_REPEAT}")
    ap.add_argument("--small", type=int, default=DEFAULT_SMALL,
                    help=f"entries of the small session (default {DEFAULT_SMALL:,})")
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"entries per incremental push (default {DEFAULT_BATCH})")
    ap.add_argument("--reps", type=int, default=None,
                    help=f"timed incremental pushes per side, after one warm-up (default {DEFAULT_REPS}, {QUICK_REPS} with --quick)")
    ap.add_argument("--cold-reps", type=int, default=DEFAULT_COLD_REPS,
                    help=f"cold pushes per side, for scale (default {DEFAULT_COLD_REPS}; 0 skips them)")
    ap.add_argument("--full-repeat", type=int, default=None,
                    help=f"import and full push runs, best reported (default {DEFAULT_FULL_REPEAT}, "
                         f"{QUICK_FULL_REPEAT} with --quick)")
    ap.add_argument("--seed", type=int, default=20260917, help="generator seed")
    ap.add_argument("--profile", type=int, nargs="?", const=30, metavar="N",
                    help="cProfile the pushes and print the top N functions (done anyway for a missed target)")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    args = ap.parse_args(argv)
    q = args.quick
    count = args.entries if args.entries is not None else (QUICK_ENTRIES if q else DEFAULT_ENTRIES)
    reps = args.reps if args.reps is not None else (QUICK_REPS if q else DEFAULT_REPS)
    full_repeat = args.full_repeat if args.full_repeat is not None else (QUICK_FULL_REPEAT if q else DEFAULT_FULL_REPEAT)
    if args.small < 1 or args.batch < 1 or reps < 1 or full_repeat < 1 or args.cold_reps < 0:
        ap.error("--small, --batch, --reps and --full-repeat must be positive, --cold-reps not negative")
    if count <= args.small:
        ap.error(f"--entries ({count:,}) must be more than --small ({args.small:,})")

    print(f"bench_exchange: agentsession-cas {agentsession_cas.__version__}, Python {platform.python_version()} "
          f"({platform.python_implementation()}), {platform.machine()}, {os.cpu_count()} CPUs")
    base = ROOT / ".bench-tmp"
    base.mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-exchange-", dir=base)
    same_fs = os.stat(tmp).st_dev == os.stat(ROOT).st_dev
    print(f"temp dir: {tmp} ({'same filesystem as the repository' if same_fs else 'WARNING: not the repository filesystem'})")
    t_start = time.perf_counter()
    res = Results()
    big = small = None
    try:
        t0 = time.perf_counter()
        data, entries, _ = generate(count, args.seed)
        header_line = data[: data.index(b"\n") + 1]
        small_data = header_line + b"".join(e.canonical_line() for e in entries[: args.small])
        del entries  # a smaller heap for the collector while timing
        n_batches = reps + 2  # warm-up, reps, one for a profile
        batches = fresh_batches(n_batches + args.cold_reps, args.batch, args.seed + 1)
        cold_batches, batches = batches[n_batches:], batches[:n_batches]
        print(f"session: {count:,} entries, {len(data) / 1e6:.1f} MB (the small one: its first {args.small:,}, "
              f"{len(small_data) / 1e6:.1f} MB); {len(batches) + len(cold_batches)} batches of {args.batch} fresh entries "
              f"(seed {args.seed + 1}); generated in {time.perf_counter() - t0:.1f} s (seed {args.seed})")
        for label, d, n in (("big", data, count), ("small", small_data, args.small)):
            sf = read_session_bytes(d, source=f"<{label}>")
            if sf.all_problems() or len(sf.entries) != n:
                print(f"INVALID: the generated {label} session does not verify clean "
                      f"({len(sf.all_problems())} problems, {len(sf.entries)} entries)")
                return 1
            del sf
        appended = args.batch * (reps + 2)
        if appended >= CHECKPOINT_ENTRIES:
            print(f"note: {appended:,} appends on each side pass the sender's checkpoint (every {CHECKPOINT_ENTRIES:,}) "
                  f"{appended // CHECKPOINT_ENTRIES} time(s): in that repetition a background checkpoint runs beside "
                  "the push, on both sides alike (the median is what is compared)")

        big, small = Side(tmp, "big", data), Side(tmp, "small", small_data)
        print("\nsetting up: import each session as this store's record, open it, push it whole once")
        for side in (big, small):
            side.import_()
            side.open()
            side.push_full()
            print(f"    {side.name:<5}: {side.entries:>7,} entries imported in {side.import_s:6.2f} s, opened in "
                  f"{side.open_s:5.2f} s, pushed whole in {side.push_s:6.2f} s")
        # The pushed session must read back at the remote as the file it came from.
        out = Store(big.remote, readonly=True).export(SESSION_ID)
        if out != data:
            print("ERROR: the remote's export of the pushed session differs from the session's file")
            return 1
        print("    the remote's export of the big session is byte-identical to its file")

        # [1] before [2]: its extra runs push the sender's session as imported.
        bench_full(tmp, big, data, full_repeat, res, args.profile)
        bench_incremental(big, small, batches, reps, res, args.profile)
        big.close()
        small.close()
        if args.cold_reps:
            bench_cold(big, small, cold_batches, res)
        bench_http_fetch(tmp, big, full_repeat, res)
        # What the remotes hold at the end: every entry pushed, head where the sender's is.
        for side in (big, small):
            local = Store(side.local, readonly=True).read(SESSION_ID)
            remote = Store(side.remote, readonly=True).read(SESSION_ID)
            if len(remote) != len(local) or remote.head != local.head:
                print(f"ERROR: {side.name}: the remote holds {len(remote)} entries at {remote.head}, "
                      f"the sender {len(local)} at {local.head}")
                return 1
        print(f"\nend: each remote holds as many entries as its sender ({len(local):,} for the last) at the same head")

        print(f"\nSUMMARY ({time.perf_counter() - t_start:.0f} s; big session {count:,} entries, small {args.small:,}, "
              f"batches of {args.batch}, {reps} repetitions)")
        for name, value, target, met in res.rows:
            tag = "INFO   " if met is None else ("MET    " if met else "NOT MET")
            print(f"  {tag}  {name:<50} {value:8.3f}  (target {target})")
        targets = [m for *_, m in res.rows if m is not None]
        print(f"  {sum(targets)} of {len(targets)} targets met")
        return 0
    except BenchError as exc:
        print(f"ERROR: {exc}")
        return 1
    finally:
        for side in (big, small):
            if side is not None:
                try:
                    side.close()
                except Exception as exc:  # cleanup must not hide the result
                    print(f"warning: closing {side.name}: {exc}")
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                base.rmdir()
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
