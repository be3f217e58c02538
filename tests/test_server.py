"""The RFC 0003 server over a real socket: capabilities, auth and scopes, sessions, the
log and the path, objects and their visibility, leases and writing, refs, limits,
errors as problem+json, Idempotency-Key replay.

Every test talks to `agentsession serve` in its own process (tests/server_helpers.py)
with httpx; nothing is mocked at the HTTP layer.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from agentsession_cas import Header
from agentsession_cas.errors import SessionLockedError
from agentsession_cas.exchange import push
from agentsession_cas.exchange.http_client import HttpTransport
from agentsession_cas.exchange.wire import OBJECTS, FrameReader
from agentsession_cas.format.canonical import canonical_bytes
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cas.store.refs import header_ident
from server_helpers import TOKENS, ServerProcess
from server_helpers import served as served  # a fixture; "as served" marks it used on purpose (F401, F811)
from storetools import count_entry_reads

TS = "2026-09-17T12:00:00Z"


def user(text: str, n: int = 0) -> dict:
    return {"type": "item", "ts": f"2026-09-17T12:{n // 60 % 60:02d}:{n % 60:02d}Z",
            "item": {"type": "message", "role": "user", "content": text}}


def lines(response) -> list[dict]:
    assert response.headers["content-type"].startswith("application/x-ndjson"), response.text
    out = [json.loads(x) for x in response.text.splitlines()]
    assert out and out[-1].get("end") is True, out
    return out


def problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == code, body
    assert body["status"] == status and body["detail"]
    return body


def create(c, sid: str, **header) -> dict:
    created_at = header.pop("created_at", TS)
    r = c.post("/v1/sessions", json=Header.new(sid, created_at=created_at, **header).data)
    assert r.status_code in (200, 201), r.text
    return r.json()


def lease(c, sid: str, ttl_ms: int = 60_000) -> dict:
    r = c.post(f"/v1/sessions/{sid}/lease", json={"holder": "test", "ttl_ms": ttl_ms})
    assert r.status_code == 201, r.text
    return r.json()


def append(c, sid: str, token: int, *entries: dict, commit: bool = False):
    body = b"".join(json.dumps(e).encode() + b"\n" for e in entries)
    return c.post(f"/v1/sessions/{sid}/entries", content=body, params={"commit": str(commit).lower()},
                  headers={"Lease-Token": str(token)})


def recorded(c, sid: str, n: int, **header) -> tuple[dict, list[str]]:
    """A session created and leased over the wire, with a config and n user items."""
    create(c, sid, **header)
    held = lease(c, sid)
    r = append(c, sid, held["token"], {"type": "config", "ts": TS, "model": "m1"},
               *[user(f"{sid} turn {i}", i) for i in range(n)], commit=True)
    assert r.status_code == 200 and r.json()["stopped"] is None, r.text
    return held, [x["id"] for x in r.json()["results"]]


# -- capabilities and the routes not built ------------------------------------------------


def test_capabilities_are_truthful(served):
    with served.client("reader") as c:
        caps = c.get("/v1/").json()
        assert caps["auth"] == "bearer"
        assert caps["principal"] == {"name": "reader", "scopes": ["read"], "sessions": ""}
        features = caps["features"]
        assert features["objects"] and features["exchange"] and features["leases"] and features["refs"]
        assert caps["limits"]["max_body_bytes"] > 0 and caps["limits"]["max_lease_ttl_ms"] > 0
        # What is not claimed answers 501 unsupported, a problem body; an unknown path 404.
        assert features["follow"] is True  # tests/test_server_follow.py
        problem(c.get("/v1/sessions/x/follow"), 404, "no_session")
        assert features["shallow"] is True  # test_a_shallow_path_leaves_out_what_the_fold_replaced
        assert features["ref_follow"] is True and features["ref_log"] is True  # test_ref_log_over_the_wire
        problem(c.get("/v1/no/such/route"), 404, "unsupported")
        problem(c.delete("/v1/"), 405, "unsupported")


# -- authentication and scopes ------------------------------------------------------------


def test_every_request_is_authenticated(served):
    with served.client() as c:
        r = c.get("/v1/")
        problem(r, 401, "auth")
        assert r.headers["www-authenticate"].startswith("Bearer")
        problem(c.get("/v1/", headers={"Authorization": "Bearer not-a-token-we-know"}), 401, "auth")
        problem(c.get("/v1/", headers={"Authorization": "Basic dXNlcjpwYXNz"}), 401, "auth")


def test_a_token_without_the_scope_is_403(served):
    with served.client("all") as c:
        recorded(c, "s1", 1)
    with served.client("reader") as c:
        problem(c.post("/v1/sessions", json={"id": "r1", "created_at": TS}), 403, "scope")
        problem(c.post("/v1/sessions/s1/lease", json={"ttl_ms": 1000}), 403, "scope")
        problem(c.put(f"/v1/objects/contents/{sha256_ref(b'{}')}", content=b"{}"), 403, "scope")
        problem(c.post("/v1/objects/missing", json={"entries": []}), 403, "scope")
        problem(c.put("/v1/refs/x", json={"expected": None, "next": "s1"}), 403, "scope")
        assert c.get("/v1/sessions/s1").status_code == 200
    with served.client("nobody") as c:
        problem(c.get("/v1/sessions/s1"), 403, "scope")
        problem(c.get("/v1/sessions"), 403, "scope")
    with served.client("writer") as c:
        problem(c.post("/v1/sessions/s1/lease/break"), 403, "scope")


def test_a_token_with_a_sessions_prefix_touches_only_those(served):
    with served.client("all") as c:
        recorded(c, "a-1", 1)
        recorded(c, "b-1", 1)
    with served.client("team-a") as c:
        assert [x["id"] for x in lines(c.get("/v1/sessions"))[:-1]] == ["a-1"]
        assert c.get("/v1/sessions/a-1").status_code == 200
        # Refused whether or not it exists: the answer says nothing of b-1.
        problem(c.get("/v1/sessions/b-1"), 403, "scope")
        problem(c.get("/v1/sessions/b-nothing"), 403, "scope")
        problem(c.get("/v1/sessions/b-1/log"), 403, "scope")
        problem(c.post("/v1/sessions", json={"id": "b-2", "created_at": TS}), 403, "scope")
        create(c, "a-2")


def test_without_auth_the_server_listens_on_loopback_only(tmp_path):
    Store.init(tmp_path / "st").close()
    r = subprocess.run([sys.executable, "-m", "agentsession_cas", "--store", str(tmp_path / "st"), "serve",
                        "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "loopback only" in r.stderr
    with ServerProcess(tmp_path / "st") as server, server.client() as c:
        caps = c.get("/v1/").json()
        assert caps["auth"] == "none (loopback only)"
        assert set(caps["principal"]["scopes"]) == {"read", "write", "refs", "exchange", "admin"}


def test_a_bad_token_file_is_refused_naming_what(tmp_path):
    Store.init(tmp_path / "st").close()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tokens": [{"token": "short", "scopes": ["read"]}]}))
    r = subprocess.run([sys.executable, "-m", "agentsession_cas", "--store", str(tmp_path / "st"), "serve",
                        "--auth", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "tokens[0]" in r.stderr and "16 characters" in r.stderr


# -- sessions, the log and the path ---------------------------------------------------------


def test_create_get_list_and_a_retried_create(served):
    with served.client("all") as c:
        facts = create(c, "s1", cwd="/w")
        assert facts["session"] == "s1" and facts["head"] is None and facts["mark"] == "record"
        header = facts["header"]
        assert facts["incarnation"] == header_ident(header)
        # A complete header retried returns the session; another header is session_exists.
        again = c.post("/v1/sessions", json=header)
        assert again.status_code == 200 and again.json()["incarnation"] == facts["incarnation"]
        problem(c.post("/v1/sessions", json=dict(header, cwd="/elsewhere")), 409, "session_exists")
        got = c.get("/v1/sessions/s1")
        assert got.headers["incarnation"] == facts["incarnation"]
        assert got.json()["length"] == 0 and got.json()["cursor"]
        create(c, "s2", cwd="/v", created_at="2026-09-18T00:00:00Z")
        listed = lines(c.get("/v1/sessions"))
        assert [x["id"] for x in listed[:-1]] == ["s2", "s1"]  # newest first
        assert [x["id"] for x in lines(c.get("/v1/sessions", params={"cwd": "/w"}))[:-1]] == ["s1"]
        assert [x["id"] for x in lines(c.get("/v1/sessions", params={"limit": "1"}))[:-1]] == ["s2"]
        assert [x["id"] for x in lines(c.get("/v1/sessions", params={"extra": 'cwd:"/v"'}))[:-1]] == ["s2"]
        problem(c.get("/v1/sessions", params={"page": "2"}), 501, "unsupported")
        problem(c.get("/v1/sessions/nope"), 404, "no_session")
        problem(c.post("/v1/sessions", json={"id": "../x", "created_at": TS}), 400, "store_fault")


def test_an_idempotency_key_replays_the_first_outcome(served):
    with served.client("all") as c:
        key = {"Idempotency-Key": "create-1"}
        unfilled = {k: v for k, v in Header.new("x", created_at=TS).data.items() if k != "id"}
        first = c.post("/v1/sessions", json=unfilled, headers=key)
        assert first.status_code == 201
        second = c.post("/v1/sessions", json=unfilled, headers=key)
        assert second.status_code == 201 and second.headers["idempotent-replay"] == "true"
        assert second.json()["session"] == first.json()["session"]
        assert len(lines(c.get("/v1/sessions"))) == 2  # one session and the end frame
        # The same key for another request is refused, not replayed.
        problem(c.post("/v1/sessions/x/commit", headers=key), 400, "store_fault")
        # A refusal is an outcome too: replayed, though the retry would now succeed.
        sid = first.json()["session"]
        held = lease(c, sid)
        k2 = {"Idempotency-Key": "lease-1"}
        problem(c.post(f"/v1/sessions/{sid}/lease", json={"ttl_ms": 1000}, headers=k2), 409, "session_locked")
        c.delete(f"/v1/sessions/{sid}/lease", headers={"Lease-ID": held["lease_id"]})
        again = c.post(f"/v1/sessions/{sid}/lease", json={"ttl_ms": 1000}, headers=k2)
        problem(again, 409, "session_locked")
        assert again.headers["idempotent-replay"] == "true"
        assert c.post(f"/v1/sessions/{sid}/lease", json={"ttl_ms": 1000}).status_code == 201


def test_the_log_with_cursors_and_the_path(served):
    with served.client("all") as c:
        held, ids = recorded(c, "s1", 3)
        log = lines(c.get("/v1/sessions/s1/log"))
        records = log[:-1]
        assert [x["entry"] for x in records] == ids
        assert all(x["outcome"] == "continued" and x["durable"] for x in records)
        assert records[-1]["head"] == ids[-1]
        first = records[0]["session"]
        assert first["incarnation"] == c.get("/v1/sessions/s1").json()["incarnation"] and first["mark"] == "record"
        # Resuming after a cursor reads only what came after it.
        after = lines(c.get("/v1/sessions/s1/log", params={"after": records[1]["cursor"]}))
        assert [x["entry"] for x in after[:-1]] == ids[2:]
        end = lines(c.get("/v1/sessions/s1/log", params={"after": log[-1]["cursor"]}))
        assert len(end) == 1 and end[0]["session"]["head"] == ids[-1]
        problem(c.get("/v1/sessions/s1/log", params={"after": "junk"}), 400, "store_fault")
        # A lazy append is in the log, not durable; durable=true commits and serves it.
        r = append(c, "s1", held["token"], user("lazy", 9))
        lazy = r.json()["results"][0]
        assert lazy["durable"] is False
        tail = lines(c.get("/v1/sessions/s1/log", params={"after": log[-1]["cursor"]}))
        assert [x["entry"] for x in tail[:-1]] == [lazy["id"]] and tail[0]["durable"] is False
        durable = lines(c.get("/v1/sessions/s1/log", params={"durable": "true"}))
        assert durable[-2]["entry"] == lazy["id"] and durable[-2]["durable"] is True
        # The path: root first, envelopes inline, verifiable from the response alone.
        path = lines(c.get("/v1/sessions/s1/path"))
        assert [x["entry"] for x in path[:-1]] == ids + [lazy["id"]]
        assert path[0]["incarnation"] == first["incarnation"] and path[0]["contents"] == "all"
        for x in path[:-1]:
            assert sha256_ref(canonical_bytes(x["envelope"])) == x["entry"]
            assert sha256_ref(canonical_bytes(x["content"])) == x["envelope"]["content"]
        bare = lines(c.get("/v1/sessions/s1/path", params={"contents": "none", "leaf": ids[1]}))
        assert [x["entry"] for x in bare[:-1]] == ids[:2] and bare[0]["content"] is None
        problem(c.get("/v1/sessions/s1/path", params={"leaf": "sha256:" + "0" * 64}), 404, "no_entry")


def test_if_incarnation_refuses_another_incarnation(served):
    with served.client("all") as c:
        facts = create(c, "s1")
        assert c.get("/v1/sessions/s1", headers={"If-Incarnation": facts["incarnation"]}).status_code == 200
        problem(c.get("/v1/sessions/s1", headers={"If-Incarnation": "sha256:" + "1" * 64}), 409, "session_replaced")


# -- objects and who may see them -------------------------------------------------------------


def _objects_of(c, sid: str) -> tuple[str, str]:
    path = lines(c.get(f"/v1/sessions/{sid}/path"))
    return path[-2]["entry"], path[-2]["envelope"]["content"]


def test_objects_are_served_only_to_a_caller_who_may_read_a_session_holding_them(served):
    with served.client("team-a") as a:
        recorded(a, "a-1", 1)
        entry, content = _objects_of(a, "a-1")
        r = a.get(f"/v1/objects/contents/{content}")
        assert r.status_code == 200 and sha256_ref(r.content) == content
        assert r.headers["cache-control"] == "private, max-age=31536000, immutable"
        assert a.head(f"/v1/objects/entries/{entry}").status_code == 200
        assert a.post("/v1/objects/missing", json={"entries": [entry], "contents": [content]}).json() == {
            "entries": [], "contents": []}
    with served.client("team-b") as b:
        # A guessed hash of another tenant's object: no_object for GET and HEAD, missing for missing.
        problem(b.get(f"/v1/objects/contents/{content}"), 404, "no_object")
        assert b.head(f"/v1/objects/contents/{content}").status_code == 404
        problem(b.get(f"/v1/objects/entries/{entry}"), 404, "no_object")
        assert b.post("/v1/objects/missing", json={"entries": [entry], "contents": [content]}).json() == {
            "entries": [entry], "contents": [content]}
    with served.client("all") as c:
        assert c.get(f"/v1/objects/contents/{content}").status_code == 200


def _read_frames(response) -> tuple[list[tuple[str, str, bytes]], int]:
    """The objects of a batch read's answer and its end frame's count (the wire's reader)."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == OBJECTS
    reader = FrameReader(where="test", max_object=1 << 30)
    got = list(reader.feed(response.content))
    assert reader.ended
    return got, reader.count


def test_a_batch_read_serves_what_the_caller_may_read_in_the_order_asked(served):
    with served.client("team-a") as a:
        recorded(a, "a-1", 3)
        path = lines(a.get("/v1/sessions/a-1/path"))[:-1]
        entries = [f["entry"] for f in path]
        contents = [f["envelope"]["content"] for f in path]
        assert a.get("/v1/").json()["features"]["object_read"] is True
        asked = {"contents": list(reversed(contents)), "entries": entries + entries[:1]}  # a repeat: served once
        got, count = _read_frames(a.post("/v1/objects/read", json=asked))
        assert [(s, n) for s, n, _ in got] == [("contents", c) for c in reversed(contents)] + [("entries", e) for e in entries]
        assert count == len(got) and all(sha256_ref(d) == n for _, n, d in got)
        assert got[-1][2] == a.get(f"/v1/objects/entries/{entries[-1]}").content
        # An object no readable session holds, or none at all, is left out, as its GET is 404.
        absent = sha256_ref(b'{"nowhere":1}')
        got, count = _read_frames(a.post("/v1/objects/read", json={"contents": [absent, contents[0]]}))
        assert [n for _, n, _ in got] == [contents[0]] and count == 1
        problem(a.post("/v1/objects/read", json={"contents": ["sha256:xyz"]}), 400, "store_fault")
        problem(a.post("/v1/objects/read", json={"nowhere": [absent]}), 400, "store_fault")
    with served.client("team-b") as b:
        got, count = _read_frames(b.post("/v1/objects/read", json={"entries": entries, "contents": contents}))
        assert got == [] and count == 0


def test_a_batch_read_is_bounded_as_missing_is(tmp_path):
    Store.init(tmp_path / "st").close()
    with ServerProcess(tmp_path / "st", extra=("--max-body-bytes", "4096")) as server, server.client() as c:
        problem(c.post("/v1/objects/read", content=b"[" + b" " * 5000 + b"]"), 413, "store_fault")


def test_an_uploaded_object_is_verified_and_reachable_by_no_one_until_a_push_names_it(served):
    with served.client("all") as c:
        data = b'{"a":1}'
        name = sha256_ref(data)
        problem(c.put(f"/v1/objects/contents/{sha256_ref(b'other')}", content=data), 422, "bad_object")
        assert c.put(f"/v1/objects/contents/{name}", content=data).status_code == 204
        assert c.put(f"/v1/objects/contents/{name}", content=data).status_code == 204  # again: a no-op
        problem(c.get(f"/v1/objects/contents/{name}"), 404, "no_object")
        assert c.post("/v1/objects/missing", json={"contents": [name]}).json() == {"contents": [name]}
        problem(c.put("/v1/objects/nowhere/" + name, content=data), 400, "store_fault")
        problem(c.get("/v1/objects/contents/sha256:xyz"), 400, "store_fault")


def test_a_batch_upload_verifies_every_object_and_keeps_none_of_a_bad_batch(served):
    good, other = b'{"b":2}', b'{"c":3}'
    frame = lambda space, name, data: f"{space} {name} {len(data)}\n".encode() + data  # noqa: E731
    with served.client("all") as c:
        assert c.get("/v1/").json()["features"]["object_batch"] is True
        bad = frame("contents", sha256_ref(good), good) + frame("contents", sha256_ref(b"x"), other)
        problem(c.post("/v1/objects", content=bad), 422, "bad_object")
        problem(c.post("/v1/objects", content=b"contents nothing\n"), 400, "store_fault")
        problem(c.post("/v1/objects", content=frame("contents", sha256_ref(good), good)[:-2]), 400, "store_fault")
        ok = c.post("/v1/objects", content=frame("contents", sha256_ref(good), good) + frame("media", sha256_ref(other), other))
        assert ok.status_code == 200 and ok.json() == {"stored": 2}
    with served.client("reader") as c:
        problem(c.post("/v1/objects", content=frame("contents", sha256_ref(good), good)), 403, "scope")


def test_request_bodies_are_bounded(tmp_path):
    Store.init(tmp_path / "st").close()
    with ServerProcess(tmp_path / "st", extra=("--max-body-bytes", "4096", "--max-resume-records", "7")) as server, \
            server.client() as c:
        limits = c.get("/v1/").json()["limits"]
        assert limits["max_body_bytes"] == 4096 and limits["max_resume_records"] == 7
        big = b"x" * 5000
        problem(c.put(f"/v1/objects/contents/{sha256_ref(big)}", content=big), 413, "store_fault")
        problem(c.post("/v1/objects/missing", content=b"[" + b" " * 5000 + b"]"), 413, "store_fault")


# -- leases and writing under them --------------------------------------------------------------


def test_leases_fence_every_write(served):
    with served.client("all") as c:
        create(c, "s1")
        problem(append(c, "s1", 1, user("no lease")), 409, "lease_lost")
        first = lease(c, "s1")
        assert len(first["lease_id"]) >= 22 and first["token"] >= 1 and first["expires"]
        problem(c.post("/v1/sessions/s1/lease", json={"ttl_ms": 1000}), 409, "session_locked")
        r = append(c, "s1", first["token"], {"type": "config", "ts": TS, "model": "m"}, user("hi"))
        assert r.status_code == 200 and [x["outcome"] for x in r.json()["results"]] == ["continued", "continued"]
        problem(append(c, "s1", first["token"] + 1, user("wrong token")), 409, "lease_lost")
        problem(c.post("/v1/sessions/s1/entries", content=json.dumps(user("x")).encode()), 409, "lease_lost")
        # Renew and release by the lease ID only; a renew after release is lease_lost.
        assert c.put("/v1/sessions/s1/lease", headers={"Lease-ID": first["lease_id"]}).status_code == 200
        problem(c.put("/v1/sessions/s1/lease", headers={"Lease-ID": "guess"}), 409, "lease_lost")
        assert c.delete("/v1/sessions/s1/lease", headers={"Lease-ID": first["lease_id"]}).json()["released"]
        problem(c.put("/v1/sessions/s1/lease", headers={"Lease-ID": first["lease_id"]}), 409, "lease_lost")
        problem(append(c, "s1", first["token"], user("released")), 409, "lease_lost")
        second = lease(c, "s1")
        assert second["token"] > first["token"]
        # A break (admin) ends it at once and advances the token past the broken one's.
        assert c.post("/v1/sessions/s1/lease/break").json()["broken"] is True
        problem(append(c, "s1", second["token"], user("broken")), 409, "lease_lost")
        assert lease(c, "s1")["token"] > second["token"] + 1


def test_fencing_tokens_never_go_back_across_restart_and_re_creation(tmp_path):
    Store.init(tmp_path / "st").close()
    with ServerProcess(tmp_path / "st") as server, server.client() as c:
        create(c, "s1")
        t1 = lease(c, "s1")["token"]
    with ServerProcess(tmp_path / "st") as server, server.client() as c:
        held = lease(c, "s1")  # the lease did not survive the restart; its token's successor is greater
        assert held["token"] > t1
        problem(append(c, "s1", t1, user("old")), 409, "lease_lost")
        assert c.delete("/v1/sessions/s1", headers={"Lease-Token": str(held["token"])}).json()["deleted"]
        problem(c.delete("/v1/sessions/s1", headers={"Lease-Token": str(held["token"])}), 404, "no_session")
        create(c, "s1", created_at="2026-09-18T00:00:00Z")
        assert lease(c, "s1")["token"] > held["token"]


def test_appends_stop_at_the_first_refusal_and_keep_what_landed(served):
    with served.client("all") as c:
        create(c, "s1")
        held = lease(c, "s1")
        forged = dict(user("forged"), id="sha256:" + "2" * 64)
        r = append(c, "s1", held["token"], {"type": "config", "ts": TS, "model": "m"}, forged, user("never"))
        body = r.json()
        assert len(body["results"]) == 1
        assert body["stopped"]["index"] == 1 and body["stopped"]["problem"]["code"] == "bad_entry"
        assert c.get("/v1/sessions/s1").json()["length"] == 1
        bad = c.post("/v1/sessions/s1/entries", content=b"{not json\n", headers={"Lease-Token": str(held["token"])})
        assert bad.json()["stopped"]["problem"]["code"] == "bad_entry"
        parentless = dict(user("x"), parent="sha256:" + "3" * 64)
        stopped = append(c, "s1", held["token"], parentless).json()["stopped"]
        assert stopped["problem"]["code"] in ("no_entry", "bad_entry"), stopped
        late = c.post("/v1/sessions/s1/entries", content=json.dumps(user("x")).encode(),
                      headers={"Lease-Token": str(held["token"]), "Session-Format": "agentsession/0.99"})
        problem(late, 422, "format")


def test_an_append_raises_the_header_to_the_clients_format_not_past_it(served):
    """RFC 0002/0003: the header's ``format`` is raised to the minor of the writer that
    appends (its ``Session-Format``), before the append lands, and never lowered. The
    server raised it to its own minor whatever the client said, so a reader of the
    client's minor could no longer read a session that client alone had written."""
    from agentsession_cas.format.entry import FORMAT_MINOR, FORMAT_WRITTEN

    def fmt() -> str:
        return c.get("/v1/sessions/s1").json()["header"]["format"]

    def appended(text: str, minor: int | None) -> None:
        headers = {"Lease-Token": str(held["token"])}
        if minor is not None:
            headers["Session-Format"] = f"agentsession/0.{minor}"
        r = c.post("/v1/sessions/s1/entries", content=json.dumps(user(text)).encode(), headers=headers)
        assert r.status_code == 200 and r.json()["stopped"] is None, r.text

    old = FORMAT_MINOR - 2
    with served.client("all") as c:
        create(c, "s1", format=f"agentsession/0.{old}")
        held = lease(c, "s1")
        appended("at the session's own minor", old)
        assert fmt() == f"agentsession/0.{old}"
        appended("one minor later", old + 1)
        assert fmt() == f"agentsession/0.{old + 1}"
        r = c.post("/v1/sessions/s1/entries", content=json.dumps(user("x")).encode(),
                   headers={"Lease-Token": str(held["token"]), "Session-Format": f"agentsession/0.{old}"})
        problem(r, 422, "format")
        assert fmt() == f"agentsession/0.{old + 1}"
        appended("no Session-Format: the server's own", None)
        assert fmt() == FORMAT_WRITTEN


def test_head_compare_and_swap_and_commit_under_a_lease(served):
    with served.client("all") as c:
        held, ids = recorded(c, "s1", 2)
        tok = {"Lease-Token": str(held["token"])}
        problem(c.put("/v1/sessions/s1/head", json={"expected": ids[0], "to": ids[1]}, headers=tok), 409, "head_moved")
        r = c.put("/v1/sessions/s1/head", json={"expected": ids[-1], "to": ids[0]}, headers=tok)
        assert r.status_code == 200 and r.json()["head"] == ids[0] and r.json()["durable"] is True
        problem(c.put("/v1/sessions/s1/head", json={"expected": ids[0], "to": "sha256:" + "4" * 64}, headers=tok),
                404, "no_entry")
        log = lines(c.get("/v1/sessions/s1/log"))
        assert log[-2] == {"seq": len(ids), "head": ids[0], "durable": True, "cursor": log[-2]["cursor"]}
        assert c.post("/v1/sessions/s1/commit", headers=tok).json()["cursor"] == log[-1]["cursor"]
        problem(c.post("/v1/sessions/s1/commit"), 409, "lease_lost")


# -- refs ------------------------------------------------------------------------------------------


def test_refs_resolve_update_by_compare_and_swap_and_list(served):
    with served.client("all") as c:
        recorded(c, "s1", 1)
        held, _ = recorded(c, "s2", 1)
        problem(c.get("/v1/refs/chat/one"), 404, "no_ref")
        r = c.put("/v1/refs/chat/one", json={"expected": None, "next": {"session": "s1", "entry": ""}})
        assert r.status_code == 200 and r.json()["current"] == {"session": "s1", "entry": ""}
        got = c.get("/v1/refs/chat/one").json()
        assert got["target"] == {"session": "s1", "entry": ""} and got["state"] == "live"
        body = problem(c.put("/v1/refs/chat/one", json={"expected": None, "next": "s2"}), 409, "ref_moved")
        assert body["current"] == "s1"
        problem(c.put("/v1/refs/chat/two", json={"expected": None, "next": "nope"}), 404, "no_session")
        problem(c.get("/v1/refs/bad name"), 400, "ref_name")
        problem(c.put("/v1/refs/chat/one", json={"expected": "s1", "next": {"session": "s2", "entry": "sha256:" + "0" * 64}}),
                501, "unsupported")
        assert c.put("/v1/refs/chat/one", json={"expected": "s1", "next": "s2"}).status_code == 200
        assert [x["name"] for x in lines(c.get("/v1/refs", params={"prefix": "chat/"}))[:-1]] == ["chat/one"]
        c.put("/v1/refs/chat/gone", json={"expected": None, "next": "s1"})
        deleted = c.put("/v1/refs/chat/gone", json={"expected": "s1", "next": None})
        assert deleted.status_code == 200 and deleted.json()["current"] is None
        problem(c.get("/v1/refs/chat/gone"), 404, "no_ref")
        # Dangling once its session is deleted: 409 with the target.
        c.delete("/v1/sessions/s2", headers={"Lease-Token": str(held["token"])})
        body = problem(c.get("/v1/refs/chat/one"), 409, "ref_dangling")
        assert body["target"] == {"session": "s2", "entry": ""}
        problem(c.put("/v1/refs/chat/one", json={"expected": "s2", "next": "s2"}), 409, "ref_dangling")


def test_the_store_after_the_server_is_clean(tmp_path):
    """Stopped by SIGTERM (what a service manager sends), the server closes its store
    before it exits: every session it wrote checkpointed, its summary kept (list reads
    it, not the log), and the exit status a signal's (uvicorn raised the signal again
    once it stopped serving, and the process ended before the store was closed)."""
    Store.init(tmp_path / "st").close()
    server = ServerProcess(tmp_path / "st").start()
    with server.client() as c:
        for i in range(3):
            recorded(c, f"s{i}", 4)
    assert server.stop(signal.SIGTERM) == 143
    with Store(tmp_path / "st") as st:
        assert fsck(st).ok
        assert len(st.list()) == 3 and len(st.read("s1")) == 5
        for i in range(3):
            kept = st.backend.sessions.summary(f"s{i}")
            assert kept is not None and kept[1], f"s{i}: no summary kept, or not the log's"


def test_a_killed_server_keeps_what_it_acknowledged_durable(tmp_path):
    Store.init(tmp_path / "st").close()
    server = ServerProcess(tmp_path / "st").start()
    with server.client() as c:
        _, ids = recorded(c, "s1", 3)
    server.stop(signal.SIGKILL)
    with Store(tmp_path / "st") as st:
        assert st.read("s1").log_order == ids


HOLDER = r"""
import json, sys, time
import httpx
url, token = sys.argv[1], sys.argv[2]
with httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": "Bearer " + token}, timeout=30) as c:
    held = c.post("/v1/sessions/s1/lease", json={"holder": "doomed", "ttl_ms": 60_000}).json()
    line = json.dumps({"type": "item", "ts": "2026-09-17T12:00:01Z",
                       "item": {"type": "message", "role": "user", "content": "before the kill"}})
    r = c.post("/v1/sessions/s1/entries", content=line.encode(), headers={"Lease-Token": str(held["token"])})
    # Shortened once its append is in, not taken short: a lease of 400 ms could expire
    # before a busy machine got the append to the server (the append then lease_lost).
    c.put("/v1/sessions/s1/lease", json={"ttl_ms": 1}, headers={"Lease-ID": held["lease_id"]}).raise_for_status()
    print(json.dumps({"token": held["token"], "entry": r.json()["results"][0]["id"]}), flush=True)
    time.sleep(3600)
"""


def test_a_holder_killed_loses_its_lease_at_expiry_and_its_token_is_fenced(served):
    with served.client("all") as c:
        create(c, "s1")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, served.url, TOKENS["all"][0]], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        doomed = json.loads(holder.stdout.readline())
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with served.client("writer") as c:
        # Until the lease expires the session stays locked; then the next writer gets it.
        deadline = time.monotonic() + 30
        while True:
            r = c.post("/v1/sessions/s1/lease", json={"holder": "successor", "ttl_ms": 60_000})
            if r.status_code == 201 or time.monotonic() > deadline:
                break
            problem(r, 409, "session_locked")
            time.sleep(0.05)
        assert r.status_code == 201, r.text
        successor = r.json()
        assert successor["token"] > doomed["token"]
        # The takeover committed the dead holder's lazy append: the new holder resumes from it.
        log = lines(c.get("/v1/sessions/s1/log"))
        assert log[0]["entry"] == doomed["entry"] and log[0]["durable"] is True
        # A late write under the old token is fenced off; the new holder's lands.
        problem(append(c, "s1", doomed["token"], user("late", 2)), 409, "lease_lost")
        assert append(c, "s1", successor["token"], user("next", 3)).json()["stopped"] is None


