"""Redaction (issue 15, RFC 0001 header ``redacted``): the reader's header rules, and
``export --redact-home/--redact-env/--secret`` with every hash, id and entry reference
recomputed; a redacted file verifies against itself and no store imports it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, open_store, read_session_bytes, verify_session
from agentsession_cas.errors import RedactionError, SessionFormatError, StoreError
from agentsession_cas.format.canonical import canonical_bytes
from agentsession_cas.format.context import request_hash_for
from agentsession_cas.format.hashing import is_hash
from agentsession_cas.format.redact import REDACTED, RedactOptions, redact, redacted_session_id
from agentsession_cas.store import Store
from agentsession_cli.main import main

HOME = "/home/alice"
SECRET = "sk-live-0123456789abcdef"
_N = iter(range(10**9))


def mem() -> Store:
    return open_store(f"memory:redact-{next(_N)}", create=True)


def header_line(**members) -> bytes:
    data = {"type": "session", "format": "agentsession/0.14", "id": "s1", "created_at": "2026-10-05T11:00:00Z",
            "payload": "openresponses/2026-04-24", **members}
    return canonical_bytes(data) + b"\n"


# ---------------------------------------------------------------------------
# the reader's header rules


@pytest.mark.parametrize(("members", "words"), [
    ({"redacted_from": {"session": "orig"}}, "without redacted: true"),
    ({"redacted": False, "redacted_from": {"session": "orig"}}, "without redacted: true"),
    ({"redacted": True, "redacted_from": "orig"}, "not an object naming the original"),
    ({"redacted": True, "redacted_from": {"session": ""}}, "not an object naming the original"),
    ({"redacted": True, "redacted_from": {"session": "s1"}}, "names the session itself"),
    ({"redacted": "yes"}, "is not a boolean"),
])
def test_header_rules_refuse(members, words):
    with pytest.raises(SessionFormatError) as exc:
        read_session_bytes(header_line(**members))
    assert [p.code for p in exc.value.problems] == ["header"] and words in exc.value.problems[0].message


def test_redacted_from_before_013_is_kept_as_written_and_a_good_one_reads():
    sf = read_session_bytes(header_line(format="agentsession/0.12", redacted_from="anything"))
    assert sf.header.data["redacted_from"] == "anything"
    sf = read_session_bytes(header_line(redacted=True, redacted_from={"session": "orig", "profile": "p", "x:y": 1}))
    assert sf.header.data["redacted_from"]["x:y"] == 1


# ---------------------------------------------------------------------------
# the redactor


def user(text: str) -> dict:
    return {"type": "item", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def build(st: Store) -> tuple[str, str]:
    """An origin and a fork of it whose bodies hold the home path and a secret in every
    kind of place an entry names another: target, first_kept, from, queued_from,
    parents (local and into another session) and the header's base."""
    o = st.create(Header.new("origin", cwd=f"{HOME}/proj", harness={"name": "h", "version": "1"}))
    o.append({"type": "config", "model": "m", "instructions": f"Work in {HOME}/proj."})
    first = o.append(user(f"my key is {SECRET}")).id
    o.close()
    f = st.create(Header.new("fork", base=first, cwd=f"{HOME}/proj", **{"acme:note": f"by {HOME}"}))
    path = st.path_to(first)
    body = {"type": "response", "response_id": "r1", "model": "m"}
    body["request_hash"] = request_hash_for(path, body)
    resp = f.append(body).id
    env = f.append({"type": "env", "cwd": f"{HOME}/proj",
                    "files": {"read": {f"{HOME}/proj/a.py": "sha256:" + "a" * 64, "rel/b.py": "sha256:" + "b" * 64}}}).id
    q = f.append({"type": "queued", "item": user(f"steer {SECRET}")["item"], "mode": "steer"}).id
    drained = f.append({**user(f"steer {SECRET}"), "queued_from": q}).id
    f.append({"type": "outcome", "kind": "test", "target": drained, "pass": True, "details": {"log": f"{HOME}/log"}})
    f.append({"type": "compaction", "first_kept": drained, "summary": {"type": "message", "role": "system", "content": "s"},
              "config": {"model": "m"}})
    side = f.append({**user("a side branch"), "parent": env}).id
    f.append({"type": "branch_summary", "from": side, "summary": {"type": "message", "role": "system", "content": "x"}})
    f.append({**user("merged"), "parents": [{"entry": side}, {"entry": "sha256:" + "c" * 64, "session": "elsewhere"}]})
    f.append({"type": "custom", "ns": "acme", "data": {"path": f"{HOME}/x", "call_id": SECRET}, "call_id": "call_1"})
    f.close()
    return resp, env


