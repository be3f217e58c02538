"""Helpers the store tests share: what a killed writer leaves, objects written by hand,
a lock that must not be waited for, a command started so that SIGINT reaches it, a
store's every byte (to hold a command to changing nothing)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from agentsession_cas import Entry
from agentsession_cas.format.hashing import entry_objects
from agentsession_cas.store import Store


def crash(st: Store) -> None:
    """Let go of a writing store's sessions as a killed process would: no commit, no
    checkpoint (one in flight is let finish, as the process's thread would have or not),
    the lock freed."""
    for s in list(st._open.values()):
        log = s.log
        if log._inflight is not None:
            log._inflight[0].result()
            log._inflight = None
        if log._fd is not None:
            os.close(log._fd)
            log._fd = None
        s._closed = True
        log._closed = True
        if log.lock is not None:
            log.lock.release()
            log.lock = None
        st.objects.unregister(log)
    st._open.clear()


def put_entry(st: Store, e: Entry) -> None:
    """Write an entry's two objects durably, as if some writer had (no log names them)."""
    _, chash, content, env = entry_objects(dict(e.data))
    st.objects.put("contents", chash, content, durable=True)
    st.objects.put("entries", e.id, env, durable=True)


def line_body(line: bytes) -> bytes:
    """A log line's record bytes (and payload), whichever form it has (with a link or not)."""
    from agentsession_cas.backends.files.log import CHECKSUM_HEX

    raw = line.rstrip(b"\n")
    if raw[2 * CHECKSUM_HEX + 1 : 2 * CHECKSUM_HEX + 2] == b" " and raw[CHECKSUM_HEX : CHECKSUM_HEX + 1] == b" ":
        return raw[2 * CHECKSUM_HEX + 2 :]
    return raw[CHECKSUM_HEX + 1 :]


def rechain(data: bytes) -> bytes:
    """A log with every line framed anew as a chain from the first (records kept): what a
    test that edits a line whole must write so only its edit, not the chain, is wrong."""
    from agentsession_cas.backends.files.log import chain

    lines = [ln for ln in data.split(b"\n") if ln]
    return chain(line_body(ln) for ln in lines)[0]


def chained_after(log: bytes, *lines: bytes) -> bytes:
    """``lines`` (each a framed line, any form) framed anew to follow ``log``'s last line."""
    from agentsession_cas.backends.files.log import ZERO_LINK, chain, line_checksum

    last = [ln for ln in log.split(b"\n") if ln]
    prev = line_checksum(last[-1]) if last else ZERO_LINK
    return chain((line_body(ln) for ln in b"".join(lines).split(b"\n") if ln), prev)[0]


def refuse_to_wait(seconds: float) -> None:
    """In place of ``time.sleep`` where a held lock must be refused at once: a lock that
    waits polls with ``time.sleep`` (backends/files/locks.py does), so waiting fails the test however
    fast or slow the machine is (a bound on the time taken can fail on a busy one)."""
    raise AssertionError(f"waited ({seconds} s) where a held lock must be refused at once")


def interruptible(args: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen``, the child taking SIGINT as Ctrl-C even where this process
    ignores it: a shell starts a background job (``make test &``) with SIGINT ignored,
    children inherit that through exec, and a test that stops a command with SIGINT to
    check its Ctrl-C path would wait out its timeout instead. An ignored signal stays
    ignored across exec, a caught one is reset to its default: it is caught here for the
    time of the spawn (tests run on the main thread, which alone may set a handler)."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return subprocess.Popen(args, **kwargs)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **kwargs)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def files(path: Path) -> dict[str, bytes | None]:
    """Every file and directory under path with its bytes (None for a directory)."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), path)] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, path)] = Path(p).read_bytes()
    return out


def count_entry_reads(monkeypatch: Any) -> list[str]:
    """The ids of the entries any store of this process reads from here on (one by one,
    whole or by the envelope alone, or in bulk)."""
    reads: list[str] = []
    one, many, env = Store.entry, Store.entries, Store.envelope

    def envelope(self: Store, entry_id: str):
        reads.append(entry_id)
        return env(self, entry_id)

    def entry(self: Store, entry_id: str):
        reads.append(entry_id)
        return one(self, entry_id)

    def entries(self: Store, entry_ids):
        for e in many(self, entry_ids):
            reads.append(e.id)
            yield e

    monkeypatch.setattr(Store, "entry", entry)
    monkeypatch.setattr(Store, "entries", entries)
    monkeypatch.setattr(Store, "envelope", envelope)
    return reads


def short_of_stack(work: Any) -> list[str]:
    """Run ``work()`` with the cyclic collector running every 20 allocations and, at each
    collection, a callback that needs 100 frames (what a finalizer, or pytest's report of
    the error one raises, needs); the phases at which they were not there. A parse that
    recurses to the interpreter's limit leaves a collection during it none (how a full
    suite under load once stopped in pytest's own traceback, test_torture_backends).
    A parse that refuses first leaves it."""
    short: list[str] = []

    def need(n: int) -> int:
        return 0 if n == 0 else need(n - 1) + 1

    def probe(phase: str, info: dict) -> None:
        try:
            need(100)
        except RecursionError:
            short.append(phase)

    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.callbacks.append(probe)
    gc.set_threshold(20)
    try:
        work()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(probe)
        if not enabled:
            gc.disable()
    return short
