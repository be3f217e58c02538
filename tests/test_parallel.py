"""verify FILE with the line rules in a helper process (format/parallel.py): the report is
the one-process report, byte for byte, for every file; a helper that cannot start, dies,
is killed or answers out of turn leaves the verdict as it is; no helper outlives a pass."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, make_entry
from agentsession_cas.backends.files.objects import PackStage
from agentsession_cas.backends.files.packs import PackSet, StreamPackWriter, compressor, ready_blocks
from agentsession_cas.errors import AgentSessionError, StoreError
from agentsession_cas.format import parallel, reader
from agentsession_cas.format.canonical import loads_canonical
from agentsession_cas.format.rules import check_line
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cli.main import main
from test_rules import FILES

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
from bench_verify import SESSION_ID, generate

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def forced(monkeypatch):
    """The helper used from the first block (no checking here while it starts), and small
    blocks, so a small file is many blocks; the helpers of the test, for a look at them.
    ``counted[0]`` counts the lines the helper's answers made."""
    monkeypatch.setattr(parallel, "WAIT", True)
    monkeypatch.setattr(reader, "_BLOCK", 512)
    helpers: list[parallel.LineHelper] = []
    real_init = parallel.LineHelper.__init__

    def init(self, **kw):
        real_init(self, **kw)
        helpers.append(self)

    monkeypatch.setattr(parallel.LineHelper, "__init__", init)
    counted = [0]
    real_clean = reader.clean_entry

    def clean(*a, **kw):
        counted[0] += 1
        return real_clean(*a, **kw)

    monkeypatch.setattr(reader, "clean_entry", clean)
    return helpers, counted


def _report(path: Path, processes: bool):
    try:
        return reader.verify_file(path, processes=processes).as_dict()
    except AgentSessionError as exc:
        return f"{type(exc).__name__}: {exc}"


def _mutants(tmp_path: Path) -> list[Path]:
    """The benchmark's session, and copies of it each broken (or made unusual) one way: a
    changed byte, a line not canonical, a float, a repeated line, a cut last line, a bad
    ts, a reserved member, an empty line, a line that is no object, stray bytes."""
    data = generate(120, 7)[0]
    lines = data.split(b"\n")[:-1]
    out = []

    def put(name: str, ls: list[bytes], end: bytes = b"\n") -> None:
        p = tmp_path / f"{name}.jsonl"
        p.write_bytes(b"\n".join(ls) + end)
        out.append(p)

    put("clean", lines)
    ls = list(lines)
    ls[10] = ls[10].replace(b'"text":"', b'"text":"X', 1)
    put("changed", ls)
    ls = list(lines)
    ls[11] = json.dumps(json.loads(ls[11])).encode()  # spaces after ':' and ','
    put("spaced", ls)
    ls = list(lines)
    obj = json.loads(ls[12])
    obj["usage"] = {"cost": 0.5}
    ls[12] = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    put("float", ls)
    ls = list(lines)
    ls.insert(20, ls[19])
    put("repeated", ls)
    put("cut", lines[:-1] + [lines[-1][:40]], end=b"")
    put("no-final-lf", lines, end=b"")
    ls = list(lines)
    ls[30] = ls[30].replace(b'"ts":"2026', b'"ts":"1999', 1)
    put("ts", ls)
    ls = list(lines)
    obj = json.loads(ls[31])
    obj["content"] = 1
    ls[31] = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    put("reserved", ls)
    put("empty-line", [*lines[:40], b"", *lines[40:]])
    put("array", [*lines[:41], b"[1,2]", *lines[41:]])
    put("bytes", [*lines[:42], b"\xff\xfe", *lines[42:]])
    return out


def test_every_file_verifies_the_same_with_the_helper(forced, tmp_path):
    """Every corpus file, fixture and rule case (test_rules.FILES: together they break every
    rule), the benchmark's session and broken copies of it: the report with the helper is
    the one-process report (problems, codes, lines, wording, order, notes, requests)."""
    helpers, counted = forced
    paths = sorted(CORPUS.glob("**/*.jsonl")) + sorted(FIXTURES.glob("**/*.jsonl")) + _mutants(tmp_path)
    cases = tmp_path / "cases"
    cases.mkdir()
    for name, data in sorted(FILES.items()):
        p = cases / f"{name}.jsonl"
        p.write_bytes(data)
        paths.append(p)
    assert len(paths) > 60
    for p in paths:
        assert _report(p, True) == _report(p, False), p
    assert counted[0] > 1000  # the helper's answers were used, not only the reader's own checks
    assert helpers and all(h.failed is None for h in helpers)
    assert all(h.proc is None for h in helpers)  # every helper ended with its pass


