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

Run: ``.venv/bin/python tests/bench/cpu_lazy_append.py [--appends N] [--callgrind]``
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_verify import generate  # noqa: E402

from agentsession_cas import Header  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402

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
    args = ap.parse_args(argv)
    if args.appends < 0:
        ap.error("--appends must not be negative")
    count = args.generate if args.generate is not None else args.appends
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
