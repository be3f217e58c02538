"""Stores served over HTTP for tests: one real uvicorn server on a free loopback port,
started on first use and kept for the test session, serving many stores side by side.

Each store is a file store directory served by the RFC 0003 application
(``agentsession_cas.server.app``) under its own path, ``http://127.0.0.1:PORT/<key>/``,
so ``open_store(url)`` reaches it as it would reach ``agentsession serve`` (the
client's routes are under ``<url>v1/``). Nothing is mocked: requests go through
httpx, a socket and uvicorn. A store's server side (its ``Store`` and
``ServerState``) is made on the first request for it and closed by
:func:`release`, which the contract suite's factory calls at the end of a test.

The server runs with ``sync="never"``: whether an append is committed is the
client's to ask (``?commit=true``), so a client store's sync policy decides, as
the contract suite expects of every backend.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["release", "served_url"]

_LOCK = threading.Lock()
_SERVER: dict[str, Any] = {}
#: key -> store directory; key -> the ASGI app over it (made on first request).
_PATHS: dict[str, str] = {}
_APPS: dict[str, Any] = {}


def _key(scratch: Path, tag: str, name: str) -> str:
    return f"{tag}-{name}"


async def _mux(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Route ``/<key>/…`` to that store's application (its root path ``/<key>``)."""
    if scope["type"] == "lifespan":
        message = await receive()
        while message is not None:
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
            message = await receive()
        return
    key = scope["path"].split("/", 2)[1] if scope["path"].count("/") >= 2 else ""
    app = _app(key)
    if app is None:
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"no store here"})
        return
    await app(dict(scope, root_path=scope.get("root_path", "") + "/" + key), receive, send)


def _app(key: str) -> Any:
    from agentsession_cas.server.app import ServerState, create_app
    from agentsession_cas.store import Store

    with _LOCK:
        app = _APPS.get(key)
        if app is None and key in _PATHS:
            state = ServerState(Store.init(_PATHS[key], sync="never"), None)
            app = _APPS[key] = create_app(state)
            app.state.served = state
        return app


def _start() -> str:
    import uvicorn

    with _LOCK:
        if "url" in _SERVER:
            return str(_SERVER["url"])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY: see server/run.py
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(_mux, log_level="warning", lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="http-store")
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the test HTTP store server did not start")
            time.sleep(0.01)
        _SERVER.update(url=f"http://127.0.0.1:{sock.getsockname()[1]}", server=server, thread=thread)
        return str(_SERVER["url"])


def served_url(scratch: Path, tag: str, name: str) -> str:
    """The URL of the store ``name`` of a test, served over HTTP (the server starts on
    first use; the store directory is made when first reached)."""
    base = _start()
    key = _key(scratch, tag, name)
    with _LOCK:
        _PATHS.setdefault(key, os.fspath(scratch / f"http-{key}"))
    return f"{base}/{key}/"


def release(scratch: Path, tag: str) -> None:
    """Close the server side of every store of the test ``tag`` (it commits and lets go of
    its sessions), so a long run does not keep them open."""
    with _LOCK:
        keys = [k for k in _PATHS if k.startswith(f"{tag}-")]
        apps = [_APPS.pop(k, None) for k in keys]
        for k in keys:
            del _PATHS[k]
    for app in apps:
        if app is not None:
            state = app.state.served
            with state.lock:
                state.store.close()


#: Contract tests that cannot apply to a store over HTTP, and why (contract_helpers.BACKENDS).
CANNOT: dict[str, str] = {
    "test_open_of_a_store_never_made_is_refused":
        "a server's store exists as long as it is served; the test server makes each store when first reached",
    "test_sweep_keeps_what_logs_and_prefixes_name": "sweep is local maintenance (RFC 0003: not carried)",
    "test_sweep_keeps_working_state": "sweep is local maintenance (RFC 0003: not carried)",
    "test_sweep_spares_an_unnamed_object_younger_than_the_grace": "sweep is local maintenance (RFC 0003: not carried)",
    "test_objects_are_verified_when_read":
        "the server verifies every object it receives (bad_object), so no corrupt copy can be stored through it",
    "test_put_replaces_a_corrupt_copy":
        "the server verifies every object it receives (bad_object), so no corrupt copy can be stored through it",
    "test_verify_and_fsck_name_a_corrupt_sidecar_blob":
        "the server verifies every object it receives (bad_object), so no corrupt copy can be stored through it",
}
CANNOT.update({
    "test_ref_replaced_after_delete_and_create":
        "RFC 0003 refuses a same-target update of a dangling ref, a replaced one included (ref_dangling); "
        "the library re-adopts a replaced ref that way (docs/refs.md)",
    "test_scan_gives_every_object_of_the_spaces_asked":
        "RFC 0003 carries no listing of objects, which a bulk scan is (grep over such a store reads every entry)",
    "test_a_session_let_go_is_appended_to_and_listed_reading_none_of_its_entries":
        "RFC 0003 carries no append rules' state: a client judges its appends itself, from the session's "
        "entries, read in bulk when it first appends (test_a_session_with_no_kept_state_is_read_in_bulk)",
    "test_an_imported_session_is_appended_to_reading_none_of_its_entries":
        "RFC 0003 carries no append rules' state (as above)",
    "test_put_blob_and_blob":
        "RFC 0003 Reach: an uploaded object is reachable by no one until a push or an append names it, "
        "so another handle (the read-only reopen) cannot read a blob no session names",
})

_FETCH_IN = ("a fetch into a store over HTTP: the server takes a mirror's entries only by a push to it "
             "(RFC 0003), so a client cannot admit them into it; push from the holder instead")
_MIRROR_HOLD = ("RFC 0003: a mirror cannot be leased, and deleting needs a lease, so a client neither holds nor "
                "deletes a mirror the server keeps")
CANNOT.update({
    "test_fetch_into_third_store[first]": _FETCH_IN,
    "test_fetch_moves_a_mirror_head_that_it_descends_from[first]": _FETCH_IN,
    "test_take_back[first]": _FETCH_IN,
    "test_a_header_a_store_took_before_the_member_rule_still_moves_and_continues[first]": _FETCH_IN,
    "test_fetch_serves_only_what_a_writer_committed[first]": _FETCH_IN,
    "test_fetch_serves_only_what_a_writer_committed[second]":
        "RFC 0003: a durable read commits the working state a lease holder's appends left (the server is the "
        "session's writer), so the fetch is served them",
    "test_push_to_a_remote_never_made_is_refused[second]":
        "a server's store exists as long as it is served; the test server makes each store when first reached",
    "test_kept_transport_after_remote_session_replaced[second]": _MIRROR_HOLD,
    "test_push_to_a_session_held_at_the_remote_is_refused[second]": _MIRROR_HOLD,
})
#: Cross-store tests pair the HTTP store with the file store and itself (the file store
#: meets memory and PostgreSQL already; every pair would double this backend's cost).
PAIRS_WITH = ("file", "http")
