"""Streaming reads (issue 11): ``export`` and ``show`` of a stored session stream its
projection, and give byte for byte what they gave when they held it whole."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import rfc8785
from click.testing import CliRunner

from agentsession_cas import Header
from agentsession_cas.store import Session, Store
from agentsession_cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
from bench_verify import generate  # the benchmark's coding-agent session


def cli(store: Path, *args: str):
    return CliRunner().invoke(main, ["--store", str(store), *args], catch_exceptions=False)


def _user(text: str) -> dict:
    return {"type": "item", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> tuple[Path, list[str]]:
    """A store holding sessions of every shape a projection takes: the benchmark's (branches,
    labels, configs, responses with request hashes), a fork (a prefix above its base), one
    whose head was moved back (a synthetic marker ends its projection), one with a leaf
    label of its own, one cleared by a null label, and an empty one."""
    root = tmp_path_factory.mktemp("streaming") / "store"
    data, _, _ = generate(400, 7)
    st = Store.init(root)
    big = st.import_bytes(data, record=True)
    sids = [big.id]
    moved = st.create(Header.new("moved"))
    ids = [moved.append(_user(f"turn {i}")).id for i in range(5)]
    moved.set_head(ids[2], expected=ids[-1])
    fork = st.create(Header.new("fork", base=ids[3]))
    fork.append(_user("on the fork"))
    labelled = st.create(Header.new("labelled"))
    a = labelled.append(_user("a")).id
    labelled.append(_user("b"))
    labelled.append({"type": "label", "target": a, "label": "leaf"})
    cleared = st.create(Header.new("cleared"))
    c = cleared.append(_user("c")).id
    cleared.append({"type": "label", "target": c, "label": "leaf"})
    cleared.append({"type": "label", "target": c, "label": None})
    cleared.append(_user("d"))
    st.create(Header.new("empty"))
    rooted = st.create(Header.new("rooted"))
    r2 = [rooted.append(_user(f"r{i}")).id for i in range(2)]
    rooted.set_head(None, expected=r2[-1])  # back to the universal root: the marker names none
    st.create(Header.new("bare-fork", base=ids[1]))  # a fork with no entry of its own: its head is its base
    sids += ["moved", "fork", "labelled", "cleared", "empty", "rooted", "bare-fork"]
    st.close()
    return root, sids


def test_export_streams_the_projection_byte_for_byte(shapes):
    root, sids = shapes
    st = Store(root, readonly=True)
    for sid in sids:
        s = st.read(sid)
        whole = s.projection()
        assert b"".join(s.projection_lines()) == whole
        assert cli(root, "export", sid).stdout_bytes == whole
        s.close()
    moved = st.export("moved")
    assert moved.splitlines()[-1].startswith(b'{"id":') and b'"synthetic":true' in moved.splitlines()[-1]


def test_show_of_a_stored_session_is_show_of_its_export(shapes, tmp_path):
    """The streamed listing prints what ``show`` of the exported file prints, for every
    shape and the listing options."""
    root, sids = shapes
    for sid in sids:
        path = tmp_path / f"{sid}.jsonl"
        assert cli(root, "export", sid, "-o", str(path)).exit_code == 0
        for opts in ([], ["-v"], ["-n", "3"], ["--tail", "2"], ["--tail", "0"], ["-n", "1000"]):
            streamed = cli(root, "show", sid, *opts)
            whole = cli(root, "show", str(path), *opts)
            assert streamed.exit_code == whole.exit_code == 0, (sid, opts, streamed.stderr)
            assert streamed.stdout == whole.stdout, (sid, opts)


def test_a_projection_read_in_small_chunks_is_the_same(shapes, tmp_path, monkeypatch):
    """The walk reads a chunk of entries at a time: with chunks of 7 (a fork's prefix and
    its own entries each cut several times, labels across a cut) export, the outline and
    show give what they give read whole."""
    from agentsession_cas.store import session as session_mod

    root, sids = shapes
    st = Store(root, readonly=True)
    whole = {sid: (st.export(sid), cli(root, "show", sid).stdout, cli(root, "show", sid, "-v", "--tail", "5").stdout)
             for sid in sids}
    outlines = {sid: vars(st.read(sid).projection_outline()) for sid in sids}
    monkeypatch.setattr(session_mod._ProjectionWalk, "CHUNK", 7)
    for sid in sids:
        assert st.export(sid) == whole[sid][0], sid
        assert (cli(root, "show", sid).stdout, cli(root, "show", sid, "-v", "--tail", "5").stdout) == whole[sid][1:], sid
        assert vars(st.read(sid).projection_outline()) == outlines[sid], sid


def test_show_of_a_stored_session_with_every_entry_parked_is_the_same(shapes, tmp_path, monkeypatch):
    """``show`` of a stored session parks the path's entries as it lists them (their
    objects read back from the store when the context algorithm consults one, or its item
    is printed): with no window at all, so every look back reads a woken entry, it prints
    what ``show`` of the exported file prints, for the shapes and the corpus's contexts
    (a compaction's kept range and pins, omit settings that leave items out or replace
    them); and once it is done, no entry of a long path is held whole but the last."""
    from agentsession_cas.format import context, reader

    monkeypatch.setattr(reader.Parking, "WINDOW", 0)
    monkeypatch.setattr(reader.Parking, "WINDOW_BYTES", 0)
    pushed: list = []
    real_push = context.ContextBuilder.push

    def push(self, entry, t=None):
        pushed.append(entry)
        real_push(self, entry, t)

    monkeypatch.setattr(context.ContextBuilder, "push", push)
    root, sids = shapes
    held = [(root, sid) for sid in sids]
    for name in ["compaction", "pinned", "omit", "branch", "instructions", "queued", "runs"]:
        path = CORPUS / "sessions" / f"{name}.jsonl"
        if path.exists():
            with Store.init(tmp_path / name) as st:
                held.append((tmp_path / name, st.import_file(path).id))
    for i, (at, sid) in enumerate(held):
        path = tmp_path / f"{i}.jsonl"
        assert cli(at, "export", sid, "-o", str(path)).exit_code == 0
        pushed.clear()
        streamed = cli(at, "show", sid)
        if i == 0:  # the benchmark's session: hundreds of entries, no omit in force
            whole_ones = [at for at, e in enumerate(pushed) if not e.parked]
            assert len(pushed) > 100 and whole_ones == [len(pushed) - 1], whole_ones
        whole = cli(at, "show", str(path))
        assert streamed.exit_code == whole.exit_code == 0, (sid, streamed.stderr)
        assert streamed.stdout == whole.stdout, sid
    assert len(held) > len(sids) + 3, "the corpus's contexts were shown"


def test_show_of_a_stored_session_reads_each_object_once(shapes, monkeypatch):
    """The listing reads the envelopes for its outline and then the contents alone: every
    object of the session is read once (a label's content twice: the outline needs its
    members), and with -n or --tail the contents of entries neither listed nor on the
    leaf's path are not read at all."""
    from collections import Counter

    from agentsession_cas.backends.files.objects import FileObjects

    reads: Counter = Counter()
    real_get, real_many = FileObjects.get, FileObjects.get_many
    monkeypatch.setattr(FileObjects, "get", lambda self, space, name: reads.update([(space, name)]) or real_get(self, space, name))
    monkeypatch.setattr(FileObjects, "get_many", lambda self, space, names: reads.update((space, n) for n in names)
                        or real_many(self, space, names))
    root, sids = shapes
    st = Store(root, readonly=True)
    s = st.read(sids[0])
    envelopes = {e: st.objects.get("entries", e) for e in s.state.log_order}
    labels = {e for e, env in envelopes.items() if b'"type":"label"' in env}
    reads.clear()
    assert cli(root, "show", sids[0]).exit_code == 0
    assert {name for (space, name) in reads if space == "entries"} == set(envelopes)
    twice = {name for name, n in reads.items() if n > 1}
    assert len(twice) == len(labels) and all(space == "contents" for space, _ in twice), twice
    moved = st.read("moved")  # its head moved back: the entries after it are on no path shown
    outline = moved.projection_outline()
    wanted = {outline.content(p) for p in {0, *outline.path(moved.head)}}
    reads.clear()
    assert cli(root, "show", "moved", "-n", "1").exit_code == 0
    assert {name for (space, name) in reads if space == "contents"} == wanted and len(wanted) < len(moved)


