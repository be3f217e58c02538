"""A session's own entries held as a snapshot's digests (issue 11): they answer as the
list of ids and the dict of sequence numbers they stand in for."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from agentsession_cas.backends import digests
from agentsession_cas.backends.digests import EntryDigests, SeqRuns
from agentsession_cas.store.own import OwnOrder, OwnSeqs, own_of
from agentsession_cas.store.state import replay


def eid(i: int) -> str:
    return "sha256:" + hashlib.sha256(str(i).encode()).hexdigest()


NOT_IDS = [None, 7, b"sha256:" + b"0" * 64, "sha256:" + "0" * 63, "sha256:" + "A" * 64, "sha256:" + "0" * 62 + " 0",
           "sha1:" + "0" * 64, "sha256:" + "g" * 64, eid(0)[:-1] + "G"]


@given(hs.lists(hs.integers(0, 60), max_size=80), hs.lists(hs.integers(0, 80), max_size=20))
@settings(max_examples=200, deadline=None)
def test_digests_answer_as_the_list_of_ids(picks, probes):
    ids = [eid(i) for i in dict.fromkeys(picks)]
    for scans in (digests.SCANS, 0):  # (the first look-ups scan the bytes, the later ones use the table)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(digests, "SCANS", scans)
            d = EntryDigests.of(ids)
            assert len(d) == len(ids) and list(d) == ids and d[:] == ids and d.first_repeat() is None
            assert [d[i] for i in range(-len(ids), len(ids))] == ids + ids
            assert d[3:9] == ids[3:9] and d[::2] == ids[::2]
            for i in probes:
                assert d.position(eid(i)) == (ids.index(eid(i)) if eid(i) in ids else -1)
            assert not any(x in d for x in NOT_IDS)


@pytest.mark.parametrize("scans", [digests.SCANS, 0])
def test_bytes_across_two_digests_are_no_digest(monkeypatch, scans):
    monkeypatch.setattr(digests, "SCANS", scans)
    a, b = hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()
    d = EntryDigests(a + b)
    across = "sha256:" + (a[16:] + b[:16]).hex()
    assert d.position(across) == -1 and d.position("sha256:" + b.hex()) == 1
    # ... nor when it also stands whole further on
    d = EntryDigests(a + b + a[16:] + b[:16])
    assert d.position(across) == 2


@pytest.mark.parametrize("scans", [digests.SCANS, 0])
def test_a_repeat_is_found_and_the_first_place_answers(monkeypatch, scans):
    monkeypatch.setattr(digests, "SCANS", scans)
    ids = [eid(i) for i in range(50)] + [eid(7)]
    d = EntryDigests.of(ids)
    assert d.position(eid(7)) == 7 and d.first_repeat() == eid(7) and d.position(eid(7)) == 7
    # Ids whose first 8 bytes agree are no repeat (the table tells them apart).
    twin = eid(3)[:23] + ("0" if eid(3)[23] != "0" else "1") + eid(3)[24:]
    assert EntryDigests.of([eid(3), twin]).first_repeat() is None
    assert own_of(ids, range(1, 52)) is None
    assert own_of([*ids[:-1], "sha256:x"], range(1, 52)) is None


def test_ids_whose_slots_collide_are_all_found(monkeypatch):
    """Every id probes from the same slot (a key of 0): the table still tells them apart."""
    monkeypatch.setattr(digests, "_KEY", 0)
    ids = [eid(i) for i in range(300)]
    d = EntryDigests.of(ids)
    assert [d.position(x) for x in ids] == list(range(300)) and d.position(eid(300)) == -1


@given(hs.integers(0, 40), hs.lists(hs.integers(0, 80), max_size=30), hs.lists(hs.integers(0, 90), max_size=30))
@settings(max_examples=200, deadline=None)
def test_own_entries_answer_as_a_list_and_a_dict(n, later, probes):
    snap_ids = [eid(i) for i in range(n)]
    seqs = [2 * i + 1 for i in range(n)]
    held = own_of(snap_ids, seqs)
    assert held is not None
    order, own = held
    model_order, model_own = list(snap_ids), dict(zip(snap_ids, seqs))
    copies = (order.copy(), own.copy())
    seq = 2 * n + 1
    for i in later:
        e = eid(i)
        if e in own:
            with pytest.raises(KeyError):
                own[e] = 0
            continue
        seq += 1
        own[e], model_own[e] = seq, seq
        order.append(e)
        model_order.append(e)
    assert order == model_order and list(order) == model_order and len(order) == len(model_order)
    assert own == model_own and dict(own) == model_own and len(own) == len(model_own)
    assert [order[i] for i in range(-len(order), len(order))] == model_order * 2
    for a, b in [(0, 3), (n - 2, n + 3), (n, None), (None, None), (-4, None)]:
        assert order[a:b] == model_order[a:b]
    for i in probes:
        e = eid(i)
        assert (e in own, own.get(e), e in order) == (e in model_own, model_own.get(e), e in model_order)
    # A copy taken before is what was then (a writer's state copies it for a batch).
    assert list(copies[0]) == snap_ids and dict(copies[1]) == dict(zip(snap_ids, seqs))
    assert order != snap_ids + ["x"] and OwnOrder() == [] and OwnSeqs() == {}


def test_a_replayed_snapshot_holds_digests_and_appends_after_it():
    ids = [eid(i) for i in range(5)]
    create = {"op": "create", "session": "s", "base": None, "mark": "record"}
    snap = {"op": "snapshot", "seq": 5, "records": 5, "entries": ids, "seqs": [1, 2, 3, 4, 5],
            "leaf_labels": [], "head": ids[-1], "mark": "record", "others": []}
    state = replay([create, snap, {"op": "append", "seq": 6, "entry": eid(9), "head": eid(9)},
                    {"op": "append", "seq": 7, "entry": ids[2]}, {"op": "commit"}])
    assert not state.damage
    assert isinstance(state.own, OwnSeqs) and isinstance(state.own.snap, EntryDigests)
    assert state.log_order == [*ids, eid(9)] and state.own[ids[2]] == 3 and state.max_seq == 7


@given(hs.lists(hs.tuples(hs.integers(1, 5), hs.integers(1, 6)), max_size=8))
def test_sequence_runs_read_as_the_numbers_they_stand_for(gaps):
    runs, numbers, last = [], [], 0
    for gap, count in gaps:
        runs.append([last + gap, count])
        numbers.extend(range(last + gap, last + gap + count))
        last = last + gap + count - 1
    seqs = SeqRuns(runs)
    assert len(seqs) == len(numbers) and list(seqs) == numbers and seqs[:] == numbers
    assert [seqs[i] for i in range(-len(numbers), len(numbers))] == numbers * 2
    with pytest.raises(IndexError):
        seqs[len(numbers)]
