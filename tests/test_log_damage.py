"""A file session's log damaged or cut below the API, and a log write that fails half-way.

- Committed records lost from the log's end where HEAD does not point into them (an append
  on a branch): the kept ``summary`` and ``rules`` are written only after a commit, so like
  HEAD they may lag the log but never lead it (``store.state.index_damage``). Every reader
  (open, ``verify ID``, ``history``, fsck, sweep) calls it ``log-cut``; repair spends the
  lost numbers, so none is given out again.
- A short write whose roll-back also fails stops the log, as a failed fsync does.
- A read racing a delete says "no such session", not "damaged".
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import agentsession_cas.backends.files.sessions as file_sessions
from agentsession_cas import Header, make_entry
from agentsession_cas.errors import NoSuchSessionError, SessionDamagedError, StoreError, SweepRefusedError
from agentsession_cas.maintenance.check import verify_stored
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.maintenance.repair import repair_session
from agentsession_cas.store import Store

SID = "a"


def item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def branched(root: Path) -> list[str]:
    """Two appends on a line, then a third on a branch from the first (each durable): the
    head stays on the second, so HEAD names nothing the third's records hold."""
    with Store.init(str(root)) as st:
        s = st.create(Header.new(SID))
        a1 = s.append(make_entry("item", s.head, item=item("one")).data, durable=True).id
        a2 = s.append(make_entry("item", s.head, item=item("two")).data, durable=True).id
        r3 = s.append(make_entry("item", a1, item=item("three")).data, durable=True)
        assert (r3.seq, s.head) == (3, a2)
    return [a1, a2, r3.id]


def log_of(root: Path) -> Path:
    return root / "sessions" / SID / "log"


def third_line_at(root: Path) -> tuple[bytes, int]:
    """The log's bytes and where the third append's line begins."""
    data = log_of(root).read_bytes()
    lines = data.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if b'"seq":3' in ln)
    return data, sum(len(ln) for ln in lines[:at])


def test_a_log_cut_after_a_branch_append_is_log_cut_everywhere(tmp_path):
    """The log cut at the line boundary before the branch append (its record and its commit
    lost). Before: open, fsck, verify and sweep all passed, the next append took seq 3
    again, and a sweep deleted the lost entry's objects."""
    root = tmp_path / "s"
    ids = branched(root)
    data, at = third_line_at(root)
    log_of(root).write_bytes(data[:at])
    before = log_of(root).read_bytes()
    with Store(str(root)) as st:
        for opening in (st.read, st.session):
            with pytest.raises(SessionDamagedError, match="sequence number 3") as got:
                opening(SID)
            assert ids[2] in got.value.why and "lost committed records" in got.value.why
        assert [p["code"] for p in verify_stored(st, SID).problems] == ["log-cut"]
        assert [p.code for p in st.history(SID).damage] == ["log-cut"]
        with pytest.raises(SweepRefusedError, match="sequence number 3"):
            st.sweep(grace=0)
    assert log_of(root).read_bytes() == before  # the refused writing open wrote nothing
    assert [(p.code, p.file) for p in fsck(str(root)).errors] == [("log-cut", f"sessions/{SID}/summary")]
    with Store(str(root)) as st:
        assert repair_session(st, SID).repaired
        s = st.session(SID)
        assert list(s.log_order) == ids[:2]
        assert s.append(make_entry("item", s.head, item=item("four")).data).seq == 4  # 3 is never given again
    assert fsck(str(root)).ok


@pytest.mark.parametrize("into", ["its entry id", "its payload"])
def test_zeroed_bytes_over_a_committed_append_are_log_cut(tmp_path, into):
    """The log's last bytes zeroed (a bad block over fsynced bytes) from inside the branch
    append's line: before, they read as a crash's torn tail, fsck was clean, and a writing
    open dropped the committed append with a ``loss`` record over the evidence. Zeroed
    within its entry id the line names no number (the summary's 3 is beyond the log's 2);
    zeroed within its payload the recovery reads its seq 3 back from the torn bytes, and
    the rules' state, naming the entry as the last, is what finds it."""
    root = tmp_path / "s"
    ids = branched(root)
    data, at = third_line_at(root)
    start = at + 40 if into == "its entry id" else data.index(b"\t", at) + 5
    log_of(root).write_bytes(data[:start] + b"\0" * (len(data) - start))
    before = log_of(root).read_bytes()
    with Store(str(root)) as st:
        with pytest.raises(SessionDamagedError, match="lost committed records") as got:
            st.session(SID)
        assert ids[2] in got.value.why
        if into == "its entry id":  # (a snapshot reads no rules' state: the torn seq hides the other)
            with pytest.raises(SessionDamagedError, match="sequence number 3"):
                st.read(SID)
        assert [p["code"] for p in verify_stored(st, SID).problems] == ["log-cut"]
    assert log_of(root).read_bytes() == before
    assert [p.code for p in fsck(str(root)).errors] == ["log-cut"]