def test_show_of_a_stored_session_never_holds_the_projection(shapes, monkeypatch):
    """The text listing reads the projection line by line: it never asks for it whole."""
    root, sids = shapes

    def whole(self):
        raise AssertionError("show asked for the whole projection")

    monkeypatch.setattr(Session, "projection", whole)
    for sid in sids:
        r = cli(root, "show", sid)
        assert r.exit_code == 0, r.stderr


def test_export_holds_no_more_than_the_outline_per_entry(shapes, monkeypatch):
    """What the projection keeps while it streams is one small tuple per entry (id, parent,
    a label's members), never a line or an entry: the memory bound docs/storage-format.md
    states. Checked on the walk's own record of what it keeps."""
    from agentsession_cas.store import session as session_mod

    root, sids = shapes
    kept = []
    real = session_mod._ProjectionWalk.__init__

    def spy(self, s):
        real(self, s)
        kept.append(self)

    monkeypatch.setattr(session_mod._ProjectionWalk, "__init__", spy)
    st = Store(root, readonly=True)
    for _ in st.export_lines(sids[0]):  # drained: the walk is what is looked at
        pass
    (walk,) = kept
    assert len(walk.stubs) == len(st.read(sids[0])) and all(
        len(stub) == 3 and isinstance(stub[0], str) and (stub[2] is None or "label" in stub[2]) for stub in walk.stubs
    )