def test_import_stores_the_same_with_the_helper(forced, tmp_path, monkeypatch):
    """An import takes each entry's objects from the helper's answers: the store holds the
    same session (export gives the file back), and a bad file is refused the same way."""
    helpers, counted = forced
    data = generate(150, 3)[0]
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    bad = tmp_path / "bad.jsonl"
    ls = data.split(b"\n")
    ls[5] = ls[5].replace(b'"text":"', b'"text":"X', 1)
    bad.write_bytes(b"\n".join(ls))
    errors = []
    for n in ("1", "2"):
        monkeypatch.setenv(parallel.ENV, n)
        with Store.init(tmp_path / f"store{n}") as st:
            s = st.import_file(path)
            assert b"".join(s.projection_lines()) == data
            s.close()
            with pytest.raises(AgentSessionError) as got:
                st.import_file(bad)
            errors.append(str(got.value).replace(str(tmp_path / f"store{n}"), "STORE"))  # (a refusal names its store)
    assert errors[0] == errors[1]
    assert counted[0] >= 150 and helpers and helpers[0].objects


def _packed(root: Path) -> tuple[int, int, int]:
    """A store's packs: how many, their slots, and the objects their indexes name."""
    packs = PackSet(str(root / "objects" / "pack"))
    try:
        packs.refresh(force=True)
        return len(packs.packs), sum(p.slots for p in packs.packs), sum(len(p) for p in packs.packs)
    finally:
        packs.close()


def _imported(root: Path, path: Path, exported: bytes | None = None) -> None:
    """Import ``path`` into a new store at ``root``: export gives the file back (or
    ``exported``), and fsck finds the store sound, every object referenced."""
    with Store.init(root) as st:
        s = st.import_file(path)
        sid = s.id
        s.close()
        assert st.export(sid) == (path.read_bytes() if exported is None else exported)
        report = fsck(st)
        assert report.ok and not report.warnings, report.as_dict()
        assert not any(report.counts["unreferenced"].values()), report.counts


def test_an_import_packs_the_helper_blocks_as_one_process_packs_the_objects(forced, tmp_path, monkeypatch):
    """An import through the helper takes the entries' objects as blocks the helper made
    ready (a file with labels and a synthetic marker among them, which it leaves to this
    process): the store holds one pack of every object, as in one process, and nothing else."""
    helpers, counted = forced
    ready: list[int] = []
    real = PackStage.add_ready
    monkeypatch.setattr(PackStage, "add_ready", lambda self, blocks: (ready.append(len(blocks)), real(self, blocks))[1])
    data = generate(150, 5)[0]
    lines = data.split(b"\n")[:-1]
    leaf = json.loads(lines[-1])["id"]
    marker = make_entry("label", leaf, ts="2026-01-01T00:00:00Z", label="leaf", target=leaf, synthetic=True)
    path = tmp_path / "s.jsonl"
    path.write_bytes(data + marker.canonical_line())
    for n in ("1", "2"):
        monkeypatch.setenv(parallel.ENV, n)
        _imported(tmp_path / f"store{n}", path, data)
    assert sum(ready) > 100 and counted[0] >= 150
    assert _packed(tmp_path / "store1") == _packed(tmp_path / "store2")


def test_an_import_into_a_store_holding_its_objects_packs_none_again(forced, tmp_path, monkeypatch):
    """The same entries imported again (another session's header): each ready block holds
    objects the store's pack holds, so it is opened and its objects taken one by one; none
    is packed a second time."""
    helpers, counted = forced
    monkeypatch.setenv(parallel.ENV, "2")
    data = generate(150, 5)[0]
    first, rest = data.split(b"\n", 1)
    header = json.loads(first)
    header["id"] = "01995b2a-7c3e-7d10-8a4f-3b2c1d0e9f81"
    again = tmp_path / "again.jsonl"
    again.write_bytes(Header(header).canonical_line() + rest)
    (tmp_path / "s.jsonl").write_bytes(data)
    with Store.init(tmp_path / "store") as st:
        st.import_file(tmp_path / "s.jsonl").close()
        before = _packed(tmp_path / "store")
        s = st.import_file(again)
        assert b"".join(s.projection_lines()) == again.read_bytes()
        s.close()
        assert fsck(st).ok
    assert _packed(tmp_path / "store")[1:] == before[1:]


