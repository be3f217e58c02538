#!/usr/bin/env python3
"""The CPU one lazy append costs, in instructions (issue 10).

Runs N lazy appends (sync policy ``never``, one commit at the end) of the generated
session's entries (``bench_verify.generate``) into a fresh store, through the public
API: ``Store.init``, ``Store.create``, ``Session.append``, ``Session.commit``,
``Store.close``. Wall time on a shared machine says little; instructions say what the
code asks of the CPU. With ``--callgrind`` the script runs itself under
``valgrind --tool=callgrind`` twice, with N appends and with none (the same start-up,
generation and store set-up), and prints the difference: the instructions of the N
appends and their commit, and per append. Without it, it runs once and prints the CPU
seconds of the appends (``resource.getrusage``).

With ``--account`` it runs, in one process and on the appending thread's CPU clock,
verify and the append side by side over the same N entries: verify as ``bench_store``
divides by (``read_session_bytes``: parse, line rules, tree rules), verify with every
rule (``verify_bytes``: the record and context rules too), the append's two rule
kernels alone over the parsed entries (``check_line`` as an append calls it; the
session checker's trial, ``add`` and commit), then the appends with each of those and
the log write timed inside the run, the collector's share, and the commit and close.

Run: ``.venv/bin/python tests/bench/cpu_lazy_append.py [--appends N] [--callgrind | --account]``
(N defaults to 2,000; a callgrind run of 2,000 takes a few minutes).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from agentsession_cas import Header  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402
from bench_verify import generate  # noqa: E402

DEFAULT_APPENDS = 2_000
SEED = 20260917


def appends(n: int, count: int) -> float:
    """Generate ``count`` entries, append the first ``n`` lazily to a fresh store; the CPU
    seconds of the appends and the commit."""
    _, entries, _ = generate(max(count, 1), SEED)
    tmp = tempfile.mkdtemp(prefix="cpu-lazy-append-")
    try:
        store = Store.init(os.path.join(tmp, "store"), sync="never")
        session = store.create(Header.new("cpu-lazy-append", created_at="2026-09-17T12:00:00Z"))
        append = session.append
        gc.collect()
        t0 = resource.getrusage(resource.RUSAGE_SELF)
        for e in entries[:n]:
            append(e)
        session.commit()
        t1 = resource.getrusage(resource.RUSAGE_SELF)
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return (t1.ru_utime + t1.ru_stime) - (t0.ru_utime + t0.ru_stime)


def _fresh_store(tmp: str) -> Any:
    store = Store.init(os.path.join(tmp, "store"), sync="never")
    return store, store.create(Header.new("cpu-lazy-append", created_at="2026-09-17T12:00:00Z"))


def account(n: int) -> list[tuple[str, float]]:
    """Microseconds an entry of each step, on this thread's CPU clock (see the module's
    doc): verify's passes over the bytes, the append's rule kernels over parsed entries,
    then appends with their pieces timed in the run. Each pass that feeds on parsed
    entries gets a fresh generation: an append keeps on an entry what its check made."""
    from agentsession_cas import read_session_bytes
    from agentsession_cas.format import rules
    from agentsession_cas.format.reader import verify_bytes
    from agentsession_cas.store import session as session_mod

    clock = time.thread_time_ns
    out: list[tuple[str, float]] = []

    def timed(label: str, run: Callable[[], object]) -> None:
        gc.collect()
        t0 = clock()
        run()
        out.append((label, (clock() - t0) / 1e3 / n))

    data = generate(n, SEED)[0]
    timed("verify as bench_store divides by (read_session_bytes)", lambda: read_session_bytes(data, source="<account>"))
    timed("verify with every rule (verify_bytes)", lambda: verify_bytes(data, source="<account>"))
    data = b""
    header = Header.new("cpu-lazy-append", created_at="2026-09-17T12:00:00Z")
    _, entries, _ = generate(n, SEED)

    def line_kernel() -> None:
        for e in entries:  # as Session._hash calls it for an entry the format core made
            built, _ = rules.check_line(e.data, careful=e.careful, keep_objects=True, require_id=False, into=e)
            if built is not None:
                built.objects = None

    def rule_kernel() -> None:
        checker = rules.SessionChecker(header)
        for e in entries:
            trial = checker.begin()
            checker.add(e, prefix=False)
            checker.commit(trial)

    with rules.gc_paused():  # (as verify runs)
        timed("  the append's line check alone (check_line, objects kept)", line_kernel)
        timed("  the append's trial, tree, record and context rules alone", rule_kernel)
    del entries

    # The appends, each piece timed where it runs (a wrapper costs some 0.3 us a call,
    # counted in the session's rest).
    _, entries, _ = generate(n, SEED)
    spent: dict[str, int] = {}

    def wrap(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        spent[label] = 0

        def timed_call(*a: Any, **k: Any) -> Any:
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                spent[label] += clock() - t0
        return timed_call

    in_gc = [0, 0]

    def collector(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            in_gc[1] = clock()
        else:
            in_gc[0] += clock() - in_gc[1]

    saved = (rules.SessionChecker.add, rules.SessionChecker.begin, rules.SessionChecker.commit, list(session_mod._CHECK_LINE))
    tmp = tempfile.mkdtemp(prefix="cpu-lazy-append-")
    try:
        rules.SessionChecker.add = wrap("rules", rules.SessionChecker.add)  # type: ignore[method-assign]
        rules.SessionChecker.begin = wrap("trial", rules.SessionChecker.begin)  # type: ignore[method-assign]
        rules.SessionChecker.commit = wrap("trial", rules.SessionChecker.commit)  # type: ignore[method-assign]
        spent["trial"] = 0
        session_mod._CHECK_LINE[:] = [wrap("line", rules.check_line)]
        store, session = _fresh_store(tmp)
        session.log.write = wrap("log", session.log.write)
        append = session.append
        gc.collect()
        gc.callbacks.append(collector)
        t0 = clock()
        for e in entries:
            append(e)
        total = clock() - t0
        gc.callbacks.remove(collector)
        t1 = clock()
        session.commit()
        store.close()
        close = clock() - t1
    finally:
        rules.SessionChecker.add, rules.SessionChecker.begin, rules.SessionChecker.commit = saved[:3]  # type: ignore[method-assign]
        session_mod._CHECK_LINE[:] = saved[3]
        shutil.rmtree(tmp, ignore_errors=True)
    parts = {k: v / 1e3 / n for k, v in spent.items()}
    out.append(("a lazy append, in all (pieces timed)", total / 1e3 / n))
    out.append(("  its line check (check_line)", parts["line"]))
    out.append(("  its tree, record and context rules (SessionChecker.add)", parts["rules"]))
    out.append(("  its trial (begin and commit)", parts["trial"]))
    out.append(("  its log write (SessionLog.write)", parts["log"]))
    out.append(("  the session's own steps and the wrappers (the rest)", total / 1e3 / n - sum(parts.values())))
    out.append(("  (the collector, counted in whichever of these it interrupted)", in_gc[0] / 1e3 / n))
    out.append(("the commit and close, an append's share", close / 1e3 / n))
    return out


#: The runs write and read their modules' bytecode, as an installed command does: with
#: PYTHONDONTWRITEBYTECODE set every run would compile what it imports (see warm_up).
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def warm_up(count: int) -> None:
    """One run with one append, outside valgrind: the bytecode of every module the counted
    runs import is then written, so neither of them compiles any (a module the first
    append or the close imports, as ``store/rulestate.py``, included: compiled in the
    counted run of N appends alone, it added some 30,000 instructions an append)."""
    subprocess.run([sys.executable, __file__, "--appends", "1", "--generate", str(max(count, 1))],
                   check=True, stdout=subprocess.DEVNULL, env=_ENV)


def instructions(n: int, count: int) -> int:
    """Instructions (callgrind's Ir) of a whole run of this script with ``n`` appends."""
    with tempfile.TemporaryDirectory(prefix="cpu-lazy-append-cg-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, __file__, "--appends", str(n), "--generate", str(count)],
            capture_output=True, text=True, env=_ENV,
        )
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"the callgrind run of {n} appends failed")
        m = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
        if m is None:
            raise SystemExit("callgrind printed no instruction count")
        return int(m.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--appends", type=int, default=DEFAULT_APPENDS, help=f"lazy appends (default {DEFAULT_APPENDS:,})")
    ap.add_argument("--generate", type=int, default=None, help="entries generated (default: the appends)")
    ap.add_argument("--callgrind", action="store_true", help="count instructions under valgrind (with N and with 0 appends)")
    ap.add_argument("--account", action="store_true", help="verify and the append side by side, piece by piece (CPU)")
    args = ap.parse_args(argv)
    if args.appends < 0:
        ap.error("--appends must not be negative")
    if args.account and args.callgrind:
        ap.error("--account and --callgrind are separate runs")
    count = args.generate if args.generate is not None else args.appends
    if args.account:
        if args.appends < 1:
            ap.error("--account needs appends")
        print(f"{args.appends:,} entries, microseconds of this thread's CPU an entry:")
        for label, us in account(args.appends):
            print(f"  {us:7.2f}  {label}")
        return 0
    if not args.callgrind:
        cpu = appends(args.appends, count)
        print(f"{args.appends:,} lazy appends and their commit: CPU {cpu:.3f} s "
              f"({1e6 * cpu / max(args.appends, 1):,.1f} us each)")
        return 0
    if shutil.which("valgrind") is None:
        ap.error("--callgrind needs valgrind on the PATH")
    warm_up(count)
    full = instructions(args.appends, count)
    none = instructions(0, count)
    diff = full - none
    print(f"instructions (callgrind Ir): {full:,} with {args.appends:,} appends, {none:,} with none")
    print(f"{args.appends:,} lazy appends and their commit: {diff:,} instructions "
          f"({diff / 1e6:,.0f}M; {diff / max(args.appends, 1):,.0f} per append)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
