"""`show` and `verify` with contexts and request hashes: output shapes and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, SessionBuilder, read_session, request_hash_for
from agentsession_cas.store import Store
from agentsession_cli.main import main

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
needs_corpus = pytest.mark.skipif(not (CORPUS / "sessions").is_dir(), reason=f"reference corpus not found at {CORPUS}")


def run(*args: str, store: Path | None = None):
    argv = (["--store", str(store)] if store is not None else []) + list(args)
    return CliRunner().invoke(main, argv, catch_exceptions=False)


def short(entry_id: str) -> str:
    return entry_id[7:19]


def msg(role: str, text: str) -> dict:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def write_session(path: Path, *, tamper: bool = False, hashes: bool = True) -> SessionBuilder:
    """config, two turns each with one response; the second response's hash is wrong with ``tamper``."""
    b = SessionBuilder(Header.new("sess-ctx", created_at="2026-09-17T12:00:00Z"))
    b.append("config", ts="2026-09-17T12:00:00Z", model="m1", instructions="Be brief.", extra={"temperature": 0.5})
    for turn in range(2):
        b.append("item", ts=f"2026-09-17T12:00:{turn * 10 + 1:02d}Z", item=msg("user", f"question {turn}"))
        b.append("item", ts=f"2026-09-17T12:00:{turn * 10 + 2:02d}Z", item=msg("assistant", f"answer {turn}"), response=f"r{turn}")
        path_ = [e for e in b.entries]
        body = {"response_id": f"r{turn}", "status": "completed"}
        if hashes:
            body["request_hash"] = request_hash_for(path_, body)
            if tamper and turn == 1:
                body["request_hash"] = "sha256:" + "ab" * 32
        b.append("response", ts=f"2026-09-17T12:00:{turn * 10 + 3:02d}Z", **body)
    b.write(path)
    return b


# -- show ---------------------------------------------------------------------


def test_show_json_carries_the_context_at_the_leaf(tmp_path):
    path = tmp_path / "s.jsonl"
    b = write_session(path)
    out = json.loads(run("show", "--json", str(path)).output)
    ctx = out["context"]
    assert set(ctx) == {"settings", "items", "entries", "item_entries"}
    assert ctx["settings"] == {"model": "m1", "instructions": "Be brief.", "extra": {"temperature": 0.5}}
    assert [i["content"][0]["text"] for i in ctx["items"]] == ["question 0", "answer 0", "question 1", "answer 1"]
    assert ctx["entries"] == out["path"] == [e.id for e in b.entries]
    assert ctx["item_entries"] == [b.entries[i].id for i in (1, 2, 4, 5)]
    assert out["context_hash"].startswith("sha256:") and "context_error" not in out
    assert [("context_hash" in e) for e in out["entries"]] == [True] * len(b.entries)


def test_show_text_prints_settings_and_each_item_with_its_entry(tmp_path):
    path = tmp_path / "s.jsonl"
    b = write_session(path)
    text = run("show", str(path)).output
    assert f"context at {short(b.leaf)}: 4 items from 7 entries" in text
    assert "  model         m1" in text and '  instructions  "Be brief."' in text and "  extra         temperature" in text
    assert f"    1  {short(b.entries[1].id)}  user: \"question 0\"" in text
    assert f"    4  {short(b.entries[5].id)}  assistant: \"answer 1\"" in text


def test_show_leaf_gives_the_context_at_that_entry(tmp_path):
    path = tmp_path / "s.jsonl"
    b = write_session(path)
    out = json.loads(run("show", "--json", "--leaf", short(b.entries[2].id), str(path)).output)
    assert out["leaf"] == b.entries[2].id
    assert out["context"]["item_entries"] == [b.entries[1].id, b.entries[2].id]
    text = run("show", "--leaf", b.entries[0].id, str(path)).output
    assert f"context at {short(b.entries[0].id)}: 0 items from 1 entry" in text


