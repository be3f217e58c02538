#!/usr/bin/env python3
"""Benchmark: fsck's objects verified per second against `git fsck --full` on the same objects,
and what fsck costs in a fresh process (peak RSS, CPU).

The 100,000-entry coding-agent session of ``bench_verify.py``
(:func:`bench_verify.generate`) is imported into a new store
(``Store.import_file``: one pack of its envelopes and contents, and the log);
``--sessions S`` imports S such sessions of ``--entries`` each instead (each
generated from its own seed, under its own id: 20 x 5,000 is a store where the
logs' records, not one log's, are what fsck must not hold all at once).
Every object of that store is then written, as a git blob, into a new git
repository with ``git fast-import``, with one commit whose tree names each
blob (``<2 hex>/<62 hex>`` of its hash), so git's walk has a root and
prints no dangling objects; fast-import writes it as one pack, as a
repository that has been packed holds its objects.

Timed, alternately, each the best of ``--repeat`` runs on a warm cache:

* **fsck**: ``agentsession_cas.maintenance.fsck.fsck(store)`` in this process: every pack
  and index checksum, every object decompressed once and hashed against its
  name, the session's log (checksums, the rules, the indexes) and the
  retention counts. Objects verified = ``counts["objects"]``.
* **git**: ``git fsck --full --no-progress``: every object of the pack
  inflated and hashed, the trees and the commit parsed, connectivity.
  Objects = what ``git count-objects -v`` counts (blobs, trees, the commit).

Then, ``--children`` times, fsck runs in a fresh process of its own
(``python -c``: import, ``fsck(root)``, exit): its peak RSS (``VmHWM``, as
the process reports it at its end), CPU (user + system, ``os.wait4``) and
wall time, beside a process
that only imports the same modules (what the interpreter and the imports hold
before fsck reads anything); medians. ``--against DIR`` (a checkout of another
release, such as ``git worktree add`` or ``git archive`` of it) runs that
release's fsck in the same way, alternately with this one's, on the same store,
and prints both and the change.

It prints both rates, the ratio **fsck / git** and the target: **at least
git's rate** (ratio >= 1.0), with ``RESULT: target MET`` or ``NOT MET``. The
exit status is 0 either way; 1 when fsck finds a problem in the generated
store (the numbers would then mean nothing) or a git command fails; 2 on bad
arguments. The store and the repository live in a temp directory under
``<repo>/.bench-tmp``, removed at the end unless ``--keep``.

Run: ``.venv/bin/python tests/bench/bench_fsck.py [--quick | --entries N] [--sessions S] [--repeat R]
[--children C] [--against DIR]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
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
from agentsession_cas.backends.files.objects import SPACES, FileObjects  # noqa: E402
from agentsession_cas.maintenance.fsck import fsck  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402
from bench_verify import SESSION_ID, generate  # noqa: E402

DEFAULT_ENTRIES, QUICK_ENTRIES = 100_000, 10_000
TARGET = 1.0  # fsck's objects/s over git's, at least


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


#: A fresh process's fsck of the store ``argv[1]`` (``argv[2]``: ``import`` only imports), with
#: ``argv[3]`` (a tree, or empty) first on the path and the editable install's finder out of
#: the way, so another release's tree is the one imported.
_CHILD = """
import sys
tree = sys.argv[3]
if tree:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "") + type(f).__module__]
    sys.path.insert(0, tree)
import agentsession_cas
assert tree in agentsession_cas.__file__, agentsession_cas.__file__
from agentsession_cas.maintenance.fsck import fsck
ok = fsck(sys.argv[1]).ok if sys.argv[2] == "fsck" else True
with open("/proc/self/status") as f:
    print(next(line.split()[1] for line in f if line.startswith("VmHWM:")))
