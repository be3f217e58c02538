"""show reads a session once as it comes (issue 11): what it holds of a long path stays
bounded, its JSON writer prints emit_json's bytes, a bad --leaf leaves standard output
empty, and a file changed between its read and its listing is refused. (What every mode
prints is pinned by test_show_modes_golden.py.)"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentsession_cas.format.entry import Entry
from agentsession_cas.format.reader import Parking
from agentsession_cas.store import Store, showing
from agentsession_cli.common import JsonStream, Made, emit_json, indented
from agentsession_cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
from bench_verify import generate


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("show-streaming") / "s.jsonl"
    path.write_bytes(generate(600, 11)[0])
    return path


def _awake(entries: list[Entry]) -> int:
    return sum(1 for e in entries if not e.parked)


def test_the_runs_walk_and_the_context_hold_a_window_of_the_path(session):
    """The runs report walks the leaf's path again and the context's items are read back
    one at a time: once done, what stays parsed of the path is the parking window, not
    the path (a long session's show --json held every entry of it)."""
    read = showing.read_file(str(session), hashes=True)
    assert read.report is not None
    leaf = read.leaf()
    path = read.outline.path(leaf) if leaf is not None else []
    assert len(path) > 3 * Parking.WINDOW
    parking = read.parking()
    read.report.runs_report(leaf, settle=parking.settle, tidy=parking.tidy, path=read.path_entries(path))
    ctx = read.report.context_at(leaf, hold_items=False)
    for _ in ctx.items:
        parking.tidy()
    gc.collect()
    ours = set(read.outline.ids)  # (another test of the process may hold entries of its own)
    entries = [o for o in gc.get_objects() if isinstance(o, Entry) and o.id in ours]
    assert len(entries) >= len(path)
    assert _awake(entries) <= 2 * Parking.WINDOW + 2, (_awake(entries), len(path))


@pytest.mark.parametrize("value", [
    {"a": 1, "b": [1, 2.5, 1e-07, 1e21, 2**70, None, True], "c": {}, "d": [], "e": "caf\u00e9 \u2028 \x1f \\ \""},
    {"nested": {"deep": [{"x": [[]]}], "s": "plain"}, "n": -0.0},
    {"ascii": "before", "lone": "\ud800 after"},
    {"ids": ["sha256:ab", "caf\u00e9", "x\ny \"q\""], "one": ["z"], "deep": {"ids": ["a", "b"]}},
    {"ids": ["a", "b\ud800", "caf\u00e9"], "after": ["x", "y"]},
])
def test_the_json_stream_writes_what_emit_json_writes(value, capsys):
    emit_json(value)
    whole = capsys.readouterr().out
    out = JsonStream()
    for k, v in value.items():
        out.member(k, v)
    out.end()
    assert capsys.readouterr().out == whole
    # a list member written an element at a time, and a lazy sequence inside a member
    out = JsonStream()
    out.open_list("rows")
    for k in value:
        out.item({"key": k, "value": value[k]})
    out.close_list()
    out.member("lazy", {"items": _Lazy(list(value.values())), "n": len(value)})
    # elements whose text was made ahead (show --json's context items): that text, unless
    # the stream escapes every non-ASCII character by then (a lone surrogate met), when
    # the value is written as any is
    made = [Made(text, lambda v=v: v) if (text := indented(v)) is not None else v for v in value.values()]
    out.member("made", _Lazy(made))
    out.end()
    streamed = capsys.readouterr().out
    emit_json({"rows": [{"key": k, "value": value[k]} for k in value], "lazy": {"items": list(value.values()), "n": len(value)},
               "made": list(value.values())})
    assert streamed == capsys.readouterr().out


class _Lazy(Sequence[Any]):
    """A sequence that is not a list (a context's items, read one at a time)."""

    def __init__(self, of: list[Any]) -> None:
        self._of = of

    def __len__(self) -> int:
        return len(self._of)

    def __getitem__(self, i: Any) -> Any:
        return self._of[i]


def test_a_bad_leaf_name_leaves_nothing_on_standard_output(session):
    r = CliRunner().invoke(main, ["show", str(session), "--json", "--leaf", "deadbeef"])
    assert r.exit_code == 1
    assert r.stdout == ""
    assert "no such entry: deadbeef" in r.stderr


def test_a_file_changed_after_it_was_read_is_refused(tmp_path, session):
    path = tmp_path / "s.jsonl"
    path.write_bytes(session.read_bytes())
    read = showing.read_file(str(path))
    with open(path, "ab") as f:  # a writer appends once the read is over
        f.write(b'{"type":"item"}\n')
    with pytest.raises(OSError, match="changed while it was shown"):
        list(read.entries(range(len(read.outline))))


def test_a_stored_session_and_its_file_show_the_same_json(tmp_path, session):
    """The stored session's document is its file's, but for what names where it came from."""
    root = tmp_path / "store"
    with Store.init(root) as st:
        sid = st.import_file(session).id
    as_file = json.loads(CliRunner().invoke(main, ["show", str(session), "--json"]).stdout)
    stored = json.loads(CliRunner().invoke(main, ["--store", str(root), "show", sid, "--json"]).stdout)
    for doc, source in ((stored, sid), (as_file, str(session))):
        assert doc.pop("source") == doc["runs"].pop("source") == source
    assert stored == as_file


@pytest.mark.parametrize("window", [None, 4096])
def test_a_stored_sessions_json_reads_each_content_once(tmp_path, session, monkeypatch, window):
    """show --json of a stored session reads each entry from the store once: its context's
    items are written from the text made of them as the walk read them, not read back
    from the store at the end (half the command's time on a long session). With a small
    window the texts go through the temporary file, read back a window at a time."""
    from agentsession_cas.store import views
    from agentsession_cli import file_commands

    if window is not None:
        monkeypatch.setattr(file_commands._ItemTexts, "WINDOW", window)

    root = tmp_path / "store"
    with Store.init(root) as st:
        sid = st.import_file(session).id
    ref = CliRunner().invoke(main, ["show", str(session), "--json"])
    read: list[int] = []
    listing = views.listing_entries

    def counted(s: Any, outline: Any, positions: Any) -> Any:
        for pos, e in listing(s, outline, positions):
            read.append(pos)
            yield pos, e

    monkeypatch.setattr(views, "listing_entries", counted)
    r = CliRunner().invoke(main, ["--store", str(root), "show", sid, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["context"]["items"]) > 100
    assert sorted(read) == list(range(len(doc["entries"])))
    assert doc["context"] == json.loads(ref.stdout)["context"]


@pytest.mark.parametrize("fails", ["open", "write", "read"])
def test_a_stored_sessions_json_is_whole_when_its_spool_cannot_be_written(tmp_path, session, monkeypatch, fails):
    """The temporary file show --json spools its items' texts to is a shortcut: where it
    cannot be made, written (its directory full) or read back, every item is read from its
    entry as before it, the same bytes, exit 0 (a reviewer: a full TMPDIR cut the document
    short with a no_space error blaming the store)."""
    import errno
    import tempfile

    from agentsession_cli import file_commands

    root = tmp_path / "store"
    with Store.init(root) as st:
        sid = st.import_file(session).id
    whole = CliRunner().invoke(main, ["--store", str(root), "show", sid, "--json"])
    assert whole.exit_code == 0
    monkeypatch.setattr(file_commands._ItemTexts, "WINDOW", 4096)
    full = OSError(errno.ENOSPC, "No space left on device")

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise full

    if fails == "open":
        monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    elif fails == "write":
        made = tempfile.TemporaryFile

        class Full:
            def __init__(self) -> None:
                self.f, self.n = made(), 0

            def write(self, data: bytes) -> int:
                self.n += 1
                if self.n > 1:  # (the second window: some texts already spooled)
                    raise full
                return self.f.write(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.f, name)

        monkeypatch.setattr(tempfile, "TemporaryFile", Full)
    else:
        made, spools, pread = tempfile.TemporaryFile, set(), file_commands.os.pread

        def spool() -> Any:
            f = made()
            spools.add(f.fileno())
            return f

        monkeypatch.setattr(tempfile, "TemporaryFile", spool)
        # (os.pread is every reader's: only the spool's read back fails, after its first window)
        monkeypatch.setattr(file_commands.os, "pread",
                            lambda fd, n, at: refuse() if fd in spools and at > 0 else pread(fd, n, at))
    r = CliRunner().invoke(main, ["--store", str(root), "show", sid, "--json"])
    assert r.exit_code == 0, r.output
    assert r.stdout == whole.stdout


def test_standard_input_shows_as_its_file(session):
    """A session read from standard input is held (nowhere to read it again from): every
    mode prints what the file's does (a long path once parked what it could not wake)."""
    data = session.read_bytes()
    for opts in (["--json"], ["--runs"], ["--graph"], []):
        from_stdin = CliRunner().invoke(main, ["--no-pager", "show", "-", *opts], input=data)
        from_file = CliRunner().invoke(main, ["--no-pager", "show", str(session), *opts])
        assert from_stdin.exit_code == from_file.exit_code == 0, from_stdin.stderr
        assert from_stdin.stdout == from_file.stdout.replace(json.dumps(str(session)), '"-"', 1).replace(
            json.dumps(str(session)), '"<stdin>"'), opts
