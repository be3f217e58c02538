#!/usr/bin/env python3
"""Benchmark: the command's start-up, against the interpreter's own.

Timed, alternately, each the best of ``--repeat`` runs: ``python -c pass`` (the
baseline), and the installed ``agentsession`` with ``--version``, ``--help``, and
``head``, ``list`` and ``append`` (one small entry each run) on a one-session store
made in a temp directory. Then the Python import time of each command
(``python -X importtime``: every module's import, summed over the top-level ones, the
least of ``--repeat`` runs), the interpreter's own start-up included, and how many
dataclasses each creates (the standard decorator's class processing counted in one run:
each costs start-up, its methods compiled).

With ``--callgrind`` (valgrind installed), also each command's instruction count
(``valgrind --tool=callgrind``, ``PYTHONHASHSEED=0``): one run each, and unlike the
times it does not move with the machine's load, so a change of a few per cent shows.

Targets: ``--version`` wall time at most 3x ``python -c pass``; the import time of
``--version``, ``--help``, ``head``, ``list`` and ``append`` under 100 ms each. Each
printed with ``MET`` or ``NOT MET``; the exit status is 0 either way, 2 on bad arguments.

Run: ``.venv/bin/python tests/bench/bench_startup.py [--quick] [--repeat R] [--callgrind]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 3.0
TARGET_IMPORT_MS = 100.0
BIN = Path(sys.executable).parent
ENTRY = b'{"type":"config","model":"m"}'


def wall(argv: list[str], repeat: int, env: dict[str, str], stdin: bytes | None) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env, input=stdin)
        best = min(best, time.perf_counter() - t)
    return best


def import_ms(argv: list[str], repeat: int, env: dict[str, str], stdin: bytes | None) -> tuple[float, int]:
    """The least, over ``repeat`` runs, of the import time ``-X importtime`` reports (the
    top-level imports' cumulative times summed), and how many modules were imported."""
    best, modules = float("inf"), 0
    for _ in range(repeat):
        r = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, input=stdin,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
        total = count = 0
        for line in r.stderr.decode().splitlines():
            if not line.startswith("import time:") or "cumulative" in line:
                continue
            _, cumulative, name = line[len("import time:"):].split("|")
            count += 1
            if name.startswith(" ") and not name.startswith("  "):  # a top-level import
                total += int(cumulative)
        if total / 1000 < best:
            best, modules = total / 1000, count
    return best, modules


#: Run a script (argv[1], its arguments after it) counting the dataclasses it creates.
_COUNT_DATACLASSES = (
    "import atexit, dataclasses, runpy, sys\n"
    "made = []\n"
    "standard = dataclasses._process_class\n"
    "def counted(cls, *args):\n"
    "    made.append(cls)\n"
    "    return standard(cls, *args)\n"
    "dataclasses._process_class = counted\n"
    "atexit.register(lambda: print(f'dataclasses: {len(made)}', file=sys.stderr))\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def dataclasses_made(argv: list[str], env: dict[str, str], stdin: bytes | None) -> int:
    """How many dataclasses a command creates (one run; 0 for a plain ``python``)."""
    if argv[0] == sys.executable:
        return 0
    r = subprocess.run([sys.executable, "-c", _COUNT_DATACLASSES, *argv], env=env, input=stdin,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    found = re.search(rb"dataclasses: (\d+)", r.stderr)
    if found is None:
        raise RuntimeError("the dataclass count was not reported")
    return int(found.group(1))


def instructions(argv: list[str], env: dict[str, str], stdin: bytes | None) -> int:
    """The instructions the process ran (callgrind's ``Collected``), one run."""
    r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
                       env=dict(env, PYTHONHASHSEED="0"), input=stdin, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, check=True)
    found = re.search(rb"Collected : (\d+)", r.stderr)
    if found is None:
        raise RuntimeError("callgrind reported no instruction count")
    return int(found.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--callgrind", action="store_true", help="also each command's instruction count (valgrind)")
    args = ap.parse_args()
    if args.callgrind and shutil.which("valgrind") is None:
        ap.error("--callgrind needs valgrind on PATH")
    repeat = args.repeat or (5 if args.quick else 20)
    if repeat < 1:
        ap.error("--repeat must be at least 1")
    cmd = str(BIN / "agentsession")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, AGENTSESSION_STORE=os.path.join(tmp, "store"))
        subprocess.run([cmd, "init"], check=True, stdout=subprocess.DEVNULL, env=env)
        sid = subprocess.run([cmd, "create", "--id", "bench-startup"], check=True, capture_output=True, text=True, env=env).stdout.strip()
        subprocess.run([cmd, "append", sid], input=ENTRY, check=True, stdout=subprocess.DEVNULL, env=env)
        runs: dict[str, tuple[list[str], bytes | None]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], None),
            "agentsession --version": ([cmd, "--version"], None),
            "agentsession --help": ([cmd, "--help"], None),
            "agentsession head ID": ([cmd, "head", sid], None),
            "agentsession list": ([cmd, "list"], None),
            "agentsession append ID": ([cmd, "append", sid], ENTRY),
        }
        best = {name: float("inf") for name in runs}
        for _ in range(2):  # alternate, so a slow moment of the machine hits all alike
            for name, (argv, stdin) in runs.items():
                best[name] = min(best[name], wall(argv, max(1, repeat // 2), env, stdin))
        imports = {name: import_ms(argv[1:] if argv[0] == sys.executable else argv, repeat, env, stdin)
                   for name, (argv, stdin) in runs.items()}
        made = {name: dataclasses_made(argv, env, stdin) for name, (argv, stdin) in runs.items()}
        counts = {name: instructions(argv if argv[0] == sys.executable else [sys.executable, *argv], env, stdin)
                  for name, (argv, stdin) in runs.items()} if args.callgrind else {}
    base = best["python -c pass"]
    print(f"bench_startup: Python {sys.version.split()[0]}, best of {repeat} runs each")
    print(f"  {'':<24}  {'wall':>8}   {'vs python':>9}   {'import time':>11}  modules  dataclasses"
          + ("   instructions" if counts else ""))
    met_all = True
    for name, t in best.items():
        ms, modules = imports[name]
        line = f"  {name:<24}: {t * 1000:8.1f} ms {t / base:6.2f}x   {ms:8.1f} ms  {modules:5d}  {made[name]:11d}"
        if counts:
            line += f"   {counts[name] / 1e6:8.1f} M"
        if name != "python -c pass":
            ok = ms < TARGET_IMPORT_MS
            met_all &= ok
            line += f"   import {'MET' if ok else 'NOT MET'} (< {TARGET_IMPORT_MS:.0f} ms)"
        print(line)
    ratio = best["agentsession --version"] / base
    met = ratio <= TARGET
    print(f"RESULT: target {'MET' if met else 'NOT MET'}: --version is {ratio:.2f}x python -c pass (target <= {TARGET:.1f}x)")
    print(f"RESULT: target {'MET' if met_all else 'NOT MET'}: import time of --version, --help, head, list, append "
          f"each < {TARGET_IMPORT_MS:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
