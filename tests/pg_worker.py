"""A subprocess the PostgreSQL concurrency test runs (tests/test_postgresql_stress.py); not a test module.

Each mode opens the store at URL, prints ``READY``, waits for a line on stdin (so every
worker starts at once), does its work and prints what succeeded, one line per event,
each written at once:

``append URL SESSION N``          create SESSION and append N durable entries: ``ACK <id>``, then ``DONE``
``head URL SESSION TARGETS``  race head compare-and-swaps: for each of TARGETS
    (comma-separated entry ids), read the head from a snapshot, take the session
    (retrying while another holds it) and move the head from what was read to the
    target: ``CAS <expected> <new>`` on success, ``MOVED`` when the head had moved
``ref URL NAME TARGETS``     the same for a named ref and the sessions TARGETS
``sweep URL ROUNDS``         sweep with no grace, ROUNDS times: ``SWEPT <dropped>``
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from agentsession_cas import Header  # noqa: E402
from agentsession_cas.errors import HeadMovedError, RefMovedError, SessionLockedError  # noqa: E402
from agentsession_cas.store.refs import Refs  # noqa: E402
from agentsession_cas.store.url import open_store  # noqa: E402


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def start() -> None:
    say("READY")
    sys.stdin.readline()


def run_append(url: str, sid: str, n: int) -> None:
    store = open_store(url, sync="always")
    start()
    s = store.create(Header.new(sid))
    for i in range(n):
        r = s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"{sid} says {i} " + "x" * (i * 97 % 3000)}})
        say(f"ACK {r.id}")
    store.close()
    say("DONE")


def run_head(url: str, sid: str, targets: list[str]) -> None:
    store = open_store(url, sync="always")
    start()
    for target in targets:
        snap = store.read(sid)
        expected = snap.head
        snap.close()
        while True:
            try:
                s = store.session(sid)
                break
            except SessionLockedError:
                continue  # another racer holds it: take it once it lets go
        try:
            s.set_head(target, expected=expected)
            say(f"CAS {expected} {target}")
        except HeadMovedError:
            say("MOVED")
        finally:
            s.close()
    store.close()
    say("DONE")


def run_ref(url: str, name: str, targets: list[str]) -> None:
    store = open_store(url)
    refs = Refs(store)
    start()
    for target in targets:
        current = refs.get(name)
        expected = current.session if current is not None else None
        try:
            refs.update(name, target, expected=expected)
            say(f"CAS {expected} {target}")
        except RefMovedError:
            say("MOVED")
    store.close()
    say("DONE")


def run_sweep(url: str, rounds: int) -> None:
    store = open_store(url)
    start()
    for _ in range(rounds):
        res = store.sweep(grace=0, force=True)  # racing the writers on purpose
        say(f"SWEPT {res.repack.dropped}")
    store.close()
    say("DONE")


def main(argv: list[str]) -> int:
    mode, rest = argv[0], argv[1:]
    if mode == "append":
        run_append(rest[0], rest[1], int(rest[2]))
    elif mode == "head":
        run_head(rest[0], rest[1], rest[2].split(","))
    elif mode == "ref":
        run_ref(rest[0], rest[1], rest[2].split(","))
    elif mode == "sweep":
        run_sweep(rest[0], int(rest[1]))
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