def test_projection_entries_are_the_lines_parsed(shapes, tmp_path):
    """What ``show`` reads (Session.projection_entries: each entry from its two objects,
    the content parsed once) is what parsing each projection line gives: the members in
    the line's order, the parse's careful flag, the synthetic marker last; for every
    shape, and for contents with member names outside ASCII, floats and integers of 16 digits.
    The flag may be unknown (None: a later encoding scans) where the content's parse was
    proved by encoding it again; an item's bytes, when cut from the content, are its
    canonical form; and the context hashes fed these entries are those fed the lines'."""
    from agentsession_cas.format.canonical import loads_flagged
    from agentsession_cas.format.context import ContextHasher

    root, sids = shapes
    odd = Store.init(tmp_path / "odd")
    s = odd.create(Header.new("odd"))
    s.append({"type": "acme:x", "\u00e9t\u00e9": 1, "zeta": 1.5, "big": 9007199254740993 - 1})
    s.append({"type": "acme:y", "\U0001f600": "smile", "a": [1, 2.25, {"\u00e9": None}]})
    s.append({"type": "acme:z", "v": 2.5, "n": {"\u00e9": 1, "e": 2, "\U0001f600": 3}})  # ASCII at the top only
    s.append(_user("plain"))
    # an item holding a member named as the content's next one (no cut), and one holding a float
    s.append({**_user("nested"), "item": {**_user("nested")["item"], "response": "inner"}, "response": "outer"})
    s.append({**_user("float"), "item": {**_user("float")["item"], "temperature": 0.5}})
    odd.close()
    stores = [(Store(root, readonly=True), sids), (Store(tmp_path / "odd", readonly=True), ["odd"])]
    for st, names in stores:
        for sid in names:
            s = st.read(sid)
            lines = list(s.projection_lines())[1:]
            entries = list(s.projection_entries())
            assert len(entries) == len(lines), sid
            by_entries, by_lines = ContextHasher(), ContextHasher()
            cut = 0
            for raw, e in zip(lines, entries):
                obj, careful = loads_flagged(raw)
                assert list(e.data.items()) == list(obj.items()), (sid, raw)
                assert e.id == obj["id"] and e.careful in (careful, None), (sid, raw)
                if e.item_bytes is not None:
                    assert e.item_bytes == rfc8785.dumps(obj["item"]), (sid, raw)
                    cut += 1
                if e.parent is None or e.parent in by_lines:
                    assert by_entries.feed(e) == by_lines.feed(obj), (sid, raw)
            assert cut or not any(e.type == "item" for e in entries), "no item's bytes cut from its content"
            s.close()


# ---------------------------------------------------------------------------
# verify FILE in one pass


CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _old_report(path: Path):
    from agentsession_cas.format.reader import read_session
    from agentsession_cas.format.rules import verify_session

    return verify_session(read_session(path)).as_dict()


def _files() -> list[Path]:
    found = sorted(CORPUS.glob("**/*.jsonl")) + sorted(FIXTURES.glob("**/*.jsonl"))
    if not found:
        pytest.skip("no corpus nor fixtures")
    return found


def test_verify_file_reports_what_verify_session_reports(tmp_path):
    """Every corpus file (good, broken, truncated, of the earlier format) and every fixture,
    and the benchmark's session: the streamed verify of the file, and of its bytes, report
    exactly what reading it whole and checking it reports."""
    from agentsession_cas.errors import SessionFormatError
    from agentsession_cas.format.reader import verify_bytes, verify_file

    generated = tmp_path / "generated.jsonl"
    generated.write_bytes(generate(300, 11)[0])
    for path in [*_files(), generated]:
        try:
            expected = _old_report(path)
        except SessionFormatError as exc:
            with pytest.raises(SessionFormatError) as got:
                verify_file(path)
            assert str(got.value) == str(exc)
            continue
        assert verify_file(path).as_dict() == expected, path
        assert verify_bytes(path.read_bytes(), source=str(path)).as_dict() == expected, path


