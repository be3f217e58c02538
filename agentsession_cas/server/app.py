"""The RFC 0003 server: a Starlette application over one :class:`Store`.

Every route authenticates its caller (:mod:`.auth`), checks the scope it needs,
does its work on the store under one lock (the store is one writer; requests
are ordered as a single-writer store orders its callers), and answers JSON,
NDJSON ending with an ``{"end": true}`` frame, object bytes, or an RFC 9457
problem whose ``code`` is the error class's (:mod:`..exchange.wire`). The
receiving rules of exchange are :class:`~..exchange.endpoint.StoreEndpoint`'s,
the same a local transport calls; what the server adds is the network's:
authentication, reach (:mod:`.reach`), leases (:mod:`.leases`), limits and
``Idempotency-Key`` replay.

Routes not built answer a problem too (404 for an unknown path, 501
``unsupported`` for a feature the capabilities do not claim).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import field
from itertools import islice
from typing import Any
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..backends.base import COMMIT_POINTS, Space
from ..errors import (
    AgentSessionError,
    AppendRefusedError,
    BadNameError,
    BadRefNameError,
    BadRefTargetError,
    DanglingRefError,
    FormatVersionError,
    HeaderDiffersError,
    HeadMovedError,
    IJSONError,
    MirrorError,
    MissingObjectsError,
    NoSuchEntryError,
    NoSuchObjectError,
    NoSuchRefError,
    NoSuchSessionError,
    RefMovedError,
    ScopeError,
    SessionExistsError,
    SessionLockedError,
    SessionReplacedError,
    StoreError,
    TimestampError,
    TooLargeError,
    UnsupportedError,
    not_an_entry_id,
    not_an_object_name,
    quoted,
)
from ..exchange.endpoint import StoreEndpoint
from ..exchange.transport import PushRequest, RefPush, RefResult
from ..exchange.wire import (
    OBJECTS,
    OUTCOMES,
    end_frame,
    error_frame,
    object_frame,
    parse_frames,
    problem_body,
    space_from_wire,
    space_to_wire,
)
from ..format.canonical import canonical_bytes, loads, loads_flagged
from ..format.entry import FORMAT_MAJOR, FORMAT_MINOR, FORMAT_WRITTEN, Header, parse_format
from ..format.hashing import envelope_content, is_hash
from ..format.media import sidecar_names
from ..format.names import check_ref_name, check_ref_prefix, check_session_id
from ..format.timestamps import normalise_ts
from ..lean import dataclass
from ..store.refs import Refs, header_ident
from ..store.session import AppendResult, Session, expected_head_given, head_target_given
from ..store.store import Store
from ..store.summary import SessionSummary, select
from .auth import LOCAL, Principal, Tokens
from .follow import (
    LINES,
    MAX_RESUME_RECORDS,
    SNAPSHOT_INLINE_BYTES,
    Changes,
    Stream,
    Tails,
    Told,
    cursor_of,
    load_view,
    locate,
    log_line,
    parse_cursor,
)
from .leases import Leases
from .reach import Reach

__all__ = ["Limits", "ServerState", "create_app"]

log = logging.getLogger("agentsession.server")

JSON = "application/json"
NDJSON = "application/x-ndjson"
PROBLEM = "application/problem+json"
OCTETS = "application/octet-stream"
#: Entry lines an append batch may have and still be served in the event loop itself.
QUICK_LINES = 8
#: The part of the table of Idempotency-Keys one token may hold by default: at least four
#: tokens must fill their shares before the table refuses a fifth.
TOKEN_SHARE = 0.25


@dataclass(frozen=True)
class Limits:
    """What the server bounds, published in the capabilities."""

    max_body_bytes: int = 256 * 1024 * 1024
    max_object_bytes: int = 64 * 1024 * 1024
    max_missing: int = 1_000_000
    max_lease_ttl_ms: int = 10 * 60 * 1000
    idempotency_ttl_ms: int = 20 * 60 * 1000
    #: First answers kept at once; past it a new key is refused (503), none forgotten early.
    idempotency_keys: int = 500_000
    #: First answers one token's keys may hold at once (None: :data:`TOKEN_SHARE` of
    #: ``idempotency_keys``), so one token cannot fill the table for every other: see
    #: :meth:`keys_per_token`, the one place the share is decided.
    idempotency_keys_per_token: int | None = None
    upload_grace_s: int = 3600
    max_streams: int = 256
    max_stream_age_s: int = 3600
    #: Records a follow resumed from a cursor replays at most; a follower further behind
    #: gets a ``reset`` (the session afresh, as a new follower's ``snapshot``). None: no
    #: bound, every resume replays from its cursor, as RFC 0003 has it.
    max_resume_records: int | None = MAX_RESUME_RECORDS

    def as_dict(self) -> dict[str, int | None]:
        return {
            "max_body_bytes": self.max_body_bytes,
            "max_object_bytes": self.max_object_bytes,
            "max_missing": self.max_missing,
            "max_lease_ttl_ms": self.max_lease_ttl_ms,
            "idempotency_ttl_ms": self.idempotency_ttl_ms,
            "idempotency_keys": self.idempotency_keys,
            "idempotency_keys_per_token": self.keys_per_token(),
            "upload_grace_s": self.upload_grace_s,
            "max_streams": self.max_streams,
            "max_stream_age_s": self.max_stream_age_s,
            "max_resume_records": self.max_resume_records,
            "snapshot_inline_bytes": SNAPSHOT_INLINE_BYTES,
        }

    def keys_per_token(self) -> int:
        """The most first answers one token's keys hold at once: as set, else
        :data:`TOKEN_SHARE` of the table, never more than the table itself."""
        share = self.idempotency_keys_per_token
        if share is None:
            share = max(1, int(self.idempotency_keys * TOKEN_SHARE))
        return min(share, self.idempotency_keys)


@dataclass
class _Stored:
    """The first outcome of a request sent with an ``Idempotency-Key``."""

    method: str
    path: str
    status: int
    body: bytes
    media_type: str
    headers: dict[str, str]
    at: float


@dataclass
class ServerState:
    """What one server keeps: the store, its token table (None: loopback, no auth), the
    one lock its work is done under, and the network's state beside the store's.
    ``tls``: where TLS is, as the capabilities say it (``run.TLS_MODES``: "server",
    "proxy", "none"), which ``run.tls_mode`` decided."""

    store: Store
    tokens: Tokens | None
    limits: Limits = field(default_factory=Limits)
    lock: threading.RLock = field(default_factory=threading.RLock)
    tls: str = "none"

    def __post_init__(self) -> None:
        self.endpoint = StoreEndpoint(self.store)
        self.reach = Reach(self.store, self._held_session)
        self.leases = Leases(self.store, max_ttl_ms=self.limits.max_lease_ttl_ms)
        self.replies: OrderedDict[tuple[str, str], _Stored] = OrderedDict()
        #: When each token's keys in ``replies`` were stored, oldest first (the table's
        #: order, so the table's oldest is its token's oldest), and how many of each
        #: token's are being served now: what its share counts.
        self.token_replies: dict[str, deque[float]] = {}
        self.token_inflight: Counter[str] = Counter()
        #: Objects each principal uploaded and no push has named yet: (space, name) -> time.
        self.uploads: dict[str, dict[tuple[str, str], float]] = {}
        self.changes = Changes()
        self.tails = Tails(self.store)
        self.streams = 0
        #: When each open follow stream began (time.monotonic()): the oldest ends by its
        #: age limit at the latest, which is what a refused follower is told to wait.
        self.stream_starts: list[float] = []
        self._snapshots: dict[str, tuple[int | None, Session]] = {}
        #: Idempotency keys whose first request is being served now.
        self.inflight: dict[tuple[str, str], asyncio.Event] = {}

    # -- sessions -----------------------------------------------------------------

    def session(self, session_id: str) -> Session:
        """The session open for writing here (the server is its writer); NoSuchSessionError.
        A read-only server reads a snapshot instead, again whenever the session's size
        says another process wrote it since."""
        check_session_id(session_id)
        if not self.store.readonly:
            return self.store.session(session_id)
        size = self.store.backend.sessions.size(session_id)
        held = self._snapshots.get(session_id)
        if held is not None and held[0] == size and size is not None and session_id in self.store:
            return held[1]
        s = self.store.read(session_id)
        if held is not None:
            held[1].close()
        self._snapshots[session_id] = (size, s)
        return s

    def _held_session(self, session_id: str) -> Session | None:
        try:
            return self.session(session_id)
        except AgentSessionError:
            return None

    def readable(self, principal: Principal) -> list[str]:
        """The ids of the sessions the caller may read."""
        return [s for s in self.store.list() if principal.may_read(s)]

    def present(self, space: Space, name: str) -> bool:
        """Held sound, or held by a log open here until its next checkpoint."""
        return self.present_many(space, [name])[0]

    def present_many(self, space: Space, names: Sequence[str]) -> list[bool]:
        """:meth:`present` of each name, asked of the store at once (one query of a
        database, not one a name)."""
        objects = self.store.objects
        out = objects.held_many(space, names)
        for i, held in enumerate(out):
            if not held:
                try:
                    objects.get(space, names[i])
                    out[i] = True
                except (AgentSessionError, OSError):
                    pass
        return out

    def reachable_objects(self, space: Space, names: Sequence[str], view: dict[str, dict[str, set[str]]]) -> list[tuple[str, bytes]]:
        """The objects of ``names`` a session of ``view`` holds, read (each verified) in
        one bulk read (a pack's blocks at once, one query of a database); when that read
        fails, each is read alone and one that does not read is left out."""
        wanted = [name for name in names if is_hash(name) and self.reach.in_view(view, space, name)]
        objects = self.store.objects
        try:
            return list(zip(wanted, objects.get_many(space, wanted)))
        except (AgentSessionError, OSError):
            out = []
            for name in wanted:
                try:
                    out.append((name, objects.get(space, name)))
                except (AgentSessionError, OSError):
                    pass
            return out

    def reachable(
        self, principal: Principal, space: Space, name: str, view: dict[str, dict[str, set[str]]] | None = None
    ) -> bool:
        """Whether the caller may be told of the object (``view``: :meth:`Reach.view` of
        the sessions it may read, when one request asks about many)."""
        if not is_hash(name):
            return False
        if view is None:
            # The sessions last seen holding it first, each brought up to date: most
            # questions are about objects some session holds (see reach.py).
            for sid in list(self.reach.holders(space, name)):
                if principal.may_read(sid):
                    sets = self.reach.sets(sid)
                    if sets is not None and name in sets[space]:
                        return self.present(space, name)
            view = self.reach.view(self.readable(principal))
        return self.reach.in_view(view, space, name) and self.present(space, name)


# -- plumbing --------------------------------------------------------------------------


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8"), status, headers,
                    media_type=JSON)


def _problem(exc: AgentSessionError, headers: dict[str, str] | None = None) -> Response:
    body = problem_body(exc)
    extra = dict(headers or {})
    if exc.code == "auth":
        extra["WWW-Authenticate"] = 'Bearer realm="agentsession"'
    return Response(json.dumps(body, ensure_ascii=False).encode("utf-8"), body["status"], extra, media_type=PROBLEM)


def _ndjson(lines: Iterable[bytes], headers: dict[str, str] | None = None) -> Response:
    return Response(b"".join(line + b"\n" for line in lines), 200, headers, media_type=NDJSON)


def _dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


async def _body(request: Request, cap: int) -> bytes:
    """The request body, refused past ``cap`` bytes before more is read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise TooLargeError(f"the request body is {declared} bytes; this server takes at most {cap}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise TooLargeError(f"the request body passes this server's limit of {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_json(data: bytes, what: str) -> Any:
    """A request body read as the store reads a line (:func:`~..format.canonical.loads`,
    I-JSON): a value nested past its bound, a repeated member, NaN, an infinity or bytes
    that are no UTF-8 are this refusal (``bad_name``, 400), never a parser's failure (a
    deep nesting was a RecursionError, 500) nor a value the store refused later as its
    own fault."""
    try:
        return loads(data)
    except ValueError as exc:  # JSONDecodeError, IJSONError, UnicodeDecodeError
        raise BadNameError(f"{what} is not I-JSON: {exc}") from None


def _whole(text: str, what: str) -> int:
    """A query parameter's whole number: ASCII digits, at most 18 of them; BadNameError
    otherwise (``str.isdigit`` takes '\u00b2', which ``int()`` refuses, and a number of
    5,000 digits is past what ``int()`` reads)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise BadNameError(f"{what} must be a whole number, not {quoted(text)}")
    return int(text)


def _ttl_ms(value: Any, what: str = "ttl_ms") -> int:
    """A lease's time to live as a request gives it: a positive whole number of
    milliseconds (:class:`.leases.Leases` caps it); BadNameError otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise BadNameError(f"{what} must be a positive whole number of milliseconds")
    return value


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadNameError(f"{what} must be a JSON object")
    return value


def _expected(value: Any) -> str | None:
    """An expected head as a request gives it (a push's ``head.expected``, a head move's
    ``expected``, a handover's or a declare's ``head``), refused by the library's one rule
    (:func:`~..store.session.expected_head_given`: ``bad_argument``), as a local caller's is."""
    expected_head_given(value)
    return value


def _headers_only(status: int, headers: dict[str, str] | None, media_type: str | None,
                  raw: list[tuple[bytes, bytes]] | None = None) -> Response:
    """A ``HEAD``'s answer: the status and headers a ``GET`` answers with (``headers`` and
    ``media_type``, or another answer's ``raw`` headers), and no content. No
    ``Content-Length`` either: it is known only by making the content, which a HEAD does
    not (RFC 9110 lets a server leave such a header out of a HEAD's answer)."""
    response = Response(None, status, headers, media_type=media_type)
    kept = response.raw_headers if raw is None else raw
    response.raw_headers = [(k, v) for k, v in kept if k != b"content-length"]
    return response


class _StreamSlot:
    """One open follow stream's place among ``max_streams``, taken at admission
    (:meth:`Api._admit_stream`) and given back once, when the stream ends or is never
    sent."""

    def __init__(self, state: ServerState):
        self.state = state
        self.began = time.monotonic()
        self.held = True
        state.streams += 1
        state.stream_starts.append(self.began)

    def release(self) -> None:
        if self.held:
            self.held = False
            self.state.streams -= 1
            self.state.stream_starts.remove(self.began)


class _CountedStream(StreamingResponse):
    """A follow's stream, its place (:class:`_StreamSlot`) given back when it ends: sent
    whole, its follower gone, or not sent at all."""

    def __init__(self, slot: _StreamSlot, content: AsyncIterator[bytes], **kwargs: Any):
        super().__init__(content, **kwargs)
        self.slot = slot

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name, "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise BadNameError(f"query parameter {name} must be true or false, not {value!r}")
    return value in ("true", "1")


Handler = Callable[[Request, Principal], Awaitable[Response]]


class Api:
    """The routes, bound to one :class:`ServerState`."""

    def __init__(self, state: ServerState):
        self.state = state

    # -- the wrapper every route goes through ----------------------------------------

    def route(self, fn: Handler, *, replay: bool = False) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                principal = self._principal(request)
            except AgentSessionError as exc:
                return _problem(exc)
            key = request.headers.get("idempotency-key") if replay else None
            if key is None:
                return await self._answer(fn, request, principal)
            # A retry that arrives while the first request with its key is still being
            # served waits for that one's outcome rather than acting a second time.
            slot = (principal.key, key)
            while (running := self.state.inflight.get(slot)) is not None:
                await running.wait()
            stored = self._replayed(principal, key, request)
            if stored is not None:
                return stored
            full = self._keys_full(principal)
            if full is not None:
                return full
            done = self.state.inflight[slot] = asyncio.Event()
            self.state.token_inflight[principal.key] += 1
            try:
                response = await self._answer(fn, request, principal)
                self._remember(principal, key, request, response)
                return response
            finally:
                del self.state.inflight[slot]
                self.state.token_inflight[principal.key] -= 1
                if not self.state.token_inflight[principal.key]:
                    del self.state.token_inflight[principal.key]
                done.set()

        return endpoint

    async def _answer(self, fn: Handler, request: Request, principal: Principal) -> Response:
        """The route's response, a refusal as its problem body; followers woken after a write."""
        try:
            response = await fn(request, principal)
        except AgentSessionError as exc:
            response = _problem(exc)
        except Exception as exc:  # a bug or a failure the store did not name: still a problem body
            log.exception("unexpected failure serving %s %s", request.method, request.url.path)
            response = _problem(StoreError(f"the server failed: {type(exc).__name__}: {exc}"))
        if request.method == "HEAD":
            # A GET route's HEAD (Starlette routes HEAD to it): the handlers skip their
            # body work for it; a body made all the same (a small one: the capabilities, a
            # problem) is not sent, its length said, and no stream is begun.
            if isinstance(response, StreamingResponse):
                if isinstance(response, _CountedStream):
                    response.slot.release()
                return _headers_only(response.status_code, None, None, response.raw_headers)
            out = Response(None, response.status_code)
            out.raw_headers = response.raw_headers
            return out
        if request.method not in ("GET", "HEAD"):
            sid = request.path_params.get("id")
            if sid is not None:
                self.state.changes.notify(sid)  # wake the session's followers
            self.state.changes.notify(REFS_CHANGED)  # and the refs' (a ref moved, a session went)
        return response

    def _principal(self, request: Request) -> Principal:
        if self.state.tokens is None:
            return LOCAL
        return self.state.tokens.principal(request.headers.get("authorization"))

    def _replayed(self, principal: Principal, key: str, request: Request) -> Response | None:
        with self.state.lock:
            self._expire_replies()
            stored = self.state.replies.get((principal.key, key))
        if stored is None:
            return None
        if stored.method != request.method or stored.path != request.url.path:
            return _problem(BadNameError(
                f"Idempotency-Key {key!r} was first used for {stored.method} {stored.path}, not this request"
            ))
        headers = dict(stored.headers, **{"Idempotent-Replay": "true"})
        return Response(stored.body, stored.status, headers, media_type=stored.media_type)

    def _remember(self, principal: Principal, key: str, request: Request, response: Response) -> None:
        if response.status_code >= 500:
            return  # a fault is not an outcome: the retry may succeed
        headers = {k: v for k, v in response.headers.items() if k.lower() in ("incarnation", "location")}
        stored = _Stored(request.method, request.url.path, response.status_code, bytes(response.body),
                         response.media_type or JSON, headers, time.monotonic())
        with self.state.lock:
            self.state.replies[(principal.key, key)] = stored
            self.state.token_replies.setdefault(principal.key, deque()).append(stored.at)

    def _keys_full(self, principal: Principal) -> Response | None:
        """A 503 (retryable) when the caller's token holds its share of the table of keys
        (:meth:`Limits.keys_per_token`), or the table holds :attr:`Limits.idempotency_keys`,
        counting those being served; else None. A key is forgotten only once its
        ``idempotency_ttl_ms`` has passed (RFC 0003: the first outcome is returned "for at
        least the lease's longest TTL"), never to make room, so a new key waits until the
        oldest expires (the token's oldest when it is over its share), which
        ``Retry-After`` says. A server without tokens has one caller, who may use the
        whole table: there is no other to be fair to."""
        state, limits = self.state, self.state.limits
        with state.lock:
            self._expire_replies()
            mine = state.token_replies.get(principal.key) or deque()
            held = len(mine) + state.token_inflight[principal.key]
            if state.tokens is not None and held >= limits.keys_per_token():
                oldest = mine[0] if mine else None
                why = (f"this token ({principal.name}) has {held} Idempotency-Keys remembered, its share of the "
                       f"{limits.idempotency_keys} this server keeps")
            else:
                held = len(state.replies) + len(state.inflight)
                if held < limits.idempotency_keys:
                    return None
                first = next(iter(state.replies.values()), None)
                oldest = None if first is None else first.at
                why = f"this server remembers {held} Idempotency-Keys, its limit"
        wait = math.ceil(max(1.0, 1.0 if oldest is None else oldest + limits.idempotency_ttl_ms / 1000 - time.monotonic()))
        busy = StoreError(f"{why} (each for {limits.idempotency_ttl_ms // 1000} s); "
                          f"nothing was done: send this request again in {wait} s")
        busy.status = 503
        return _problem(busy, {"Retry-After": str(wait)})

    def _expire_replies(self) -> None:
        """Forget the keys older than ``idempotency_ttl_ms``: the oldest come first, in
        the table and in each token's."""
        horizon = time.monotonic() - self.state.limits.idempotency_ttl_ms / 1000
        replies, by_token = self.state.replies, self.state.token_replies
        while replies:
            first = next(iter(replies.values()))
            if first.at >= horizon:
                break
            (who, _), _ = replies.popitem(last=False)
            mine = by_token.get(who)
            if mine:
                mine.popleft()
            if not mine:
                by_token.pop(who, None)

    async def work(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run store work in a worker thread, under the server's lock."""

        def locked() -> Any:
            with self.state.lock:
                return fn(*args)

        return await run_in_threadpool(locked)

    async def soon(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run short store work (a follower's read of what was just written) in the event
        loop when the lock is free, else in a worker thread as :meth:`work` does: a
        follower is woken right after a write, when the lock is usually free, and a thread
        hop would be most of its latency; one that waits never blocks the loop."""
        if self.state.lock.acquire(blocking=False):
            try:
                return fn(*args)
            finally:
                self.state.lock.release()
        return await self.work(fn, *args)

    def quick(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run small store work (one append batch, a commit, a lease) in the event loop
        itself, under the same lock: a thread hop would cost more than the work, and the
        store's writes are ordered by the lock either way."""
        with self.state.lock:
            return fn(*args)

    # -- capabilities ------------------------------------------------------------------

    async def capabilities(self, request: Request, principal: Principal) -> Response:
        st = self.state
        backend = st.store.backend
        return _json({
            "protocol": "agentsession-store/1",
            "formats": {"reads": [f"agentsession/0.{m}" for m in range(5, FORMAT_MINOR + 1)] if FORMAT_MAJOR == 0 else [],
                        "writes": FORMAT_WRITTEN},
            "features": dict(FEATURES, ref_log=backend.refs.keeps_moves),
            "limits": st.limits.as_dict(),
            "auth": "bearer" if st.tokens is not None else "none (loopback only)",
            "tls": st.tls,
            "store": {"describe": st.store.describe(), "persistent": backend.capabilities.persistent,
                      "read_only": st.store.readonly},
            "principal": {"name": principal.name, "scopes": sorted(principal.scopes), "sessions": principal.sessions},
        })

    # -- objects -------------------------------------------------------------------------

    def _object_name(self, request: Request) -> tuple[Space, str]:
        space = space_from_wire(request.path_params["space"])
        name = request.path_params["hash"]
        if not is_hash(name):
            raise not_an_object_name(name)
        return space, name

    async def get_object(self, request: Request, principal: Principal) -> Response:
        _need_any(principal, "read", "exchange")
        space, name = self._object_name(request)

        head = request.method == "HEAD"

        def do() -> bytes:
            if not self.state.reachable(principal, space, name):
                raise NoSuchObjectError(f"no {space_to_wire(space)} object {name} here that this caller may read")
            return b"" if head else self.state.store.objects.get(space, name)  # (a HEAD: held, not read)

        data = await self.work(do)
        headers = {"Cache-Control": "private, max-age=31536000, immutable"}
        if head:
            return _headers_only(200, headers, OCTETS)
        return Response(data, 200, headers, media_type=OCTETS)

    async def put_object(self, request: Request, principal: Principal) -> Response:
        principal.need("exchange")
        space, name = self._object_name(request)
        data = await _body(request, self.state.limits.max_object_bytes)

        def do() -> None:
            self.state.endpoint.put_objects([(space, name, data)], 1)
            mine = self.state.uploads.setdefault(principal.key, {})
            now = time.monotonic()
            mine[(space, name)] = now
            if len(mine) > 100_000:  # forget those past the grace period
                horizon = now - self.state.limits.upload_grace_s
                for k in [k for k, at in mine.items() if at < horizon]:
                    del mine[k]

        await self.work(do)
        return Response(b"", 204)

    async def put_objects(self, request: Request, principal: Principal) -> Response:
        """``POST /v1/objects``: this server's extension (capability ``object_batch``), many
        uploads in one body, each framed ``<space> <hash> <length>\\n<bytes>``, stored as
        one batch (one pack, one sync) and each verified as a PUT is."""
        principal.need("exchange")
        raw = await _body(request, self.state.limits.max_body_bytes)
        items = parse_frames(raw, self.state.limits.max_object_bytes)

        def do() -> None:
            self.state.endpoint.put_objects(items, len(items))
            mine = self.state.uploads.setdefault(principal.key, {})
            now = time.monotonic()
            for space, name, _ in items:
                mine[(space, name)] = now

        await self.work(do)
        return _json({"stored": len(items)})

    async def _asked(self, request: Request) -> list[tuple[Space, list[str]]]:
        """The hashes a ``missing`` or batch read asks about, by space, each once, in the
        order asked: ``{"entries": [...], "contents": [...], "media": [...]}``."""
        wanted = _obj(_parse_json(await _body(request, self.state.limits.max_body_bytes), "the request"), "the request")
        count = sum(len(v) for v in wanted.values() if isinstance(v, list))
        if count > self.state.limits.max_missing:
            raise TooLargeError(f"{count} hashes asked; this server answers at most {self.state.limits.max_missing} at once")
        out: list[tuple[Space, list[str]]] = []
        for wire_space, names in wanted.items():
            space = space_from_wire(wire_space)
            if not isinstance(names, list):
                raise BadNameError(f"{wire_space} must be a list of hashes")
            for name in names:
                if not isinstance(name, str) or not is_hash(name):
                    raise not_an_object_name(name)
            out.append((space, list(dict.fromkeys(names))))
        return out

    async def missing(self, request: Request, principal: Principal) -> Response:
        principal.need("exchange")
        asked = await self._asked(request)

        def do() -> dict[str, list[str]]:
            sessions = self.state.reach.view(self.state.readable(principal))
            out: dict[str, list[str]] = {}
            for space, names in asked:
                seen = [name for name in names if self.state.reach.in_view(sessions, space, name)]
                found = {name for name, here in zip(seen, self.state.present_many(space, seen)) if here}
                out[space_to_wire(space)] = [name for name in names if name not in found]
            return out

        return _json(await self.work(do))

    async def read_objects(self, request: Request, principal: Principal) -> Response:
        """``POST /v1/objects/read``: this server's extension (capability ``object_read``),
        many GETs in one request. The body asks as ``missing`` does; the answer streams
        the objects the caller may read, each framed ``<space> <hash> <length>\\n<bytes>``
        as a batch upload is, then ``end <count>``. An object the caller may not read, or
        the server lacks, is left out, as a GET answers 404 for it: the client names it.
        Each piece is read under the lock on its own, so a long answer neither holds up
        writers nor is held whole; a failure part way is an ``error`` frame."""
        _need_any(principal, "read", "exchange")
        asked = await self._asked(request)
        pieces = [(space, names[i : i + _READ_PIECE]) for space, names in asked for i in range(0, len(names), _READ_PIECE)]
        sessions = await self.work(lambda: self.state.reach.view(self.state.readable(principal)))

        def frames(space: Space, names: list[str]) -> tuple[int, bytes]:
            out = [object_frame(space, name, data) for name, data in self.state.reachable_objects(space, names, sessions)]
            return len(out), b"".join(out)

        async def body() -> Any:
            served = 0
            try:
                for space, names in pieces:
                    count, data = await self.work(frames, space, names)
                    served += count
                    yield data
            except AgentSessionError as exc:
                yield error_frame(exc)
                return
            yield end_frame(served)

        return StreamingResponse(body(), media_type=OBJECTS)

    # -- sessions ------------------------------------------------------------------------

    def _session_facts(self, s: Session) -> dict[str, Any]:
        return {
            "session": s.id,
            "header": dict(s.header.data),
            "incarnation": header_ident(s.header.data),
            "head": s.head,
            "base": s.base,
            "mark": s.mark,
            "length": len(s),
        }

    def _readable_session(self, principal: Principal, session_id: str, request: Request) -> Session:
        """The session, for a caller who may read it; the If-Incarnation check."""
        check_session_id(session_id)
        if not principal.may_read(session_id):
            principal.need_session(session_id, "read")
        s = self.state.session(session_id)
        _check_incarnation(request, s)
        return s

    def _origins_readable(self, principal: Principal, s: Session) -> bool:
        """Whether the caller may read every session a fork's prefix crosses into: its
        origin (``parent_session``), and, where that is a fork too, its origin's, and so
        on. ``parent_session`` is provenance the writer states, so the origin must be
        there and hold the fork's base (its own entry or on its prefix), looked at
        read-only (a path read takes no writer's hold of it); an origin deleted, damaged,
        named twice in the chain or not holding the base cannot vouch for what the prefix
        crosses, and a caller whose scope is limited is refused (``no_entry``)."""
        if not principal.sessions:
            return True  # a caller who may read every session
        header, seen = s.header.data, {s.id}
        while (base := header.get("base")) is not None:
            origin = header.get("parent_session")
            if not (isinstance(origin, str) and principal.may_read(origin)) or origin in seen:
                return False
            seen.add(origin)
            try:
                o = self.state.store.read(origin)
            except AgentSessionError:  # deleted, or damaged
                return False
            try:
                if base not in o and (o.base is None or base not in o.prefix_set):
                    return False  # the named origin does not hold the base
                header = o.header.data  # (a path through it crosses its own base in turn)
            finally:
                o.close()
        return True

    async def _session_head(self, request: Request, principal: Principal, sid: str, media: str,
                            headers: dict[str, str] | None = None) -> Response:
        """A ``HEAD`` of a route about one session: the session checked as its GET checks it
        (scope, held, ``If-Incarnation``) and named by its ``Incarnation``; nothing more read."""
        s = await self.work(self._readable_session, principal, sid, request)
        return _headers_only(200, dict(headers or {}, Incarnation=header_ident(s.header.data)), media)

    async def get_session(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        if request.method == "HEAD":  # its facts (a read of its log) are not made
            return await self._session_head(request, principal, sid, JSON)

        def do() -> dict[str, Any]:
            s = self._readable_session(principal, sid, request)
            facts = self._session_facts(s)
            lease = self.state.leases.current(sid)
            facts["leased"] = lease is not None
            facts["cursor"] = self.state.tails.cursor(s)
            return facts

        facts = await self.work(do)
        return _json(facts, headers={"Incarnation": facts["incarnation"]})

    async def list_sessions(self, request: Request, principal: Principal) -> Response:
        _need_any(principal, "read", "exchange")
        q = request.query_params
        if "page" in q:
            raise UnsupportedError("this server lists in one stream and hands out no page tokens")
        with_names, current = _flag(request, "with_names"), _flag(request, "current")
        top_level = _flag(request, "top_level")
        limit = _whole(q["limit"], "limit") if "limit" in q else None
        extras: list[tuple[str, bytes]] = []
        for item in q.getlist("extra"):
            name, sep, value = item.partition(":")
            if not sep:
                raise BadNameError("extra is written name:<canonical JSON value>")
            try:
                extras.append((name, canonical_bytes(_parse_json(value.encode("utf-8"), f"extra {name}"))))
            except IJSONError as exc:  # (a whole number past 2**53: the canonical form refuses it)
                raise BadNameError(f"extra {name} is not I-JSON: {exc}") from None

        when = {k: _when(q[k], k) for k in ("after", "before") if k in q}
        if request.method == "HEAD":  # the query checked; no session read
            return _headers_only(200, None, NDJSON)

        def do() -> list[bytes]:
            headers: dict[str, Header] = {}
            summaries: list[SessionSummary] = []
            for sid in self.state.readable(principal):
                try:
                    header = self.state.store.header(sid)
                except NoSuchSessionError:
                    continue
                if _matches(header, q, top_level, extras):
                    headers[sid] = header
                    summaries.append(self.state.store.summary(sid))
            # The library's List filter and order (agentsession list's): one rule.
            chosen = select(summaries, harness=q.get("harness"), cwd=q.get("cwd"), current=current,
                            limit=limit, **when)
            rows: list[bytes] = []
            for summary in chosen:
                header = headers[summary.id]
                row = {"id": summary.id, "header": header.data, "incarnation": header_ident(header.data),
                       "name": summary.title, "modified": summary.last_activity,
                       "size": self.state.store.backend.sessions.size(summary.id)}
                if with_names or current:
                    row["superseded_by"] = summary.continued_in
                rows.append(_dumps(row))
            return rows + [_dumps({"end": True, "count": len(rows)})]

        return _ndjson(await self.work(do))

    async def create_session(self, request: Request, principal: Principal) -> Response:
        header = _obj(_parse_json(await _body(request, self.state.limits.max_body_bytes), "the header"), "the header")
        q = request.query_params
        # Refused before anything lands.
        ttl = _ttl_ms(_whole(q["lease_ttl_ms"], "lease_ttl_ms"), "lease_ttl_ms") if "lease_ttl_ms" in q else None
        holder = request.query_params.get("holder", principal.name)
        data = dict(header)
        data.setdefault("id", str(uuid.uuid4()))
        if not isinstance(data["id"], str):
            raise BadNameError("the header's id must be a string")
        principal.need_session(data["id"], "write")

        def do() -> tuple[int, dict[str, Any]]:
            sid = check_session_id(data["id"])
            store = self.state.store
            if sid in store:
                held = store.header(sid)
                filled = Header(dict(data))
                if "created_at" in data and header_ident(held.data) == header_ident(filled.data):
                    s = self.state.session(sid)
                    return 200, self._session_facts(s)
                raise SessionExistsError(f"session {sid} already exists under another header")
            base = data.get("base")
            if base is not None and not self.state.reachable(principal, "entries", str(base)):
                raise NoSuchEntryError(f"base {base} is not an entry of a session this caller may read")
            # The client's store made the header (and checked it) or imports one a session
            # has: a member of another form is kept, as an import and a push keep it.
            s = store.create(Header(data), given=True)
            self.state.reach.forget(sid)
            facts = self._session_facts(s)
            if ttl is not None:
                lease, _ = self.state.leases.acquire(sid, holder, ttl)
                facts["lease"] = lease.as_dict()
            return 201, facts

        status, facts = await self.work(do)
        return _json(facts, status, headers={"Incarnation": facts["incarnation"]})

    async def delete_session(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        principal.need_session(sid, "write")

        def do() -> dict[str, Any]:
            s = self.state.session(sid)
            _check_incarnation(request, s)
            self.state.leases.check(sid, request.headers.get("lease-token"))
            ident = header_ident(s.header.data)
            self.state.store.delete(sid)
            self.state.reach.forget(sid)
            self.state.tails.forget(sid)
            self.state.leases.drop(sid)
            return {"session": sid, "deleted": True, "incarnation": ident}

        facts = await self.work(do)
        return _json(facts, headers={"Incarnation": facts["incarnation"]})

    # -- reading ---------------------------------------------------------------------------

    async def read_log(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        durable = _flag(request, "durable")
        after = request.query_params.get("after")
        if request.method == "HEAD":  # no log read, nothing committed
            answer = await self._session_head(request, principal, sid, NDJSON)
            if after is not None and answer.status_code < 300:  # (after the session's checks, as the GET)
                _cursor_of(after, answer.headers["Incarnation"])
            return answer

        def snapshot() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            s = self._readable_session(principal, sid, request)
            if durable:
                s.commit()
            return s.records(), dict(s.header.data)

        # The log is read under the store's lock; its lines are made outside it, so a
        # long session's read does not hold up other sessions' writers.
        records, header = await self.work(snapshot)
        return _ndjson(await run_in_threadpool(_log_lines, sid, records, header, durable, after),
                       headers={"Incarnation": header_ident(header)})

    async def read_path(self, request: Request, principal: Principal) -> Response:
        """The path from the root to the head (or ``leaf``), streamed: the walk up and
        each piece of lines are store work of their own under the lock, so a long path
        neither holds up other writers while it is read nor is held whole in memory. A
        failure once the stream has begun is its last frame (RFC 0003, Streams)."""
        sid = request.path_params["id"]
        contents = request.query_params.get("contents", "all")
        if contents not in ("all", "since-fold", "none"):
            raise BadNameError(f"contents must be all, since-fold or none, not {contents!r}")
        leaf = request.query_params.get("leaf")
        store = self.state.store
        head = request.method == "HEAD"

        def start() -> tuple[str | None, str, dict[str, Any]]:
            s = self._readable_session(principal, sid, request)
            ident = header_ident(s.header.data)
            target = leaf if leaf is not None else s.head
            if target is not None and not (target in s.own or target in s.prefix_set):
                raise NoSuchEntryError(f"{target} is not an entry of session {sid}")
            if target is not None and s.base is not None and not self._origins_readable(principal, s):
                # RFC 0003, Reading: the walk from any entry of a fork crosses its base into
                # the origin's entries, which this caller may not read: the base is no_entry,
                # and so is every entry whose path crosses it (the head's, by default).
                raise NoSuchEntryError(f"{target} is not an entry of a session this caller may read: its path "
                                       "crosses the fork's base into a session this caller may not read")
            if head:  # the session and the leaf checked; no cursor made, no path walked
                return target, ident, {}
            first = {"head": s.head, "cursor": self.state.tails.cursor(s), "incarnation": ident}
            return target, ident, first

        target, ident, first = await self.work(start)
        if head:
            return _headers_only(200, {"Incarnation": ident}, NDJSON)
        # The walk keeps each entry's id, type and content hash (what since-fold reads).
        steps: list[tuple[str, Any, Any]] = []
        if target is not None:
            walk = store.ancestry_up(target)
            while piece := await self.work(
                lambda: [(eid, env.get("type"), env.get("content")) for eid, env in islice(walk, _PATH_PIECE * 16)]
            ):
                steps.extend(piece)
            steps.reverse()
        ids = [eid for eid, _, _ in steps]
        wanted, first["contents"] = await _shallow(self.work, store, steps, contents)
        del steps

        def lines(at: int) -> bytes:
            out: list[bytes] = []
            piece = ids[at : at + _PATH_PIECE]
            envs = store.objects.get_many("entries", piece)
            chashes = [envelope_content(env) for env in envs]
            named = [c for n, c in enumerate(chashes) if c is not None and wanted[at + n]]
            bodies = iter(store.objects.get_many("contents", named))
            for n, eid in enumerate(piece):
                chash = chashes[n]
                body = next(bodies) if chash is not None and wanted[at + n] else b"null"
                line = b'{"entry":"' + eid.encode() + b'","envelope":' + envs[n] + b',"content":' + body
                if at + n == 0:
                    line += b"," + _dumps(first)[1:-1]
                out.append(line + b"}\n")
            return b"".join(out)

        async def body() -> Any:
            try:
                for at in range(0, len(ids), _PATH_PIECE):
                    yield await self.work(lines, at)
            except AgentSessionError as exc:
                yield _dumps({"error": problem_body(exc)}) + b"\n"
                return
            end: dict[str, Any] = {"end": True, "count": len(ids), "incarnation": ident}
            if not ids:  # no first line to carry them (a session with no entry): the end frame does, as a log read's
                end.update(first)
            yield _dumps(end) + b"\n"

        return StreamingResponse(body(), media_type=NDJSON, headers={"Incarnation": ident})

    async def follow(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        durable = _flag(request, "durable")
        after = request.headers.get("last-event-id") or request.query_params.get("after")
        accept = request.headers.get("accept", "")
        sse = "application/x-ndjson" not in accept
        media = "text/event-stream" if sse else NDJSON
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        if request.method == "HEAD":  # no stream opened, no log read; at the limit, the GET's 503
            return self._streams_busy() or await self._session_head(request, principal, sid, media, headers)
        slot = self._admit_stream()
        if isinstance(slot, Response):
            return slot
        try:

            def first() -> Any:
                self._readable_session(principal, sid, request)
                return load_view(self.state.store, self.state.tails, sid, durable)

            view = await self.work(first)
            # A durable follow commits before it reads (a wait on the disk): never in the loop.
            stream = Stream(self.state.store, sid, durable, sse, self.work if durable else self.soon, self.state.changes,
                            self.state.tails, float(self.state.limits.max_stream_age_s),
                            self.state.limits.max_resume_records)
        except BaseException:
            slot.release()
            raise
        return _CountedStream(slot, stream.events(view, after), media_type=media,
                              headers=dict(headers, Incarnation=view.ident))

    def _admit_stream(self) -> _StreamSlot | Response:
        """A place among the open follow streams (a session's and a ref's alike), taken at
        once, at admission, so requests admitted together cannot pass ``max_streams`` while
        each reads its session before its stream begins (RFC 0003: a server SHOULD bound
        the number of open streams). At the limit, a 503 with ``Retry-After``: the oldest
        open stream ends by its age limit at the latest (sooner if its follower leaves),
        the wait a refused follower is given (RFC 0003 clients retry a 503 after it)."""
        busy = self._streams_busy()
        return _StreamSlot(self.state) if busy is None else busy

    def _streams_busy(self) -> Response | None:
        """The 503 :meth:`_admit_stream` answers at the limit, or None below it: what a
        follow's ``HEAD`` answers too (the status its GET would get), taking no place."""
        state = self.state
        if state.streams < state.limits.max_streams:
            return None
        starts = state.stream_starts
        age = float(state.limits.max_stream_age_s)
        wait = math.ceil(max(1.0, (min(starts) + age - time.monotonic()) if starts else 1.0))
        busy = StoreError(f"this server has {state.streams} follow streams open, its limit; "
                          f"one ends within {wait} s: try again then")
        busy.status = 503
        return _problem(busy, {"Retry-After": str(wait)})

    # -- exchange --------------------------------------------------------------------------

    async def push(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        principal.need_session(sid, "exchange")
        body = _obj(_parse_json(await _body(request, self.state.limits.max_body_bytes), "the push"), "the push")
        req = _push_request(sid, body)
        if req.refs:
            principal.need("refs")
        for ref in req.refs:
            if ref.next != sid:
                raise BadRefTargetError(f"pushed ref {ref.name} must name the pushed session {sid}, not {ref.next}")
            if ref.expected is not None and not principal.may_touch(ref.expected):
                principal.need_session(ref.expected, "refs")  # as an update naming it is refused
        if req.header.get("id") != sid:
            raise BadNameError(f"the pushed header's id {req.header.get('id')!r} is not the session in the path, {sid}")

        def do() -> dict[str, Any]:
            held = self.state.store.opened(sid) or (self.state.session(sid) if sid in self.state.store else None)
            if held is not None:
                _check_incarnation(request, held)
                if header_ident(held.header.data) != header_ident(req.header):
                    raise HeaderDiffersError(
                        f"this server holds another session under the id {sid} (the headers differ apart from "
                        "'format'); nothing was admitted"
                    )
                if self.state.leases.current(sid) is not None:
                    raise SessionLockedError(f"session {sid} is leased here; a push waits until its lease ends")
            self._prove(principal, req, held)
            adm = self.state.endpoint.receive(req)
            s = self.state.session(sid)
            return {
                "session": sid,
                "admitted": adm.admitted,
                "created": adm.created,
                "head": {"moved": adm.moved, "forced": adm.forced, "current": adm.head, "why": adm.why,
                         "previous": adm.previous, "outcome": adm.outcome},
                "mark": adm.mark,
                "refs": [_ref_step(principal, r) for r in adm.refs],
                "incarnation": header_ident(s.header.data),
            }

        out = await self.work(do)
        return _json(out, headers={"Incarnation": out["incarnation"]})

    def _prove(self, principal: Principal, req: PushRequest, held: Session | None = None) -> None:
        """RFC 0003: a push must upload every object it names that the caller could not
        already show it may read. What is neither reachable by the caller nor uploaded by
        it (within the grace period) is ``missing_object``, and nothing is admitted.

        An entry the pushed session already holds here (``held``), with its content and
        blobs, is proven when the caller may read that session: it is what makes them
        reachable. So a whole closure pushed again (a sender that lost what it knew of
        this server) costs its new entries, not the session (a 100,000-entry session's
        re-push read every envelope here)."""
        mine = held.own if held is not None and principal.may_read(held.id) else {}
        uploads = self.state.uploads.get(principal.key, {})
        horizon = time.monotonic() - self.state.limits.upload_grace_s
        sessions = self.state.reach.view(self.state.readable(principal))
        objects = self.state.store.objects
        missing: dict[str, list[str]] = {"entries": [], "contents": [], "blobs": []}

        def proven(space: Space, name: str) -> bool:
            at = uploads.get((space, name))
            if at is not None and at >= horizon:
                return True
            return self.state.reachable(principal, space, name, sessions)

        for eid in list(req.prefix) + list(req.entries):
            if not is_hash(eid):
                raise not_an_entry_id(eid)
            if eid in mine:
                continue
            if not proven("entries", eid):
                missing["entries"].append(eid)
                continue
            chash = envelope_content(objects.get("entries", eid))
            if chash is None:
                continue  # admission refuses it with the reason
            if not proven("contents", chash):
                missing["contents"].append(chash)
                continue
            data = objects.get("contents", chash)
            if b"sidecar:" in data:
                for blob in sidecar_names(data):
                    if not proven("blobs", blob):
                        missing["blobs"].append(blob)
        if any(missing.values()):
            missing = {k: list(dict.fromkeys(v)) for k, v in missing.items() if v}
            parts = ", ".join(f"{len(v)} {k}" for k, v in missing.items())
            raise MissingObjectsError(
                f"push of session {req.session} names objects this caller has not uploaded and may not read ({parts}); "
                "nothing was admitted",
                missing=missing,
            )

    async def handover(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        principal.need_session(sid, "exchange")
        body = _obj(_parse_json(await _body(request, self.state.limits.max_body_bytes), "the handover"), "the handover")
        if body.get("to") != "client":
            raise BadNameError("a handover names {\"to\": \"client\", \"head\": ...}; a push hands over to this server")
        head = _expected(body.get("head"))

        def do() -> dict[str, Any]:
            s = self.state.session(sid)
            _check_incarnation(request, s)
            self._not_leased_to_another(request, sid, "it is handed over once its lease ends")
            result = self.state.endpoint.release_record(sid, head=head)
            return dict(result.as_dict(), incarnation=header_ident(s.header.data))

        out = await self.work(do)
        return _json(out, headers={"Incarnation": out["incarnation"]})

    def _not_leased_to_another(self, request: Request, sid: str, wait: str) -> None:
        """A mark change on a leased session is its holder's (it presents the lease's
        token, as every leased write does); anyone else is ``session_locked``."""
        lease = self.state.leases.current(sid)
        if lease is None:
            return
        token = request.headers.get("lease-token")
        if token is None:
            raise SessionLockedError(f"session {sid} is leased here; {wait}")
        self.state.leases.check(sid, token)

    async def record(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        if "exchange" not in principal.scopes:
            principal.need("write")
        principal.need_session(sid, "exchange" if "exchange" in principal.scopes else "write")
        body = _obj(_parse_json(await _body(request, self.state.limits.max_body_bytes), "the request"), "the request")
        if body.get("basis") not in ("record_deleted", "sole_copy"):
            raise BadNameError("basis must be record_deleted or sole_copy")
        if "head" not in body:
            raise BadNameError("a declare-record carries the head the caller believes this server holds")
        head = _expected(body.get("head"))

        def do() -> dict[str, Any]:
            s = self.state.session(sid)
            _check_incarnation(request, s)
            self._not_leased_to_another(request, sid, "its record is declared once its lease ends")
            result = self.state.endpoint.declare_record(sid, head=head)
            return dict(result.as_dict(), incarnation=header_ident(s.header.data))

        out = await self.work(do)
        return _json(out, headers={"Incarnation": out["incarnation"]})

    # -- leases ----------------------------------------------------------------------------

    async def lease(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        principal.need_session(sid, "write")
        method = request.method
        body: dict[str, Any] = {}
        raw = await _body(request, 64 * 1024)
        if raw.strip():
            body = _obj(_parse_json(raw, "the request"), "the request")
        lease_id = request.headers.get("lease-id", "")

        def do() -> tuple[int, dict[str, Any]]:
            s = self.state.session(sid)
            _check_incarnation(request, s)
            leases = self.state.leases
            ident = header_ident(s.header.data)
            if method == "POST":
                if s.mark != "record":
                    raise MirrorError(f"session {sid} is held here as a mirror; a mirror is written only through exchange")
                ttl = _ttl_ms(body.get("ttl_ms", 30_000))
                holder = body.get("holder", principal.name)
                lease, old = leases.acquire(sid, str(holder), ttl)
                if old is not None:
                    s.commit()  # a takeover resumes from a durable log
                return 201, dict(lease.as_dict(), incarnation=ident)
            if method == "PUT":
                # A ttl_ms that is not one is refused, as an acquire refuses it (it was
                # ignored, and one of 0 or less left a lease of 1 ms).
                lease = leases.renew(sid, lease_id, _ttl_ms(body["ttl_ms"]) if "ttl_ms" in body else None)
                return 200, dict(lease.as_dict(), incarnation=ident)
            lease = leases.release(sid, lease_id)
            s.commit()
            return 200, {"session": sid, "released": True, "token": lease.token, "incarnation": ident}

        status, out = self.quick(do)
        return _json(out, status, headers={"Incarnation": out["incarnation"]})

    async def lease_break(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        principal.need_session(sid, "admin")

        def do() -> dict[str, Any]:
            s = self.state.session(sid)
            _check_incarnation(request, s)
            old = self.state.leases.break_(sid)
            s.commit()
            return {"session": sid, "broken": old is not None, "holder": old.holder if old else None,
                    "incarnation": header_ident(s.header.data)}

        out = await self.work(do)
        return _json(out, headers={"Incarnation": out["incarnation"]})

    # -- writing ---------------------------------------------------------------------------

    def _writer(self, principal: Principal, request: Request, sid: str, what: str = "") -> Session:
        """The session for a leased write: scope, incarnation, then the fence. ``what``
        names a write a mirror refuses (an append, a head move): a mirror is never
        leased, so it is refused as ``mirror`` before the fence, not as ``lease_lost``."""
        s = self.state.session(sid)
        _check_incarnation(request, s)
        if what and s.mark != "record":
            raise MirrorError(f"session {sid} is held here as a mirror; {what} only through exchange")
        self.state.leases.check(sid, request.headers.get("lease-token"))
        return s

    async def append(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        principal.need_session(sid, "write")
        commit = _flag(request, "commit")
        fmt = request.headers.get("session-format")
        raw = await _body(request, self.state.limits.max_body_bytes)
        lines = [line for line in raw.split(b"\n") if line.strip()]
        if not lines:
            raise BadNameError("an append carries one entry line, or several as newline-delimited lines")

        def do() -> dict[str, Any]:
            s = self._writer(principal, request, sid, "it is appended to")
            s.writer_format = _check_format(fmt, s)
            objs: list[dict[str, Any]] = []
            stopped: dict[str, Any] | None = None
            for i, line in enumerate(lines):
                try:
                    objs.append(_entry_line(line, i))
                except AgentSessionError as exc:
                    stopped = {"index": i, "problem": problem_body(exc)}
                    break
            durable = True if commit else None
            done: list[AppendResult] = []
            try:  # the whole batch as one prepared write: one log write, one commit at most
                batch = s.prepare(objs)
            except AgentSessionError:
                # A line is refused: apply them one by one, to stop exactly at it.
                for i, obj in enumerate(objs):
                    try:
                        done.append(s.prepare([obj]).commit(durable=durable)[0])
                    except AgentSessionError as exc:
                        stopped = {"index": i, "problem": problem_body(exc)}
                        break
            else:
                try:
                    done = batch.commit(durable=durable)
                except AgentSessionError as exc:  # the write failed: nothing of the batch landed
                    stopped = {"index": 0, "problem": problem_body(exc)}
            if commit:
                s.commit()
            results = [{"id": r.id, "outcome": OUTCOMES.get(r.outcome, r.outcome), "head": r.head,
                        "durable": r.durable or commit, "seq": r.seq, "unresolved": list(r.unresolved)} for r in done]
            ident = header_ident(s.header.data)
            return {"session": sid, "results": results, "stopped": stopped, "head": s.head, "incarnation": ident}

        # A commit waits on the disk and a long batch takes a while: both off the event loop.
        out = await self.work(do) if commit or len(lines) > QUICK_LINES else self.quick(do)
        return _json(out, headers={"Incarnation": out["incarnation"]})

    async def commit(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        principal.need_session(sid, "write")

        def do() -> dict[str, Any]:
            s = self._writer(principal, request, sid)
            s.commit()
            ident = header_ident(s.header.data)
            return {"session": sid, "cursor": self.state.tails.cursor(s), "head": s.head, "incarnation": ident}

        out = self.quick(do)
        return _json(out, headers={"Incarnation": out["incarnation"]})

    async def set_head(self, request: Request, principal: Principal) -> Response:
        sid = request.path_params["id"]
        principal.need_session(sid, "write")
        body = _obj(_parse_json(await _body(request, 64 * 1024), "the request"), "the request")
        if "expected" not in body or "to" not in body:
            raise BadNameError("a head move is {\"expected\": e|null, \"to\": t, \"durable\": bool}")
        expected, to = _expected(body["expected"]), body["to"]
        head_target_given(to)

        def do() -> dict[str, Any]:
            s = self._writer(principal, request, sid, "its head moves")
            try:
                s.set_head(to, expected=expected)
            except HeadMovedError as exc:  # RFC 0003: head_moved with the current head
                raise HeadMovedError(str(exc), current=s.head) from None
            ident = header_ident(s.header.data)
            return {"session": sid, "head": s.head, "durable": True, "incarnation": ident,
                    "cursor": self.state.tails.cursor(s)}

        out = self.quick(do)
        return _json(out, headers={"Incarnation": out["incarnation"]})

    # -- refs --------------------------------------------------------------------------------

    async def list_refs(self, request: Request, principal: Principal) -> Response:
        _need_any(principal, "read", "refs")
        # A prefix that breaks the name rules is ref_name before the stream begins (RFC
        # 0003: "ref_name on a read as on a write"), not a 200 ending in an error frame.
        prefix = check_ref_prefix(request.query_params.get("prefix", ""))
        if request.method == "HEAD":  # the prefix checked; no ref read
            return _headers_only(200, None, NDJSON)

        def do() -> Iterator[bytes]:
            refs = Refs(self.state.store)
            lines = []
            try:
                for ref in refs.iter(prefix):
                    if not principal.may_touch(ref.session):
                        continue
                    lines.append(_dumps(_ref_facts(refs, ref)))
            except AgentSessionError as exc:
                lines.append(_dumps({"error": problem_body(exc)}))
                return iter(lines)
            lines.append(_dumps({"end": True, "count": len(lines)}))
            return iter(lines)

        return _ndjson(await self.work(do))

    async def ref(self, request: Request, principal: Principal) -> Response:
        name = request.path_params["name"]
        try:
            check_ref_name(name)
        except BadNameError as exc:
            raise BadRefNameError(str(exc)) from None
        view = request.query_params.get("view")
        if request.method == "PUT":
            return await self._update_ref(request, principal, name)
        if view == "follow":
            _need_any(principal, "read", "refs")
            return await self._follow_ref(request, principal, name)
        if view == "log":
            _need_any(principal, "read", "refs")
            if request.method == "HEAD":  # no history read
                Refs(self.state.store).require_log()
                return _headers_only(200, None, NDJSON)
            return await self._ref_log(principal, name)
        if view is not None:
            raise BadNameError(f"view must be log or follow, not {view!r}")
        _need_any(principal, "read", "refs")

        def do() -> tuple[int, dict[str, Any]]:
            refs = Refs(self.state.store)
            ref = refs.get(name)
            if ref is None or not principal.may_touch(ref.session):
                raise NoSuchRefError(f"no such ref: {name}")
            facts = _ref_facts(refs, ref)
            if facts["state"] != "live":
                return 409, dict(problem_body(_dangling(name, ref.session, facts["state"])), **facts)
            return 200, facts

        status, out = await self.work(do)
        if status == 409:
            return Response(json.dumps(out).encode(), 409, media_type=PROBLEM)
        return _json(out, headers={"Incarnation": out["incarnation"]} if out.get("incarnation") else None)

    async def _ref_log(self, principal: Principal, name: str) -> Response:
        """``?view=log``: the ref's changes, newest first, as NDJSON ending ``end``; each
        ``{name, old, new, ident, at[, reason]}`` with ``old``/``new`` as targets. A caller
        limited to a session prefix sees a change only when it may touch both sides."""

        def do() -> list[bytes]:
            out = []
            for move in Refs(self.state.store).log(name):
                if not all(s is None or principal.may_touch(s) for s in (move.get("old"), move.get("new"))):
                    continue
                out.append(_dumps({
                    "name": name, "at": move.get("at"), "reason": move.get("reason"), "incarnation": move.get("ident"),
                    "old": {"session": move["old"], "entry": ""} if move.get("old") else None,
                    "new": {"session": move["new"], "entry": ""} if move.get("new") else None,
                }))
            return out + [_dumps({"end": True, "count": len(out)})]

        return _ndjson(await self.work(do))

    async def _follow_ref(self, request: Request, principal: Principal, name: str) -> Response:
        """``?view=follow``: a ``target`` event with ``{name, target, state}`` on connect and
        whenever the target or its state (live, dangling) changes, as SSE or NDJSON."""
        sse = "application/x-ndjson" not in request.headers.get("accept", "")
        media = "text/event-stream" if sse else NDJSON
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        if request.method == "HEAD":  # no stream opened, the ref not read; at the limit, the GET's 503
            return self._streams_busy() or _headers_only(200, headers, media)

        def read() -> dict[str, Any]:
            refs = Refs(self.state.store)
            ref = refs.get(name)
            if ref is None or not principal.may_touch(ref.session):
                return {"name": name, "target": None, "state": "live"}
            facts = _ref_facts(refs, ref)
            return {"name": name, "target": facts["target"], "state": "live" if facts["state"] == "live" else "dangling"}

        slot = self._admit_stream()  # (a ref's follows were not counted against the limit)
        if isinstance(slot, Response):
            return slot
        try:
            first = await self.work(read)
        except BaseException:
            slot.release()
            raise
        changes = self.state.changes
        age = float(self.state.limits.max_stream_age_s)

        def frame(data: dict[str, Any], n: int, kind: str = "target") -> bytes:
            body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
            if sse:
                return f"id: {n}\nevent: {kind}\ndata: {body}\n\n".encode()
            return _dumps({"event": kind, "id": str(n), "data": data}) + b"\n"

        async def body() -> AsyncIterator[bytes]:
            last, n, started = first, 0, time.monotonic()
            yield frame(first, n)
            while (left := age - (time.monotonic() - started)) > 0:
                try:
                    await asyncio.wait_for(changes.event(REFS_CHANGED).wait(), timeout=min(15.0, left))
                except TimeoutError:
                    yield b": keep-alive\n\n" if sse else b"\n"
                    continue
                if changes.closing:  # the server is stopping: end now, not at the age limit
                    yield frame({"reason": "shutdown"}, n, "end")
                    return
                now = await self.work(read)
                if now != last:
                    n += 1
                    last = now
                    yield frame(now, n)

        return _CountedStream(slot, body(), media_type=media, headers=headers)

    async def _update_ref(self, request: Request, principal: Principal, name: str) -> Response:
        principal.need("refs")
        body = _obj(_parse_json(await _body(request, 64 * 1024), "the request"), "the request")
        if "expected" not in body or "next" not in body:
            raise BadNameError("a ref update is {\"expected\": target|null, \"next\": target|null}")
        expected, nxt = _target(body["expected"], "expected"), _target(body["next"], "next")
        for sid in (expected, nxt):
            if sid is not None and not principal.may_touch(sid):
                principal.need_session(sid, "refs")

        def do() -> dict[str, Any]:
            refs = Refs(self.state.store)
            held = refs.get(name)
            if held is not None and nxt is not None and held.session == nxt and refs.state(held) != "ok":
                raise _dangling(name, held.session, "dangling" if refs.state(held) == "dangling" else "replaced")
            reason = body.get("reason")
            try:
                update = refs.update(name, nxt, expected=expected, reason=reason if isinstance(reason, str) else None)
            except RefMovedError as exc:
                if exc.current is not None and not principal.may_touch(exc.current):
                    raise _withheld_ref(principal, name) from None
                raise
            return {"name": name, "moved": True, "changed": update.changed,
                    "current": {"session": update.new, "entry": ""} if update.new else None,
                    "previous": {"session": update.old, "entry": ""} if update.old else None}

        return _json(await self.work(do))

    # -- not built -----------------------------------------------------------------------------

    async def unsupported(self, request: Request, principal: Principal) -> Response:
        raise UnsupportedError(f"{request.method} {request.url.path}: this server does not serve it yet (see GET /v1/)")


#: The wakeup key of every ref follower: any write may move a ref or end its session.
REFS_CHANGED = "\0refs"

#: What this server offers (RFC 0003, Conventions): every claim here has a route behind it.
FEATURES: dict[str, bool] = {
    "objects": True,
    "object_batch": True,
    "object_read": True,
    "shallow": True,
    "exchange": True,
    "marks": True,
    "commit": True,
    "committed_view": True,
    "refs": True,
    "ref_log": False,  # per store: whether its backend keeps the refs' history
    "ref_follow": True,
    "follow": True,
    "leases": True,
}


# -- small helpers ---------------------------------------------------------------------------


def _need_any(principal: Principal, *scopes: str) -> None:
    """ScopeError unless the caller holds one of ``scopes`` (the first is named)."""
    if not principal.scopes.intersection(scopes):
        principal.need(scopes[0])


def _entry_line(line: bytes, i: int) -> dict[str, Any]:
    """Line ``i`` of an append batch as an entry object (``bad_entry`` ijson otherwise)."""
    try:
        obj, _ = loads_flagged(line)
    except ValueError as exc:
        raise AppendRefusedError(f"line {i + 1} is not I-JSON: {exc}", rule="ijson") from None
    if not isinstance(obj, dict):
        raise AppendRefusedError(f"line {i + 1} is not a JSON object", rule="ijson")
    return obj


def _check_incarnation(request: Request, s: Session) -> None:
    want = request.headers.get("if-incarnation")
    if want is not None and want != header_ident(s.header.data):
        raise SessionReplacedError(
            f"session {s.id} here is another incarnation ({header_ident(s.header.data)}) than If-Incarnation {want}"
        )


def _check_format(fmt: str | None, s: Session) -> str:
    """The format the client's write is of (RFC 0003 ``Session-Format``; this server's own
    when it names none), which the header is raised to and not past: refused when
    earlier than the session's, or one this server does not read."""
    if fmt is None:
        return FORMAT_WRITTEN
    version = parse_format(fmt)
    if version is None or version[0] != FORMAT_MAJOR or version[1] > FORMAT_MINOR:
        raise FormatVersionError(f"Session-Format {fmt!r} is not one this server reads (up to {FORMAT_WRITTEN})")
    theirs = s.header.format_version
    if theirs is not None and version < theirs:
        raise FormatVersionError(f"Session-Format {fmt} is earlier than session {s.id}'s {s.header.format}")
    return FORMAT_WRITTEN if version == (FORMAT_MAJOR, FORMAT_MINOR) else f"agentsession/{version[0]}.{version[1]}"


def _matches(header: Header, q: Any, top_level: bool, extras: list[tuple[str, bytes]]) -> bool:
    """The list filter's members the library's :func:`~..store.summary.select` has no
    place for, read from the header: ``parent_session``, ``top_level`` and ``extra``."""
    d = header.data
    if "parent_session" in q and d.get("parent_session") != q["parent_session"]:
        return False
    if top_level and d.get("spawned_by") is not None:
        return False  # top level: no spawned_by (what a call spawned is a subsession)
    for name, value in extras:
        if name not in d or canonical_bytes(d[name]) != value:
            return False
    return True


def _when(value: str, what: str) -> str:
    """A list filter's ``after`` or ``before`` (RFC 3339, any offset) as the admitted
    ``ts`` the library's filter compares."""
    try:
        return normalise_ts(value)
    except TimestampError:
        raise BadNameError(f"{what} must be an RFC 3339 date-time, not {value!r}") from None


#: The entry types whose contents a shallow path leaves out above the newest fold.
_FOLDED = frozenset({"item", "branch_summary"})


def _cursor_given(after: str) -> tuple[Any, ...]:
    """A log read's ``after``, parsed; one of another form is ``bad_name`` (a GET's and a
    HEAD's answer alike)."""
    parsed = parse_cursor(after)
    if parsed is None:
        raise BadNameError(f"{after!r} is no cursor of this server")
    return parsed


def _cursor_of(after: str, ident: str) -> tuple[Any, ...]:
    """:func:`_cursor_given` of a cursor that must be of the incarnation ``ident``; one of
    another is ``session_replaced`` (its tag says so: no log read, so a HEAD says it too)."""
    parsed = _cursor_given(after)
    if parsed[1] != ident[7:23]:
        raise SessionReplacedError(f"cursor {after} is of another incarnation of this session: read it afresh")
    return parsed


def _log_lines(sid: str, records: list[dict[str, Any]], header: dict[str, Any], durable: bool,
               after: str | None) -> list[bytes]:
    """The lines of a log read (RFC 0003, Reading) from a snapshot of the session's
    records: pure work, done outside the store's lock. A cursor ``after`` is resumed as a
    follow resumes it (``server.follow.locate``): one this log cannot be resumed from is
    ``session_replaced``, to be read afresh."""
    ident = header_ident(header)
    last_commit = max((i for i, r in enumerate(records) if r.get("op") in COMMIT_POINTS), default=-1)
    upto = last_commit + 1 if durable else len(records)
    told, start = Told(), 0
    if after is not None:
        parsed = _cursor_of(after, ident)
        found = locate(records, len(records), parsed[0], parsed[2])
        if found is None:
            raise SessionReplacedError(f"cursor {after} is not of this session's log as it is now (it was rewritten, "
                                       "or the records it counted were taken back): read it afresh")
        start, told = found
    state = told.state
    lines: list[dict[str, Any]] = []
    for i in range(start, upto):
        rec = records[i]
        told.apply(rec, i)
        if rec.get("op") in LINES:
            line = log_line(rec, state, i <= last_commit, cursor_of(i + 1, ident, told.check()))
            assert line is not None
            lines.append(line)
    view = {"id": sid, "header": header, "incarnation": ident, "head": state.head,
            "mark": state.mark, "base": state.base, "length": len(state.log_order)}
    end: dict[str, Any] = {"end": True, "cursor": cursor_of(max(upto, start), ident, told.check())}
    if lines:
        lines[0]["session"] = view
    else:
        end["session"] = view
    return [_dumps(x) for x in lines] + [_dumps(end)]


#: Entries a piece of a path read holds (its objects read by one bulk read); the walk
#: up takes sixteen pieces' worth of steps at a time.
_PATH_PIECE = 256
#: Objects one piece of a batch read reads under the lock.
_READ_PIECE = 256


async def _shallow(
    work: Callable[..., Awaitable[Any]], store: Store, steps: list[tuple[str, Any, Any]], mode: str
) -> tuple[list[bool], str]:
    """Which contents a path read serves (RFC 0003, Reading): every one for ``all``, none
    for ``none``; for ``since-fold`` those context building needs at the leaf: from the
    newest compaction's ``first_kept`` on, and above it every entry that is not an
    ``item`` or ``branch_summary``. No fold, or a fold with no ``config`` checkpoint
    (the settings do not start afresh), is answered as ``all``, and says so. ``steps``
    are the path's (id, type, content hash), root first; the fold's content is read as
    store work of its own (``work``)."""
    n = len(steps)
    if mode != "since-fold":
        return [mode == "all"] * n, mode
    fold = next((i for i in range(n - 1, -1, -1) if steps[i][1] == "compaction"), None)
    chash = steps[fold][2] if fold is not None else None
    if fold is None or not isinstance(chash, str):
        return [True] * n, "all"
    body = json.loads(await work(store.objects.get, "contents", chash))
    first_kept = body.get("first_kept") if isinstance(body, dict) else None
    kept = next((i for i in range(fold) if steps[i][0] == first_kept), None)
    if not isinstance(body, dict) or not isinstance(body.get("config"), dict) or kept is None:
        return [True] * n, "all"
    return [i >= kept or steps[i][1] not in _FOLDED for i in range(n)], "since-fold"


def _push_request(sid: str, body: dict[str, Any]) -> PushRequest:
    header = _obj(body.get("header"), "header")
    head = _obj(body.get("head", {}), "head")
    entries, prefix = body.get("entries", []), body.get("prefix", [])
    if not isinstance(entries, list) or not isinstance(prefix, list):
        raise BadNameError("entries and prefix are lists of entry ids")
    mark = body.get("mark", "mirror")
    if mark not in ("mirror", "record"):
        raise BadNameError("mark is mirror or record")
    pushed = body.get("refs")
    if pushed is None:
        pushed = []
    if not isinstance(pushed, list):
        raise BadNameError("refs is a list of {\"name\", \"expected\", \"next\"}")
    refs = []
    for r in pushed:
        r = _obj(r, "a ref")
        # A name that is no string is refused whole (it was pushed as the ref "None" or
        # "5"); a string that breaks the name rules is that ref's refusal in the 200.
        name = r.get("name")
        name = name if isinstance(name, str) else check_ref_name(name)
        nxt = _target(r.get("next"), "next")
        if nxt is None:
            raise BadRefTargetError(f"pushed ref {name} must name the pushed session {sid}, not none")
        refs.append(RefPush(name, _target(r.get("expected"), "expected"), nxt))
    return PushRequest(
        header=header, prefix=[str(e) for e in prefix], entries=[str(e) for e in entries],
        to=_head_to(head.get("to")), expected=_expected(head.get("expected")),
        force=_bool(head, "force", False, "head.force"), mark=mark, refs=refs,
        complete=_bool(body, "complete", True, "complete"),
    )


def _head_to(value: Any) -> str | None:
    """A push's ``head.to``: None or an entry id (:func:`~..store.session.head_target_given`);
    which entry ids the session may take is the receiving rules' (``head_target``)."""
    head_target_given(value)
    return value


def _bool(body: dict[str, Any], name: str, default: bool, what: str) -> bool:
    """A member that is true or false when present (``bool("false")`` is true: a push
    naming ``"force": "false"`` was a forced one); BadNameError otherwise."""
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadNameError(f"{what} must be true or false, not {quoted(value)}")
    return value


def _target(value: Any, what: str) -> str | None:
    """A ref target as the wire gives it: null, a session id, or {"session", "entry"};
    this store's refs name sessions, so an entry pin is unsupported."""
    if value is None:
        return None
    if isinstance(value, str):
        return check_session_id(value)
    if isinstance(value, dict) and isinstance(value.get("session"), str):
        if value.get("entry"):
            raise UnsupportedError(f"{what}: this store's refs name sessions, not entries (no entry pins)")
        return check_session_id(value["session"])
    raise BadNameError(f"{what} must be null, a session id or {{\"session\": id}}")


def _ref_facts(refs: Refs, ref: Any) -> dict[str, Any]:
    state = refs.state(ref)
    return {"name": ref.name, "target": {"session": ref.session, "entry": ""}, "incarnation": ref.ident,
            "state": "live" if state == "ok" else ("dangling" if state == "dangling" else "replaced")}


def _withheld_ref(principal: Principal, name: str) -> ScopeError:
    """The refusal of a ref step on a ref that names a session the caller may not touch:
    its target is not told (a read of the ref answers ``no_ref``), and it is not moved
    (RFC 0003, Security considerations: naming is not authorization)."""
    return ScopeError(f"ref {name} names a session this token ({principal.name}) may not touch; it is not shown or moved")


def _ref_step(principal: Principal, result: RefResult) -> dict[str, Any]:
    """A push's ref step as its answer says it, the target withheld (as an update's
    refusal withholds it) when the caller may not touch the session the ref holds."""
    if result.current is None or principal.may_touch(result.current):
        return result.as_dict()
    return {"name": result.name, "moved": False, "changed": False, "current": None,
            "why": str(_withheld_ref(principal, result.name))}


def _dangling(name: str, session: str, state: str) -> AgentSessionError:
    return DanglingRefError(f"ref {name} is dangling ({state}): its session {session} is gone or another now",
                            name=name, session=session, state=state)


# -- the application -------------------------------------------------------------------------


class _WholeSegments:
    """Routing by the path's segments as they were sent. Starlette routes the decoded path,
    so a session id sent as ``a%2Flog`` was routed as two segments, ``/v1/sessions/a/log``
    (the log of ``a``). A segment whose bytes spell a ``/`` (``%2F``) is refused before
    routing as what its place holds: a bad session id, object space or object name, a ref
    name's segment (a ref name's ``/`` is sent as it is: RFC 0003, Conventions), or no route."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = _split_segment(scope.get("raw_path") or b"")
            if refusal is not None:
                response = _problem(refusal)
                if scope["method"] == "HEAD":
                    response = _headers_only(response.status_code, None, None, response.raw_headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _split_segment(raw_path: bytes) -> AgentSessionError | None:
    """The refusal of a path (as sent, ``raw_path``) one of whose segments decodes to
    something holding a ``/``; None for a path whose segments are whole."""
    raw = raw_path.split(b"?", 1)[0]
    if b"%2f" not in raw.lower():
        return None
    parts = [unquote(part.decode("ascii", "replace")) for part in raw.split(b"/")]
    for i, text in enumerate(parts):
        if "/" not in text:
            continue
        kind = parts[2] if len(parts) > 2 and parts[1] == "v1" else None
        try:
            if kind == "sessions" and i == 3:
                check_session_id(text)
            elif kind == "objects" and i == 3:
                space_from_wire(text)
            elif kind == "objects" and i == 4:
                return not_an_object_name(text)
            elif kind == "refs" and i >= 3:
                return BadRefNameError(f"a ref name's segment {quoted(text)} holds a '/': a ref name is sent with "
                                       "its '/' as it is, each of its segments a segment of the path")
        except AgentSessionError as exc:
            return exc
        err = UnsupportedError(f"no route {quoted(raw.decode('ascii', 'replace'))} here: a segment of the path holds "
                               "an encoded '/' (RFC 0003 routes are under /v1/; see GET /v1/)")
        err.status = 404
        return err
    return None


def create_app(state: ServerState) -> Starlette:
    """The ASGI application over ``state``."""
    api = Api(state)
    r = api.route
    routes = [
        Route("/v1/", r(api.capabilities), methods=["GET"]),
        Route("/v1/objects/missing", r(api.missing), methods=["POST"]),
        Route("/v1/objects/read", r(api.read_objects), methods=["POST"]),
        Route("/v1/objects", r(api.put_objects), methods=["POST"]),
        Route("/v1/objects/{space}/{hash}", r(api.get_object), methods=["GET", "HEAD"]),
        Route("/v1/objects/{space}/{hash}", r(api.put_object), methods=["PUT"]),
        Route("/v1/sessions", r(api.list_sessions), methods=["GET"]),
        Route("/v1/sessions", r(api.create_session, replay=True), methods=["POST"]),
        Route("/v1/sessions/{id}", r(api.get_session), methods=["GET"]),
        Route("/v1/sessions/{id}", r(api.delete_session, replay=True), methods=["DELETE"]),
        Route("/v1/sessions/{id}/log", r(api.read_log), methods=["GET"]),
        Route("/v1/sessions/{id}/path", r(api.read_path), methods=["GET"]),
        Route("/v1/sessions/{id}/follow", r(api.follow), methods=["GET"]),
        Route("/v1/sessions/{id}/push", r(api.push, replay=True), methods=["POST"]),
        Route("/v1/sessions/{id}/handover", r(api.handover, replay=True), methods=["POST"]),
        Route("/v1/sessions/{id}/record", r(api.record, replay=True), methods=["POST"]),
        Route("/v1/sessions/{id}/lease", r(api.lease, replay=True), methods=["POST", "PUT", "DELETE"]),
        Route("/v1/sessions/{id}/lease/break", r(api.lease_break, replay=True), methods=["POST"]),
        Route("/v1/sessions/{id}/entries", r(api.append, replay=True), methods=["POST"]),
        Route("/v1/sessions/{id}/commit", r(api.commit, replay=True), methods=["POST"]),
        Route("/v1/sessions/{id}/head", r(api.set_head, replay=True), methods=["PUT"]),
        Route("/v1/refs", r(api.list_refs), methods=["GET"]),
        # A ref's read and its update are one handler, but only the update is replayed
        # under its Idempotency-Key (a read carrying one is read afresh).
        Route("/v1/refs/{name:path}", r(api.ref), methods=["GET"]),
        Route("/v1/refs/{name:path}", r(api.ref, replay=True), methods=["PUT"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        if status == 405:
            err: AgentSessionError = UnsupportedError(f"{request.method} is not served on {request.url.path}")
            err.status = 405
        else:
            err = UnsupportedError(f"no route {request.url.path} here (RFC 0003 routes are under /v1/; see GET /v1/)")
            err.status = 404
        return _problem(err)

    app = Starlette(routes=routes, exception_handlers={HTTPException: not_found},
                    middleware=[Middleware(_WholeSegments)])
    # A path off a route by a slash (/v1, /v1/sessions/) is a 404 problem like any other,
    # not Starlette's 307 to the other spelling, which is no RFC 0003 answer (and would
    # have a client send a write again elsewhere; this one follows no redirect).
    app.router.redirect_slashes = False
    return app