@needs_corpus
@pytest.mark.parametrize("name", ["basic", "omit", "pinned", "handback", "runs"])
def test_show_json_context_is_the_corpus_context(name):
    expected = json.loads((CORPUS / "context" / f"{name}.json").read_text())
    ((key, want),) = expected.items()
    out = json.loads(run("show", "--json", "--leaf", key, str(CORPUS / "sessions" / f"{name}.jsonl")).output)
    assert out["context"] == want


@needs_corpus
def test_show_legacy_leaf_and_omitted_items_in_text():
    out = json.loads(run("show", "--json", "--leaf", "r0000002", str(CORPUS / "sessions" / "branch.jsonl")).output)
    want = json.loads((CORPUS / "context" / "branch.json").read_text())["r0000002"]
    assert out["context"]["items"] == want["items"] and out["context"]["settings"] == want["settings"]
    text = run("show", str(CORPUS / "sessions" / "omit.jsonl")).output
    assert "  omit          reasoning other_models, 1 item" in text
    assert "  left out (other_models)  21deadb6a350  reasoning:" in text
    assert "  left out (items)  c5b17c66c1c9  assistant: \"Answer resp_2.\"" in text


@needs_corpus
def test_show_a_context_that_cannot_be_built():
    path = str(CORPUS / "sessions" / "bad-first-kept.jsonl")
    r = run("show", path)
    assert r.exit_code == 0  # show displays; verify is the checker
    assert 'not built: compaction 45124eea486f: first_kept "zzzz" names no entry on its path before it' in r.output
    out = json.loads(run("show", "--json", path).output)
    assert out["context"] is None and "first_kept" in out["context_error"]


# -- verify -------------------------------------------------------------------


def test_verify_checks_every_request_hash(tmp_path):
    """Per-response lines with -v; without, the summary and the problems only."""
    path = tmp_path / "s.jsonl"
    b = write_session(path)
    r = run("verify", "-v", str(path))
    assert "response " not in run("verify", str(path)).output
    assert r.exit_code == 0, r.output
    for e in b.entries:
        if e.type == "response":
            assert f"response {short(e.id)}: ok" in r.output
    assert r.output.rstrip().endswith(
        "7 entries read, each id checked against its hash; 0 problem(s); 2 response(s): 2 request hash(es) verified, "
        "0 without a hash, 0 failed; 0 run(s) checked"
    )


def test_verify_exits_1_on_a_mismatch_naming_the_response(tmp_path):
    path = tmp_path / "s.jsonl"
    b = write_session(path, tamper=True)
    bad = b.entries[-1]
    r = run("verify", str(path))
    assert r.exit_code == 1
    assert f"response {short(bad.id)}: MISMATCH recorded sha256:{'ab' * 32}" in r.output
    assert "1 problem(s); 2 response(s): 1 request hash(es) verified, 0 without a hash, 1 failed" in r.output
    out = json.loads(run("verify", "--json", str(path)).output)
    assert out["ok"] is False and out["requests"] == {"responses": 2, "verified": 1, "without_hash": 0, "failed": 1}
    assert [(p["code"], p["entry"], p["line"]) for p in out["problems"]] == [("request_hash", bad.id, 8)]
    assert [c["status"] for c in out["responses"]] == ["ok", "mismatch"]
    assert out["responses"][1]["computed"].startswith("sha256:") and out["responses"][1]["entry"] == bad.id


def test_verify_counts_responses_without_a_hash_and_never_calls_them_verified(tmp_path):
    path = tmp_path / "s.jsonl"
    write_session(path, hashes=False)
    r = run("verify", "-v", str(path))
    assert r.exit_code == 0
    assert r.output.count(": no hash recorded") == 2 and ": ok" not in r.output
    assert "2 response(s): 0 request hash(es) verified, 2 without a hash, 0 failed" in r.output


@needs_corpus
def test_verify_refuses_bad_omit_for_the_omit_divergence():
    r = run("verify", str(CORPUS / "sessions" / "bad-omit.jsonl"))
    assert r.exit_code == 1
    assert ("response cc55dc7d634e: MISMATCH recorded sha256:86505dbc16894aef5240fa8a0c3ea1f3f4a7c69b4873b0bbd397f04b1b319e3e, "
            "the request with the items the omit setting leaves out") in r.output
    assert "4 response(s): 3 request hash(es) verified, 0 without a hash, 1 failed" in r.output


