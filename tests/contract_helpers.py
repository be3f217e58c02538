"""What the contract suite (tests/test_contract.py) needs to know of a backend, and nothing more.

A backend joins the suite with one line in :data:`BACKENDS`: a name and how to
spell the URL of a store of it, for ``open_store(url, create=True)`` to make
and ``open_store(url)`` to open again. Every contract test then runs against it,
and every cross-store test (import, exchange) runs against it paired with each
other backend. A backend whose stores the local transport cannot reach by URL
says so (``reachable=False``) and the exchange tests leave it out as a remote.

The rest is helpers that read a store only through its public API (export,
read snapshots, the log's records), so that "nothing changed" means the same
thing for every backend.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import http_store
import pg_server
from agentsession_cas import LEAF_LABEL
from agentsession_cas.errors import AgentSessionError
from agentsession_cas.store import Session, Store
from agentsession_cas.store.state import replay
from agentsession_cas.store.url import open_store

__all__ = [
    "BACKENDS",
    "BackendKind",
    "StoreFactory",
    "fingerprint",
    "unchanged",
    "ts",
    "msg",
    "leaf",
    "committed_in_log",
    "domain_records",
]


@dataclass(frozen=True)
class BackendKind:
    """One backend as the suite sees it: ``url(scratch, tag, name)`` spells the URL of
    the store called ``name`` in a test (``scratch`` is a directory the test owns, for a
    backend that keeps files; ``tag`` is unique to the test, so two tests never share a
    store, and a process-wide backend such as memory: is not reused)."""

    name: str
    url: Callable[[Path, str, str], str]
    #: The local transport reaches a store of this backend by its URL (a push's remote).
    reachable: bool = True
    #: Contract tests that cannot apply to this backend: test name -> why (they are
    #: skipped with that reason, for this backend and any pair it is part of); a name
    #: ending ``[first]`` or ``[second]`` skips a cross-store test only where this
    #: backend is that store of the pair.
    skips: Mapping[str, str] = field(default_factory=dict)
    #: The backends it is paired with in cross-store tests (None: every one).
    pairs_with: tuple[str, ...] | None = None
    #: Called with (scratch, tag) once a test's stores are closed, for a backend whose
    #: stores have a side to let go of (a server's).
    release: Callable[[Path, str], None] | None = None

    def __str__(self) -> str:
        return self.name


#: One line per backend. A later backend (PostgreSQL, an HTTP remote store) is one more line.
BACKENDS: list[BackendKind] = [
    BackendKind("file", lambda scratch, tag, name: str(scratch / f"{tag}-{name}")),
    BackendKind("memory", lambda tmp, tag, name: f"memory:contract-{tag}-{name}"),
    BackendKind("postgresql", lambda scratch, tag, name: pg_server.store_url(f"c_{tag}_{name}")),
    BackendKind("http", http_store.served_url, skips=http_store.CANNOT, release=http_store.release,
                pairs_with=http_store.PAIRS_WITH),
]


@dataclass
class StoreFactory:
    """Stores of one backend for one test. ``factory(name)`` makes a fresh writable
    store; ``factory.reopen(name)`` opens the same store again (another handle: for
    files another ``Store`` on the directory, for memory another handle on the named
    store). Every store made or opened is closed at the end of the test."""

    kind: BackendKind
    scratch: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    opened: list[Store] = field(default_factory=list)
    made: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.kind.name

    def url(self, name: str = "a") -> str:
        return self.kind.url(self.scratch, self.tag, name)

    def __call__(self, name: str = "a", *, sync: str = "always") -> Store:
        assert name not in self.made, f"store {name!r} was made already in this test; reopen it"
        self.made.add(name)
        st = open_store(self.url(name), create=True, sync=sync)
        self.opened.append(st)
        return st

    def reopen(self, name: str = "a", *, readonly: bool = False, sync: str = "always") -> Store:
        assert name in self.made, f"store {name!r} was not made in this test"
        st = open_store(self.url(name), readonly=readonly, sync=sync)
        self.opened.append(st)
        return st

    def close_all(self) -> list[BaseException]:
        errors: list[BaseException] = []
        for st in reversed(self.opened):
            try:
                st.close()
            except (AgentSessionError, OSError) as exc:  # reported by the fixture
                errors.append(exc)
        self.opened.clear()
        if self.kind.release is not None:
            self.kind.release(self.scratch, self.tag)
        return errors


def scratch_root() -> str | None:
    """A directory on a tmpfs for the file backend's stores, or None where there is none.

    A store directory is made with its object fan-out (some 780 directories), and this
    suite makes a few hundred stores: on this project's disks creating and removing
    them is most of the suite's time (0.4 s a store, against 0.04 s on a tmpfs). The
    file backend runs the same code either way (an fsync on a tmpfs returns at once),
    and no contract test depends on what reaches a disk. ``AGENTSESSION_CONTRACT_DISK=1``
    keeps the stores under pytest's ``tmp_path`` instead."""
    if os.environ.get("AGENTSESSION_CONTRACT_DISK"):
        return None
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        return None
    return tempfile.mkdtemp(prefix="agentsession-contract-", dir=shm)


