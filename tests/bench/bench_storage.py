#!/usr/bin/env python3
"""Benchmark: what a session's size costs the commands that should not pay for it (issue 11).

Through the installed ``agentsession`` (each figure the best of ``--repeat`` runs of
the command in a subprocess, with the child's peak resident memory), on the
deterministic coding-agent session of ``bench_verify.py``:

* **recorded log**: the session recorded entry by entry into a store (lazy appends,
  as a harness records), then closed: the bytes of its log against the bytes of the
  store's packed objects (target <= 10%: compaction drops the payloads a checkpoint
  made durable);
* **append**: ``agentsession append`` of one entry to that session, against the same
  append to a 1-entry session (target <= 1.3x, peak memory <= 60 MB);
* **append a response**: the same with a ``response`` whose request hash the rules
  check, each run on a fresh copy of the store (same targets; its request context is the
  whole path, which the kept rules' state does not hold: today the whole state is rebuilt);
* **first append after an import**: the same append to the session just imported from
  the file (imported afresh before each run, so no writer's close came between), against
  the first append after importing a 1-entry file (same targets: an import keeps the
  rules' state its verify pass leaves);
* **list**: ``agentsession list`` of a store of 1,000 sessions holding the same number
  of entries in all, against a store of 10 (target <= 1.5x, and under 0.5 s).

Each figure is printed beside its target with ``MET`` or ``NOT MET``; the exit status
is 0 whatever is met, 1 when a command fails, 2 on bad arguments.

Run: ``.venv/bin/python tests/bench/bench_storage.py [--quick | --entries N] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
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
from agentsession_cas import Header, read_session_bytes, request_hash_for  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402
from bench_commands import best, compile_packages  # noqa: E402
from bench_verify import generate  # noqa: E402

DEFAULT_ENTRIES, QUICK_ENTRIES = 100_000, 10_000
TARGET_LOG = 0.10  # log bytes / packed object bytes
TARGET_APPEND = 1.3
TARGET_APPEND_MB = 60
TARGET_LIST = 1.5
TARGET_LIST_S = 0.5
ENTRY = json.dumps({"type": "item", "item": {"type": "message", "role": "user", "content": "one more"}})


def _bytes_under(path: str) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return total


def record(store_dir: str, sid: str, entries: list) -> None:
    """The session appended entry by entry (its tree kept: each entry names its parent)."""
    st = Store.init(store_dir, sync="never")
    header = entries[0]
    s = st.create(Header(dict(header.data, id=sid)))
    for e in entries[1:]:
        s.append(e)
    st.close()


def verdict(met: bool) -> str:
    return "MET" if met else "NOT MET"


def report_append(small_label: str, big_label: str, small: tuple, big: tuple) -> bool:
    """Print an append's figures (``best``'s tuples) beside the append targets; whether a run failed."""
    ratio, mb = big[0] / small[0], big[2] / 1e6
    print(f"{small_label} {small[0] * 1000:8.1f} ms, {big_label} {big[0] * 1000:8.1f} ms = {ratio:5.2f}x "
          f"(target <= {TARGET_APPEND}x: {verdict(ratio <= TARGET_APPEND)}); "
          f"peak {mb:.0f} MB (target <= {TARGET_APPEND_MB} MB: {verdict(mb <= TARGET_APPEND_MB)})")
    return small[1] != 0 or big[1] != 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--entries", type=int, default=None, help=f"entries (default {DEFAULT_ENTRIES:,})")
    size.add_argument("--quick", action="store_true", help=f"{QUICK_ENTRIES:,} entries")
    ap.add_argument("--repeat", type=int, default=None, help="runs of each command (default 3)")
    ap.add_argument("--seed", type=int, default=20260917)
    args = ap.parse_args(argv)
    count = QUICK_ENTRIES if args.quick else (args.entries or DEFAULT_ENTRIES)
    repeat = args.repeat or 3
    if count < 10 or repeat < 1:
        ap.error("--entries must be at least 10 and --repeat at least 1")
    exe = shutil.which("agentsession", path=str(Path(sys.executable).parent))
    if exe is None:
        ap.error("the agentsession command is not installed beside this interpreter")
    print(f"bench_storage: agentsession-cas {agentsession_cas.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {count:,} entries")
    data, _, _ = generate(count, args.seed)
    sf = read_session_bytes(data, source="bench")
    base_dir = ROOT / ".bench-tmp"
    base_dir.mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-storage-", dir=base_dir)
    failed = False
    compile_packages()  # the commands run with their bytecode cached, as an installed command does
    try:
        # -- a recorded session: its log after close against its packed objects
        big = os.path.join(tmp, "big")
        t0 = time.perf_counter()
        record(big, "rec", [sf.header, *sf.entries])  # type: ignore[list-item]
        rec_s = time.perf_counter() - t0
        log_bytes = os.path.getsize(os.path.join(big, "sessions", "rec", "log"))
        packed = _bytes_under(os.path.join(big, "objects"))
        ratio = log_bytes / packed
        print(f"\nrecorded {count:,} entries by append in {rec_s:.1f}s ({count / rec_s:,.0f}/s)")
        print(f"  log after close {log_bytes / 1e6:8.2f} MB / objects {packed / 1e6:8.2f} MB = {ratio:6.1%}  "
              f"(target <= {TARGET_LOG:.0%}: {verdict(ratio <= TARGET_LOG)})")

        # -- append one entry: the big recorded session against a 1-entry one
        small = os.path.join(tmp, "small")
        record(small, "one", [sf.header, sf.entries[0]])  # type: ignore[list-item]

        def append(store: str, sid: str) -> tuple[float, int, int, float]:
            return best(["sh", "-c", f"printf '%s' '{ENTRY}' | {exe} --store {store} append {sid}"], repeat)

        failed |= report_append("\nappend one entry: 1-entry session", f"{count:,}-entry session",
                                append(small, "one"), append(big, "rec"))

        # -- append one response whose request hash is checked: its request context is the
        # whole path to the head, which the kept rules' state does not hold (docs/storage-format.md,
        # "What an append costs"); each run on a fresh copy of the store, so each appends at the
        # same head
        def response_append(store: str, sid: str) -> tuple[float, int, int, float]:
            with Store(store, readonly=True) as st:
                s = st.read(sid)
                by_id = {e.id: e for e in s.projection_entries()}
                path, at = [], s.head
                while at is not None:
                    path.append(by_id[at])
                    at = by_id[at].parent
            body = {"type": "response", "response_id": "bench-response", "model": "m", "status": "completed"}
            body["request_hash"] = request_hash_for(path[::-1], body)
            copy = store + "-copy"

            def fresh() -> None:
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(store, copy)
                os.sync()  # (the copy's pages written back untimed: the append's fsync would wait for them)

            line = json.dumps(body)
            return best(["sh", "-c", f"printf '%s' '{line}' | {exe} --store {copy} append {sid}"], repeat, before=fresh)

        failed |= report_append("append one response (request hash checked): 1-entry session",
                                f"{count:,}-entry session", response_append(small, "one"), response_append(big, "rec"))

        # -- the first append after an import (no writer's close before it): the big file
        # imported afresh before each run, against a 1-entry file so imported
        def first_after_import(name: str, lines: bytes) -> tuple[float, int, int, float]:
            path, store = os.path.join(tmp, f"{name}.jsonl"), os.path.join(tmp, f"imported-{name}")
            with open(path, "wb") as f:
                f.write(lines)

            def imported() -> None:
                shutil.rmtree(store, ignore_errors=True)
                st = Store.init(store, sync="never")
                st.import_file(path, record=True).close()
                st.close()

            sid = str(sf.header.id)
            return best(["sh", "-c", f"printf '%s' '{ENTRY}' | {exe} --store {store} append {sid}"], repeat, before=imported)

        one_entry = b"".join(line + b"\n" for line in data.split(b"\n", 2)[:2])
        failed |= report_append("first append after an import: of 1 entry", f"of {count:,}",
                                first_after_import("one", one_entry), first_after_import("all", data))

        # -- list: 1,000 sessions against 10, the same entries in all
        def store_of(path: str, sessions: int) -> None:
            """``sessions`` sessions of a model, an info title and user messages,
            ``count`` entries in all."""
            st = Store.init(path, sync="never")
            per = max(2, count // sessions)
            for i in range(sessions):
                s = st.create(Header.new(f"s{i:05d}", harness={"name": "bench", "version": "1"}))
                s.append({"type": "config", "model": "m"})
                s.append({"type": "info", "name": f"session {i}"})
                for k in range(per - 2):
                    s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"{i}/{k}"}})
                s.close()
            st.close()

        many, few = os.path.join(tmp, "many"), os.path.join(tmp, "few")
        t0 = time.perf_counter()
        store_of(many, 1000)
        store_of(few, 10)
        print(f"\nbuilt a 1,000-session and a 10-session store in {time.perf_counter() - t0:.1f}s")
        l_many, l_few = best([exe, "--store", many, "list"], repeat), best([exe, "--store", few, "list"], repeat)
        failed |= l_many[1] != 0 or l_few[1] != 0
        lr = l_many[0] / l_few[0]
        print(f"list: 10 sessions {l_few[0] * 1000:8.1f} ms, 1,000 sessions {l_many[0] * 1000:8.1f} ms = {lr:5.2f}x "
              f"(target <= {TARGET_LIST}x: {verdict(lr <= TARGET_LIST)}; under {TARGET_LIST_S}s: "
              f"{verdict(l_many[0] < TARGET_LIST_S)})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