@needs_corpus
def test_verify_refuses_bad_first_kept_for_its_first_kept():
    r = run("verify", str(CORPUS / "sessions" / "bad-first-kept.jsonl"))
    assert r.exit_code == 1
    assert 'line 3: compaction 45124eea486f: first_kept "zzzz" names no entry on its path before it' in r.output
    out = json.loads(run("verify", "--json", str(CORPUS / "sessions" / "bad-first-kept.jsonl")).output)
    assert [(p["code"], p["line"]) for p in out["problems"]] == [("first_kept", 3)]


@needs_corpus
def test_verify_notes_an_of_that_cannot_be_resolved():
    r = run("verify", str(CORPUS / "sessions" / "bad-handback.jsonl"))
    # the of is quoted, so the note reads as one line whatever the file holds
    assert ('note: line 18: config bb53025d82e3: an omitted keep names the list of config '
            '"sha256:' + "0" * 64 + '", which its path cannot resolve') in r.output
    assert "5 request hash(es) verified" in r.output
    assert r.exit_code == 0  # as the reference: the element is kept as written, not corruption


@needs_corpus
@pytest.mark.parametrize("name", ["basic", "branch", "compaction", "converge", "fork", "handback", "instructions",
                                  "omit", "pinned", "queued", "runs", "v0.4/basic", "v0.4/compaction"])
def test_verify_every_good_corpus_file_checks_its_hashes(name):
    sf = read_session(CORPUS / "sessions" / f"{name}.jsonl")
    n = sum(1 for e in sf.entries if e.type == "response" and "request_hash" in e.data)
    r = run("verify", str(CORPUS / "sessions" / f"{name}.jsonl"))
    assert r.exit_code == 0, r.output
    assert f"{n} request hash(es) verified" in r.output and n > 0


# -- a stored session ---------------------------------------------------------


def test_verify_a_stored_session_checks_its_request_hashes(tmp_path):
    store = tmp_path / "store"
    assert run("init", store=store).exit_code == 0
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write_session(good)
    b = write_session(bad, tamper=True)
    sid_good = run("import", str(good), store=store).output.strip()
    r = run("verify", sid_good, store=store)
    assert r.exit_code == 0, r.output
    assert "0 problem(s); 2 response(s): 2 request hash(es) verified, 0 without a hash, 0 failed" in r.output
    # the same id twice would clash: make the second one another session
    text = bad.read_text().replace('"id":"sess-ctx"', '"id":"sess-bad"', 1)
    bad.write_text(text)
    # import refuses a file verify rejects, naming the rule; appends store the response
    # (refusing would lose a model's output) and return the mismatch as a finding.
    r = run("import", str(bad), store=store)
    assert r.exit_code == 1 and "MISMATCH" in r.output
    sid_bad = "sess-bad"
    sf = read_session(bad)
    with Store(store) as st:
        s = st.create(sf.header)
        results = [s.append(dict(e.data)) for e in sf.entries]
    assert [p.code for r_ in results for p in r_.findings] == ["request_hash"]
    r = run("verify", sid_bad, store=store)
    assert r.exit_code == 1
    assert f"response {short(b.entries[-1].id)}: MISMATCH recorded" in r.output
    out = json.loads(run("verify", "--json", sid_bad, store=store).output)
    assert out["requests"] == {"responses": 2, "verified": 1, "without_hash": 0, "failed": 1}
    assert [p["where"] for p in out["problems"]] == ["requests"]
    shown = json.loads(run("show", "--json", sid_bad, store=store).output)
    assert len(shown["context"]["items"]) == 4


def test_verify_quiet_prints_nothing_and_sets_the_status(tmp_path):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write_session(good)
    bad.write_bytes(good.read_bytes().replace(b'"sha256:', b'"sha256:0', 1))
    for args, code in ((["-q", str(good)], 0), (["-q", str(bad)], 1), (["-q", "--json", str(bad)], 1)):
        r = run("verify", *args)
        assert (r.exit_code, r.stdout) == (code, ""), (args, r.output)