# -- the rest of RFC 0003's error table, each provoked over the wire ---------------------------


def test_each_remaining_error_code_over_the_wire(served, tmp_path):
    with served.client("all") as c:
        held, ids = recorded(c, "s1", 1)
        tok = {"Lease-Token": str(held["token"])}
        # head_target: a head may not rest on a leaf label.
        r = append(c, "s1", held["token"], {"type": "label", "ts": TS, "target": ids[0], "label": "leaf"})
        label = r.json()["results"][0]["id"]
        problem(c.put("/v1/sessions/s1/head", json={"expected": ids[0], "to": label}, headers=tok), 422, "head_target")
        # synthetic: a label carrying it is a projection's marker.
        r = append(c, "s1", held["token"], {"type": "label", "ts": TS, "target": ids[0], "label": "x", "synthetic": True})
        assert r.json()["stopped"]["problem"]["code"] == "synthetic"
        # call_id_repeated: one call_id names one function call in a session.
        call = {"type": "item", "ts": TS, "item": {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}}
        assert append(c, "s1", held["token"], call).json()["stopped"] is None
        r = append(c, "s1", held["token"], dict(call, ts="2026-09-17T12:00:05Z"))
        assert r.json()["stopped"]["problem"]["code"] == "call_id_repeated"
        # base_rule: a fork's own entry is never a root.
        fork = create(c, "f1", base=ids[-1], parent_session="s1")
        fl = lease(c, "f1")
        r = append(c, "f1", fl["token"], dict(user("root"), parent=None))
        assert r.json()["stopped"]["problem"]["code"] == "base_rule", r.text
        assert fork["head"] == ids[-1]
        # bad_base: a fork whose base is a leaf label.
        r = c.post("/v1/sessions", json=Header.new("f2", created_at=TS, base=label).data)
        problem(r, 422, "bad_base")
        # header_differs: a push of another session under a held id.
        other = Header.new("s1", created_at="2026-09-20T00:00:00Z").data
        r = c.post("/v1/sessions/s1/push", json={"header": other, "entries": [], "prefix": [],
                                                 "head": {"expected": None, "to": None}, "mark": "mirror"})
        problem(r, 409, "header_differs")
        # bad_ref_target: a pushed ref must name the pushed session.
        r = c.post("/v1/sessions/s1/push", json={"header": c.get("/v1/sessions/s1").json()["header"], "entries": [],
                                                 "prefix": [], "head": {"expected": None, "to": None}, "mark": "mirror",
                                                 "refs": [{"name": "x", "expected": None, "next": "f1"}]})
        problem(r, 422, "bad_ref_target")
    # mirror: a pushed session is a mirror here; it cannot be leased or written.
    a = Store.init(tmp_path / "a")
    s = a.create(Header.new("m1", created_at=TS))
    s.append({"type": "config", "ts": TS, "model": "m"})
    a.close()
    with Store(tmp_path / "a") as a:
        push(a, HttpTransport(served.url, token=TOKENS["all"][0]), "m1")
    with served.client("all") as c:
        problem(c.post("/v1/sessions/m1/lease", json={"ttl_ms": 1000}), 409, "mirror")


