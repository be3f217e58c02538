"""The recorder: a harness records locally, commits where RFC 0001 asks, pushes, and resumes
after a crash (a real process killed mid-run)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from agentsession_cas import is_valid_ts, read_session_bytes, verify_records, verify_requests
from agentsession_cas.errors import MirrorError, StoreError, TransportError
from agentsession_cas.exchange.recorder import Recorder, new_session_id
from agentsession_cas.format.hashing import entry_hashes
from agentsession_cas.store import Store
from agentsession_cas.store.refs import Refs

REPO = Path(__file__).resolve().parents[1]
TOOLS = [{"type": "function", "name": "ls", "parameters": {"type": "object", "properties": {}}}]


def call(call_id: str) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "ls", "arguments": "{}"}


def say(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def turn(rec: Recorder, n: int) -> None:
    """One run: a question, a tool call and its output, an answer."""
    rec.run_start()
    rec.user(f"question {n}")
    rec.items([call(f"call_{n}")], response=f"resp_{n}a")
    rec.response(f"resp_{n}a", model="m1", usage={"input_tokens": 10 + n, "output_tokens": 2})
    rec.dispatch(f"call_{n}")
    rec.function_output(f"call_{n}", f"file_{n}.txt")
    rec.items([say(f"answer {n}")], response=f"resp_{n}b")
    rec.response(f"resp_{n}b", model="m1")
    rec.run_end("done")


def projection(root: Path, sid: str) -> bytes:
    return Store(root, readonly=True).export(sid)


def check_file(data: bytes) -> None:
    """The projection reads clean, every request hash verifies, and the record rules hold."""
    sf = read_session_bytes(data)
    sf.raise_for_problems()
    report = verify_requests(sf)
    assert report.ok and report.verified, report
    check = verify_records(sf)
    assert not check.problems, check.problems


@pytest.fixture
def remote(tmp_path) -> Path:
    Store.init(tmp_path / "remote").close()
    return tmp_path / "remote"


def test_a_harness_records_a_run_and_pushes_it(tmp_path, remote):
    rec = Recorder.open(tmp_path / "local", harness=("my-agent", "1.2"), cwd="/work/proj",
                        records=["run", "dispatch"], remote=remote, ref="chat/C1")
    sid = rec.session_id
    rec.config(model="m1", instructions="Be brief.", tools_added=TOOLS)
    turn(rec, 1)
    assert rec.run_id is None and rec.pending_calls() == []
    result = rec.close()
    assert result.created and result.outcome == "fast-forward" and result.refs[0].moved
    header = Store(remote, readonly=True).read(sid).header.data
    assert header["harness"] == {"name": "my-agent", "version": "1.2"}
    assert header["cwd"] == "/work/proj" and header["records"] == ["run", "dispatch"]
    local = projection(tmp_path / "local", sid)
    assert projection(remote, sid) == local
    check_file(local)
    assert Refs(Store(remote, readonly=True)).resolve("chat/C1") == sid
    for line in local.splitlines()[1:]:
        e = json.loads(line)
        assert is_valid_ts(e["ts"]) and entry_hashes(e)[0] == e["id"]


def test_appends_are_durable_where_the_writing_discipline_asks(tmp_path):
    rec = Recorder.open(tmp_path / "local", harness="h", records=["run"])
    durable = {}
    durable["config"] = rec.config(model="m1").durable
    rec.run_start()
    durable["run start (records names run)"] = rec.session.records()[-1].get("lazy") is None
    durable["user"] = rec.user("hi").durable
    durable["output item"] = rec.items([call("c1")], response="r1")[0].durable
    durable["response"] = rec.response("r1", model="m1").durable
    durable["dispatch"] = rec.dispatch("c1").durable
    durable["function output"] = rec.function_output("c1", "ok").durable
    durable["info"] = rec.record("info", text="note").durable
    durable["run end"] = rec.run_end().durable  # the segment reads stopped: the reason computed
    assert durable == {
        "config": False, "run start (records names run)": True, "user": False, "output item": False,
        "response": True, "dispatch": True, "function output": True, "info": False, "run end": True,
    }
    rec.close()


def test_a_run_end_the_segment_does_not_read_is_refused_and_the_computed_one_written(tmp_path):
    """The segment is authoritative (RFC 0001 run): a recorder never writes an end that
    verify then rejects. Asked for "done" where the segment reads "stopped" (the last
    response made a call, its output came, no model call followed), the store refuses
    it with verify's rule; with no reason given, the computed one is written."""
    from agentsession_cas.errors import AppendRefusedError

    rec = Recorder.open(tmp_path / "local", harness="h", records=["run", "dispatch"])
    rec.run_start()
    rec.user("hi")
    rec.items([call("c1")], response="r1")
    rec.response("r1", model="m1")
    rec.dispatch("c1")
    rec.function_output("c1", "ok")
    before = rec.session.head
    with pytest.raises(AppendRefusedError) as info:
        rec.run_end("done")
    assert info.value.rule == "run-reason" and rec.session.head == before
    result = rec.run_end()
    assert rec.store.entry(result.id).data["reason"] == "stopped"
    rec.close()
    sf = read_session_bytes(rec.store.export(rec.session_id))
    assert verify_records(sf).ok