@pytest.mark.parametrize("how", ["killed", "late"])
def test_an_import_whose_helper_fails_or_falls_behind_holds_every_object(forced, tmp_path, monkeypatch, how):
    """The helper killed after its first answers, or every fourth block's answers late (so
    checked here, and their ready blocks dropped with them): the lines this process checks
    are packed here, the others from the helper's blocks, each once."""
    helpers, counted = forced
    real = parallel.LineHelper._answers
    calls = []

    def answers(self):
        calls.append(1)
        if how == "late":
            return None if len(calls) % 4 == 0 else real(self)
        got = real(self)
        if self.proc is not None and len(calls) == 20:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        return got

    data = generate(150, 5)[0]
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    monkeypatch.setenv(parallel.ENV, "1")
    _imported(tmp_path / "alone", path)
    monkeypatch.setenv(parallel.ENV, "2")
    monkeypatch.setattr(parallel.LineHelper, "_answers", answers)
    _imported(tmp_path / "store", path)
    assert 0 < counted[0] < 150 and helpers[-1].checked_here > 0
    assert (helpers[-1].failed is not None) == (how == "killed")
    assert _packed(tmp_path / "store") == _packed(tmp_path / "alone")


def test_a_ready_block_that_is_not_what_it_says_is_refused(tmp_path):
    """A ready block whose frame does not declare its stream's size, or whose names do not
    match its count, is refused by the pack writer (the import is then refused: nothing
    of it is published)."""
    objs = [b'{"a":1}', b'{"b":2}']
    raws = bytes(64)
    good = ready_blocks(raws, b"\x02\x01", objs, compressor())
    assert len(good) == 1 and good[0][1] == 9 * 2 + sum(map(len, objs))
    frame, raw, names, spaces = good[0]
    bad = [(frame, raw + 1, names, spaces), (frame[:4] + b"\x00" * 4, raw, names, spaces), (frame, raw, names[:32], spaces)]
    for block in bad:
        writer = StreamPackWriter(str(tmp_path / "pack"), str(tmp_path / "tmp"))
        with pytest.raises(StoreError):
            writer.add_ready([block])
        writer.abort()
    writer = StreamPackWriter(str(tmp_path / "pack"), str(tmp_path / "tmp"))
    writer.add_ready(good)
    packs = PackSet(str(tmp_path / "pack"))
    try:
        writer.finish()
        packs.refresh(force=True)
        assert [packs.read(*packs.locate("sha256:" + "00" * 32))]  # (both named the same: the first)
    finally:
        packs.close()
    assert not list((tmp_path / "tmp").iterdir())


def test_a_pack_ended_early_takes_no_more_objects_and_publishes_at_finish(tmp_path):
    """An import ends its pack once its pass is over (the thread compresses the last
    blocks and makes it durable beside what the import does next): nothing more is taken
    after, and only finish makes it visible; an abort after the end removes it."""
    block = ready_blocks(bytes(32), b"\x02", [b'{"a":1}'], compressor())
    for publish in (True, False):
        pack = tmp_path / f"pack-{publish}"
        writer = StreamPackWriter(str(pack), str(tmp_path / "tmp"), threads=1)
        writer.add_many(["sha256:" + "11" * 32], b"\x02", [b'{"b":2}'])
        writer.end()
        with pytest.raises(StoreError):
            writer.add_ready(block)
        with pytest.raises(StoreError):
            writer.add_many(["sha256:" + "22" * 32], b"\x02", [b'{"c":3}'])
        assert not pack.exists()
        if publish:
            writer.finish()
            assert len(list(pack.glob("*.idx"))) == 1
        else:
            writer.abort()
        assert not list((tmp_path / "tmp").iterdir())


