"""Streaming reads (issue 11): ``export`` and ``show`` of a stored session stream its
projection, and give byte for byte what they gave when they held it whole."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header
from agentsession_cas.store import Session, Store
from agentsession_cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
from bench_verify import generate  # noqa: E402  (the benchmark's coding-agent session)


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
    for line in st.export_lines(sids[0]):
        pass
    (walk,) = kept
    assert len(walk.stubs) == len(st.read(sids[0])) and all(
        len(stub) == 3 and isinstance(stub[0], str) and (stub[2] is None or "label" in stub[2]) for stub in walk.stubs
    )


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


def test_cli_verify_streams_the_file(tmp_path, monkeypatch):
    """``agentsession verify FILE`` never reads the file whole."""
    from agentsession_cas.format import reader

    path = _interleaved(tmp_path)

    def whole(*args, **kwargs):
        raise AssertionError("verify read the file whole")

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