def remove_tree(path: str | Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# -- entries ----------------------------------------------------------------------

_TICK = itertools.count()


def ts() -> str:
    """A fresh, distinct, valid ``ts`` (so two appends of like bodies are two entries)."""
    n = next(_TICK)
    return f"2026-10-05T12:{(n // 60) % 60:02d}:{n % 60:02d}.{n % 1000000:06d}1Z"


def msg(text: str, **kw: Any) -> dict[str, Any]:
    """A user message item, with a fresh ``ts`` unless one is given."""
    d: dict[str, Any] = {"type": "item", "item": {"type": "message", "role": "user", "content": text}, "ts": ts()}
    d.update(kw)
    return d


def leaf(target: str | None, parent: str | None, **kw: Any) -> dict[str, Any]:
    """A ``leaf`` label naming ``target``, hanging from ``parent``."""
    return {"type": "label", "label": LEAF_LABEL, "target": target, "parent": parent, "ts": ts(), **kw}


# -- observing a store through its API ----------------------------------------------


def committed_in_log(session: Session, entry_id: str) -> bool:
    """Whether the session's log, as its backend holds it now, has a commit covering the
    entry (read from the log's records, not from the handle's memory)."""
    return replay(session.records()).is_committed(entry_id)


#: The log records the domain gives a meaning to (RFC 0002 "A log per session"); a
#: backend may keep others of its own (the file backend's ``checkpoint``, saying its
#: objects were written out), which say nothing about the session.
DOMAIN_OPS = frozenset({"create", "append", "head", "mark", "commit", "loss", "repair"})


def domain_records(session: Session) -> list[dict[str, Any]]:
    """The session's log records that the domain replays, as its backend holds them now."""
    return [r for r in session.records() if r.get("op") in DOMAIN_OPS]


def fingerprint(st: Store, *handles: Session) -> dict[str, Any]:
    """What a store says about its sessions, read afresh: per session its projection,
    log order, head, mark and log records (through lock-free snapshots); and what each
    given writing handle believes (head, log order, mark)."""
    out: dict[str, Any] = {"sessions": st.list()}
    for sid in out["sessions"]:
        snap = st.read(sid)
        try:
            out[sid] = (snap.projection(), list(snap.log_order), snap.head, snap.mark, domain_records(snap))
        finally:
            snap.close()
    for h in handles:
        out[f"handle:{h.id}"] = (h.head, list(h.log_order), h.mark, h.state.max_seq)
    return out


@contextmanager
def unchanged(st: Store, *handles: Session) -> Iterator[None]:
    """Assert that what is done inside changes nothing the store or the handles show."""
    before = fingerprint(st, *handles)
    yield
    after = fingerprint(st, *handles)
    assert after == before