def test_a_helper_that_dies_midway_leaves_the_verdict(forced, tmp_path, monkeypatch):
    """The helper killed after its first answers: the blocks it had and every later one are
    checked here; the report is the same and the pass says why it gave the helper up."""
    helpers, counted = forced
    path = _mutants(tmp_path)[1]  # one with a problem
    real = parallel.LineHelper._answers

    def killing(self):
        got = real(self)
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        return got

    monkeypatch.setattr(parallel.LineHelper, "_answers", killing)
    assert _report(path, True) == _report(path, False)
    assert helpers[0].failed is not None and "helper" in helpers[0].failed
    assert 0 < counted[0] < 50


@pytest.mark.parametrize("argv", [
    ["/nonexistent/python"],
    [sys.executable, "-c", "pass"],
    [sys.executable, "-c", "import sys, struct; o = sys.stdout.buffer; o.write(b'R' + struct.pack('<II', 0, 999)); "
                           "o.flush(); sys.stdin.buffer.read()"],
    [sys.executable, "-c", "import sys; o = sys.stdout.buffer; o.write(b'R' + b'\\xff' * 9); o.flush(); sys.stdin.buffer.read()"],
], ids=["cannot-start", "exits", "out-of-turn", "garbage"])
def test_a_helper_that_fails_leaves_the_verdict(forced, tmp_path, monkeypatch, argv):
    helpers, counted = forced
    monkeypatch.setattr(parallel, "command", lambda *_: argv)
    for path in _mutants(tmp_path)[:2]:
        assert _report(path, True) == _report(path, False)
    assert counted[0] == 0 and helpers[0].failed is not None
    assert all(h.proc is None for h in helpers)


