"""The views of issue 14 through the command: `show --graph`, `diff`, `grep`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, make_entry
from agentsession_cas.store import Store
from agentsession_cas.store.views import diff_sequences, graph_rows
from agentsession_cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TS = "2026-09-17T12:00:00Z"


def cli(store: Path | None, *args: str):
    argv = (["--store", str(store)] if store is not None else []) + list(args)
    return CliRunner().invoke(main, argv, catch_exceptions=False)


def ok(result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def msg(role: str, text: str) -> dict:
    return {"type": "message", "role": role, "content": text}


@pytest.fixture
def store(tmp_path) -> Path:
    """Session `orig`: config, a user turn, an answer (labelled `good`), a retry of the
    answer (a branch), a tool call and its output; session `fork` forked at the answer."""
    root = tmp_path / "store"
    with Store.init(str(root)) as st:
        s = st.create(Header.new("orig"))
        config = s.append({"type": "config", "ts": TS, "model": "m1", "instructions": "Be brief."}).id
        ask = s.append({"type": "item", "ts": TS, "item": msg("user", "Name a Prime number")}).id
        answer = s.append({"type": "item", "ts": TS, "item": msg("assistant", "7 is prime.")}).id
        s.append({"type": "label", "ts": TS, "target": answer, "label": "good"})
        s.append({"type": "item", "ts": TS, "parent": ask, "item": msg("assistant", "Eleven.\nIt is prime too.")})
        s.append({"type": "item", "ts": TS, "item": {"type": "function_call", "call_id": "c1", "name": "lookup_table",
                                                     "arguments": "{\"q\": \"primes\"}"}})
        s.append({"type": "item", "ts": TS, "item": {"type": "function_call_output", "call_id": "c1",
                                                     "output": "2 3 5 7 11"}})
        f = st.fork("orig", answer, session_id="fork")
        f.append({"type": "item", "ts": TS, "item": msg("user", "And a dog's name?")})
        st.create(Header.new("other")).append({"type": "item", "ts": TS, "item": msg("user", "nothing to see")})
        assert config and f.base == answer
    return root


# -- show --graph ---------------------------------------------------------------


def _tree(*spec: tuple[str, str | None]) -> list:
    """Entries named by text, each (name, parent's name), in file order."""
    made: dict = {}
    for name, parent in spec:
        made[name] = make_entry("item", made[parent].id if parent else None, ts=TS, item=msg("user", name))
    return list(made.values())


def test_graph_rows_draw_lanes_as_git_log_graph():
    rows = graph_rows(_tree(("a", None), ("b", "a"), ("c", "b"), ("d", "a"), ("e", "d")))
    assert [(r.branch, r.lanes) for r in rows] == [
        (None, "*"),
        ("|\\", "| *"),  # b: a's first child of two opens a lane
        (None, "| *"),  # c continues it; a's lane stays open for d
        (None, "*"),  # d: a's last child takes a's lane; c's lane closed
        (None, "*"),
    ]


def test_graph_of_a_branch_beside_an_open_lane_crosses_it():
    rows = graph_rows(_tree(("a", None), ("b", "a"), ("x", "a"), ("bb", "b"), ("y", "a"), ("r", None)))
    assert [(r.branch, r.lanes) for r in rows] == [
        (None, "*"),
        ("|\\", "| *"),
        ("|_|\\", "| | *"),  # x: a's lane joined to a third lane, across b's
        (None, "| *"),  # bb, below b; x's lane closed
        (None, "*"),  # y: a's last child
        (None, "*"),  # a second root: a lane of its own
    ]



def test_graph_moves_lanes_left_when_one_ends_before_them():
    rows = graph_rows(_tree(("a", None), ("b", "a"), ("c", "a"), ("bb", "b")))
    assert [(r.branch, r.lanes, r.collapse) for r in rows] == [
        (None, "*", None),
        ("|\\", "| *", None),  # b opens lane 1
        (None, "* |", " /"),  # c, a's last child, is a leaf: its lane ends, b's moves left
        (None, "*", None),  # bb, b's child, in lane 0 now
    ]


def test_show_graph_marks_head_labels_and_branches(store):
    out = ok(cli(store, "show", "--graph", "orig")).splitlines()
    assert out[0].startswith("*  ") and "config" in out[0] and 'instructions "Be brief."' in out[0]
    assert "|\\" in out  # the retry branches from the user turn
    answer = next(line for line in out if '"7 is prime."' in line)
    assert answer.startswith("| *") and answer.endswith("[good]")
    retry = next(line for line in out if "Eleven" in line)
    assert retry.startswith("* |")  # the user turn's last child keeps its lane, beside the open branch
    # the head went on from the label (the retry started a branch and left it there): the
    # retry's lane ends, and the label's moves left into it
    assert out[out.index(retry) + 1] == " /"
    assert out[-1].startswith("*  ") and "output c1" in out[-1] and out[-1].endswith("(head)")
    assert sum("(head)" in line for line in out) == 1


def test_show_graph_of_a_fork_marks_its_base(store):
    out = ok(cli(store, "show", "--graph", "fork")).splitlines()
    assert len(out) == 4  # the prefix root..base, then the fork's own entry
    assert '"7 is prime."' in out[2] and out[2].endswith("(base)")
    assert "And a dog's name?" in out[3] and out[3].endswith("(head)")


def test_show_graph_of_a_file_and_json(store, tmp_path):
    out = ok(cli(None, "show", "--graph", str(FIXTURES / "branches.jsonl")))
    assert out.count("*") == 14 and "|\\" in out and "(head)" in out
    piped = CliRunner().invoke(main, ["show", "--graph", "-"], input=(FIXTURES / "branches.jsonl").read_bytes())
    assert piped.exit_code == 0 and piped.stdout == out
    data = json.loads(ok(cli(store, "show", "--graph", "--json", "orig")))
    assert data["session"] == "orig" and data["base"] is None
    rows = data["entries"]
    assert [r["type"] for r in rows] == ["config", "item", "item", "label", "item", "item", "item"]
    assert rows[-1]["marks"] == ["(head)"] and rows[-1]["id"] == data["head"]
    assert rows[2]["marks"] == ["[good]"] and rows[2]["graph"] == "| *"
    assert rows[2]["branch"] == "|\\" and all("branch" not in r for i, r in enumerate(rows) if i != 2)


def test_show_without_graph_is_unchanged_and_graph_refuses_listing_options(store):
    out = ok(cli(store, "show", "orig"))
    assert "LINE" in out and "context at" in out
    r = cli(store, "show", "--graph", "--tail", "2", "orig")
    assert r.exit_code == 2 and "--graph" in r.stderr and "--tail" in r.stderr


# -- diff -----------------------------------------------------------------------


def test_diff_sequences():
    d = diff_sequences(["a", "b", "c", "x"], ["a", "b", "x", "d"])
    assert d.common == ["a", "b"] and d.only_a == ["c"] and d.only_b == ["d"] and d.shared == {"x"}
    assert not d.same and diff_sequences(["a"], ["a"]).same


def test_diff_of_an_origin_and_its_fork(store):
    out = ok(cli(store, "diff", "orig", "fork")).splitlines()
    assert out[:3] == ["a orig", "b fork", out[2]]
    assert out[2].startswith("common prefix: 3 entries, up to ")
    minus = [line for line in out if line.startswith("- ")]
    plus = [line for line in out if line.startswith("+ ")]
    assert len(minus) == 4 and "label" in minus[0] and "output c1" in minus[-1]
    assert len(plus) == 1 and "And a dog's name?" in plus[0]
    data = json.loads(ok(cli(store, "diff", "--json", "orig", "fork")))
    assert data["common"] == 3 and not data["same"]
    assert [e["type"] for e in data["only_a"]] == ["label", "item", "item", "item"]
    assert [e["summary"] for e in data["only_b"]] == ['user: "And a dog\'s name?"']


def test_diff_of_a_session_with_itself_is_the_same(store):
    data = json.loads(ok(cli(store, "diff", "--json", "orig", "orig")))
    assert data["same"] and data["common"] == 7 and data["only_a"] == data["only_b"] == []
    assert ok(cli(store, "diff", "orig", "orig")).splitlines()[-1] == "common prefix: 7 entries, up to " + \
        data["last_common"].split(":")[1][:12]


def test_diff_of_two_entries_compares_their_paths(store):
    with Store(str(store), readonly=True) as st, st.read("orig") as s:
        ids = s.log_order
    answer, retry, output = ids[2], ids[4], ids[6]
    data = json.loads(ok(cli(store, "diff", "--json", "--session", "orig", answer[7:15], output)))
    assert data["a"] == answer and data["b"] == output and data["common"] == 3
    # the answer is a child of the user turn; the output is below the answer's label
    assert [e["entry"] for e in data["only_a"]] == []
    assert [e["entry"] for e in data["only_b"]] == [ids[3], ids[5], ids[6]]
    data = json.loads(ok(cli(store, "diff", "--json", "--session", "orig", retry, output)))
    assert data["common"] == 2 and [e["entry"] for e in data["only_a"]] == [retry]
    assert [e["entry"] for e in data["only_b"]] == [answer, ids[3], ids[5], ids[6]]
    r = cli(store, "diff", "--session", "orig", "ffff", answer)
    assert r.exit_code == 1 and "ffff" in r.stderr


def test_diff_json_is_emit_json_of_the_document_byte_for_byte(store):
    """diff --json is written as it goes (its rows read in bulk): the bytes are emit_json's
    of the whole document, for two sessions and for two entries' paths."""
    from agentsession_cas.store.views import diff_paths
    from agentsession_cli.describe import describe

    with Store(str(store), readonly=True) as st:
        with st.read("orig") as s:
            ids = s.log_order
        seqs = []
        for sid in ("orig", "fork"):
            with st.read(sid) as s:
                seqs.append([*s.prefix, *s.log_order])
        cases = [(["orig", "fork"], {"a": "orig", "b": "fork"}, diff_sequences(*seqs)),
                 (["--session", "orig", ids[4], ids[6]], {"session": "orig", "a": ids[4], "b": ids[6]},
                  diff_paths(st.ancestry(ids[4]), st.ancestry(ids[6])))]
        for args, sides, d in cases:
            rows = {k: [{"entry": e.id, "parent": e.parent, "type": e.type, "summary": describe(e)}
                        for e in (st.entry(i) for i in getattr(d, k))] for k in ("only_a", "only_b")}
            doc = {**sides, "same": d.same, "common": len(d.common), "last_common": d.common[-1] if d.common else None,
                   **rows, "shared": sorted(d.shared)}
            assert rows["only_a"] and rows["only_b"]
            assert ok(cli(store, "diff", "--json", *args)) == json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def test_diff_of_a_missing_session_is_one_error(store):
    r = cli(store, "diff", "orig", "nosuch")
    assert r.exit_code == 1 and r.stdout == "" and "no such session: nosuch" in r.stderr


# -- grep -----------------------------------------------------------------------


def test_grep_finds_lines_across_the_store(store):
    out = ok(cli(store, "grep", r"prime\b")).splitlines()
    # orig: the answer, the retry's second line; fork: nothing of its own (its prefix is orig's)
    assert len(out) == 2 and all(line.startswith("orig:") for line in out)
    assert out[0].endswith(":item:item.content: 7 is prime.")
    assert out[1].endswith(":item:item.content: It is prime too.")
    assert len(ok(cli(store, "grep", "-i", r"PRIME\b")).splitlines()) == 3  # "Name a Prime number" too
    assert len(ok(cli(store, "grep", "prime")).splitlines()) == 3  # and the call's arguments, "primes"


def test_grep_searches_tool_calls_and_outputs_by_type(store):
    out = ok(cli(store, "grep", "lookup_|11$")).splitlines()
    assert [line.split(":")[-2] for line in out] == ["item.name", "item.output"]
    assert cli(store, "grep", "--type", "config", "Be brief").exit_code == 0
    assert cli(store, "grep", "--type", "item", "Be brief").exit_code == 1


def test_grep_lists_sessions_and_prints_json(store):
    assert ok(cli(store, "grep", "-l", "-i", "dog|nothing")).splitlines() == ["fork", "other"]
    assert ok(cli(store, "grep", "-l", "nothing", "orig", "other")).splitlines() == ["other"]
    data = json.loads(ok(cli(store, "grep", "--json", "primes")))
    assert len(data) == 1 and data[0]["session"] == "orig" and data[0]["field"] == "item.arguments"
    assert data[0]["type"] == "item" and data[0]["entry"].startswith("sha256:") and data[0]["line"] == 1


def test_grep_without_a_match_exits_1_and_a_bad_pattern_2(store):
    r = cli(store, "grep", "zebra")
    assert r.exit_code == 1 and r.stdout == "" and r.stderr == ""
    r = cli(store, "grep", "--json", "zebra")
    assert r.exit_code == 1 and json.loads(r.stdout) == []
    assert cli(store, "grep", "(").exit_code == 2
    r = cli(store, "grep", "x", "nosuch")
    assert r.exit_code == 1 and "no such session: nosuch" in r.stderr


# -- stats ----------------------------------------------------------------------


def _files_bytes(directory: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in directory.glob(pattern) if p.is_file())


def test_stats_counts_objects_logical_and_stored_bytes(store):
    data = json.loads(ok(cli(store, "stats", "--json", "--by-session")))
    with Store(str(store), readonly=True) as st:
        # logical: the sessions' exported entry lines (none of them ends with a synthetic marker)
        exported = {sid: st.export(sid).splitlines(keepends=True)[1:] for sid in ("orig", "fork", "other")}
        distinct = {line for lines in exported.values() for line in lines}
    assert data["sessions"] == 3
    assert data["logical_bytes"] == sum(len(line) for lines in exported.values() for line in lines)
    assert data["distinct_entries"] == len(distinct) == 7 + 1 + 1
    assert data["distinct_bytes"] == sum(len(line) for line in distinct)
    assert data["shared_entries"] == 3  # the fork's prefix: config, user turn, answer
    assert data["dedup"] == round(data["logical_bytes"] / data["distinct_bytes"], 3) and data["dedup"] > 1
    assert data["objects"]["entries"]["count"] == 9 and data["objects"]["blobs"] == {"count": 0, "bytes": 0}
    assert data["stored"] == {"loose": _files_bytes(store / "objects", "[ecb]*/*/*"), "packs": 0}
    by = {s["session"]: s for s in data["by_session"]}
    assert by["fork"] == {"session": "fork", "entries": 4, "own": 1, "shared_entries": 3,
                          "logical_bytes": sum(len(line) for line in exported["fork"]),
                          "shared_bytes": sum(len(line) for line in exported["fork"][:3])}
    assert by["other"]["shared_entries"] == 0 and by["orig"]["shared_entries"] == 3


def test_stats_after_pack_and_as_text(store):
    ok(cli(store, "pack"))
    data = json.loads(ok(cli(store, "stats", "--json")))
    assert data["stored"] == {"loose": 0, "packs": _files_bytes(store / "objects" / "pack", "pack-*")}
    assert "by_session" not in data
    out = ok(cli(store, "stats", "--by-session")).splitlines()
    assert out[0].startswith("objects") and "entries 9 in " in out[0]
    assert any(line.startswith("stored") and "loose 0 bytes, packs " in line for line in out)
    assert any(line.startswith("shared") and "3 entries held by more than one session; dedup " in line for line in out)
    assert out[-4].split() == ["SESSION", "ENTRIES", "OWN", "LOGICAL", "SHARED"]
    assert out[-3].split()[:3] == ["fork", "4", "1"]


def test_stats_of_a_session_whose_writer_did_not_close(store):
    """A writer that did not close (a crash, or one still writing) holds its last appends
    in its log, not yet in objects/: a reader is served them from the log while the
    session is open. stats measured every line after closing the sessions, so it called
    those entries missing (`missing-object`, exit 1) on a sound store."""
    from storetools import crash

    st = Store(str(store), sync="never")
    s = st.session("other")
    s.append({"type": "item", "ts": TS, "item": msg("user", "still here")})
    s.append({"type": "item", "ts": TS, "item": msg("assistant", "yes")})
    crash(st)
    assert not (store / "objects" / "entries" / s.head[7:9] / s.head[9:]).exists()  # in the log only
    data = json.loads(ok(cli(store, "stats", "--json", "--by-session")))
    assert data["problems"] == []
    with Store(str(store), readonly=True) as ro:
        exported = ro.export("other").splitlines(keepends=True)[1:]
    by = {x["session"]: x for x in data["by_session"]}
    assert by["other"]["entries"] == 3 and by["other"]["logical_bytes"] == sum(len(line) for line in exported)
    assert data["distinct_entries"] == 7 + 1 + 3


def test_stats_of_an_empty_store(tmp_path):
    Store.init(str(tmp_path / "empty")).close()
    data = json.loads(ok(cli(tmp_path / "empty", "stats", "--json")))
    assert data["sessions"] == data["logical_bytes"] == data["distinct_entries"] == 0 and data["dedup"] is None
    assert data["objects"]["entries"] == {"count": 0, "bytes": 0}
    assert "dedup" not in ok(cli(tmp_path / "empty", "stats"))


def test_stats_of_a_backend_that_cannot_say_what_it_stores():
    from agentsession_cas.store.url import open_store

    with open_store("memory:views-stats", create=True) as st:
        st.create(Header.new("m")).append({"type": "item", "ts": TS, "item": msg("user", "hi")})
        out = ok(cli("memory:views-stats", "stats"))
        data = json.loads(ok(cli("memory:views-stats", "stats", "--json")))
    assert "stored    not known for this backend" in out.splitlines()
    assert data["stored"] is None and data["stored_bytes"] is None and data["distinct_entries"] == 1


def test_stats_of_a_damaged_store_counts_what_reads_and_names_the_rest(store):
    """A log that does not read and an envelope that does not hash: stats still prints
    every figure it could count, lists the damage as coded problems (fsck's codes), and
    exits 1 (a problem found and reported, docs/cli.md)."""
    with Store(str(store), readonly=True) as st:
        lone = st.session("fork").log_order[0]
        orig_lines = st.export("orig").splitlines(keepends=True)[1:]
    log = store / "sessions" / "other" / "log"
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0x01
    log.write_bytes(bytes(data))
    h = lone.split(":", 1)[1]
    envelope = store / "objects" / "entries" / h[:2] / h[2:]
    envelope.write_bytes(envelope.read_bytes().replace(b'"', b"'", 1))
    before = sorted((p, p.stat().st_mtime_ns) for p in store.rglob("*"))
    r = cli(store, "stats", "--json", "--by-session")
    assert r.exit_code == 1 and r.stderr == "", (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["ok"] is False
    found = {(p["code"], p["session"], p["object"]) for p in doc["problems"]}
    assert ("corrupt-object", None, lone) in found
    assert ("missing-object", "fork", lone) in found
    assert any(code == "log-damage" and sid == "other" for code, sid, _ in found), found
    assert all(p["severity"] == "error" and p["message"] for p in doc["problems"])
    # what reads is counted: the 8 envelopes that hash, the two sessions that read
    assert doc["objects"]["entries"]["count"] == 8
    by = {s["session"]: s for s in doc["by_session"]}
    assert set(by) == {"orig", "fork"} and doc["sessions"] == 2
    assert by["orig"]["logical_bytes"] == sum(len(line) for line in orig_lines)
    assert by["fork"]["entries"] == 4
    # as text: the figures, then each problem one coded line as fsck prints it, exit 1
    r = cli(store, "stats")
    assert r.exit_code == 1 and r.stdout.startswith("objects"), r.stdout
    assert "\nerror: log-damage: session other: " in r.stdout and r.stderr == ""
    assert sorted((p, p.stat().st_mtime_ns) for p in store.rglob("*")) == before  # nothing written


def test_stats_names_a_session_whose_header_file_is_gone(store):
    """A session directory whose header file is gone is not listed, yet it holds a log:
    stats says so with fsck's code (missing-header) and exits 1, rather than leave the
    session out of its figures without a word."""
    (store / "sessions" / "other" / "header").unlink()
    r = cli(store, "stats", "--json")
    assert r.exit_code == 1, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    found = [p for p in doc["problems"] if p["code"] == "missing-header"]
    assert [(p["session"], p["file"]) for p in found] == [("other", "sessions/other/header")]
    assert doc["sessions"] == 2 and doc["ok"] is False
    r = cli(store, "stats")
    assert r.exit_code == 1 and "\nerror: missing-header: session other " in r.stdout, r.stdout


def test_stats_line_sizes_are_the_exported_lines(tmp_path):
    """stats sums each entry's line from its two objects' sizes (format.hashing.line_size),
    never making the line: over the bundled fixtures, imported, what it counts is what
    the exports hold, byte for byte."""
    root = tmp_path / "st"
    with Store.init(str(root)) as st:
        for path in sorted(FIXTURES.glob("*.jsonl")):
            if path.name != "truncated.jsonl":  # (a file that does not verify)
                st.import_file(str(path))
    data = json.loads(ok(cli(root, "stats", "--json", "--by-session")))
    assert len(data["by_session"]) >= 5
    with Store(str(root), readonly=True) as st:
        for s in data["by_session"]:
            lines = st.export(s["session"]).splitlines(keepends=True)[1 : 1 + s["entries"]]  # (a synthetic marker after)
            assert s["logical_bytes"] == sum(map(len, lines)), s


def test_stats_of_a_pack_that_does_not_read_counts_its_loose_copies(store):
    """A packed store whose pack's block does not decompress: stats names the pack once
    (bad-pack, with how many objects it keeps from the count) and still counts an object
    whose loose copy is sound (read_all falls back to it, as get does)."""
    ok(cli(store, "pack"))
    before = json.loads(ok(cli(store, "stats", "--json")))["objects"]
    total = sum(before[space]["count"] for space in before)
    with Store(str(store), readonly=True) as st:
        lone = st.session("other").log_order[0]
        kept = st.objects.get("entries", lone)
    pack = next((store / "objects" / "pack").glob("*.pack"))
    data = bytearray(pack.read_bytes())
    for i in range(40, len(data) - 40, 7):  # the block's compressed bytes, not its frame header
        data[i] ^= 0x55
    pack.write_bytes(bytes(data))
    h = lone.split(":", 1)[1]
    (store / "objects" / "entries" / h[:2] / h[2:]).write_bytes(kept)
    r = cli(store, "stats", "--json")
    assert r.exit_code == 1, r.stdout
    doc = json.loads(r.stdout)
    bad = [p for p in doc["problems"] if p["code"] == "bad-pack"]
    assert len(bad) == 1 and bad[0]["file"] == f"objects/pack/{pack.name}", doc["problems"]
    assert doc["objects"]["entries"] == {"count": 1, "bytes": len(kept)}
    assert f"{total - 1:,} object(s) in it do not read" in bad[0]["message"], bad[0]["message"]


def test_stats_of_a_backend_read_a_chunk_at_a_time_names_the_one_corrupt_object():
    """The seam's read_all reads a chunk of objects at once (get_many: one round trip on
    PostgreSQL); a chunk holding a corrupt object is read again one by one, so stats
    counts every other object and names that one with fsck's code."""
    from agentsession_cas.store.url import open_store

    with open_store("memory:views-stats-chunk", create=True) as st:
        s = st.create(Header.new("m"))
        ids = [s.append({"type": "item", "ts": TS, "item": msg("user", f"turn {i}")}).id for i in range(5)]
        st.backend.objects.data.objects[("entries", ids[2])] = b"{}"
        data = json.loads(cli("memory:views-stats-chunk", "stats", "--json").stdout)
    assert data["objects"]["entries"]["count"] == 4
    assert [(p["code"], p["object"]) for p in data["problems"] if p["session"] is None] == [("corrupt-object", ids[2])]
    assert data["ok"] is False


def test_diff_of_two_entries_reads_their_paths_in_bulk(tmp_path, monkeypatch):
    """`diff --session` of two entries 600 deep walks their paths up through bulk reads of
    the envelopes along the log order (Session.ancestry), never an envelope at a time (it
    read 1,202 of them, one by one), with the output the one-at-a-time walk gives."""
    from agentsession_cas.store import Session
    from agentsession_cas.store.views import diff_paths
    from storetools import count_entry_reads

    root = tmp_path / "store"
    with Store.init(str(root)) as st:
        s = st.create(Header.new("long"))
        ids = [s.append({"type": "item", "ts": TS, "item": msg("user", f"turn {i}")}).id for i in range(600)]
        other = s.append({"type": "item", "ts": TS, "parent": ids[500], "item": msg("user", "retry")}).id
        s.close()
    with Store(str(root), readonly=True) as st:
        d = diff_paths(st.ancestry(ids[-1]), st.ancestry(other))
    assert len(d.common) == 501
    with monkeypatch.context() as m:  # the walk of an envelope at a time, for the output it gives
        m.setattr(Session, "ancestry", lambda self, entry_id: self.store.ancestry(entry_id), raising=False)
        expected = ok(cli(root, "diff", "--json", "--session", "long", ids[-1], other))
    reads = count_entry_reads(monkeypatch)
    out = ok(cli(root, "diff", "--json", "--session", "long", ids[-1], other))
    assert out == expected and json.loads(out)["common"] == 501
    assert not [r for r in reads if r not in (*ids[501:], other)], "an entry off the rows read one at a time"
    assert len(reads) <= 100, len(reads)
