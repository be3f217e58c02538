"""verify ID with the line rules in a helper process, as verify FILE has them
(format/parallel.py): the helper is handed the entries' objects and makes their lines
(LineHelper.built). What a stored session's check finds is what one process finds, for
every session the corpus and the fixtures import into; a line the helper does not make,
or finds a fault in, is made and checked here."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from agentsession_cas import make_entry
from agentsession_cas.errors import AgentSessionError
from agentsession_cas.format import parallel
from agentsession_cas.format.hashing import entry_objects, lines_from_objects, read_envelope
from agentsession_cas.maintenance.check import verify_stored
from agentsession_cas.store import Store
from agentsession_cas.store.session import _ProjectionWalk
from test_parallel import forced as forced  # a fixture; "as forced" marks it used on purpose (F401, F811)

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _check(store: Store, sid: str) -> tuple:
    c = verify_stored(store, sid)
    return c.problems, c.notes, c.stats


def test_a_stored_session_verifies_the_same_with_the_helper(forced, tmp_path, monkeypatch):
    helpers, counted = forced  # the helper's answers used from the first block
    monkeypatch.setattr(_ProjectionWalk, "CHUNK", 3)  # small blocks: a session is many
    paths = sorted(CORPUS.glob("**/*.jsonl")) + sorted(FIXTURES.glob("**/*.jsonl"))
    sids = []
    with Store.init(str(tmp_path / "st")) as st:
        for p in paths:
            try:
                sids.append(st.import_file(str(p)).id)
            except (AgentSessionError, OSError, ValueError):
                continue  # (a file the import refuses)
    assert len(sids) > 10
    with Store(str(tmp_path / "st"), readonly=True) as st:
        for sid in sids:
            monkeypatch.setenv(parallel.ENV, "1")
            alone = _check(st, sid)
            monkeypatch.setenv(parallel.ENV, "2")
            assert _check(st, sid) == alone, sid
    assert counted[0] > 200  # the helper's answers were used
    assert helpers and all(h.built_mode and h.failed is None for h in helpers)


@pytest.mark.parametrize("said, used", [("1", False), ("2", True)])
def test_the_helper_is_taken_as_a_file_takes_it(tmp_path, monkeypatch, said, used):
    """AGENTSESSION_VERIFY_PROCESSES decides for a stored session as for a file."""
    started: list[int] = []
    real_start = parallel.LineHelper.start
    monkeypatch.setattr(parallel.LineHelper, "start", lambda self: (started.append(1), real_start(self))[1])
    monkeypatch.setenv(parallel.ENV, said)
    with Store.init(str(tmp_path / "st")) as st:
        sid = st.import_file(str(FIXTURES / "branches.jsonl")).id
        assert verify_stored(st, sid).ok
    assert bool(started) is used


def _objects() -> list[tuple[str, dict, bytes, bytes | None]]:
    """Entries' objects as the projection's walk reads them: (id, envelope, content, the
    envelope's members but content): a session's, and entries that do not make a clean
    line: an integer past I-JSON's, a ts not in the admitted form and a merge (the last
    two: an envelope not of the common form, whose line the helper does not make)."""
    first = make_entry("item", None, ts="2026-09-17T12:00:00Z", item={"type": "message", "role": "user", "content": "a"})
    bad = dict(make_entry("item", first.id, ts="2026-09-17T12:00:01Z", item={"type": "message", "role": "user",
                                                                             "content": "b"}).data, ts="yesterday")
    bad.pop("id")
    merge = make_entry("item", first.id, ts="2026-09-17T12:00:01Z", parents=[{"entry": first.id}, {"entry": entry_objects(bad)[0]}],
                       item={"type": "message", "role": "user", "content": "c"})
    big = make_entry("info", first.id, ts="2026-09-17T12:00:01Z", big=2**60)  # past I-JSON's integers
    entries = [dict(first.data), dict(big.data), bad, dict(merge.data)]
    entries += [dict(make_entry("label", first.id, ts="2026-09-17T12:00:02Z", target=first.id, label=f"x{i}").data)
                for i in range(3)]
    out = []
    for e in entries:
        eid, _, content, env = entry_objects(e)
        parsed, _, _, members = read_envelope(env)
        out.append((eid, parsed, content, members))
    assert [o[3] is None for o in out] == [False, False, True, True, False, False, False]
    return out


@pytest.mark.parametrize("how", ["answered", "killed", "taken"])
def test_the_helper_makes_the_lines_this_process_would_and_answers_only_the_clean(tmp_path, monkeypatch, how):
    """The lines LineHelper.built passes on are lines_from_objects' byte for byte, in
    order; the helper's answer is None for a line with a fault (checked here) and for one
    it does not make (made here); a helper killed, or blocks taken here, leave the lines
    the same, checked here."""
    monkeypatch.setattr(parallel, "WAIT", how != "taken")
    objects = _objects()
    blocks = [objects[i : i + 2] for i in range(0, len(objects), 2)]

    def given(chunk):
        return [(e, c, m) for e, _, c, m in chunk], lambda which: lines_from_objects([chunk[i] for i in which])

    with parallel.LineHelper(built=True) as helper:
        if how == "killed":  # (before any block: a helper killed midway may have answered all already)
            assert helper._readied() and helper.proc is not None
            helper.proc.send_signal(signal.SIGKILL)
            helper.proc.wait()
        elif how == "taken":
            monkeypatch.setattr(parallel.LineHelper, "_readied", lambda self: True)
            monkeypatch.setattr(parallel.LineHelper, "_waiting", lambda self, seconds: False)
        lines = list(helper.built(given(b) for b in blocks))
        known = list(helper.known)
    assert lines == lines_from_objects(objects)
    assert len(known) == len(objects)
    if how == "answered":
        assert [k is None for k in known] == [False, True, True, True, False, False, False], known
        assert all(k[0] == o[1]["content"] for k, o in zip(known, objects) if k is not None)
    elif how == "killed":
        assert helper.failed is not None and known == [None] * len(objects)
    else:
        assert known == [None] * len(objects) and helper.checked_here == len(objects)