def test_a_helper_that_never_answers_is_given_up(forced, tmp_path, monkeypatch):
    """A helper alive but silent (stopped, starved): past ``STALL`` (here none at all) the
    pass checks the lines itself, and the helper is killed."""
    helpers, counted = forced
    monkeypatch.setattr(parallel, "command", lambda *_: [
        sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'R'); sys.stdout.flush(); sys.stdin.buffer.read()"])
    real = parallel.LineHelper._readied

    def readied(self):  # (once it said it is ready, no time at all for an answer)
        ready = real(self)
        if ready:
            monkeypatch.setattr(parallel, "STALL", 0.0)
        return ready

    monkeypatch.setattr(parallel.LineHelper, "_readied", readied)
    path = _mutants(tmp_path)[1]
    assert _report(path, True) == _report(path, False)
    assert counted[0] == 0 and "no answer" in (helpers[0].failed or "")
    assert helpers[0].proc is None


def test_the_reader_never_waits_for_a_helper_behind(forced, tmp_path, monkeypatch):
    """Without WAIT (as a command runs), a block whose answer is not there when its turn
    comes is checked here: a helper that never answers costs the pass nothing but its
    start, and the verdict is the same."""
    helpers, counted = forced
    monkeypatch.setattr(parallel, "WAIT", False)
    monkeypatch.setattr(parallel, "command", lambda *_: [
        sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'R'); sys.stdout.flush(); sys.stdin.buffer.read()"])
    path = _mutants(tmp_path)[1]
    assert _report(path, True) == _report(path, False)
    assert counted[0] == 0 and helpers[0].failed is None and helpers[0].checked_here > 100
    assert helpers[0].proc is None


def test_answers_for_blocks_checked_here_are_dropped(forced, tmp_path, monkeypatch):
    """Some blocks' answers late (forced: every fourth block's not there when its turn
    came), so those blocks are checked here; the answers that come later are read and
    dropped in order, and the next blocks take theirs."""
    helpers, counted = forced
    real = parallel.LineHelper._answers
    calls = []

    def sometimes(self):
        calls.append(1)
        return None if len(calls) % 4 == 0 else real(self)

    monkeypatch.setattr(parallel.LineHelper, "_answers", sometimes)
    for path in _mutants(tmp_path)[:4]:
        assert _report(path, True) == _report(path, False), path
    assert counted[0] > 200 and all(h.checked_here > 0 and h.failed is None for h in helpers[::2])


def test_a_block_taken_here_is_skipped_by_the_helper(monkeypatch):
    """A block this process took (its answer not there when its turn came, the helper not
    begun on it) is skipped by the helper, which answers nothing for it; one it had begun
    is not taken. (The helper stopped while the block is taken: no race.)"""
    monkeypatch.setattr(parallel, "WAIT", True)
    lines = [e.canonical_line()[:-1] for e in _entries(3)]
    block = b"\n".join(lines)
    with parallel.LineHelper() as helper:
        assert helper._readied() and helper.proc is not None
        helper.proc.send_signal(signal.SIGSTOP)
        try:
            assert helper._send(block, 3) and helper._send(block, 3)
            assert helper._take(0)
        finally:
            helper.proc.send_signal(signal.SIGCONT)
        assert helper._frame() == [None, None, None]
        answered = helper._frame()
        assert answered is not None and all(k is not None for k in answered)
        assert not helper._take(1)  # (begun: it answered)


def test_the_helper_has_each_block_whole_without_this_process_writing_again(monkeypatch):
    """A block sent is in the memory the two processes share, its head alone in the pipe:
    the helper answers the blocks sent without this process writing anything more (through
    the pipe alone it waited for a block's last bytes until the next write, a block's work
    later, and had not begun the block when its turn came). ``STALL`` short: a helper left
    waiting fails the test at once rather than in a minute."""
    monkeypatch.setattr(parallel, "WAIT", True)
    monkeypatch.setattr(parallel, "STALL", 5.0)
    lines = [e.canonical_line()[:-1] for e in _entries(40, 40_000)]
    block = b"\n".join(lines)
    assert 1 << 20 < len(block) <= parallel._SLOT  # (more than a pipe holds)
    with parallel.LineHelper() as helper:
        assert helper._readied()
        for _ in range(parallel._SLOTS):
            assert helper._send(block, len(lines))
        assert not helper._unwritten
        for _ in range(parallel._SLOTS):
            answered = helper._frame()
            assert answered is not None and all(k is not None for k in answered)
        assert helper.failed is None


@pytest.mark.parametrize("how", ["slots", "a block larger than a slot", "no shared memory"])
def test_blocks_through_the_pipe_or_the_shared_memory_verify_the_same(forced, tmp_path, monkeypatch, how):
    """A block larger than a slot (a very long line) goes through the pipe after its head, as
    every block does where no memory can be shared: the reports are the one-process ones
    either way, and the helper's answers are used."""
    helpers, counted = forced
    monkeypatch.setattr(reader, "_BLOCK", 4096)
    if how == "a block larger than a slot":
        monkeypatch.setattr(parallel, "_SLOT", 6000)  # (blocks of 4 kB and more: some fit, some not)
    elif how == "no shared memory":
        monkeypatch.setattr(parallel, "_shared", lambda size: None)
    for path in _mutants(tmp_path)[:3]:
        assert _report(path, True) == _report(path, False), path
    assert counted[0] > 200 and all(h.failed is None for h in helpers)


def test_the_two_process_pass_holds_its_window_not_the_file(forced, tmp_path):
    """With the helper, the pass holds what test_streaming holds it to in one process, and
    the blocks read ahead (a bound: a few blocks, here of one line each): doubling a linear
    session moves the reader's peak (tracemalloc) by a small part of the bytes added."""
    import tracemalloc

    helpers, counted = forced
    peaks, sizes = [], []
    for n in (400, 800):
        path = tmp_path / f"linear{n}.jsonl"
        path.write_bytes(Header.new(f"linear{n}").canonical_line() + b"".join(e.canonical_line() for e in _entries(n, 8_000)))
        tracemalloc.start()
        try:
            report = reader.verify_file(path, processes=True)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert report.ok and report.entries == n
        sizes.append(path.stat().st_size)
    assert counted[0] > 1000
    assert peaks[1] - peaks[0] < (sizes[1] - sizes[0]) / 4, (peaks, sizes)


def test_a_pass_stopped_midway_ends_its_helper(forced, tmp_path):
    """Ctrl-C (or any error) in the middle of a pass: the helper is killed and reaped."""
    helpers, _ = forced
    path = _mutants(tmp_path)[0]
    calls = []

    def interrupt(done, total):
        calls.append(done)
        if len(calls) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        reader.verify_file(path, processes=True, progress=interrupt)
    assert helpers[0].proc is None


def test_the_helper_ignores_ctrl_c(tmp_path, monkeypatch):
    """Ctrl-C reaches the helper too (one process group): it goes on; the reader decides."""
    monkeypatch.setattr(parallel, "WAIT", True)
    lines = [e.canonical_line()[:-1] for e in _entries(3)]
    with parallel.LineHelper() as helper:
        assert helper._readied()
        assert helper.proc is not None
        helper.proc.send_signal(signal.SIGINT)
        got = list(helper.lines([(b"\n".join(lines), lines)]))
        assert got == lines and all(k is not None for k in helper.known) and helper.failed is None


def _entries(n: int, pad: int = 0):
    """A linear session's ``n`` user messages (each text padded by ``pad`` bytes)."""
    out, parent = [], None
    for i in range(n):
        text = f"t{i} " + "y" * pad
        e = make_entry("item", parent, ts="2026-01-01T00:00:00Z",
                       item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
        out.append(e)
        parent = e.id
    return out


@pytest.mark.parametrize("body", [
    {"item": {"type": "message"}},
    {"item": {}, "x_note": {}},  # the item's bytes twice in the line
    {"a_note": {"item": {"type": "x"}}, "item": {"type": "message"}},  # an "item" key before the item
    {"a_note": {"item": {"type": "message"}}, "item": {"type": "message"}},  # ... holding the same bytes
], ids=["once", "twice", "key-before", "same-before"])
def test_the_item_span_the_helper_gives_holds_the_item_bytes(body):
    """The reader cuts the item's bytes (the request hashes take them) from its own copy
    of the line where the helper says they stand: wherever that is, they are the bytes
    the line rules hashed, and the objects and hash are the reader's own."""
    raw = make_entry("item", None, ts="2026-01-01T00:00:00Z", **body).canonical_line()[:-1]
    got = parallel.answer(raw, objects=True)
    assert got is not None
    chash, start, end, objects = got
    obj, careful, _ = loads_canonical(raw)
    entry, found = check_line(obj, careful=careful, keep_objects=True, raw=raw)
    assert not found and objects == entry.objects and chash == entry.content_hash
    assert raw[start:end] == entry.item_bytes


def test_when_the_helper_is_wanted(monkeypatch):
    monkeypatch.delenv(parallel.ENV, raising=False)
    monkeypatch.setattr(parallel, "_cores", lambda: 2)
    assert parallel.wanted(parallel.MIN_BYTES, None)
    assert not parallel.wanted(parallel.MIN_BYTES - 1, None)
    assert parallel.wanted(0, True) and not parallel.wanted(1 << 40, False)
    monkeypatch.setattr(parallel, "_cores", lambda: 1)
    assert not parallel.wanted(1 << 40, None)
    monkeypatch.setenv(parallel.ENV, "2")
    assert parallel.wanted(0, None)
    monkeypatch.setenv(parallel.ENV, "1")
    monkeypatch.setattr(parallel, "_cores", lambda: 8)
    assert not parallel.wanted(1 << 40, None) and parallel.wanted(0, True)


def test_verify_command_says_the_same_in_both_paths(forced, tmp_path):
    """``agentsession verify FILE`` (and ``--json``) prints the same words either way."""
    helpers, counted = forced
    for path in _mutants(tmp_path)[:4]:
        outs = []
        for n in ("1", "2"):
            for args in ([], ["--json"]):
                r = CliRunner().invoke(main, ["verify", *args, str(path)], env={parallel.ENV: n})
                outs.append((r.exit_code, r.output))
        assert outs[:2] == outs[2:], path
    assert counted[0] > 0 and all(h.proc is None for h in helpers)


def test_standard_input_stays_in_one_process(forced, tmp_path):
    helpers, _ = forced
    data = (Header.new(SESSION_ID).canonical_line() + b"".join(e.canonical_line() for e in _entries(3)))
    r = CliRunner().invoke(main, ["verify", "-"], input=data, env={parallel.ENV: "2"})
    assert r.exit_code == 0, r.output
    assert not helpers


def test_the_architecture_doc_says_how_the_helper_is_started():
    """docs/architecture.md names the helper's command line as `command` builds it: this
    interpreter with `-c` and a program that sets this process's sys.path and runs
    parallel.main (a `python -m` would put the working directory first on the path)."""
    argv = parallel.command("", None)
    assert argv[:2] == [sys.executable, "-c"] and "from agentsession_cas.format.parallel import main" in argv[2]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    assert "python -m agentsession_cas.format.parallel" not in doc
    assert "`python -c`" in doc and "parallel.main" in doc



@pytest.mark.parametrize("mode", ["blocks", "objects", ""])
def test_a_helper_started_early_is_taken_by_the_pass_and_told_its_mode(forced, tmp_path, monkeypatch, mode):
    """``start_early`` (the import command's first step) starts a helper before the pass;
    the pass's LineHelper takes it, tells it what its answers carry, and uses its answers:
    the verdict and the stored session are the one-process ones, and it ends with the pass."""
    helpers, counted = forced
    data = generate(150, 3)[0]
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    parallel.start_early(blocks=mode != "")
    early = parallel._early
    assert early is not None
    if mode == "blocks":  # an import into a file store
        monkeypatch.setenv(parallel.ENV, "2")
        with Store.init(tmp_path / "store") as st:
            s = st.import_file(path)
            assert b"".join(s.projection_lines()) == data
            s.close()
    else:
        taken: list[object] = []
        report = reader.verify_file(path, processes=True, on_entry=taken.append if mode else None).as_dict()
        assert report == _report(path, False) and len(taken) == (150 if mode else 0)
    assert helpers[0].proc is None and early[0] is not None and early[0].returncode is not None
    assert parallel._early is None and helpers[0].failed is None and helpers[0].checked_here == 0
    assert counted[0] > 100 and helpers[0].objects == bool(mode)


def test_a_helper_started_early_and_never_taken_ends(monkeypatch):
    """One no pass takes is killed at this process's exit (``_end_early``, registered with
    atexit); and, this process gone without it, it ends by itself when its input ends."""
    parallel.start_early()
    early = parallel._early
    assert early is not None
    parallel._end_early()
    assert parallel._early is None and early[0].returncode is not None
    proc, claims = parallel._launch(parallel._LATER)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=parallel.STALL) == 0 and proc.stdout.read() == b""
    finally:
        parallel._end_early()  # (nothing: the slot is empty)
        if claims is not None:
            claims.close()
        proc.stdout.close()  # type: ignore[union-attr]


@pytest.mark.parametrize("args, started", [
    (["import", "{big}"], 2),  # (2: told an import's pack module is likely needed)
    (["--store", "S", "import", "--json", "{big}"], 2),
    (["import", "{big}", "--store", "S", "--record"], 2),
    (["-C", "{dir}", "import", "big.jsonl"], 2),
    (["import", "big.jsonl"], 0),  # (not here: in the test's directory)
    (["import", "{small}"], 0),
    (["import", "-"], 0),
    (["import", "{dir}"], 0),
    (["verify", "{big}"], 1),
    (["verify", "--json", "-q", "{big}"], 1),
    (["verify", "01995b2a"], 0),  # (a stored session's id)
    (["show", "{big}"], 0),
    (["--store", "import", "{big}"], 0),  # (the store is named "import")
    ([], 0),
])
def test_the_import_and_verify_commands_start_their_helper_early(tmp_path, monkeypatch, args, started):
    """``agentsession import FILE`` (or ``verify FILE``) of a file the helper is wanted for
    starts it first thing (``run``, before the command's modules load); nothing else does."""
    from agentsession_cli.main import start_helper_early

    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * parallel.MIN_BYTES)
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"x")
    calls: list[int] = []
    monkeypatch.setattr(parallel, "start_early", lambda blocks: calls.append(1 + blocks))
    monkeypatch.setattr(parallel, "keep_heap", lambda: calls.append(-1))  # (its heap kept for the pass)
    monkeypatch.setattr(parallel, "_cores", lambda: 2)
    monkeypatch.delenv(parallel.ENV, raising=False)
    start_helper_early([a.format(big=big, small=small, dir=tmp_path) for a in args])
    assert calls == ([started, -1] if started else [])
    monkeypatch.setenv(parallel.ENV, "1")  # kept in one process: never
    start_helper_early([a.format(big=big, small=small, dir=tmp_path) for a in args])
    assert calls == ([started, -1] if started else [])