def test_request_is_what_the_response_hash_covers(tmp_path):
    rec = Recorder.open(tmp_path / "local", harness="h")
    rec.config(model="m1", instructions="Be brief.")
    rec.user("hi")
    request = rec.request()
    assert request["model"] == "m1" and request["store"] is False and len(request["input"]) == 1
    rec.items([say("hello")], response="r1")
    rec.response("r1", model="m1")
    rec.response("r2", model="m1", request_hash=False)
    sid = rec.session_id
    rec.close()
    sf = read_session_bytes(projection(tmp_path / "local", sid))
    assert verify_requests(sf).ok
    responses = [e for e in sf.entries if e.type == "response"]
    assert "request_hash" in responses[0].data and "request_hash" not in responses[1].data


def test_helpers_refuse_what_the_path_does_not_hold(tmp_path):
    rec = Recorder.open(tmp_path / "local", harness="h")
    with pytest.raises(StoreError, match="no function_call"):
        rec.dispatch("call_x")
    with pytest.raises(StoreError, match="no run"):
        rec.run_end("done")
    with pytest.raises(StoreError, match="no remote"):
        rec.push()
    rec.close()
    with pytest.raises(StoreError, match="closed"):
        rec.user("late")


def test_pushes_on_demand_send_what_is_new(tmp_path, remote):
    rec = Recorder.open(tmp_path / "local", harness="h", remote=remote)
    rec.config(model="m1")
    first = rec.push()
    rec.user("one")
    rec.user("two")
    second = rec.push()
    assert (first.entries, second.entries, second.objects, second.complete) == (1, 2, 4, False)
    assert rec.push().objects == 0
    rec.close()


def test_rewind_branches_and_the_remote_follows(tmp_path, remote):
    rec = Recorder.open(tmp_path / "local", harness="h", remote=remote)
    rec.config(model="m1")
    asked = rec.user("first try").id
    rec.items([say("bad answer")], response="r1")
    rec.response("r1", model="m1")
    rec.push()
    rec.rewind(asked)
    rec.items([say("better answer")], response="r2")
    r = rec.response("r2", model="m1")
    result = rec.close()
    assert result.outcome == "moved" and result.head_after == r.id  # not a descendant of the head pushed
    got = Store(remote, readonly=True).read(rec.session_id)
    assert got.head == r.id and len(got) == 6  # the abandoned branch is in the log
    check_file(projection(remote, rec.session_id))


def test_a_mirror_is_not_recorded_into(tmp_path, remote):
    rec = Recorder.open(tmp_path / "local", harness="h", remote=remote)
    rec.config(model="m1")
    sid = rec.session_id
    rec.close()
    with pytest.raises(MirrorError):
        Recorder.open(remote, sid)
    # and the failed open let its store go
    with Store(remote) as st:
        st.session(sid)


def test_close_lets_the_session_go_when_the_push_fails(tmp_path):
    rec = Recorder.open(tmp_path / "local", harness="h", remote=tmp_path / "no-store-here")
    rec.config(model="m1")
    sid = rec.session_id
    with pytest.raises(TransportError):
        rec.close()
    with Store(tmp_path / "local") as st:
        assert len(st.session(sid)) == 1  # committed, and not locked


def test_as_a_context_manager_it_pushes_only_on_a_clean_exit(tmp_path, remote):
    with Recorder.open(tmp_path / "local", harness="h", remote=remote) as rec:
        rec.config(model="m1")
    assert rec.session_id in Store(remote, readonly=True)
    with pytest.raises(RuntimeError):
        with Recorder.open(tmp_path / "local", harness="h", remote=remote) as rec2:
            rec2.config(model="m2")
            raise RuntimeError("harness failed")
    assert rec2.session_id not in Store(remote, readonly=True)
    assert len(Store(tmp_path / "local", readonly=True).read(rec2.session_id)) == 1  # committed locally