def test_a_short_write_not_taken_back_stops_the_log(tmp_path, monkeypatch):
    """The device takes half a write and the roll-back's ftruncate fails: a partial line
    stays. Before, the log kept taking writes after it (acknowledged, durable) and the
    session then refused to open (a checksum mismatch). Now it stops as after a failed
    fsync, and the next open drops the torn line."""
    root = tmp_path / "s"
    with Store.init(str(root)) as st:
        s = st.create(Header.new(SID))
        first = s.append(make_entry("item", s.head, item=item("one")).data, durable=True).id
        fd = s.log._fd
        real_write, real_truncate = os.write, os.ftruncate
        armed = [True]

        def short_write(f: int, data: bytes) -> int:
            if f == fd and armed[0]:
                return real_write(f, bytes(data)[: len(data) // 2])
            return real_write(f, data)

        def failing_truncate(f: int, size: int) -> None:
            if f == fd and armed[0]:
                raise OSError(errno.EIO, "Input/output error")
            real_truncate(f, size)

        monkeypatch.setattr(os, "write", short_write)
        monkeypatch.setattr(os, "ftruncate", failing_truncate)
        with pytest.raises(OSError, match="short write"):
            s.append(make_entry("item", s.head, item=item("two")).data, durable=True)
        armed[0] = False
        assert s.log.stopped and "could not be taken back" in s.log.stopped
        with pytest.raises(StoreError, match="stopped writing"):
            s.append(make_entry("item", s.head, item=item("three")).data, durable=True)
    with Store(str(root)) as st:
        s = st.session(SID)
        assert list(s.log_order) == [first] and "log-tail" in [p.code for p in s.recovered]
        s.append(make_entry("item", s.head, item=item("three")).data, durable=True)
    assert fsck(str(root)).ok


def test_a_read_racing_a_delete_is_no_such_session(tmp_path, monkeypatch):
    """The session deleted (as by another process) between the reader's read of its header
    and of its log: before, SessionDamagedError "its log is missing or empty"."""
    root = tmp_path / "s"
    with Store.init(str(root)) as st:
        s = st.create(Header.new(SID))
        s.append(make_entry("item", None, item=item("x")).data)
    real = file_sessions.read_dense

    def deleting_first(path: str, *a, **k):
        if path.endswith(f"/sessions/{SID}/log") and os.path.exists(path):
            with Store(str(root)) as other:
                other.delete(SID)
        return real(path, *a, **k)

    monkeypatch.setattr(file_sessions, "read_dense", deleting_first)
    with Store(str(root), readonly=True) as st, pytest.raises(NoSuchSessionError):
        st.read(SID)


def test_a_log_lost_beside_its_header_is_still_damage(tmp_path):
    root = tmp_path / "s"
    with Store.init(str(root)) as st:
        st.create(Header.new(SID)).close()
    log_of(root).unlink()
    with Store(str(root), readonly=True) as st, pytest.raises(SessionDamagedError, match="missing or empty"):
        st.read(SID)


def crash_point(root: Path) -> dict[str, bytes]:
    """The session's files as a writer holds them now (what a crash here leaves)."""
    sdir = root / "sessions" / SID
    return {p.name: p.read_bytes() for p in sdir.iterdir() if p.is_file()}


def crash_to(root: Path, held: dict[str, bytes], log_bytes: int) -> None:
    """The session's files put back as ``crash_point`` saw them, the log's first
    ``log_bytes`` only (a crash that tore its last line), and none written since."""
    sdir = root / "sessions" / SID
    for p in sdir.iterdir():
        if p.is_file() and p.name not in held:
            p.unlink()
    for name, data in held.items():
        (sdir / name).write_bytes(data[:log_bytes] if name == "log" else data)


@pytest.mark.parametrize("keep, named", [(45, 0), (150, 1)])
def test_a_torn_append_spends_its_number_and_is_counted(tmp_path, keep, named):
    """A lazy append (acknowledged with its seq) torn by a crash: ``keep`` bytes of its line
    left, within its entry id (45) or past it (150). Before, a line whose id did not survive
    reserved no number (the next append took seq 2 again), and the recovery note said
    "dropped 0 uncommitted record(s)" though the torn append got a ``loss`` record naming it
    (one whose id did not survive is not counted: nothing says it was an append)."""
    root = tmp_path / "s"
    with Store.init(str(root)) as st:
        s = st.create(Header.new(SID))
        s.append(make_entry("item", s.head, item=item("one")).data, durable=True)
        size = log_of(root).stat().st_size
        assert s.append(make_entry("item", s.head, item=item("two")).data).seq == 2  # lazy
        held = crash_point(root)
    crash_to(root, held, size + keep)
    with Store(str(root)) as st:
        s = st.session(SID)
        assert [p.message.split(": ", 1)[1] for p in s.recovered if p.code == "log-tail"] == [
            f"dropped {named} uncommitted append(s) after the last commit, from a torn line 4 on"
        ]
        assert s.append(make_entry("item", s.head, item=item("three")).data).seq == 3


def test_a_torn_commit_spends_no_number(tmp_path):
    """A torn line that reads as no append (a commit cut short) spends no number."""
    root = tmp_path / "s"
    with Store.init(str(root)) as st:
        s = st.create(Header.new(SID))
        s.append(make_entry("item", s.head, item=item("one")).data)
        size = log_of(root).stat().st_size
        s.commit()
        held = crash_point(root)
    crash_to(root, held, size + 38)  # `{"op` of the commit's line
    with Store(str(root)) as st:
        s = st.session(SID)
        assert s.append(make_entry("item", s.head, item=item("two")).data).seq == 2


def test_a_loss_only_the_kept_indexes_show_is_repaired(tmp_path):
    """Zeroes over a committed branch append's payload: the read-only open reads the torn
    line's number back from its bytes and saw a sound log, so `repair` said "nothing to
    repair" while fsck, the sweep and every writing open refused the session for good.
    Repair reads the log as they do (without its torn tail, against the kept summary)."""
    root = tmp_path / "s"
    branched(root)
    data, at = third_line_at(root)
    start = data.index(b"\t", at) + 5
    log_of(root).write_bytes(data[:start] + b"\0" * (len(data) - start))
    assert [p.code for p in fsck(str(root)).errors] == ["log-cut"]
    with Store(str(root)) as st:
        rep = repair_session(st, SID)
        assert rep.repaired and rep.damaged
    assert fsck(str(root)).errors == []
    with Store(str(root)) as st:
        st.session(SID).close()
        st.sweep(grace=0)