@pytest.mark.parametrize("said, want", [
    (None, parallel.HEAP_TUNABLES),
    ("glibc.pthread.rseq=0", (("glibc.pthread.rseq", 0), *parallel.HEAP_TUNABLES)),
    ("glibc.malloc.top_pad=0", (("glibc.malloc.top_pad", 0), *parallel.HEAP_TUNABLES[1:])),  # (the caller's word kept)
])
def test_a_pass_starts_its_processes_with_their_heap_kept(tmp_path, monkeypatch, said, want):
    """The helper and the index's sorting process are started with glibc's heap tunables
    (``parallel.heap_env``: the memory each frees kept for its next allocations, not given
    back and faulted in again), added to any the environment names, a name it sets kept."""
    import subprocess

    if said is None:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    else:
        monkeypatch.setenv("GLIBC_TUNABLES", said)
    envs: list[dict[str, str] | None] = []
    real = subprocess.Popen

    def popen(*args, **kwargs):
        envs.append(kwargs.get("env"))
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    proc, claims = parallel._launch(parallel._LATER)
    parallel._end(proc, claims)
    monkeypatch.setattr(StreamPackWriter, "SORT_ASIDE_AT", 10)
    monkeypatch.setattr(StreamPackWriter, "NOTE_EVERY", 5)
    monkeypatch.setenv(parallel.ENV, "2")
    (tmp_path / "pack").mkdir()
    (tmp_path / "tmp").mkdir()
    w = StreamPackWriter(str(tmp_path / "pack"), str(tmp_path / "tmp"), threads=1)
    for i in range(20):
        w.add("contents", "sha256:" + __import__("hashlib").sha256(b"%d" % i).hexdigest(), b"%d" % i)
    assert w._sorter is not None
    w.finish()
    assert len(envs) == 2  # (the pass's helper and the pack's sorter, packs importing subprocess when it starts one)
    for env in envs:
        assert env is not None and env.get("PATH") == __import__("os").environ.get("PATH")
        assert env["GLIBC_TUNABLES"] == ":".join(f"{name}={value}" for name, value in want)