sys.exit(0 if ok else 1)
"""


def child(root: str, what: str, tree: str) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MB) of one fresh process: ``what`` is
    ``fsck`` or ``import``; ``tree`` the release's source tree. The peak is the process's
    own (``VmHWM``, Linux): ``ru_maxrss`` of a child counts the parent's pages it was
    forked with, the benchmark's hundreds of MB."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, root, what, tree], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    if proc.returncode != 0:
        raise RuntimeError(f"the {what} process ({tree}) exited {proc.returncode}")
    return wall, ru.ru_utime + ru.ru_stime, int(out) / 1024


def session_bytes(count: int, seed: int, index: int, sessions: int) -> bytes:
    """A generated session; with more than one, each under an id of its own (the header's)."""
    data, _, _ = generate(count, seed + index)
    if sessions > 1:
        head, sep, rest = data.partition(b"\n")
        data = head.replace(SESSION_ID.encode(), f"{SESSION_ID[:-4]}{index:04x}".encode()) + sep + rest
    return data


def _git(*args: str, cwd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, **kw)


def store_objects(root: str):
    """(name, bytes) of every object of the store, each once: packs read block by block,
    then loose files."""
    objs = FileObjects(root)
    seen: set[bytes] = set()
    try:
        objs.packs.refresh(force=True)
        for pack in objs.packs.packs:
            by_block: dict[int, list[tuple[bytes, int, int]]] = {}
            for raw, (b, o, length, _sp) in pack.records():
                by_block.setdefault(b, []).append((raw, o, length))
            for b in sorted(by_block):
                block = pack.read_block(b)
                for raw, o, length in by_block[b]:
                    if raw not in seen:
                        seen.add(raw)
                        yield raw.hex(), block.object(o, length)
        for space in SPACES:
            for name in objs.loose_names(space):
                raw = bytes.fromhex(name[7:])
                if raw not in seen:
                    seen.add(raw)
                    yield name[7:], objs.get(space, name)
    finally:
        objs.close()


def build_git(store_root: str, repo: str) -> int:
    """A repository holding every object of the store as a blob, and a commit naming
    them all; returns how many objects git holds."""
    if _git("init", "-q", repo, cwd=os.path.dirname(repo)).returncode != 0:
        raise RuntimeError("git init failed")
    proc = subprocess.Popen(["git", "fast-import", "--quiet"], cwd=repo, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    w = proc.stdin
    paths: list[tuple[int, str]] = []
    for mark, (hexname, data) in enumerate(store_objects(store_root), start=1):
        w.write(b"blob\nmark :%d\ndata %d\n" % (mark, len(data)))
        w.write(data)
        w.write(b"\n")
        paths.append((mark, f"{hexname[:2]}/{hexname[2:]}"))
    w.write(b"commit refs/heads/main\ncommitter bench <bench@example.com> 0 +0000\ndata 14\nstore objects\n")
    for mark, path in paths:
        w.write(b"M 100644 :%d %s\n" % (mark, path.encode()))
    w.write(b"\n")
    w.close()
    if proc.wait() != 0:
        raise RuntimeError("git fast-import failed")
    _git("symbolic-ref", "HEAD", "refs/heads/main", cwd=repo, check=True)
    counts = dict(
        line.split(": ", 1) for line in _git("count-objects", "-v", cwd=repo, text=True, check=True).stdout.splitlines()
    )
    return int(counts["count"]) + int(counts["in-pack"])


def fresh(root: str, runs: int, against: str | None) -> None:
    """fsck in fresh processes: peak RSS, CPU and wall, medians of ``runs``, beside a process
    that only imports; with ``against``, that tree's alternately with this one's."""
    trees = {"this": str(ROOT)}
    if against is not None:
        trees = {"against": against, **trees}
    got: dict[str, dict[str, list[tuple[float, float, float]]]] = {t: {"fsck": [], "import": []} for t in trees}
    loads = []
    for _ in range(runs):
        for name, tree in trees.items():
            for what in ("import", "fsck"):
                got[name][what].append(child(root, what, tree))
        loads.append(os.getloadavg()[0])
    print(f"\nfsck in a fresh process, median of {runs} (load average {min(loads):.1f} to {max(loads):.1f} "
          f"on {os.cpu_count()} CPUs):")
    med: dict[str, list[float]] = {}
    for name, tree in trees.items():
        f = [statistics.median(x) for x in zip(*got[name]["fsck"])]
        i = [statistics.median(x) for x in zip(*got[name]["import"])]
        med[name] = f
        label = "this tree" if name == "this" else f"--against {tree}"
        print(f"  {label}: peak RSS {f[2]:6.1f} MB ({i[2]:.1f} MB of it the interpreter and imports), "
              f"CPU {f[1]:6.2f} s, wall {f[0]:6.2f} s")
    if against is not None:
        a, t = med["against"], med["this"]
        print(f"  change: peak RSS {t[2] - a[2]:+.1f} MB, CPU {t[1] - a[1]:+.2f} s, wall {t[0] - a[0]:+.2f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--entries", type=int, default=None, help=f"entries to generate (default {DEFAULT_ENTRIES:,})")
    size.add_argument("--quick", action="store_true", help=f"{QUICK_ENTRIES:,} entries")
    ap.add_argument("--sessions", type=int, default=1, help="sessions of --entries each in the store (default 1)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each; the best is reported (default 3)")
    ap.add_argument("--children", type=int, default=5,
                    help="fsck runs in fresh processes for peak RSS and CPU; medians (default 5, 0: none)")
    ap.add_argument("--against", metavar="DIR", default=None,
                    help="a source tree of another release (holding agentsession_cas/): its fsck in the same children, alternately")
    ap.add_argument("--seed", type=int, default=20260917, help="generator seed")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory (store and repository)")
    args = ap.parse_args(argv)
    count = args.entries if args.entries is not None else (QUICK_ENTRIES if args.quick else DEFAULT_ENTRIES)
    if count < 1 or args.repeat < 1 or args.sessions < 1 or args.children < 0:
        ap.error("--entries, --sessions and --repeat must be positive, --children not negative")
    against = os.path.abspath(args.against) if args.against else None
    if against is not None and not os.path.isfile(os.path.join(against, "agentsession_cas", "__init__.py")):
        ap.error(f"--against {args.against}: no agentsession_cas/ there")
    if shutil.which("git") is None:
        print("bench_fsck: git is not installed; nothing to compare against")
        return 1
    git_version = _git("--version", cwd=str(ROOT), text=True).stdout.strip()
    print(f"bench_fsck: agentsession-cas {agentsession_cas.__version__}, Python {platform.python_version()}, "
          f"{git_version}, {platform.machine()}, {os.cpu_count()} CPUs")
    base = ROOT / ".bench-tmp"
    base.mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-fsck-", dir=base)
    try:
        root = os.path.join(tmp, "store")
        session_file = os.path.join(tmp, "session.jsonl")
        generated = imported = 0.0
        size = 0
        with Store.init(root) as st:
            for i in range(args.sessions):
                t0 = time.perf_counter()
                data = session_bytes(count, args.seed, i, args.sessions)
                size += len(data)
                with open(session_file, "wb") as f:
                    f.write(data)
                del data
                generated += time.perf_counter() - t0
                t0 = time.perf_counter()
                st.import_file(session_file)
                imported += time.perf_counter() - t0
        print(f"store: {args.sessions} session(s) of {count:,} entries, {size / 1e6:.1f} MB, generated in "
              f"{generated:.1f}s, imported in {imported:.1f}s")
        repo = os.path.join(tmp, "git")
        t0 = time.perf_counter()
        git_objects = build_git(root, repo)
        print(f"git: {git_objects:,} objects written by fast-import in {time.perf_counter() - t0:.1f}s")

        report = fsck(root)  # warms the cache, and must find nothing
        if not report.ok or report.warnings:
            print("INVALID: fsck finds problems in the generated store:")
            for p in report.problems[:10]:
                print(f"  {p.severity}: {p}")
            return 1
        ours = report.counts["objects"]
        print(f"fsck: {ours:,} objects ({report.counts['packs']} pack(s), {report.counts['blocks']:,} blocks, "
              f"{report.counts['bytes'] / 1e6:.1f} MB hashed), {report.counts['log_records']:,} log records")
        git_cmd = ["git", "fsck", "--full", "--no-progress"]
        warm = subprocess.run(git_cmd, cwd=repo, capture_output=True, text=True)
        if warm.returncode != 0:
            print(f"git fsck failed ({warm.returncode}): {warm.stderr.strip()[:500]}")
            return 1

        best_ours = best_git = cpu_ours = cpu_git = float("inf")
        for _ in range(args.repeat):
            gc.collect()
            c0, t0 = _cpu(resource.RUSAGE_SELF), time.perf_counter()
            fsck(root)
            best_ours = min(best_ours, time.perf_counter() - t0)
            cpu_ours = min(cpu_ours, _cpu(resource.RUSAGE_SELF) - c0)
            c0, t0 = _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run(git_cmd, cwd=repo, capture_output=True, check=True)
            best_git = min(best_git, time.perf_counter() - t0)
            cpu_git = min(cpu_git, _cpu(resource.RUSAGE_CHILDREN) - c0)
        rate_ours, rate_git = ours / best_ours, git_objects / best_git
        ratio = rate_ours / rate_git
        print(f"\nbest of {args.repeat}:")
        print(f"  fsck             {best_ours:8.3f} s  {rate_ours:12,.0f} objects/s")
        print(f"  git fsck --full  {best_git:8.3f} s  {rate_git:12,.0f} objects/s")
        print(f"  ratio fsck / git {ratio:8.2f}  (target >= {TARGET:.1f}: at least git's rate)")
        print(f"  CPU time (user + system), best: fsck {cpu_ours:.3f} s, git {cpu_git:.3f} s "
              f"(ratio {cpu_git / cpu_ours:.2f}; less sensitive to other load; load average now "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
        print(f"RESULT: target {'MET' if ratio >= TARGET else 'NOT MET'}")
        if args.children:
            fresh(root, args.children, against)
        return 0
    finally:
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
