"""One worker of the race between maintenance and work (issue 16); not a test module.

``python race_worker.py ROLE STORE_URL NAME STOP_FILE MIN [EXTRA]``

Works on the store at STORE_URL (a directory or any URL ``open_store`` takes) until
STOP_FILE exists and it has done at least MIN operations, then exits 0. After each
operation the store acknowledged it prints one line, flushed at once (the test reads
what was acknowledged from them):

- ``append``: creates session NAME and appends to it: ``append NAME <entry id>``; now
  and then closes and opens it again (a writing close checkpoints and may pack).
- ``push``: in its own store EXTRA (a directory), creates sessions ``NAME-<n>``, appends
  to them and pushes each into STORE_URL, twice (a create, then an update):
  ``push <session> <head>`` once the push returned with the head moved.
- ``fork``: forks the session EXTRA (an appender's, held by its writer) at its head
  into ``NAME-<n>`` and appends one entry there: ``fork <session> <head>``.
- ``delete``: creates ``NAME-<n>``, appends, closes, deletes it: ``deleted <session>``;
  every third it keeps instead: ``kept <session> <head>``.

An operation that fails prints ``error <role> <what>`` and the worker goes on: the test
counts every such line as a failure.
"""

from __future__ import annotations

import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from agentsession_cas import Header, make_entry  # noqa: E402
from agentsession_cas.exchange.operations import push  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402
from agentsession_cas.store.url import open_store  # noqa: E402

LIMIT = 300.0  # seconds: a worker never outlives a broken test by more


def item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def append_to(session, text: str) -> str:  # type: ignore[no-untyped-def]
    return session.append(make_entry("item", session.head, item=item(text)).data).id


def work(role: str, url: str, name: str, stop, least: int, extra: str, say=say) -> None:  # type: ignore[no-untyped-def]
    """Do ``role``'s operations on the store at ``url`` until ``stop()`` and at least
    ``least`` of them, telling ``say`` each one acknowledged (race.py, in a process or,
    for a store of this process such as memory:, a thread)."""
    import time

    t0 = time.monotonic()
    done = 0
    store = open_store(url)
    source = Store.init(extra) if role == "push" else None
    session = store.create(Header.new(name)) if role == "append" else None
    n = 0
    while (not stop() or done < least) and time.monotonic() - t0 < LIMIT:
        n += 1
        try:
            if role == "append":
                assert session is not None
                say(f"append {name} {append_to(session, f'{name} turn {n}')}")
                if n % 15 == 0:
                    session.close()
                    session = store.open(name)
            elif role == "push":
                assert source is not None
                sid = f"{name}-{n}"
                s = source.create(Header.new(sid))
                for i in range(3):
                    append_to(s, f"{sid} turn {i}")
                for step in ("create", "update"):
                    if step == "update":
                        append_to(s, f"{sid} more")
                    r = push(source, url, sid, session=s)
                    if r.head_after != s.head:
                        raise RuntimeError(f"push {sid} ({step}) left the head at {r.head_after}: {r.outcome} {r.why}")
                    say(f"push {sid} {s.head}")
                s.close()
            elif role == "fork":
                sid = f"{name}-{n}"
                f = store.fork(extra, session_id=sid)
                head = append_to(f, f"{sid} own")
                f.close()
                say(f"fork {sid} {head}")
            elif role == "delete":
                sid = f"{name}-{n}"
                s = store.create(Header.new(sid))
                head = append_to(s, f"{sid} a")
                head = append_to(s, f"{sid} b")
                s.close()
                if n % 3 == 0:
                    say(f"kept {sid} {head}")
                else:
                    store.delete(sid)
                    say(f"deleted {sid}")
            else:
                raise SystemExit(f"unknown role {role}")
            done += 1
        except Exception as exc:  # every failure is reported, the test fails on it
            say(f"error {role} {type(exc).__name__}: {' '.join(str(exc).split())[:300]} "
                f"| {' '.join(traceback.format_exc().splitlines()[-3:])[:300]}")
            time.sleep(0.05)
    if session is not None:
        session.close()
    if source is not None:
        source.close()
    store.close()


def main() -> None:
    role, url, name, stop, least = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    extra = sys.argv[6] if len(sys.argv) > 6 else ""
    work(role, url, name, lambda: os.path.exists(stop), least, extra)


if __name__ == "__main__":
    main()