def test_a_read_only_server_refuses_writes(tmp_path):
    st = Store.init(tmp_path / "st")
    st.create(Header.new("s1", created_at=TS)).append({"type": "config", "ts": TS, "model": "m"})
    st.close()
    with ServerProcess(tmp_path / "st", extra=("--read-only",)) as server, server.client() as c:
        assert c.get("/v1/").json()["store"]["read_only"] is True
        assert lines(c.get("/v1/sessions/s1/log"))[0]["entry"]
        problem(c.post("/v1/sessions", json=Header.new("s2", created_at=TS).data), 403, "read_only")
        problem(c.put(f"/v1/objects/contents/{sha256_ref(b'{}')}", content=b"{}"), 403, "read_only")
        problem(c.put("/v1/refs/x", json={"expected": None, "next": "s1"}), 403, "read_only")
        # Another process writes the store: the read-only server reads the session afresh.
        with Store(tmp_path / "st") as writer:
            new = writer.session("s1").append(user("later", 4), durable=True).id
        assert lines(c.get("/v1/sessions/s1/log"))[-2]["entry"] == new


def test_two_tokens_of_one_name_do_not_share_replayed_answers(tmp_path):
    Store.init(tmp_path / "st").close()
    auth = tmp_path / "twins.json"
    auth.write_text(json.dumps({"tokens": [
        {"name": "twin", "token": "twin-one-0123456789", "scopes": ["read", "write"]},
        {"name": "twin", "token": "twin-two-0123456789", "scopes": ["read", "write"]},
    ]}))
    unfilled = {k: v for k, v in Header.new("x", created_at=TS).data.items() if k != "id"}
    with ServerProcess(tmp_path / "st", auth=auth) as server:
        made = []
        for token in ("twin-one-0123456789", "twin-two-0123456789"):
            with server.client(bearer=token) as c:
                r = c.post("/v1/sessions", json=unfilled, headers={"Idempotency-Key": "same"})
                assert r.status_code == 201 and "idempotent-replay" not in r.headers
                made.append(r.json()["session"])
        assert made[0] != made[1]