def test_a_redaction_rewrites_text_recomputes_ids_and_re_points_every_reference():
    st = mem()
    resp, env = build(st)
    original = read_session_bytes(st.export("fork"))
    opts = RedactOptions(home=HOME, env=True, secrets=[r"sk-live-[0-9a-f]+"])
    done = redact(original, opts)
    assert SECRET.encode() not in done.data.replace(b'"call_id":"' + SECRET.encode(), b"")  # call ids name, never say
    assert HOME.encode() not in done.data and REDACTED.encode() in done.data and b"~/proj" in done.data
    sf = read_session_bytes(done.data)
    report = verify_session(sf)
    assert report.ok, [str(p) for p in report.problems]
    assert sorted(p.code for p in report.notes) == ["redacted", "redacted-request"]
    assert report.counts()["failed"] == 0 and report.counts()["redacted"] == 1
    h = sf.header.data
    assert h["redacted"] is True and h["redacted_from"] == {"session": "fork", "profile": opts.profile()}
    assert h["id"] == redacted_session_id("fork", opts.profile()) != "fork"
    assert h["cwd"] == "~/proj" and h["acme:note"] == "by ~" and h["parent_session"] == "origin"
    assert h["base"] == done.ids[original.header.base] and h["base"] in {e.id for e in sf.entries}
    ids = {e.id for e in sf.entries}
    assert len(ids) == len(original.entries) and set(done.ids.values()) == ids
    for e in sf.entries:
        for member in ("target", "first_kept", "from", "queued_from"):
            if member in e.data:
                assert e.data[member] in ids, (e.type, member)
        for ref in e.parents:
            assert (ref.entry in ids) == (ref.session is None)  # into another session: as it was
    by_type = {e.type: e for e in sf.entries}
    assert by_type["env"].body == {} and by_type["response"].get("request_hash") == original.resolve(resp).get("request_hash")
    assert by_type["custom"].get("call_id") == "call_1" and by_type["custom"].get("data")["call_id"] == SECRET
    assert redact(original, opts).data == done.data  # one original under one profile: one file


def test_the_redactor_rewrites_env_paths_and_refuses_what_it_cannot_make():
    st = mem()
    build(st)
    sf = read_session_bytes(st.export("fork"))
    done = read_session_bytes(redact(sf, RedactOptions(home=HOME)).data)
    env = next(e for e in done.entries if e.type == "env")
    assert set(env.get("files")["read"]) == {"~/proj/a.py", "rel/b.py"}
    with pytest.raises(RedactionError, match="two paths"):
        redact(sf, RedactOptions(secrets=[r"^.*\.py$"]))
    with pytest.raises(RedactionError, match="not a regular expression"):
        redact(sf, RedactOptions(secrets=["(unclosed"]))
    with pytest.raises(RedactionError, match="empty"):
        redact(sf, RedactOptions(secrets=[""]))
    with pytest.raises(RedactionError, match="already redacted"):
        redact(done, RedactOptions(home=HOME))
    # two branches that differ only by what is taken out become one entry: refused
    s = mem().create(Header.new("twins"))
    root = s.append(user("root")).id
    s.append({**user("token A1"), "ts": "2026-10-05T11:00:00Z"})
    s.append({**user("token B2"), "parent": root, "ts": "2026-10-05T11:00:00Z"})
    with pytest.raises(RedactionError, match="same entry as line"):
        redact(read_session_bytes(s.projection()), RedactOptions(secrets=[r"token \w+"]))


def test_a_store_never_imports_a_redacted_file():
    st = mem()
    build(st)
    done = redact(read_session_bytes(st.export("fork")), RedactOptions(home=HOME))
    with pytest.raises(StoreError, match="redacted"):
        mem().import_bytes(done.data)


# ---------------------------------------------------------------------------
# the command


def cli(store, *args, input=None, env=None):
    return CliRunner().invoke(main, ["--store", str(store), *args], input=input, env=env, catch_exceptions=False)


def test_export_redact_on_the_command(tmp_path: Path):
    path = tmp_path / "st"
    st = Store.init(path)
    build(st)
    st.close()
    r = cli(path, "export", "fork", "--secret", r"sk-live-\w+", "--redact-home", "--redact-env", env={"HOME": HOME})
    assert r.exit_code == 0, r.output
    assert HOME.encode() not in r.stdout_bytes and REDACTED.encode() in r.stdout_bytes
    assert "redacted: 12 entries rewritten as session" in r.stderr
    out = tmp_path / "red.jsonl"
    r = cli(path, "export", "fork", "--secret", r"sk-live-\w+", "-o", str(out))
    assert r.exit_code == 0 and SECRET.encode() not in out.read_bytes().replace(b'"call_id":"' + SECRET.encode(), b"")
    v = cli(path, "verify", str(out))
    assert v.exit_code == 0, v.stdout
    assert "this redacted file's, never the original's" in v.stdout and "not rebuilt (redacted)" in v.stdout
    assert "note: line 1: the header says the file was redacted" in v.stdout
    i = cli(path, "import", str(out))
    assert i.exit_code == 1 and "redacted" in i.stderr
    bad = cli(path, "export", "fork", "--secret", "(")
    assert bad.exit_code == 2 and "not a regular expression" in bad.stderr  # a usage error (docs/cli.md "Options")
    plain = cli(path, "export", "fork")
    assert SECRET.encode() in plain.stdout_bytes and b'"redacted"' not in plain.stdout_bytes
    data = json.loads(cli(path, "verify", str(out), "--json").stdout)
    assert data["ok"] is True and data["requests"]["redacted"] == 1
    assert is_hash(read_session_bytes(out.read_bytes()).header.base)


def test_export_refuses_redaction_with_another_projection(tmp_path: Path):
    path = tmp_path / "st"
    st = Store.init(path)
    build(st)
    st.close()
    r = cli(path, "export", "fork", "--format", "atif", "--secret", "sk")
    assert r.exit_code == 2 and "redacted session file" in r.stderr and r.stdout == ""
