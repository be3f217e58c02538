"""Sidecar media checked where it lies (RFC 0001 File: a sidecar is part of the session,
and a reader verifies a blob against its hash as it verifies a content).

``verify FILE`` reads each blob a ``media: sidecar`` file's items name from the
directory beside it (``missing-blob``, ``blob-hash``: format/media.py, the one check);
an import makes the same check and refuses the file, leaving the store as it was; a
stream has no directory beside it, so its blobs are noted as not checked. The stored
side (``verify ID``, fsck) is in the contract suite (tests/test_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header
from agentsession_cas.errors import NoSuchObjectError, SessionFormatError
from agentsession_cas.format.codes import RULES
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.format.reader import verify_bytes, verify_file
from agentsession_cas.store import Store
from agentsession_cli.main import main
from contract_helpers import msg, ts

IMAGES = (b"\x89PNG first image", b"\x89PNG second image")


def _image(name: str) -> dict:
    return {"type": "item", "ts": ts(), "item": {"type": "message", "role": "user",
            "content": [{"type": "input_image", "image_url": f"sidecar:{name}"}]}}


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, list[str]]:
    """A sidecar session's export (header, a message, two images: lines 3 and 4) with
    its blobs beside it, and the blobs' names."""
    with Store.init(tmp_path / "st") as st:
        names = [st.put_blob(b) for b in IMAGES]
        s = st.create(Header.new("media-s", media="sidecar"))
        s.append(msg("look"))
        for name in names:
            s.append(_image(name))
        out = tmp_path / "out" / "media-s.jsonl"
        out.parent.mkdir()
        st.export_to("media-s", out)
    return out, names


def _blob(out: Path, name: str) -> Path:
    return out.parent / "media-s" / name[7:]


def _codes(report) -> list[tuple[int | None, str]]:
    return [(p.line, p.code) for p in report.problems]


def test_a_sound_sidecar_file_verifies_and_each_blob_is_read(exported, monkeypatch):
    out, names = exported
    opened: list[str] = []
    real = open

    def counting(file, *a, **k):
        opened.append(str(file))
        return real(file, *a, **k)

    monkeypatch.setattr("builtins.open", counting)
    report = verify_file(out)
    assert report.ok and not report.notes
    assert sorted(p for p in opened if "/media-s/" in p) == sorted(str(_blob(out, n)) for n in names)


@pytest.mark.parametrize("processes", [False, True])
def test_a_missing_or_altered_blob_beside_a_file_is_a_problem_naming_it(exported, processes):
    out, names = exported
    _blob(out, names[0]).unlink()
    _blob(out, names[1]).write_bytes(b"tampered")
    report = verify_file(out, processes=processes)
    assert _codes(report) == [(3, "missing-blob"), (4, "blob-hash")]
    missing, altered = report.problems
    assert names[0] in missing.message and str(_blob(out, names[0])) in missing.message
    assert str(_blob(out, names[1])) in altered.message and names[1] in altered.message
    assert RULES["missing-blob"].scope == RULES["blob-hash"].scope == "media"


def test_an_inline_session_naming_sidecar_text_is_not_checked(tmp_path):
    """Only a ``media: sidecar`` session's items name blobs (as export reads them)."""
    with Store.init(tmp_path / "st") as st:
        s = st.create(Header.new("s1"))
        s.append(msg(f"see sidecar:{sha256_ref(b'nothing')}"))
        st.export_to("s1", tmp_path / "s1.jsonl")
    assert verify_file(tmp_path / "s1.jsonl").ok


def test_a_stream_notes_its_blobs_were_not_checked(exported):
    out, _ = exported
    report = verify_bytes(out.read_bytes(), source="<stdin>")
    assert report.ok
    [note] = [n for n in report.notes if n.code == "media-unchecked"]
    assert "2 sidecar blob(s)" in note.message and "<stdin>" in note.message


def test_verify_file_from_the_command_fails_and_says_why(exported):
    out, names = exported
    good = CliRunner().invoke(main, ["verify", str(out)])
    assert good.exit_code == 0, good.output
    _blob(out, names[1]).write_bytes(b"tampered")
    r = CliRunner().invoke(main, ["verify", "--json", str(out)])
    assert r.exit_code == 1
    body = json.loads(r.output)
    assert not body["ok"] and [(p["line"], p["code"]) for p in body["problems"]] == [(4, "blob-hash")]
    text = CliRunner().invoke(main, ["verify", str(out)])
    assert text.exit_code == 1 and "does not hash to its name" in text.output
    piped = CliRunner().invoke(main, ["verify", "-"], input=out.read_bytes())
    assert piped.exit_code == 0 and "not checked" in piped.output


@pytest.mark.parametrize("damage", ["missing", "altered"])
def test_import_refuses_a_file_whose_blob_is_missing_or_altered_and_leaves_the_store(exported, tmp_path, damage):
    out, names = exported
    blob = _blob(out, names[1])
    if damage == "missing":
        blob.unlink()
    else:
        blob.write_bytes(b"tampered")
    with Store.init(tmp_path / "two") as two:
        with pytest.raises(SessionFormatError) as ei:
            two.import_file(out)
        assert ei.value.code == "bad_file"
        [p] = ei.value.problems
        assert p.code == ("missing-blob" if damage == "missing" else "blob-hash") and names[1] in p.message
        assert "media-s" not in two and two.list() == []
        with pytest.raises(NoSuchObjectError):
            two.blob(names[1])
        # a blob the store holds already need not lie beside the file
        two.put_blob(IMAGES[1])
        assert two.import_file(out).id == "media-s"