def test_verify_file_with_every_entry_parked_reports_the_same(tmp_path, monkeypatch):
    """The same files verified with no window at all: every entry parked the moment it is
    in (its object dropped, read again from the file when a rule asks), so every rule that
    looks back along a path (outputs, a compaction's kept range, a request rebuilt under
    new settings, runs and calls) reads woken entries; the report is the same."""
    from agentsession_cas.errors import SessionFormatError
    from agentsession_cas.format import reader

    monkeypatch.setattr(reader.Parking, "WINDOW", 0)
    monkeypatch.setattr(reader.Parking, "WINDOW_BYTES", 0)
    woke = []
    real_park = reader.Entry.park

    def park(entry, wake):
        def counted(e):
            woke.append(e.id)
            return wake(e)
        real_park(entry, counted)

    monkeypatch.setattr(reader.Entry, "park", park)
    generated = tmp_path / "generated.jsonl"
    generated.write_bytes(generate(300, 11)[0])
    for path in [*_files(), generated]:
        try:
            expected = _old_report(path)
        except SessionFormatError:
            continue
        assert reader.verify_file(path).as_dict() == expected, path
    assert len(woke) > 100  # the rules did read parked entries back


def test_verify_of_a_stored_session_with_every_entry_parked_reports_the_same(shapes, monkeypatch):
    """``verify ID`` parks entries too, waking one from the store's objects: with no window
    at all, each stored session's report is the one the default window gives."""
    from agentsession_cas.format import reader
    from agentsession_cas.maintenance.check import _verify_projection

    root, sids = shapes
    st = Store(root, readonly=True)
    expected = {sid: _verify_projection(st.open(sid)) for sid in sids}
    monkeypatch.setattr(reader.Parking, "WINDOW", 0)
    monkeypatch.setattr(reader.Parking, "WINDOW_BYTES", 0)
    for sid in sids:
        got, want = _verify_projection(st.open(sid)), expected[sid]
        if isinstance(want, Exception):
            assert str(got) == str(want), sid
        else:
            assert got.as_dict() == want.as_dict(), sid
    assert expected[sids[0]].ok and expected[sids[0]].counts()["verified"] > 0  # the benchmark's session


