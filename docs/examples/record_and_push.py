#!/usr/bin/env python3
"""Record locally, then push: the local-first flow of a Python harness, end to end.

A pretend harness runs two turns of a coding agent (a question, a tool call,
the tool's output, an answer) into a store on local disk, with no network in
its loop, and publishes the session to a second store, which holds it as a
mirror. Then it shows what a crash costs: a third turn is cut off after its
tool call was dispatched, the recorder resumes the session, closes the run the
crash left open, answers the call it cannot tell ran, and pushes again.

Run: ``python docs/examples/record_and_push.py [WORKDIR]`` (a temp directory
by default, removed at the end). Exits 0 when the remote's projection is
byte-identical to the local one and every request hash verifies.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from agentsession_cas import read_session_bytes, short_id, verify_records, verify_requests  # noqa: E402
from agentsession_cas.exchange.recorder import Recorder  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402

TOOLS = [{"type": "function", "name": "ls", "description": "List a directory.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]


def fake_model(request: dict, n: int) -> tuple[str, list[dict]]:
    """Stands in for a provider: asks for `ls` on the first call of a turn, then answers."""
    last = request["input"][-1]
    if last.get("type") == "function_call_output":
        return f"resp_{n}b", [{"type": "message", "role": "assistant",
                               "content": [{"type": "output_text", "text": f"I see: {last['output']}"}]}]
    return f"resp_{n}a", [{"type": "function_call", "call_id": f"call_{n}", "name": "ls",
                           "arguments": '{"path": "."}'}]


def run_turn(rec: Recorder, n: int, question: str, *, crash_after_dispatch: bool = False) -> None:
    rec.run_start()
    rec.user(question)
    while True:
        response_id, output = fake_model(rec.request(), n)  # the request is rebuilt from the record
        rec.items(output, response=response_id)              # complete items only
        rec.response(response_id, model="demo-model", usage={"input_tokens": 100 + n, "output_tokens": 7})
        calls = [item for item in output if item["type"] == "function_call"]
        if not calls:
            break
        for c in calls:
            rec.dispatch(c["call_id"])                     # durable before the tool runs
            if crash_after_dispatch:
                raise SystemExit("crash")                  # the process dies here
            rec.function_output(c["call_id"], "README.md  src  tests")
    rec.run_end()                                          # the reason its segment reads


def main(workdir: str) -> int:
    local, remote = os.path.join(workdir, "local"), os.path.join(workdir, "remote")
    Store.init(remote).close()  # the shared store others read

    print("== record two turns locally, pushing after each")
    rec = Recorder.open(local, harness=("demo-harness", "0.1"), records=["run", "dispatch"],
                        remote=remote, ref="chat/demo")
    sid = rec.session_id
    rec.config(model="demo-model", instructions="You are a careful coding agent.", tools_added=TOOLS)
    for n, question in enumerate(["What is in this directory?", "And now?"], start=1):
        run_turn(rec, n, question)
        r = rec.push()
        print(f"turn {n}: pushed {r.objects} objects ({r.bytes} bytes), {r.entries} entries; "
              f"remote head {short_id(r.head_before)} -> {short_id(r.head_after)} ({r.outcome})")

    print("== turn 3 is cut off after its tool call was dispatched (a crash)")
    try:
        run_turn(rec, 3, "One more time?", crash_after_dispatch=True)
    except SystemExit:
        pass
    rec.store.close()  # the process is gone: what it made durable stays, nothing more is pushed

    print("== resume: the recorder closes the run the crash left open")
    rec = Recorder.open(local, sid, remote=remote, ref="chat/demo")
    for note in rec.notes:
        print("  " + note)
    print(f"  calls without output: {rec.pending_calls()}")
    rec.run_start(source="resume")
    for call_id in rec.pending_calls():
        rec.decision(call_id, "answer", by="policy", reason="the tool may have run before the crash")
        rec.function_output(call_id, "unknown: the harness stopped while the tool ran")
    rec.run_end("stopped")
    r = rec.close()  # commits and pushes what the remote has not seen
    print(f"pushed {r.objects} objects, {r.entries} entries, head {r.outcome}; ref "
          f"{r.refs[0].name} -> {r.refs[0].current}")

    mine = Store(local, readonly=True).export(sid)
    theirs = Store(remote, readonly=True).export(sid)
    sf = read_session_bytes(theirs)
    report, records = verify_requests(sf), verify_records(sf)
    print(f"== the remote holds {len(sf.entries)} entries; {report.verified} request hashes verify; "
          f"record rules: {'ok' if not records.problems else records.problems}")
    if mine != theirs or not report.ok or records.problems:
        print("MISMATCH", file=sys.stderr)
        return 1
    print("the remote's projection is byte-identical to the local one")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(main(sys.argv[1]))
    tmp = tempfile.mkdtemp()
    try:
        sys.exit(main(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