def test_a_shallow_path_leaves_out_what_the_fold_replaced(tmp_path):
    st = Store.init(tmp_path / "st")
    s = st.create(Header.new("s1", created_at=TS))
    ids = [s.append({"type": "config", "ts": TS, "model": "m1", "instructions": "Be brief."}).id]
    ids += [s.append(user(f"old {i}", i)).id for i in range(2)]
    ids.append(s.append({"type": "config", "ts": TS, "model": "m2"}).id)
    ids.append(s.append(user("kept", 3)).id)
    summary = {"type": "message", "role": "assistant", "content": "the story so far"}
    ids.append(s.append({"type": "compaction", "ts": TS, "first_kept": ids[4], "summary": summary,
                         "config": {"model": "m2", "instructions": "Be brief."}}).id)
    ids.append(s.append(user("after", 5)).id)
    # A second session whose fold carries no config checkpoint: answered as all.
    t = st.create(Header.new("s2", created_at=TS))
    tids = [t.append({"type": "config", "ts": TS, "model": "m1"}).id, t.append(user("x", 1)).id]
    tids.append(t.append({"type": "compaction", "ts": TS, "first_kept": tids[1], "summary": summary}).id)
    st.close()
    with ServerProcess(tmp_path / "st") as server, server.client() as c:
        path = lines(c.get("/v1/sessions/s1/path", params={"contents": "since-fold"}))[:-1]
        assert [x["entry"] for x in path] == ids and path[0]["contents"] == "since-fold"
        served = [x["content"] is not None for x in path]
        assert served == [True, False, False, True, True, True, True]
        # Every envelope still comes, so the chain verifies; an omitted content by its hash.
        assert all(sha256_ref(canonical_bytes(x["envelope"])) == x["entry"] for x in path)
        whole = lines(c.get("/v1/sessions/s2/path", params={"contents": "since-fold"}))[:-1]
        assert whole[0]["contents"] == "all" and all(x["content"] is not None for x in whole)
        problem(c.get("/v1/sessions/s1/path", params={"contents": "some"}), 400, "store_fault")


