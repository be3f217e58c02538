"""What session 40's server hunt found and left (session 41, srv), each checked here:

6. a push's ``expected`` (and a head move's, a handover's, a declare's) was checked by
   the server's own rule (``bad_name``) where the library's is ``expected_head_given``
   (``bad_argument``);
7. "is not an entry id" was written out in three places (a 10,000-character id came back
   whole): ``errors.not_an_entry_id``;
8. "unknown object space" was four classes and codes: ``errors.unknown_object_space``.

In process, through Starlette's TestClient.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from agentsession_cas import Header
from agentsession_cas.backends.files.objects import SPACES as FILE_SPACES
from agentsession_cas.errors import (
    AppendRefusedError,
    BadArgumentError,
    not_an_entry_id,
    unknown_object_space,
)
from agentsession_cas.exchange import transport as transport_module
from agentsession_cas.exchange.endpoint import StoreEndpoint
from agentsession_cas.exchange.transport import PushRequest
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.server.app import Limits, ServerState, create_app
from agentsession_cas.store import Store
from agentsession_cas.store.session import expected_head_given
from test_server import TS, problem, recorded

#: A hostile value: a wording that quotes it whole sends all 10,000 characters back.
LONG = "x" * 10_000


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerState, TestClient]]:
    state = ServerState(Store.init(tmp_path / "st"), None, Limits(max_stream_age_s=0))
    with TestClient(create_app(state)) as client:
        yield state, client


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """A follow's NDJSON events, keep-alives left out."""
    return [json.loads(x) for x in response.text.splitlines() if x.strip()]


def library_problem(response: httpx.Response, status: int, library_code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert body["library_code"] == library_code and body["status"] == status, body
    return body


# -- 6. one expected-head rule --------------------------------------------------------------


def test_an_expected_head_over_http_is_refused_by_the_librarys_rule(served):
    """The server checked a push's ``head.expected`` (and a head move's ``expected``, a
    handover's and a declare's ``head``) by its own ``_opt_hash``: ``bad_name`` with its
    own words, where the library refuses the same value locally as ``bad_argument``
    (``store.session.expected_head_given``). One rule now, one code, one message."""
    state, c = served
    held, ids = recorded(c, "s1", 1)
    token = {"Lease-Token": str(held["token"])}
    with pytest.raises(BadArgumentError) as local:
        expected_head_given("abcd")
    want = str(local.value)
    header = c.get("/v1/sessions/s1").json()["header"]
    answers = {
        "push": c.post("/v1/sessions/s1/push", json={"header": header, "entries": ids, "prefix": [],
                                                     "head": {"expected": "abcd", "to": ids[-1]}}),
        "head": c.put("/v1/sessions/s1/head", json={"expected": "abcd", "to": ids[0]}, headers=token),
        "handover": c.post("/v1/sessions/s1/handover", json={"to": "client", "head": "abcd"}, headers=token),
        "record": c.post("/v1/sessions/s1/record", json={"basis": "sole_copy", "head": "abcd"}, headers=token),
    }
    for what, r in answers.items():
        assert library_problem(r, 400, "bad_argument")["detail"] == want, what
    # A head target that is no entry id is head_target, as Session.set_head says it.
    with pytest.raises(BadArgumentError):
        expected_head_given(5)
    s = state.store.session("s1")
    with pytest.raises(AppendRefusedError) as local_to:
        s.set_head("abcd", expected=s.head)
    for r in (c.put("/v1/sessions/s1/head", json={"expected": ids[-1], "to": "abcd"}, headers=token),
              c.put("/v1/sessions/s1/head", json={"expected": ids[-1], "to": []}, headers=token)):
        problem(r, 422, "head_target")
    assert problem(c.put("/v1/sessions/s1/head", json={"expected": ids[-1], "to": "abcd"}, headers=token), 422,
                   "head_target")["detail"] == str(local_to.value)
    r = c.post("/v1/sessions/s1/push", json={"header": header, "entries": ids, "prefix": [],
                                             "head": {"expected": ids[-1], "to": "abcd"}})
    problem(r, 422, "head_target")
    assert c.get("/v1/sessions/s1").json()["head"] == ids[-1]


# -- 7. one wording for "not an entry id" ---------------------------------------------------


def test_an_entry_id_that_is_none_is_said_by_one_helper(served, tmp_path):
    """The server's push, the exchange's receiver and the session's head move each wrote
    the wording out, the first two with ``!r``: a 10,000-character id came back whole.
    Each says ``errors.not_an_entry_id`` now, cut by ``quoted()``."""
    state, c = served
    want = str(not_an_entry_id(LONG))
    assert len(want) < 200 and "(10000 characters)" in want
    header = Header.new("p1", created_at=TS).data
    r = c.post("/v1/sessions/p1/push", json={"header": header, "entries": [LONG], "prefix": [],
                                             "head": {"expected": None, "to": None}})
    assert problem(r, 422, "bad_entry")["detail"] == want
    with Store.init(tmp_path / "local") as local:
        with pytest.raises(AppendRefusedError) as received:
            StoreEndpoint(local).receive(PushRequest(header=header, prefix=[], entries=[LONG], to=None, expected=None))
        assert str(received.value) == want and received.value.code == "bad_entry"
        s = local.create(Header.new("h1", created_at=TS))
        with pytest.raises(AppendRefusedError) as moved:
            s.set_head(LONG, expected=None)
        assert str(moved.value) == want and moved.value.code == "head_target"


# -- 8. one refusal of an unknown object space ------------------------------------------------


def test_an_unknown_object_space_is_one_error_everywhere(served, tmp_path):
    """"unknown object space" was a StoreError (the exchange's transport, a 500 over
    HTTP), a BadNameError (the wire), a BadArgumentError (the store) and a bare
    AgentSessionError (the file backend, code ``error``): one helper now, one class and
    code (``bad_argument``), answered 400 by the server."""
    _, c = served
    held = "sha256:" + "0" * 64
    r = c.get(f"/v1/objects/trees/{held}")
    body = library_problem(r, 400, "bad_argument")
    assert body["detail"] == str(unknown_object_space("trees", ["entries", "contents", "media"]))
    library_problem(c.put(f"/v1/objects/trees/{held}", content=b"x"), 400, "bad_argument")
    library_problem(c.post("/v1/objects/missing", json={"trees": [held]}), 400, "bad_argument")
    library = str(unknown_object_space("trees", FILE_SPACES))
    with Store.init(tmp_path / "local") as local:
        calls = {
            "transport": lambda: transport_module.check_space("trees"),
            "store": lambda: local.cat_object(sha256_ref(b"x"), "trees"),  # type: ignore[arg-type]
            "files": lambda: local.backend.objects.path("trees", sha256_ref(b"x")),  # type: ignore[attr-defined]
        }
        for what, call in calls.items():
            with pytest.raises(BadArgumentError) as caught:
                call()
            assert caught.value.code == "bad_argument" and str(caught.value) == library, what
