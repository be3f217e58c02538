"""fsck's count of unreferenced objects is the sweep's rule (maintenance/sweep.py
``retained``), on every backend: the file walk hands the rule what it read rather than
following references itself. Damaged stores are where a second copy of the rule
drifted, so they are what is tested here."""

from __future__ import annotations

from pathlib import Path

from agentsession_cas import Header
from agentsession_cas.errors import NoSuchObjectError
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.maintenance.sweep import retained
from agentsession_cas.store import Store

SPACES = ("entries", "contents", "blobs")


def msg(text: str, n: int) -> dict:
    return {"type": "item", "item": {"type": "message", "role": "user", "content": text},
            "ts": f"2026-12-04T02:00:{n:02d}Z"}


def loose(root: Path, space: str, name: str) -> Path:
    h = name.split(":", 1)[1]
    return root / "objects" / space / h[:2] / h[2:]


def by_the_rule(root: Path) -> dict[str, int]:
    """What nothing retains by the sweep's rule, over every object the store holds."""
    st = Store(root, readonly=True)
    try:
        ret = retained(st)
        held = {space: set(st.objects.names(space)) for space in SPACES}
    finally:
        st.close()
    kept = {"entries": ret.envelopes, "contents": ret.contents, "blobs": ret.blobs}
    return {space: len(held[space] - kept[space]) for space in SPACES}


def test_a_prefix_past_a_missing_content_is_retained_as_the_sweep_retains_it(tmp_path):
    """A fork whose session is deleted keeps its prefix by the fork's base alone. An entry
    on it whose content is gone (an error fsck reports) does not end the prefix: its
    envelope still names its parent, and a sweep keeps the parent. fsck counted the
    entries above it unreferenced, which a sweep would never remove."""
    root = tmp_path / "store"
    with Store.init(root) as st:
        s = st.create(Header.new("rec"))
        ids = [s.append(msg(f"turn {i}", i)).id for i in range(6)]
        s.close()
        contents = [st.objects.get("entries", i) for i in ids]
        f = st.create(Header.new("fork", base=ids[3]))
        f.append(dict(msg("fork turn", 30), parent=ids[3]))
        f.close()
        st.delete("rec")
    from agentsession_cas.format.hashing import envelope_content

    lost = envelope_content(contents[1])
    assert lost is not None
    loose(root, "contents", lost).unlink()
    report = fsck(root)
    assert [p.code for p in report.errors] == ["missing-content"]
    # ids[4] and ids[5] (rec's own, past the fork's base) and their contents go; the
    # prefix ids[0..3] stays whole, ids[0] above the damaged entry included.
    assert report.counts["unreferenced"] == by_the_rule(root) == {"entries": 2, "contents": 2, "blobs": 0}


def test_a_content_the_log_still_carries_is_retained_when_its_envelope_is_lost(tmp_path):
    """An append's record carries its entry's objects (until compaction), and a sweep reads
    the content from that copy: the content stays while the log names it, even with its
    envelope lost from objects/. fsck counted it unreferenced (it read the content of an
    entry only through a sound envelope)."""
    root = tmp_path / "store"
    with Store.init(root) as st:
        s = st.create(Header.new("rec"))
        ids = [s.append(msg(f"turn {i}", i)).id for i in range(4)]
        s.close()
    loose(root, "entries", ids[2]).unlink()
    report = fsck(root)
    assert [p.code for p in report.errors] == ["missing-object"]
    assert report.counts["unreferenced"] == by_the_rule(root) == {"entries": 0, "contents": 0, "blobs": 0}


def test_the_walk_keeps_no_log_once_it_is_read(tmp_path, monkeypatch):
    """fsck's file walk folds each log into the retention rule as it reads it
    (maintenance/sweep.py ``Retention.add``) and keeps none of them: a store of millions of
    records held them all until the count at the end (the walk kept every log's
    ``RetentionSource`` in a list), which is where the rule now reads the objects."""
    import gc

    from agentsession_cas.backends.base import RetentionSource
    from agentsession_cas.backends.files import fsck as files_fsck

    root = tmp_path / "store"
    with Store.init(root) as st:
        for n in range(3):
            s = st.create(Header.new(f"s{n}"))
            for i in range(4):
                s.append(msg(f"{n} turn {i}", i))
            s.close()
    alive: list[int] = []
    reading = files_fsck._Read.content_names

    def counting(self, entries):
        alive.append(sum(isinstance(o, RetentionSource) for o in gc.get_objects()))
        return reading(self, entries)

    monkeypatch.setattr(files_fsck._Read, "content_names", counting)
    report = fsck(root)
    assert report.ok and report.counts["unreferenced"] == {"entries": 0, "contents": 0, "blobs": 0}
    assert alive == [0]


def kept_aside_naming_in_upper_case(root: Path) -> list[str]:
    """A store whose session ``rec`` (three entries) is deleted, and whose ``keeper`` has a
    log repair kept aside that names rec's entries only in upper case: as the base of its
    create record (ids[1]) and in an append (ids[2]). Returns rec's ids."""
    from agentsession_cas.backends.files.log import encode_log

    with Store.init(root) as st:
        s = st.create(Header.new("rec"))
        ids = [s.append(msg(f"turn {i}", i)).id for i in range(3)]
        s.close()
        k = st.create(Header.new("keeper"))
        k.append(msg("kept", 40))
        k.close()
        st.delete("rec")
    upper = ["sha256:" + i[7:].upper() for i in ids]
    (root / "sessions" / "keeper" / "log.damaged-1").write_bytes(encode_log([
        {"op": "create", "session": "keeper", "base": upper[1]},
        {"op": "append", "seq": 1, "entry": upper[2]},
    ]))
    return ids