def test_session_ids_are_uuid7():
    ids = [new_session_id() for _ in range(50)]
    for text in ids:
        u = uuid.UUID(text)
        assert u.version == 7 and u.variant == uuid.RFC_4122
    assert len(set(ids)) == 50
    ms = [int(t.replace("-", "")[:12], 16) for t in ids]
    assert ms == sorted(ms) and abs(ms[-1] - time.time() * 1000) < 60_000


HARNESS = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from agentsession_cas.exchange.recorder import Recorder

    rec = Recorder.open({local!r}, {sid!r}, harness=("crashy", "0.1"), records=["run", "dispatch"],
                        remote={remote!r})
    rec.config(model="m1", tools_added={tools!r})
    for n in (1, 2):
        rec.run_start()
        rec.user(f"question {{n}}")
        rec.items([{{"type": "function_call", "call_id": f"call_{{n}}", "name": "ls", "arguments": "{{}}"}}],
                  response=f"resp_{{n}}")
        rec.response(f"resp_{{n}}", model="m1")
        rec.dispatch(f"call_{{n}}")
        if n == 2:
            print("DISPATCHED", rec.head, flush=True)
            time.sleep(120)  # the tool runs; the test kills us here
        rec.function_output(f"call_{{n}}", "out")
        rec.run_end("stopped")  # no model call after the output: the harness chose to stop
        rec.push()
        print("PUSHED", n, flush=True)
""")


def test_a_harness_records_crashes_resumes_and_pushes(tmp_path, remote):
    sid = "01990000-0000-7000-8000-00000000c0de"
    script = HARNESS.format(repo=str(REPO), local=str(tmp_path / "local"), sid=sid, remote=str(remote), tools=TOOLS)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().split() == ["PUSHED", "1"]
        line = proc.stdout.readline().split()
        assert line[0] == "DISPATCHED", proc.stderr.read()
        dispatched = line[1]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    pushed_head = Store(remote, readonly=True).read(sid).head
    # Resume: the dispatch was durable, so it and all before it survived; the run it is in
    # was cut off, and the recorder closes it before anything else.
    rec = Recorder.open(tmp_path / "local", sid, remote=remote)
    assert rec.resumed and any("closed run" in n for n in rec.notes)
    entries = list(rec.session)
    assert dispatched in rec.session.own
    end = entries[-1]
    assert (end.type, end.data["phase"], end.data["reason"], end.data["pending"]) == ("run", "end", "error", ["call_2"])
    assert end.parent == dispatched
    assert rec.pending_calls() == ["call_2"]
    # The harness goes on: it answers the call it cannot tell ran, and pushes.
    rec.run_start(source="resume")
    rec.decision("call_2", "answer", by="policy", reason="the tool may have run before the crash")
    rec.function_output("call_2", "unknown: interrupted")
    rec.run_end("stopped")
    result = rec.close()
    assert result.head_before == pushed_head and result.outcome == "fast-forward" and not result.created
    assert result.complete is False  # only what the remote lacked, from what this store remembered
    local = projection(tmp_path / "local", sid)
    assert projection(remote, sid) == local
    check_file(local)


def test_the_example_script_runs(tmp_path):
    script = REPO / "docs" / "examples" / "record_and_push.py"
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "work")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "the remote's projection is byte-identical to the local one" in proc.stdout


def test_closing_after_a_handover_does_not_push_again(tmp_path, remote):
    rec = Recorder.open(tmp_path / "local", harness="h", remote=remote)
    rec.config(model="m1")
    handed = rec.push(handover=True)
    assert handed.handover and rec.session.mark == "mirror"
    with pytest.raises(MirrorError):
        rec.user("the record is elsewhere now")
    assert rec.close() is handed  # nothing more to publish: the remote is the record
    assert Store(remote, readonly=True).read(rec.session_id).mark == "record"


def test_a_push_cut_off_before_it_was_remembered_resumes_cleanly(tmp_path, remote, monkeypatch):
    from agentsession_cas.exchange import operations as exchange

    rec = Recorder.open(tmp_path / "local", harness="h", remote=remote)
    rec.config(model="m1")
    rec.push()
    rec.user("one")

    def killed(point: str) -> None:
        if point == "push:acknowledged":
            raise OSError("killed")

    monkeypatch.setattr(exchange, "_fault", killed)
    with pytest.raises(OSError):
        rec.push()  # the remote took it; the harness died before remembering its head
    monkeypatch.undo()
    sid = rec.session_id
    rec.close(push=False)
    rec = Recorder.open(tmp_path / "local", sid, remote=remote)
    last = rec.user("two").id
    result = rec.close()
    assert result.outcome == "fast-forward" and result.head_after == last
    assert projection(remote, sid) == projection(tmp_path / "local", sid)