def test_leases_and_local_holds_are_one_mechanism(tmp_path):
    st = Store.init(tmp_path / "st")
    st.create(Header.new("s1", created_at=TS)).append({"type": "config", "ts": TS, "model": "m"})
    st.create(Header.new("s2", created_at=TS)).close()
    with ServerProcess(tmp_path / "st") as server, server.client() as c:
        # Held by a local writer (this process): the server cannot lease it.
        problem(c.post("/v1/sessions/s1/lease", json={"ttl_ms": 60_000}), 409, "session_locked")
        # Leased through the server: a local writer cannot hold it.
        lease(c, "s2")
        with Store(tmp_path / "st") as other, pytest.raises(SessionLockedError):
            other.session("s2")
    st.close()


def test_listing_with_names_current_and_the_header_filters(tmp_path):
    st = Store.init(tmp_path / "st")
    old = st.create(Header.new("old", created_at=TS, harness={"name": "h1"}))
    old.append({"type": "config", "ts": TS, "model": "m"})
    old.append({"type": "info", "ts": TS, "name": "First name"})
    old.append({"type": "info", "ts": TS, "name": "Refactor auth"})
    old.append({"type": "link", "ts": TS, "rel": "continued_in", "session": "new"})
    new = st.create(Header.new("new", created_at="2026-09-18T00:00:00Z", harness={"name": "h2"}))
    new.append({"type": "config", "ts": TS, "model": "m"})
    st.create(Header.new("sub", created_at="2026-09-19T00:00:00Z", spawned_by="call_1", parent_session="new")).close()
    st.close()
    with ServerProcess(tmp_path / "st") as server, server.client() as c:
        def ids(**params):
            return [x["id"] for x in lines(c.get("/v1/sessions", params=params))[:-1]]

        assert ids() == ["sub", "new", "old"]
        assert ids(top_level="true") == ["new", "old"]
        assert ids(harness="h1") == ["old"]
        assert ids(parent_session="new") == ["sub"]
        # By last activity, as `agentsession list` filters (store.summary.select): new's
        # one entry is at TS, as old's are; sub has none, so its creation counts.
        assert ids(after="2026-09-17T12:00:00Z", before="2026-09-19T00:00:00Z") == ["new", "old"]
        assert ids(after="2026-09-18T00:00:00Z") == ["sub"]
        named = {x["id"]: x for x in lines(c.get("/v1/sessions", params={"with_names": "true"}))[:-1]}
        assert named["old"]["name"] == "Refactor auth" and named["old"]["superseded_by"] == "new"
        assert named["new"]["name"] is None and named["new"]["superseded_by"] is None
        plain = {x["id"]: x for x in lines(c.get("/v1/sessions"))[:-1]}
        assert plain["old"]["name"] == "Refactor auth" and "superseded_by" not in plain["old"]
        assert plain["old"]["modified"] == "2026-09-17T12:00:00Z"
        assert ids(current="true") == ["sub", "new"]