def test_a_name_in_upper_case_names_no_object(tmp_path):
    """An object name is ``sha256:`` and 64 lowercase hex digits (format/hashing.py
    ``is_hash``, ``raw_hash``): a log naming an entry in upper case names no object, and
    retains nothing. fsck's walk read such a name as the object's own (its digests made
    raw with upper case taken), counting the content and the parent of what it named
    retained, where the sweep's rule stopped on it (``bad_name``, naming no log)."""
    root = tmp_path / "store"
    kept_aside_naming_in_upper_case(root)
    report = fsck(root)
    assert report.ok and [p.code for p in report.notes] == ["damaged-log-kept"]
    assert report.counts["unreferenced"] == {"entries": 3, "contents": 3, "blobs": 0}  # (was 2 and 0)
    assert by_the_rule(root) == report.counts["unreferenced"]


class _NoObjects:
    """Objects of which none is held (the rule reads nothing of them)."""

    def content_names(self, entries):
        return iter(())

    def parent_of(self, entry):
        raise NoSuchObjectError("none held")

    def blob_names(self, contents):
        return iter(())


def test_the_rule_holds_names_as_raw_digests_and_odd_names_as_they_are():
    """The retention rule (maintenance/sweep.py ``Retention``) holds each object name as
    its raw 32-byte digest (backends/base.py ``Names``), not as a ``sha256:`` string: a
    100,000-entry session's retention took 32 MB of strings. What a log names that is
    no object name (upper-case digits, no digest at all) names no object and is held as it
    is, and the names read back, compare and count as they did (the sweep's report)."""
    from agentsession_cas.backends.base import RetentionSource
    from agentsession_cas.format.hashing import sha256_ref
    from agentsession_cas.maintenance.sweep import Retention

    a, b, blob = sha256_ref(b"a"), sha256_ref(b"b"), sha256_ref(b"blob")
    upper = "sha256:" + a[7:].upper()
    retention = Retention()
    retention.add(RetentionSource(
        [{"op": "create", "base": "no name"}, {"op": "append", "entry": a}, {"op": "append", "entry": upper}],
        {a: b}, blobs={blob}))
    ret = retention.finish(_NoObjects())
    assert ret.envelopes.raws == {bytes.fromhex(a[7:])} and ret.envelopes.odd == {upper, "no name"}
    assert ret.contents.raws == {bytes.fromhex(b[7:])} and not ret.contents.odd
    assert ret.blobs.raws == {bytes.fromhex(blob[7:])}
    assert len(ret.envelopes) == 3 and set(ret.envelopes) == {a, upper, "no name"} and set(ret.contents) == {b}
    assert a in ret.envelopes and upper in ret.envelopes and sha256_ref(b"c") not in ret.envelopes
    assert {a, sha256_ref(b"c")} - ret.envelopes == {sha256_ref(b"c")} and {a, upper} <= ret.envelopes


def test_the_rule_holds_a_log_of_many_entries_in_digests(tmp_path):
    """What the rule keeps of 20,000 appends (each envelope and the content its log's copy
    says, the records themselves dropped as they are read): under 400 bytes an entry (340
    on Python 3.11: two 65-byte digests and their sets' slots), where the ``sha256:``
    strings took 450."""
    import hashlib
    import tracemalloc

    from agentsession_cas.backends.base import RetentionSource
    from agentsession_cas.maintenance.sweep import Retention

    def sources():
        for n in range(20):
            records, contents = [], {}
            for i in range(1000):
                entry = "sha256:" + hashlib.sha256(b"e%d.%d" % (n, i)).hexdigest()
                records.append({"op": "append", "seq": i + 1, "entry": entry})
                contents[entry] = "sha256:" + hashlib.sha256(b"c%d.%d" % (n, i)).hexdigest()
            yield RetentionSource(records, contents)

    tracemalloc.start()
    try:
        retention = Retention()
        for src in sources():
            retention.add(src)
        del src
        ret = retention.finish(_NoObjects())
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ret.envelopes) == len(ret.contents) == 20_000
    assert held / 20_000 < 400, held / 20_000


def test_stored_objects_pass_by_what_a_chunk_lacks_and_keep_the_rest():
    """The rule reads a store's objects a chunk at a time (``get_many``); a chunk holding
    one object missing or corrupt is read again one by one, that one passed by (it names
    nothing, as when read alone), every other one of the chunk read."""
    from agentsession_cas.errors import CorruptObjectError
    from agentsession_cas.format.hashing import sha256_ref
    from agentsession_cas.format.media import sidecar_names
    from agentsession_cas.maintenance.sweep import StoredObjects

    bodies = [f'{{"n":{i}}}'.encode() for i in range(5)]
    held = {sha256_ref(b): b for b in bodies}
    names = list(held)
    missing, corrupt = "sha256:" + "0" * 64, names[3]

    class Objects:
        def read_order(self, order):
            return list(order)

        def get(self, space, name):
            if name == corrupt:
                raise CorruptObjectError(f"{name} is corrupt", space=space, name=name, path="x")
            if name not in held:
                raise NoSuchObjectError(f"no {space} object {name}")
            return held[name]

        def get_many(self, space, order):
            return [self.get(space, name) for name in order]

    stored = StoredObjects(Objects())  # type: ignore[arg-type]
    asked = [bytes.fromhex(n[7:]) for n in (*names, missing)]
    assert list(stored.envelopes_of(asked)) == [held[n] for n in names if n != corrupt]
    assert list(stored.sidecars_of(asked)) == [sidecar_names(held[n]) for n in names if n != corrupt]