def test_the_command_keeps_its_heap_through_mallopt_unless_told(monkeypatch):
    """``parallel.keep_heap`` (the command's own process, before its pass) sets the same
    through glibc's ``mallopt``, each unless ``GLIBC_TUNABLES`` names it."""
    import ctypes

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt: Linux")
    calls: list[tuple[int, int]] = []

    class Libc:
        def __init__(self, name):
            assert name is None

        class mallopt:  # a C function's stand-in
            argtypes = restype = None

            def __new__(cls, param, value):
                calls.append((param, value))
                return 1

    monkeypatch.setattr(ctypes, "CDLL", Libc)
    monkeypatch.setenv("GLIBC_TUNABLES", ":".join(f"{name}=1" for name, _ in parallel.HEAP_TUNABLES))
    parallel.keep_heap()
    assert calls == []
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")
    parallel.keep_heap()
    assert calls == [(-2, 64 << 20), (-3, 4 << 20)]
    calls.clear()
    monkeypatch.delenv("GLIBC_TUNABLES")
    parallel.keep_heap()
    assert calls == [(-2, 64 << 20), (-1, 128 << 20), (-3, 4 << 20)]


def test_the_installed_command_imports_with_its_helper_started_early(tmp_path):
    """The command as installed (``run``): the pass takes the helper started early, and the
    store holds the file's session, as ever."""
    import subprocess

    data = generate(150, 3)[0]
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    Store.init(tmp_path / "st").close()
    env = {**__import__("os").environ, parallel.ENV: "2"}
    boot = ("import sys; from agentsession_cli.main import run; from agentsession_cas.format import parallel as p; "
            "real = p.LineHelper.start; p.LineHelper.start = lambda self: (sys.stderr.write(f'early {p._early is not None}'), "
            "real(self))[1]; sys.argv[0] = 'agentsession'; run()")
    out = subprocess.run([sys.executable, "-c", boot, "--store", str(tmp_path / "st"), "import", str(path)],
                         env=env, capture_output=True)
    assert out.returncode == 0 and out.stderr == b"early True", out.stderr
    with Store(tmp_path / "st", readonly=True) as st:
        assert st.export(out.stdout.decode().strip()) == data