def test_ref_log_over_the_wire(served):
    """``GET /v1/refs/NAME?view=log``: the ref's changes, newest first, with the reason a
    ``PUT`` gave; an update that changes nothing is not logged; a token limited to a
    session prefix sees only changes between sessions it may touch."""
    with served.client("all") as c:
        for sid in ("a-1", "a-2", "b-1"):
            assert c.post("/v1/sessions", json=Header.new(sid).data).status_code == 201
        assert c.put("/v1/refs/conv/x", json={"expected": None, "next": "a-1", "reason": "start"}).status_code == 200
        assert c.put("/v1/refs/conv/x", json={"expected": "a-1", "next": "a-1"}).status_code == 200  # no change
        assert c.put("/v1/refs/conv/x", json={"expected": "a-1", "next": "a-2", "reason": "continued"}).status_code == 200
        assert c.put("/v1/refs/conv/x", json={"expected": "a-2", "next": "b-1"}).status_code == 200
        assert c.put("/v1/refs/conv/x", json={"expected": "b-1", "next": None}).status_code == 200
        frames = [json.loads(x) for x in c.get("/v1/refs/conv/x", params={"view": "log"}).text.splitlines()]
        assert frames[-1] == {"end": True, "count": 4}
        moves = [((f["old"] or {}).get("session"), (f["new"] or {}).get("session"), f["reason"]) for f in frames[:-1]]
        assert moves == [("b-1", None, None), ("a-2", "b-1", None), ("a-1", "a-2", "continued"), (None, "a-1", "start")]
        assert all(f["at"] for f in frames[:-1])
        empty = [json.loads(x) for x in c.get("/v1/refs/never", params={"view": "log"}).text.splitlines()]
        assert empty == [{"end": True, "count": 0}]
        problem(c.get("/v1/refs/bad@name", params={"view": "log"}), 400, "ref_name")
    with served.client("team-a") as c:
        frames = [json.loads(x) for x in c.get("/v1/refs/conv/x", params={"view": "log"}).text.splitlines()]
        assert [((f["old"] or {}).get("session"), (f["new"] or {}).get("session")) for f in frames[:-1]] == [
            ("a-1", "a-2"), (None, "a-1")]
    with served.client("nobody") as c:
        problem(c.get("/v1/refs/conv/x", params={"view": "log"}), 403, "scope")


def test_a_list_beside_a_running_server_reads_no_entry_of_a_session_pushed_to_it(served, tmp_path, monkeypatch):
    """The server holds what it admitted open; its summary is kept at the admission (more
    than SUMMARY_EVERY entries came), not only when the server stops: a local ``list``
    beside it reads none of the session's entries (it read all 1,100 before)."""
    a = Store.init(tmp_path / "a", sync="never")
    s = a.create(Header.new("big", created_at=TS))
    for i in range(1100):
        s.append(user(f"turn {i}", i % 60))
    a.close()
    with Store(tmp_path / "a") as a:
        push(a, HttpTransport(served.url, token=TOKENS["all"][0]), "big")
    reads = count_entry_reads(monkeypatch)
    with Store(served.store, readonly=True) as ro:
        assert ro.summary("big").entries == 1100
    assert reads == []
