"""A fork's rules start from its origin's kept state, not from its prefix (issue 13, forks).

* A fork at the head of a session whose rules' state the backend keeps (files,
  memory) starts from that state: its first append, and an append after it is
  opened again, read none of the prefix's entries (a store whose ``entry`` raises
  for them still appends), and both judge as a fork whose rules were built from
  its prefix does, refusals included.
* Where the origin's state does not stand for the fork's prefix (a fork below the
  head, an origin with a branch) or there is none, the rules are built from the
  prefix, as before.
* The fork's state is its own: the origin deleted, the fork opens and appends.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agentsession_cas import Header, read_session_bytes
from agentsession_cas.errors import AppendRefusedError
from agentsession_cas.format.entry import Entry, make_entry
from agentsession_cas.format.rules import SessionChecker
from agentsession_cas.store import Store
from agentsession_cas.store.rulestate import RestoredChecker
from agentsession_cas.store.url import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
from bench_verify import generate

BACKENDS = ("files", "memory")
_COUNTER = iter(range(10**9))
MESSAGE = {"type": "item", "item": {"type": "message", "role": "user", "content": "on the fork"}}


def _target(backend: str, tmp_path: Path) -> str:
    return str(tmp_path / f"s{next(_COUNTER)}") if backend == "files" else f"memory:fork-{next(_COUNTER)}"


def _recorded(target: str, count: int = 160, seed: int = 11) -> tuple[list[Entry], list[Entry]]:
    """A session ``rec`` holding the first half of a generated session, appended and
    closed as a recorder leaves it; returns (those entries, the rest)."""
    sf = read_session_bytes(generate(count, seed)[0])
    entries = list(sf.entries)
    half = len(entries) // 2
    with open_store(target, create=True, sync="never") as st:
        s = st.create(Header(dict(sf.header.data, id="rec")))
        for e in entries[:half]:
            s.append(e)
    return entries[:half], entries[half:]


def _no_prefix_reads(st: Store, prefix: set[str]) -> None:
    """Make ``st`` raise on any read of a prefix entry, whole or its envelope alone (the
    walk that lists a prefix reads the envelopes)."""
    for name in ("entry", "envelope"):
        real = getattr(st, name)

        def guarded(entry_id: str, real: Any = real) -> Any:
            assert entry_id not in prefix, f"prefix entry {entry_id} read"
            return real(entry_id)

        setattr(st, name, guarded)


def _outcome(s: Any, entry: Entry | dict) -> Any:
    try:
        r = s.append(entry)
    except AppendRefusedError as exc:
        return ("refused", exc.rule, exc.code)
    return {k: v for k, v in r.as_dict().items() if k != "durable"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fork_at_the_head_reads_none_of_its_prefix_to_append(backend, tmp_path):
    target = _target(backend, tmp_path)
    first, _ = _recorded(target)
    prefix = {e.id for e in first}
    with open_store(target, sync="never") as st:
        f = st.fork("rec", session_id="f")
        _no_prefix_reads(st, prefix)
        assert type(f.rules()) is RestoredChecker
        assert f.append(MESSAGE).outcome == "continued"
        assert type(f.rules()) is RestoredChecker  # judged from the state, not rebuilt
    with open_store(target, sync="never") as st:
        _no_prefix_reads(st, prefix)
        f = st.session("f")
        assert type(f.rules()) is RestoredChecker
        looked: list[str] = []
        real = st.objects.exists
        st.objects.exists = lambda space, name: looked.append(name) or real(space, name)  # type: ignore[method-assign]
        for text in ("again", "and again"):
            assert f.append(dict(MESSAGE, item=dict(MESSAGE["item"], content=text))).outcome == "continued"
        assert f._prefix is None  # its prefix never listed
        assert looked == []  # each hangs below the base: on no prefix, without a look at the objects


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fork_started_from_its_origin_judges_as_one_built_from_its_prefix(backend, tmp_path):
    """The origin's later entries (calls, outputs, runs), then entries breaking rules,
    appended to a fork started from the origin's state and to one whose rules are
    built from its prefix: the same outcomes, the same refusals."""
    target = _target(backend, tmp_path)
    first, rest = _recorded(target, count=240, seed=12)
    head = first[-1].id
    ts = "2026-01-01T00:00:00Z"
    bad = [
        make_entry("item", head, ts=ts, item={"type": "function_call_output", "call_id": "never-made", "output": "x"}),
        make_entry("label", head, ts=ts, target=first[0].id, label="leaf"),  # may not hold the head
        make_entry("item", first[len(first) // 2].id, ts=ts, item={"type": "message", "role": "user", "content": "up"}),
    ]
    bad += [first[3], first[-1]]  # an entry of the prefix, and the base, appended again
    with open_store(target, sync="never") as st:
        seeded = st.fork("rec", session_id="seeded")
        built = st.fork("rec", session_id="built")
        built._rule_state = None  # as a backend keeping no state leaves it
        assert type(seeded.rules()) is RestoredChecker and type(built.rules()) is SessionChecker
        for e in [*bad, *rest[:40]]:
            assert _outcome(seeded, e) == _outcome(built, e), e.id
        assert [*seeded.log_order] == [*built.log_order] and seeded.head == built.head
    with open_store(target, sync="never") as st:  # opened again: the prefix not read
        seeded, built = st.session("seeded"), st.session("built")
        built._rule_state = None
        for e in [*bad, *rest[40:]]:
            assert _outcome(seeded, e) == _outcome(built, e), e.id
        assert [*seeded.log_order] == [*built.log_order] and seeded.head == built.head


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fork_off_the_origins_path_builds_its_rules_from_its_prefix(backend, tmp_path):
    """Below the head, or at the head of an origin with a branch, the origin's state holds
    entries off the fork's path: the fork's rules are built from its prefix."""
    target = _target(backend, tmp_path)
    first, _ = _recorded(target)
    with open_store(target, sync="never") as st:
        below = st.fork("rec", first[-5].id, session_id="below")
        assert type(below.rules()) is SessionChecker
        assert below.append(MESSAGE).outcome == "continued"
        rec = st.session("rec")
        rec.append(make_entry("item", first[-3].id, ts="2026-01-01T00:00:00Z",
                              item={"type": "message", "role": "user", "content": "a branch"}))
        rec.append(MESSAGE)  # on the head: the log holds a branch behind it
        rec.close()
    with open_store(target, sync="never") as st:
        branched = st.fork("rec", session_id="branched")
        assert type(branched.rules()) is SessionChecker
        assert branched.append(MESSAGE).outcome == "continued"


@pytest.mark.parametrize("backend", BACKENDS)
def test_forks_of_forks_start_from_their_origins_state_and_outlive_it(backend, tmp_path):
    target = _target(backend, tmp_path)
    first, _ = _recorded(target)
    with open_store(target, sync="never") as st:
        st.fork("rec", session_id="f1").close()  # never appended to: its first state kept
        f2 = st.fork("f1", session_id="f2")
        assert type(f2.rules()) is RestoredChecker
        assert f2.append(MESSAGE).outcome == "continued"
        f2.close()
        st.delete("rec")
        st.delete("f1")
    with open_store(target, sync="never") as st:
        _no_prefix_reads(st, {e.id for e in first})
        f2 = st.session("f2")
        assert type(f2.rules()) is RestoredChecker
        assert f2.append(dict(MESSAGE, item=dict(MESSAGE["item"], content="again"))).outcome == "continued"
        assert len(f2) == 2 and f2._prefix is None  # its prefix never listed


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_session_created_on_a_base_at_its_owners_head_starts_from_the_owners_state(backend, tmp_path):
    """``Store.create`` with a base (the CLI's ``create --base``, the server's create)
    finds the session owning it and starts from its state as ``fork`` does."""
    target = _target(backend, tmp_path)
    first, _ = _recorded(target)
    with open_store(target, sync="never") as st:
        c = st.create(Header.new("made", base=first[-1].id))
        _no_prefix_reads(st, {e.id for e in first})
        assert type(c.rules()) is RestoredChecker
        assert c.append(MESSAGE).outcome == "continued"
        assert c.header.data["parent_session"] == "rec"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fork_of_a_session_open_here_starts_from_its_checker(backend, tmp_path):
    """An origin this store has open, its checker standing at its head after an append
    not yet committed: the fork commits it, starts from that checker's state, and reads
    none of its prefix."""
    target = _target(backend, tmp_path)
    first, _ = _recorded(target)
    with open_store(target, sync="never") as st:
        rec = st.session("rec")
        added = rec.append(MESSAGE, durable=False)
        f = st.fork("rec", session_id="f")
        assert f.base == added.id and rec.is_committed(added.id)
        _no_prefix_reads(st, {*(e.id for e in first), added.id})
        assert type(f.rules()) is RestoredChecker
        assert f.append(MESSAGE).outcome == "continued"
