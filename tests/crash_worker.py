"""A subprocess the crash and lock tests run (tests/test_crash.py); not a test module.

Every line it prints goes out in one ``write`` and is flushed at once, so a
SIGKILL never leaves a line the worker had finished printing unwritten (the
test reads only complete lines). Modes:

``append STORE SESSION POLICY COMMIT_EVERY SEED MAXOPS``
    Open the store with sync policy POLICY, open the session (creating it when
    absent), print ``READY <own> <head|->`` and then append in a loop until
    killed (or MAXOPS operations, then close and print ``CLOSED``). Before each
    operation it prints what it is about to do and after it returns what the
    store acknowledged:

    * ``TRY A <id> <head it predicts after>`` / ``ACK A <id> <durable 0|1> <head|-> <outcome>``
    * ``TRY H <target>`` / ``ACK H <target>`` (a durable head compare-and-swap)
    * ``TRY C`` / ``ACK C`` (an explicit commit, every COMMIT_EVERY appends; 0: never)

    Appends continue from the head, and now and then branch from an older own
    entry, or add a ``leaf`` label that moves the head back to an older entry.
    Bodies are unique (the seed and a counter are in each), and now and then
    large, so a kill can land while an object file is being written.

``hold STORE SESSION``
    Open the session for writing, append one entry lazily (working state, not
    committed), print ``READY <that entry's id>``, wait for a line on stdin, close
    (which commits) and print ``BYE``.

``lazy STORE SESSION N``
    Open the session (creating it when absent) with policy ``never``, append N
    entries lazily, print ``ACK A <id> 0`` for each and exit at once without
    closing or committing: a crash with the working state in the log.

``write STORE SESSION N``
    Create the session (or open it), print ``READY``, wait for a line on stdin,
    append N durable entries, close and print ``DONE <own count>``.
"""

from __future__ import annotations

import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from agentsession_cas import Header, make_entry  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def body(rng: random.Random, tag: str) -> dict:
    r = rng.random()
    if r < 0.04:
        size = rng.randint(50_000, 300_000)
    elif r < 0.2:
        size = rng.randint(1_000, 20_000)
    else:
        size = rng.randint(0, 300)
    text = f"{tag} " + "".join(rng.choice("abcdefghij klmnop") for _ in range(min(size, 64))) * (max(1, size // 64))
    role = rng.choice(["user", "assistant"])
    kind = "input_text" if role == "user" else "output_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def open_or_create(store: Store, session_id: str):
    if session_id in store:
        return store.session(session_id)
    return store.create(Header.new(session_id))


def run_append(path: str, session_id: str, policy: str, commit_every: int, seed: int, maxops: int) -> int:
    rng = random.Random(seed)
    store = Store(path, sync=policy)
    session = open_or_create(store, session_id)
    own = list(session.log_order)
    labels = set(session.leaf_labels)
    head = session.head
    say(f"READY {len(own)} {head or '-'}")
    since_commit = 0
    for n in range(maxops):
        plain = [e for e in own if e not in labels]
        r = rng.random()
        if r < 0.05 and plain and head is not None:
            target = rng.choice(plain)
            say(f"TRY H {target}")
            session.set_head(target, expected=head)
            head = target
            since_commit = 0
            say(f"ACK H {target}")
            continue
        if r < 0.10 and plain and head is not None:
            target = rng.choice(plain)
            e = make_entry("label", head, target=target, label="leaf")
            predicted = target
        else:
            if r < 0.22 and plain:
                parent = rng.choice(plain)
            else:
                parent = head
            e = make_entry("item", parent, item=body(rng, f"{seed}-{n}"))
            predicted = e.id if parent == head else head
        say(f"TRY A {e.id} {predicted or '-'}")
        result = session.append(e.data)
        if result.id != e.id or result.head != predicted:
            say(f"MISMATCH {result.as_dict()}")
            return 3
        own.append(e.id)
        if e.is_leaf_label:
            labels.add(e.id)
        head = result.head
        say(f"ACK A {e.id} {int(result.durable)} {head or '-'} {result.outcome}")
        since_commit += 1
        if commit_every and since_commit >= commit_every:
            say("TRY C")
            session.commit()
            since_commit = 0
            say("ACK C")
    store.close()
    say("CLOSED")
    return 0


def run_hold(path: str, session_id: str) -> int:
    store = Store(path, sync="never")
    session = store.session(session_id)
    e = make_entry("item", session.head, item=body(random.Random(), "held"))
    session.append(e.data)
    say(f"READY {e.id}")
    sys.stdin.readline()
    store.close()
    say("BYE")
    return 0


def run_lazy(path: str, session_id: str, count: int) -> int:
    store = Store(path, sync="never")
    session = open_or_create(store, session_id)
    rng = random.Random(f"lazy-{session_id}-{len(session)}")
    for n in range(count):
        result = session.append(make_entry("item", session.head, item=body(rng, f"lazy-{n}")).data)
        say(f"ACK A {result.id} {int(result.durable)}")
    os._exit(0)


def run_write(path: str, session_id: str, count: int) -> int:
    store = Store(path, sync="always")
    session = open_or_create(store, session_id)
    say("READY")
    sys.stdin.readline()
    rng = random.Random(session_id)
    for n in range(count):
        result = session.append(make_entry("item", session.head, item=body(rng, f"{session_id}-{n}")).data)
        if not result.durable or result.outcome != "continued":
            say(f"MISMATCH {result.as_dict()}")
            return 3
    total = len(session)
    store.close()
    say(f"DONE {total}")
    return 0


def main(argv: list[str]) -> int:
    mode, rest = argv[0], argv[1:]
    if mode == "append":
        path, sid, policy, every, seed, maxops = rest
        return run_append(path, sid, policy, int(every), int(seed), int(maxops))
    if mode == "hold":
        return run_hold(*rest)
    if mode == "lazy":
        path, sid, count = rest
        return run_lazy(path, sid, int(count))
    if mode == "write":
        path, sid, count = rest
        return run_write(path, sid, int(count))
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