def test_verify_file_holds_ids_not_the_entries_of_a_long_path(tmp_path):
    """A linear session (every entry on the one path the context rules stand on): doubling
    it moves the streamed verify's peak (tracemalloc) by a small part of the bytes added;
    holding the path's entries would add about twice those bytes."""
    import tracemalloc

    from agentsession_cas import make_entry
    from agentsession_cas.format.reader import verify_file

    peaks, sizes = [], []
    for n in (400, 800):
        lines = [Header.new(f"linear{n}").canonical_line()]
        parent = None
        for i in range(n):
            text = f"turn {i} " + "y" * 8_000
            e = make_entry("item", parent, ts="2026-01-01T00:00:00Z",
                           item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
            lines.append(e.canonical_line())
            parent = e.id
        path = tmp_path / f"linear{n}.jsonl"
        path.write_bytes(b"".join(lines))
        tracemalloc.start()
        try:
            report = verify_file(path)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert report.ok and report.entries == n
        sizes.append(path.stat().st_size)
    assert peaks[1] - peaks[0] < (sizes[1] - sizes[0]) / 4, (peaks, sizes)


def test_a_parked_entry_woken_after_the_pass_reads_the_file_again(tmp_path, monkeypatch):
    """An entry a report still names wakes after the verify returned (the file closed): it
    is read again; and a line changed meanwhile is refused, never read as the entry."""
    from agentsession_cas.errors import SessionFormatError
    from agentsession_cas.format import reader

    monkeypatch.setattr(reader.Parking, "WINDOW", 0)
    path = _interleaved(tmp_path)
    report = reader.verify_file(path)
    checks = list(report.requests)
    assert checks and all(c.entry.parked for c in checks)
    assert checks[0].entry.data["type"] == "response" and not checks[0].entry.parked
    lines = path.read_bytes().split(b"\n")
    lines[checks[1].entry.line - 1] = lines[checks[1].entry.line - 1].replace(b'"sha256:', b'"sha256:', 1)[::-1]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(SessionFormatError, match="changed while it was verified"):
        checks[1].entry.data  # noqa: B018


def test_a_verify_pass_leaves_no_cycle(tmp_path, monkeypatch):
    """A pass runs with the collector paused (gc_paused, and a whole-pass command keeps it
    off until it returns): its state must hold no reference cycle, or nothing would free it
    before the process ends. An import drops the report before it writes the session, so
    its peak is one or the other, not the two together."""
    import gc
    import weakref

    from agentsession_cas.format import reader

    path = tmp_path / "generated.jsonl"
    path.write_bytes(generate(300, 11)[0])
    was = gc.isenabled()
    gc.disable()
    try:
        for window in (reader.Parking.WINDOW, 0):  # with entries parked (holding the wake) too
            monkeypatch.setattr(reader.Parking, "WINDOW", window)
            report = reader.verify_file(path)
            assert report.ok
            checker = weakref.ref(report._checker)
            del report
            assert checker() is None
    finally:
        if was:
            gc.enable()


def _interleaved(tmp_path: Path) -> Path:
    """Two branches from one root written alternately, each with a response whose request
    hash is right: the checker must go back to a branch it left, reading its entries again."""
    from agentsession_cas.format.context import request_hash_for
    from agentsession_cas.format.entry import Header, make_entry

    ts = "2026-01-01T00:00:00Z"
    root = make_entry("config", None, ts=ts, model="m")
    a1 = make_entry("item", root.id, ts=ts, item={"type": "message", "role": "user", "content": "on a"})
    b1 = make_entry("item", root.id, ts=ts, item={"type": "message", "role": "user", "content": "on b"})
    resp = {"response_id": "r", "model": "m", "status": "completed"}
    a2 = make_entry("response", a1.id, ts=ts, request_hash=request_hash_for([root, a1], resp), **resp)
    b2 = make_entry("response", b1.id, ts=ts, request_hash="sha256:" + "0" * 64, **resp)  # a wrong one, on purpose
    path = tmp_path / "interleaved.jsonl"
    path.write_bytes(Header.new("interleaved").canonical_line() + b"".join(e.canonical_line() for e in (root, a1, b1, a2, b2)))
    return path


def test_verify_file_reads_a_left_branch_again(tmp_path, monkeypatch):
    import os

    from agentsession_cas.format.reader import verify_file

    path = _interleaved(tmp_path)
    expected = _old_report(path)
    reads = []
    real = os.pread

    def spy(fd, n, offset):
        reads.append(offset)
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", spy)
    report = verify_file(path)
    assert report.as_dict() == expected
    assert reads, "the entry of the branch left was read again from the file"
    assert report.counts() == {"responses": 2, "verified": 1, "without_hash": 0, "failed": 1}
    assert report._checker._entries is None  # nothing held but the path


def test_a_left_branch_entry_whose_id_is_not_its_hash_is_read_again_as_itself(tmp_path):
    """A line re-read on the way back to a branch must hash as it did when checked: one
    that states an id its members do not hash to is held under that id, and read again it
    is the same line, not a line that changed (its computed id is what it is held to)."""
    import json

    from agentsession_cas.format.entry import Header, make_entry
    from agentsession_cas.format.reader import verify_file

    ts = "2026-01-01T00:00:00Z"
    root = make_entry("config", None, ts=ts, model="m")
    wrong = "sha256:" + "1" * 64
    a1 = make_entry("item", root.id, ts=ts, item={"type": "message", "role": "user", "content": "on a"})
    a1_line = json.dumps({**a1.data, "id": wrong}, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    b1 = make_entry("item", root.id, ts=ts, item={"type": "message", "role": "user", "content": "on b"})
    a2 = make_entry("item", wrong, ts=ts, item={"type": "message", "role": "user", "content": "back on a"})
    path = tmp_path / "misstated.jsonl"
    path.write_bytes(Header.new("misstated").canonical_line() + root.canonical_line() + a1_line
                     + b1.canonical_line() + a2.canonical_line())
    report = verify_file(path)
    assert report.as_dict() == _old_report(path)
    assert [p.code for p in report.problems] == ["hash"]


def test_cli_verify_streams_the_file(tmp_path, monkeypatch):
    """``agentsession verify FILE`` never reads the file whole."""
    from agentsession_cas.format import reader

    path = _interleaved(tmp_path)

    def whole(*args, **kwargs):
        raise AssertionError("verify read the file whole")

    from agentsession_cas.backends.files import packs

    # The pack writer gathers up to WRITE_BUFFER compressed bytes before a write: a bound of
    # its own, whatever the file's size, taken down here so the measure is the import's.
    monkeypatch.setattr(packs.PackWriter, "WRITE_BUFFER", 1 << 20)
    monkeypatch.setattr(reader, "read_session", whole)
    r = CliRunner().invoke(main, ["verify", str(path)], catch_exceptions=False)
    assert r.exit_code == 1 and "1 request hash(es) verified" in r.stdout and "1 failed" in r.stdout, r.stdout


def test_export_to_a_file_missing_a_blob_leaves_the_file_as_it_was(tmp_path):
    """A sidecar session's blobs are read once its lines are written, before the file is
    renamed into place: one the store lacks is an error, and the file named keeps its bytes."""
    from agentsession_cas.errors import NoSuchObjectError

    st = Store.init(tmp_path / "store")
    s = st.create(Header.new("media-s", media="sidecar"))
    blob = st.put_blob(b"image bytes")
    s.append({"type": "item", "item": {"type": "message", "role": "user",
              "content": [{"type": "input_image", "image_url": f"sidecar:{blob}"}]}})
    s.close()
    out = tmp_path / "out" / "media-s.jsonl"
    out.parent.mkdir()
    st.export_to("media-s", out)
    assert (out.parent / "media-s" / blob[7:]).read_bytes() == b"image bytes"
    before = out.read_bytes()
    out.write_bytes(b"what was there\n")
    Path(st.objects.path("blobs", blob)).unlink()
    with pytest.raises(NoSuchObjectError):
        st.export_to("media-s", out)
    assert out.read_bytes() == b"what was there\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["media-s", "media-s.jsonl"]  # no temp file left
    assert before.startswith(b'{"created_at"')
    st.close()


def test_verify_of_a_stored_session_streams_its_projection(shapes, tmp_path, monkeypatch):
    """``verify ID`` checks the projection as its lines are made, never asking for it whole,
    and says what ``verify`` of the exported file says of the rules."""
    import json

    root, sids = shapes
    exported = {}
    for sid in sids:
        path = tmp_path / f"{sid}.jsonl"
        cli(root, "export", sid, "-o", str(path))
        exported[sid] = json.loads(cli(root, "verify", str(path), "--json").stdout)

    def whole(self):
        raise AssertionError("verify asked for the whole projection")

    monkeypatch.setattr(Session, "projection", whole)
    for sid in sids:
        r = cli(root, "verify", sid, "--json")
        got = json.loads(r.stdout)
        want = exported[sid]
        assert r.exit_code == (0 if want["ok"] else 1) and got["ok"] == want["ok"], (sid, got, want)
        assert got["requests"] == want["requests"], sid


# ---------------------------------------------------------------------------
# import FILE in one pass


def _fresh(tmp_path: Path, name: str) -> Store:
    return Store.init(tmp_path / name)


def _held(st: Store, sid: str) -> tuple:
    s = st.read(sid)
    out = (list(s.log_order), s.head, s.mark, list(s.prefix), s.projection(), s.summary().as_dict())
    s.close()
    return out


def test_import_file_holds_what_an_import_of_the_bytes_holds(shapes, tmp_path):
    """The streamed import (one pass, objects spilled) and the import of the same bytes
    held in memory make the same session: entries, head, mark, prefix, projection and
    summary, for every shape (a fork's prefix, a synthetic marker, labels, no entries)."""
    root, sids = shapes
    src = Store(root, readonly=True)
    for record in (False, True):
        streamed, whole = _fresh(tmp_path, f"streamed-{record}"), _fresh(tmp_path, f"whole-{record}")
        for sid in sids:
            path = tmp_path / f"{sid}.jsonl"
            data = src.export(sid)
            path.write_bytes(data)
            a = streamed.import_file(path, record=record)
            b = whole.import_bytes(data, record=record)
            assert (a.id, len(a), a.head, a.mark) == (b.id, len(b), b.head, b.mark), sid
        streamed.close()
        whole.close()
        s2, w2 = Store(tmp_path / f"streamed-{record}", readonly=True), Store(tmp_path / f"whole-{record}", readonly=True)
        for sid in sids:
            assert _held(s2, sid) == _held(w2, sid), sid
            assert s2.export(sid) == src.export(sid)


def test_import_file_head_is_the_resume_rules_leaf_with_and_without_leaf_labels(tmp_path):
    """The head of a streamed import is the resume rule's leaf of the file: without a
    ``leaf`` label (labels of other names and a branch written last, which the rule
    follows) the rule is fed the last entry alone; with one, every entry. Each is the leaf
    the reader's whole tree gives, and the same as an import of the bytes."""
    from agentsession_cas import make_entry, read_session_bytes

    def item(parent, text):
        return make_entry("item", parent, ts="2026-01-01T00:00:00Z",
                          item={"type": "message", "role": "user", "content": text})

    a = item(None, "a")
    b = item(a.id, "b")
    c = item(b.id, "c")
    good = make_entry("label", c.id, ts="2026-01-01T00:00:00Z", target=b.id, label="good")
    d = item(a.id, "d")  # a branch from a, written last: where a reader resumes
    plain = [a, b, c, good, d]
    leaf = make_entry("label", d.id, ts="2026-01-01T00:00:00Z", target=good.id, label="leaf")
    marked = [*plain, leaf]  # a leaf label moving the reader back to the label entry's branch
    for n, (entries, want) in enumerate(((plain, d.id), (marked, good.id))):
        sid = f"resume{n}"
        data = Header.new(sid).canonical_line() + b"".join(e.canonical_line() for e in entries)
        assert read_session_bytes(data).tree.resume_leaf() == want
        path = tmp_path / f"{sid}.jsonl"
        path.write_bytes(data)
        streamed, whole = _fresh(tmp_path, f"st{n}"), _fresh(tmp_path, f"wh{n}")
        assert streamed.import_file(path).head == whole.import_bytes(data).head == want, n
        streamed.close()
        whole.close()


def test_import_file_refuses_what_the_bytes_import_refuses_and_leaves_the_store(tmp_path):
    """Every corpus and fixture file: imported from the file or from its bytes, it is held
    alike or refused alike (the same error class and code); a refused file leaves the store
    with no session, no pack and nothing in tmp/."""
    for i, path in enumerate(_files()):
        streamed, whole = _fresh(tmp_path, f"s{i}"), _fresh(tmp_path, f"w{i}")
        outcome = []
        for st, do in ((streamed, lambda st, path=path: st.import_file(path)),
                        (whole, lambda st, path=path: st.import_bytes(path.read_bytes(), source=str(path)))):
            try:
                s = do(st)
                outcome.append(("held", s.id, s.head, len(s), st.export(s.id)))
            except Exception as exc:  # compared between the two paths
                outcome.append(("refused", type(exc).__name__, getattr(exc, "code", None)))
        assert outcome[0] == outcome[1], path
        if outcome[0][0] == "refused":
            assert streamed.list() == []
            for where in ("objects/pack", "tmp"):
                d = tmp_path / f"s{i}" / where
                assert not d.exists() or not list(d.iterdir()), (path, where)
        streamed.close()
        whole.close()


def test_import_file_does_not_hold_the_file(tmp_path, monkeypatch):
    """An import reads its file line by line (never whole) and keeps a few ids per entry,
    not the entries: doubling the file (4 MB to 8 MB of entries) moves the import's peak
    (tracemalloc) by a small part of the bytes added; an import that held the file or
    its entries would add them at least once. (The context rules hold the entries on the
    path they stand on, every entry in a linear session; here each entry is a branch of
    the first, so the path stays two entries long and what is measured is the import's
    own holding.)"""
    import tracemalloc

    from agentsession_cas import make_entry
    from agentsession_cas.format import reader

    def whole(*a, **k):
        raise AssertionError("the import read the file whole")

    from agentsession_cas.backends.files import objects, packs

    # The pack writer gathers compressed blocks up to WRITE_BUFFER bytes before a write: a
    # bound of its own (whatever the file's size), which these entries (compressing to
    # almost nothing) would never reach; taken down so the measure is the import's. Its
    # blocks are compressed on the import's own thread: beside it, how many are in flight
    # (up to three of 256 KiB) when the peak is taken depends on timing, which made this
    # measure flaky.
    monkeypatch.setattr(packs.StreamPackWriter, "WRITE_BUFFER", 1)
    monkeypatch.setattr(objects.PackStage, "THREADS", 0)
    monkeypatch.setattr(reader, "read_session", whole)
    monkeypatch.setattr(reader, "read_session_bytes", whole)
    peaks, sizes = [], []
    for n in (128, 256):
        sid = f"big{n}"
        lines = [Header.new(sid).canonical_line()]
        first = parent = None
        for i in range(n):
            e = make_entry("acme:blob", first, ts="2026-01-01T00:00:00Z", data=f"{sid} {i:04d} " + "x" * 32_000)
            lines.append(e.canonical_line())
            first, parent = first or e.id, e.id
        path = tmp_path / f"{sid}.jsonl"
        path.write_bytes(b"".join(lines))
        st = _fresh(tmp_path, sid)
        tracemalloc.start()
        try:
            s = st.import_file(path)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        sizes.append(path.stat().st_size)
        assert len(s) == n and s.head == parent
        st.close()
        assert Store(tmp_path / sid, readonly=True).export(sid) == path.read_bytes()
    assert peaks[1] - peaks[0] < (sizes[1] - sizes[0]) / 4, (peaks, sizes)


def test_whole_pass_commands_keep_the_collector_off_until_they_return(shapes, tmp_path, monkeypatch):
    """verify, import, export and show of a stored session run their pass with the cyclic
    collector off and turn it back on (as it was) once they return: seen from inside the
    pass, and after each command, in this process (CliRunner)."""
    import gc

    from agentsession_cas.format import reader
    from agentsession_cas.store import session as session_mod

    root, sids = shapes
    seen: list[bool] = []
    walk = session_mod._ProjectionWalk
    real_verify, real_walk, real_outline = reader.verify_file, walk.chunks, walk.outline_chunks

    def verify_spy(*a, **k):
        seen.append(gc.isenabled())
        return real_verify(*a, **k)

    def walk_spy(self, **k):
        seen.append(gc.isenabled())
        yield from real_walk(self, **k)

    def outline_spy(self):
        seen.append(gc.isenabled())
        yield from real_outline(self)

    monkeypatch.setattr(reader, "verify_file", verify_spy)
    monkeypatch.setattr("agentsession_cli.file_commands.verify_file", verify_spy)
    monkeypatch.setattr(walk, "chunks", walk_spy)
    monkeypatch.setattr(walk, "outline_chunks", outline_spy)
    path = tmp_path / "s.jsonl"
    path.write_bytes(Store(root, readonly=True).export(sids[0]))
    seen.clear()
    assert gc.isenabled()
    for args in (["verify", str(path)], ["export", sids[0]], ["show", sids[0]]):
        assert cli(root, *args).exit_code == 0, args
        assert gc.isenabled(), args
    other = tmp_path / "other"
    assert cli(other, "init").exit_code == 0
    assert cli(other, "import", str(path)).exit_code == 0
    assert gc.isenabled()
    assert len(seen) >= 4 and not any(seen), seen


def test_a_woken_line_that_keeps_its_id_but_not_its_bytes_is_refused(tmp_path, monkeypatch):
    """The id a line states is a claim: a line rewritten in place with its id kept (its
    content changed, the same length) must not be read as the entry that was checked."""
    from agentsession_cas.errors import SessionFormatError
    from agentsession_cas.format import reader

    monkeypatch.setattr(reader.Parking, "WINDOW", 0)
    path = _interleaved(tmp_path)
    report = reader.verify_file(path)
    entry = list(report.requests)[1].entry
    assert entry.parked
    data = path.read_bytes()
    lines = data.split(b"\n")
    line = lines[entry.line - 1]
    at = line.index(b'"type":"') + len(b'"type":"')
    lines[entry.line - 1] = line[:at] + (b"X" if line[at:at + 1] != b"X" else b"Y") + line[at + 1:]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(SessionFormatError, match="changed while it was verified"):
        entry.data  # noqa: B018


@pytest.mark.parametrize("block", [1, 7, 4096])
@pytest.mark.parametrize("ending", [b"\n", b"", b"\n\n", b"\r\n"])
def test_verify_file_reads_lines_across_its_blocks(tmp_path, monkeypatch, block, ending):
    """verify_file reads its file in blocks and splits the lines out of them: a line
    spanning blocks, a last line with no LF, a blank last line and CRLF lines are read as
    the whole file's lines are (verify_bytes), every report the same; and a line read
    again (a parked entry woken) is found where it was."""
    from agentsession_cas.format import reader

    data = generate(60, 3)[0]
    if ending == b"\r\n":
        data = data.replace(b"\n", b"\r\n")
    elif ending != b"\n":
        data = data[:-1] + ending
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    monkeypatch.setattr(reader, "_BLOCK", block)
    monkeypatch.setattr(reader.Parking, "WINDOW", 0)  # every entry parked: rules that read one back read the file
    seen: list[tuple[int, int]] = []
    got = reader.verify_file(path, progress=lambda done, total: seen.append((done, total)))
    want = reader.verify_bytes(data)
    assert got.as_dict() == {**want.as_dict(), "source": str(path)}
    assert seen[-1] == (len(data), len(data))
    assert [c.entry.data for c in got.requests] == [c.entry.data for c in want.requests]
