"""The transport to a store served over HTTP (RFC 0003): ``http://`` and ``https://`` remotes.

Each :class:`~.transport.Transport` call is the RFC's request (the table in
:mod:`.transport`), answered by the server's :class:`~.endpoint.StoreEndpoint`,
so a push, fetch, handover, declare-record or take-back to a server follows
exactly the rules it follows between two directories. A problem the server
answers is raised as the library error it names (:mod:`.wire`).

**Retries.** A request that did not get an answer (connection refused, reset
or cut, a timeout) is sent again, up to :data:`RETRIES` times, when that is
safe: reads, object uploads (idempotent by hash), ``missing``, and writes sent
with an ``Idempotency-Key``, which the server answers with the first outcome
(push, record, handover, and the HTTP store's writes: appends and head moves
among them). A 502/503/504 is retried the same way (from a proxy, or the server's
own when its table of keys is full). Before each retry the client waits its
schedule (0.05, 0.2, 0.5, 1 s), or longer when the answer's ``Retry-After`` asks
(seconds or an HTTP-date, RFC 9110), as long as one request's waits stay within a
bound (:data:`RETRY_WAIT_ENV`, else :data:`RETRY_WAIT_S`; ``retry_wait=``): a wait
that would pass it is not waited, and the request fails at once with the server's
error, saying so. A follow's stream is kept open by the same rule
(:meth:`HttpTransport.stream_lines`): dropped (or silent past
:data:`FOLLOW_READ_TIMEOUT_S`), ended early or refused, it is opened again after the
same waits, within the same bound.

**Bounds.** The answers that carry objects are bounded: an object's GET stops past
the object limit (:meth:`HttpTransport.object_limit`), an NDJSON answer is parsed a
line at a time and a line past its bound is refused. (A JSON answer and a follow
stream's line are read whole, unbounded as yet.)

**Tokens.** The bearer token is ``AGENTSESSION_TOKEN``, else the entry for the
remote in ``$AGENTSESSION_REMOTES`` (default
``~/.config/agentsession/remotes.json``: ``{"remotes": {"https://host/": {"token":
"..."}}}``), else none (a server without ``--auth`` on loopback).
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from ..errors import (
    AgentSessionError,
    NoSuchObjectError,
    NoSuchRefError,
    NoSuchSessionError,
    TransportError,
)
from .transport import Admission, DeclareResult, PushRequest, RefResult, SessionView, Transport, check_served_session
from .wire import (
    OBJECTS,
    FrameReader,
    error_from_problem,
    frame_problem,
    object_frame,
    space_from_wire,
    space_to_wire,
    stream_frame,
)

__all__ = [
    "FOLLOW_READ_TIMEOUT_S", "MAX_OBJECT_BYTES", "MAX_READ_OBJECT_BYTES", "READ_BATCH", "RETRIES", "RETRY_WAIT_ENV", "RETRY_WAIT_S",
    "HttpTransport", "http_url", "no_delay_transport", "retry_after", "retry_wait_bound", "token_for",
]

#: How many times a request that got no answer is sent again (when safe).
RETRIES = 4
#: Seconds before each retry.
_BACKOFF = (0.05, 0.2, 0.5, 1.0)
_RETRY_STATUS = frozenset({502, 503, 504})
#: The most seconds the retries of one request wait in all (a server's Retry-After
#: included) when neither the caller nor :data:`RETRY_WAIT_ENV` says.
RETRY_WAIT_S = 60.0
#: The environment variable that sets that bound (seconds; 0: nothing is sent again).
RETRY_WAIT_ENV = "AGENTSESSION_RETRY_WAIT"
#: The most bytes of objects one batch upload carries.
BATCH_BYTES = 16 * 1024 * 1024
#: The most objects one batch read asks for (its answer streams: it is not held whole).
READ_BATCH = 4096
#: The most bytes of one object this client reads when the server publishes no limits
#: (the reference server's ``max_object_bytes``), and its own cap otherwise.
MAX_OBJECT_BYTES = 64 * 1024 * 1024
#: This client's own cap on one object read: the reference server's ``max_body_bytes``,
#: since a session's append through a store over HTTP carries its content in the body,
#: so a server may hold a content larger than the objects it takes alone.
MAX_READ_OBJECT_BYTES = 256 * 1024 * 1024
#: What a stream's line may hold beyond its objects (its members, escapes).
_LINE_SLACK = 1 << 20
#: Seconds a follow's stream may bring nothing before it is taken as dropped (and opened
#: again after ``Last-Event-ID``): four of the 15 s keep-alive intervals RFC 0003 has an
#: idle stream's server keep (a server, or a half-open connection, gone silent).
FOLLOW_READ_TIMEOUT_S = 60.0


def no_delay_transport(verify: bool | ssl.SSLContext = True) -> httpx.HTTPTransport:
    """An httpx transport whose sockets send at once (TCP_NODELAY). A request goes out as
    two writes, its head then its body; with Nagle's algorithm the body waits for the
    server's ACK of the head, which a delayed ACK holds back some 40 ms: every request
    with a body would take that long."""
    return httpx.HTTPTransport(verify=verify, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])


def http_url(remote: str) -> str:
    """The normalised URL of an HTTP remote: scheme and host lowercased, a default port
    dropped, the path ending in ``/`` (the routes are under ``<url>v1/``)."""
    parts = urlsplit(remote)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise TransportError(f"remote {remote!r} is no http:// or https:// URL with a host")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise TransportError(
            f"remote {remote!r}: an HTTP remote carries no query, fragment or credentials (the token is AGENTSESSION_TOKEN)"
        )
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        raise TransportError(f"remote {remote!r}: the port is not a number") from None
    if port is not None and port != {"http": 80, "https": 443}[scheme]:
        host = f"{host}:{port}"
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return f"{scheme}://{host}{path}"


def retry_after(value: str | None, now: float) -> float | None:
    """The seconds a ``Retry-After`` header asks to wait (RFC 9110: delay-seconds, or an
    HTTP-date read against ``now``, the wall clock); None when there is none or it
    cannot be read."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)  # past a float's range: inf, a wait no bound allows
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # "-0000" (RFC 5322): the HTTP-date is UTC
    return max(0.0, when.timestamp() - now)


def retry_wait_bound(value: float | None = None) -> float:
    """The bound on one request's waits before its retries: ``value``, else
    :data:`RETRY_WAIT_ENV`, else :data:`RETRY_WAIT_S`; TransportError naming what is
    wrong with a bound that is not a number of seconds, 0 or more."""
    text = os.environ.get(RETRY_WAIT_ENV, "") if value is None else str(value)
    if not text:
        return RETRY_WAIT_S
    try:
        bound = float(text)
    except ValueError:
        bound = math.nan
    if not (0 <= bound < math.inf):
        where = f"{RETRY_WAIT_ENV}={text!r}" if value is None else f"retry_wait={value!r}"
        raise TransportError(f"{where}: expected the seconds one request's retries may wait in all (a number, 0 or more)")
    return bound


def token_for(url: str) -> str | None:
    """The bearer token for a remote (see the module's docstring)."""
    token = os.environ.get("AGENTSESSION_TOKEN")
    if token:
        return token
    where = os.environ.get("AGENTSESSION_REMOTES") or os.path.expanduser("~/.config/agentsession/remotes.json")
    try:
        with open(where, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TransportError(f"remotes file {where}: {exc}") from None
    entry = data.get("remotes", {}).get(url) if isinstance(data, dict) and isinstance(data.get("remotes"), dict) else None
    if isinstance(entry, dict) and isinstance(entry.get("token"), str):
        return str(entry["token"])
    return None


#: The object spaces as the wire names them (a ``missing`` answer's members).
_SPACES = frozenset({"entries", "contents", "media"})


def _kind(response: httpx.Response) -> str:
    """What a response carries, for an error that says it is not what was asked."""
    kind = response.headers.get("content-type") or "no Content-Type"
    return f"{kind}, {len(response.content)} bytes"


class _Busy(Exception):
    """A batch read answered 502/503/504: asked again after the wait its answer names
    (:meth:`HttpTransport._read_batch`, the one place that catches it; never raised
    beyond it)."""

    def __init__(self, response: httpx.Response):
        super().__init__(response.status_code)
        self.response = response


class HttpTransport(Transport):
    """A store behind an RFC 0003 server."""

    def __init__(
        self, remote: str, *, token: str | None = None, timeout: float = 300.0, verify: bool | str | ssl.SSLContext = True,
        retry_wait: float | None = None,
    ):
        """``verify``: check the server's certificate against certifi's authorities
        (True; ``SSL_CERT_FILE`` names others), a CA file's path, or an SSL context.
        ``retry_wait``: the most seconds one request's retries wait in all
        (:func:`retry_wait_bound`)."""
        self.url = http_url(remote)
        self.retry_wait = retry_wait_bound(retry_wait)
        #: How a wait before a retry is waited, and the wall clock a Retry-After date is
        #: read against (tests replace both, so that nothing sleeps).
        self.sleep: Callable[[float], None] = time.sleep
        self.clock: Callable[[], float] = time.time
        #: Seconds a follow's stream may bring nothing before it counts as dropped.
        self.follow_read_timeout = FOLLOW_READ_TIMEOUT_S
        #: This client's cap on one object's bytes (:meth:`object_limit`).
        self.max_object_bytes = MAX_READ_OBJECT_BYTES
        self._token = token if token is not None else token_for(self.url)
        headers = {"User-Agent": "agentsession"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if isinstance(verify, str):
            verify = ssl.create_default_context(cafile=verify)
        self._caps: dict[str, Any] | None = None
        #: The incarnation last seen of each session: sent as If-Incarnation with a mark
        #: change, so one deleted and created again there meanwhile is refused.
        self._seen: dict[str, str] = {}
        self._http = httpx.Client(base_url=self.url + "v1", headers=headers, timeout=timeout,
                                  transport=no_delay_transport(verify))

    def __repr__(self) -> str:
        return f"HttpTransport({self.url!r})"

    def close(self) -> None:
        self._http.close()

    # -- one request, with the retry rules ----------------------------------------------

    def request(
        self, method: str, path: str, *, safe: bool, keyed: bool = False, ok: Iterable[int] = (),
        read: Callable[[httpx.Response], None] | None = None, **kwargs: Any
    ) -> httpx.Response:
        """Send a request; raise the server's problem as the library's error. ``safe``: it
        may be sent again when no answer came; ``keyed``: it carries an Idempotency-Key
        (the same on every attempt), which makes it safe. ``ok``: error statuses the
        caller reads itself. ``read``: a success's body is not held whole but given to
        ``read`` as it streams in (each attempt's afresh; a read cut part way is an answer
        that did not come), which keeps what it wants and stops past its bound."""
        headers = dict(kwargs.pop("headers", None) or {})
        if keyed:
            headers["Idempotency-Key"] = uuid.uuid4().hex
            safe = True
        attempt, waited = 0, 0.0
        while True:
            try:
                response = self._send(method, path, headers, read, kwargs)
            except httpx.TransportError as exc:
                landed = "" if safe else " (it may or may not have been carried out)"
                lost = TransportError(f"remote {self.url}: {method} {path} got no answer: {exc}{landed}")
                if safe and attempt < RETRIES:
                    waited = self._wait_to_retry(attempt, waited, None, lost)
                    attempt += 1
                    continue
                raise lost from None
            if response.status_code in _RETRY_STATUS and safe and attempt < RETRIES:
                waited = self._wait_to_retry(attempt, waited, response, self._error(response))
                attempt += 1
                continue
            if response.status_code >= 300 and response.status_code not in ok:
                raise self._error(response)
            return response

    def _send(self, method: str, path: str, headers: dict[str, str], read: Callable[[httpx.Response], None] | None,
              kwargs: dict[str, Any]) -> httpx.Response:
        if read is None:
            return self._http.request(method, path, headers=headers, **kwargs)
        response = self._http.send(self._http.build_request(method, path, headers=headers, **kwargs), stream=True)
        try:
            if response.status_code < 300:
                read(response)
            else:
                response.read()  # (a problem body, read as request() reads one)
        finally:
            response.close()
        return response

    def object_limit(self) -> int:
        """The most bytes one object may hold as this client reads it: the larger of the
        server's published ``max_object_bytes`` and ``max_body_bytes`` (an append carries
        its content in a body, so a server may hold a content past its object limit), else
        :data:`MAX_OBJECT_BYTES`, and never more than :attr:`max_object_bytes` (this
        client's own cap, :data:`MAX_READ_OBJECT_BYTES`)."""
        limits = self.capabilities().get("limits", {})
        published = [v for v in (limits.get("max_object_bytes"), limits.get("max_body_bytes"))
                     if isinstance(v, int) and not isinstance(v, bool)]
        return min(max(published) if published else MAX_OBJECT_BYTES, self.max_object_bytes)

    def get_object(self, space: str, name: str) -> bytes:
        """An object's bytes (``GET /v1/objects/{space}/{hash}``), read as they stream in
        and refused (TransportError) once they pass :meth:`object_limit`: a server that
        answers one GET with an endless body does not take this process's memory. The
        caller verifies the hash."""
        limit, path = self.object_limit(), f"/objects/{space_to_wire(space)}/{name}"
        got = bytearray()

        def read(response: httpx.Response) -> None:
            got.clear()
            for chunk in response.iter_bytes():
                got.extend(chunk)
                if len(got) > limit:
                    raise TransportError(f"remote {self.url}: GET {path} answered more than {limit} bytes, the most "
                                         "an object may hold there; not read further")

        self.request("GET", path, safe=True, read=read)
        return bytes(got)

    def answer(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """:meth:`request`'s answer, a JSON object (every RFC 0003 answer that is not a
        stream or an object's bytes is one)."""
        return self.json_object(self.request(method, path, **kwargs))

    def json_object(self, response: httpx.Response) -> dict[str, Any]:
        """The JSON object a response carries; TransportError when it carries none (a
        server, or something in front of it, that answered an HTML page, a list, or
        bytes cut short), never the parser's own error."""
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise TransportError(f"remote {self.url}: {response.request.method} {response.request.url.path} answered "
                                 f"HTTP {response.status_code} with no JSON object ({_kind(response)})")
        return body

    def _wait_to_retry(
        self, attempt: int, waited: float, response: httpx.Response | None, failure: AgentSessionError
    ) -> float:
        """Wait before sending a request again (the ``attempt``-th time; ``waited``: the
        seconds its retries waited so far), and return the seconds waited in all. The wait
        is the schedule's, or longer when ``response`` (a 502/503/504) asks it by
        ``Retry-After``. A wait that would take the request's waits past
        :attr:`retry_wait` is not waited: ``failure`` (the server's error for a
        ``response``, its code kept) is raised at once, saying why."""
        wait = _BACKOFF[min(attempt, len(_BACKOFF) - 1)]
        asked = None if response is None else retry_after(response.headers.get("retry-after"), self.clock())
        if asked is not None:
            wait = max(wait, asked)
        if waited + wait <= self.retry_wait:
            self.sleep(wait)
            return waited + wait
        why = f"the server asked to wait {wait:g} s (Retry-After)" if asked is not None else f"a wait of {wait:g} s"
        failure.args = (f"{failure.args[0] if failure.args else failure}; not sent again: {why}, past this client's "
                        f"bound of {self.retry_wait:g} s on one request's waits ({RETRY_WAIT_ENV})",)
        raise failure from None

    def _error(self, response: httpx.Response) -> AgentSessionError:
        """The error an answer that is no success says: its problem as the library's error;
        a redirect (3xx) as TransportError, since this client follows none (a remote that
        moved is named anew, and a bearer token is not sent on to another place)."""
        if 300 <= response.status_code < 400:
            moved = response.headers.get("location")
            return TransportError(
                f"remote {self.url}: {response.request.method} {response.request.url.path} answered HTTP "
                f"{response.status_code}, a redirect{f' to {moved}' if moved else ''}, which this client does not follow"
            )
        try:
            body = response.json()
        except ValueError:
            body = None
        return error_from_problem(response.status_code, body, where=f"remote {self.url}",
                                  head=response.request.method == "HEAD")

    def ndjson(self, path: str, **kwargs: Any) -> list[dict[str, Any]]:
        """The frames of a stream that ends with ``{"end": true}``; an ``error`` frame is
        raised, and a stream cut before its end is an error, never a short result. Each
        line is parsed as it streams in, and one longer than two objects of this client's
        cap (:attr:`max_object_bytes`) and :data:`_LINE_SLACK` (a path line carries an
        envelope and a content) is refused, TransportError, rather than held."""
        limit = 2 * self.max_object_bytes + _LINE_SLACK
        where = f"remote {self.url}: the answer to {path}"
        frames: list[dict[str, Any]] = []

        def read(response: httpx.Response) -> None:
            frames.clear()
            buf = bytearray()
            for chunk in response.iter_bytes():
                buf += chunk
                start = 0
                while (end := buf.find(b"\n", start)) >= 0:
                    if take(buf[start:end]):
                        return
                    start = end + 1
                del buf[:start]
                if len(buf) > limit:
                    raise TransportError(f"{where}: a line passes {limit} bytes, more than a frame holds; not read further")
            if buf:
                take(buf)

        def take(line: bytes | bytearray) -> bool:
            if not line.strip():
                return False
            frame = stream_frame(line.decode("utf-8", "replace"), where=where)
            if "error" in frame:
                raise frame_problem(frame["error"], where=f"remote {self.url}")
            frames.append(frame)
            return frame.get("end") is True

        self.request("GET", path, safe=True, read=read, **kwargs)
        if frames and frames[-1].get("end") is True:
            return frames
        raise TransportError(f"remote {self.url}: the answer to {path} was cut before its end frame")

    def stream_lines(self, path: str, *, params: dict[str, str], headers: Callable[[], dict[str, str]]) -> Iterator[str]:
        """The lines of a follow stream as they come, for as long as the caller reads them.
        ``headers()`` gives each connection's headers (a follow's ``Last-Event-ID`` moves
        as its events come). A stream the server ends (its age limit) is opened again at
        once; one that drops (silent for :attr:`follow_read_timeout` seconds, not even the
        keep-alive due every 15 s, counts as dropped) or brings nothing, or that the server
        refuses with a 502/503/504 (503 when its follow streams are at their limit), again
        after the request path's wait (:meth:`_wait_to_retry`: the schedule, or as long as the
        server's ``Retry-After`` asks), up to :data:`RETRIES` times in a row and within
        :attr:`retry_wait`, both counted afresh once a line comes. Past them the server's
        error (its code kept) or TransportError is raised, saying why it was not asked
        again; another error status is raised as its problem at once."""
        attempt, waited = 0, 0.0
        while True:
            busy: httpx.Response | None = None
            came = False
            try:
                with self._http.stream("GET", path, params=params, headers=headers(),
                                       timeout=httpx.Timeout(30.0, read=self.follow_read_timeout)) as response:
                    if response.status_code >= 300:
                        response.read()
                        if response.status_code not in _RETRY_STATUS:
                            raise self._error(response)
                        busy = response
                    else:
                        for line in response.iter_lines():
                            came, attempt, waited = True, 0, 0.0
                            yield line
                if came:
                    continue  # the server ended it (its age limit): resumed at once
                failure = (self._error(busy) if busy is not None else
                           TransportError(f"remote {self.url}: the stream {path} ended before any event"))
            except httpx.TransportError as exc:
                failure = TransportError(f"remote {self.url}: the stream {path} dropped: {exc}")
            if attempt >= RETRIES:
                failure.args = (f"{failure.args[0]}; given up after {RETRIES} retries in a row",)
                raise failure from None
            waited = self._wait_to_retry(attempt, waited, busy, failure)
            attempt += 1

    # -- the transport --------------------------------------------------------------------

    def missing(self, wanted: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
        body = {space_to_wire(space): list(dict.fromkeys(names)) for space, names in wanted.items()}
        answer = self.answer("POST", "/objects/missing", safe=True, json=body)
        if not all(space in _SPACES and isinstance(names, list) for space, names in answer.items()):
            raise TransportError(f"remote {self.url}: its answer to missing is not lists of hashes by space")
        return {space_from_wire(space): list(names) for space, names in answer.items()}

    def capabilities(self) -> dict[str, Any]:
        """The server's ``GET /v1/`` (read once per transport)."""
        if self._caps is None:
            self._caps = self.answer("GET", "/", safe=True)
        return self._caps

    def put_objects(self, items: Iterable[tuple[str, str, bytes]], count: int) -> None:
        """One PUT per object, or, where the server offers ``object_batch``, batches of up
        to :data:`BATCH_BYTES` in one request each (one sync there per batch)."""
        caps = self.capabilities()
        if count <= 1 or not caps.get("features", {}).get("object_batch"):
            for space, name, data in items:
                self.request("PUT", f"/objects/{space_to_wire(space)}/{name}", safe=True, content=data,
                             headers={"Content-Type": "application/octet-stream"})
            return
        limit = min(BATCH_BYTES, int(caps.get("limits", {}).get("max_body_bytes", BATCH_BYTES)))
        chunk: list[bytes] = []
        size = 0
        for space, name, data in items:
            frame = object_frame(space, name, data)
            if chunk and size + len(frame) > limit:
                self._send_batch(chunk)
                chunk, size = [], 0
            chunk.append(frame)
            size += len(frame)
        if chunk:
            self._send_batch(chunk)

    def _send_batch(self, frames: list[bytes]) -> None:
        self.request("POST", "/objects", safe=True, content=b"".join(frames), headers={"Content-Type": OBJECTS})

    def get_objects(
        self, wanted: Iterable[tuple[str, str]], *, session: str | None = None
    ) -> Iterator[tuple[str, str, bytes]]:
        """One GET per object, or, where the server offers ``object_read``, batch reads of
        up to :data:`READ_BATCH` objects. The objects come in the order asked either way;
        one the server does not serve is NoSuchObjectError, as its GET's 404 would be.

        Of several batches, each is read whole on a worker thread while the caller takes
        the one before (one batch ahead, so at most two are held): the server reads the
        next batch, and the answer crosses, while this process stores the last, where
        the two used to take turns (a 100,000-entry fetch took 1.6 times a fetch from a
        path; the server's work was the difference). A lone batch is taken as it streams in."""
        if not self.capabilities().get("features", {}).get("object_read"):
            for space, name in wanted:
                yield space, name, self.get_object(space, name)
            return
        asked = list(wanted)
        if len(asked) <= READ_BATCH:
            if asked:
                yield from self._read_batch(asked)
            return
        batches = [asked[i : i + READ_BATCH] for i in range(0, len(asked), READ_BATCH)]
        del asked
        # A caller that stops early (an error storing a batch, an interrupt) is not kept
        # waiting for the batch being read ahead: that read stops at its next object and
        # its result, or error, is dropped.
        stop = threading.Event()
        ahead = ThreadPoolExecutor(1, thread_name_prefix="agentsession-read-ahead")
        try:
            coming = ahead.submit(_whole, self._read_batch, batches[0], stop)
            for k in range(len(batches)):
                got = coming.result()
                if k + 1 < len(batches):
                    coming = ahead.submit(_whole, self._read_batch, batches[k + 1], stop)
                yield from got
                del got
        finally:
            stop.set()
            ahead.shutdown(wait=False, cancel_futures=True)

    def _read_batch(self, batch: list[tuple[str, str]]) -> Iterator[tuple[str, str, bytes]]:
        """A batch read (``POST /v1/objects/read``), its objects yielded in the order asked.
        A stream cut part way is asked again for what it had not yet brought, as a GET
        that got no answer is sent again."""
        got: dict[tuple[str, str], bytes] = {}  # come, and not yet yielded
        come: set[tuple[str, str]] = set()
        order = iter(dict.fromkeys(batch))
        nxt = next(order, None)
        attempt, waited = 0, 0.0
        while True:
            asked: dict[str, list[str]] = {}
            for space, name in dict.fromkeys(batch):
                if (space, name) not in come:
                    asked.setdefault(space_to_wire(space), []).append(name)
            try:
                for space, name, data in self._read_stream(asked):
                    come.add((space, name))
                    got[(space, name)] = data
                    while nxt is not None and nxt in got:
                        yield nxt[0], nxt[1], got.pop(nxt)
                        nxt = next(order, None)
                break
            except (TransportError, _Busy) as exc:
                response = exc.response if isinstance(exc, _Busy) else None
                failure = exc if isinstance(exc, TransportError) else self._error(exc.response)
                if attempt >= RETRIES:
                    raise failure from None
                waited = self._wait_to_retry(attempt, waited, response, failure)
                attempt += 1
        if nxt is not None:
            space, name = nxt
            raise NoSuchObjectError(f"remote {self.url}: no {space_to_wire(space)} object {name} there that this caller may read")

    def _read_stream(self, asked: dict[str, list[str]]) -> Iterator[tuple[str, str, bytes]]:
        """The frames of one batch read's answer as they arrive; TransportError when the
        connection drops or the answer ends before its end frame."""
        where = f"remote {self.url}"
        reader = FrameReader(where=where, max_object=self.object_limit())
        try:
            with self._http.stream("POST", "/objects/read", json=asked) as response:
                if response.status_code in _RETRY_STATUS:
                    response.read()
                    raise _Busy(response)
                if response.status_code >= 300:
                    response.read()
                    raise self._error(response)
                for chunk in response.iter_bytes():
                    yield from reader.feed(chunk)
        except httpx.TransportError as exc:
            raise TransportError(f"{where}: POST /objects/read dropped: {exc}") from None
        if not reader.ended:
            raise TransportError(f"{where}: the answer to POST /objects/read was cut before its end frame")

    def session_header(self, session_id: str) -> dict[str, Any] | None:
        try:
            facts = self.answer("GET", f"/sessions/{quote(session_id, safe='')}", safe=True)
        except NoSuchSessionError:
            return None
        header = facts.get("header")
        if not isinstance(header, dict):
            raise TransportError(f"remote {self.url}: its answer about session {session_id} holds no header")
        check_served_session(self.url, session_id, header)  # (before its incarnation is remembered)
        if isinstance(facts.get("incarnation"), str):
            self._seen[session_id] = facts["incarnation"]
        return dict(header)

    def session_view(self, session_id: str) -> SessionView:
        sid = quote(session_id, safe="")
        frames = self.ndjson(f"/sessions/{sid}/log", params={"durable": "true"})
        view = next((f["session"] for f in frames if isinstance(f.get("session"), dict)), None)
        if view is None or not isinstance(view.get("header"), dict):
            raise TransportError(f"remote {self.url}: its log of session {session_id} names no session")
        check_served_session(self.url, session_id, view["header"])  # (before its incarnation is remembered)
        entries = [f["entry"] for f in frames if isinstance(f.get("entry"), str)]
        header = dict(view["header"])
        if isinstance(view.get("incarnation"), str):
            self._seen[session_id] = view["incarnation"]
        prefix: list[str] = []
        base = header.get("base")
        if isinstance(base, str):
            path = self.ndjson(f"/sessions/{sid}/path", params={"leaf": base, "contents": "none"})
            prefix = [f["entry"] for f in path if isinstance(f.get("entry"), str)]
        return SessionView(session_id, header, str(view.get("mark")), view.get("head"), entries, prefix)

    def push(self, request: PushRequest) -> Admission:
        body = {
            "header": request.header,
            "entries": request.entries,
            "prefix": request.prefix,
            "head": {"expected": request.expected, "to": request.to, "force": request.force},
            "mark": request.mark,
            "refs": [{"name": r.name, "expected": r.expected, "next": r.next} for r in request.refs],
            "complete": request.complete,
        }
        answer = self.answer("POST", f"/sessions/{quote(request.session, safe='')}/push", safe=False, keyed=True,
                             json=body)
        head, admitted, said = answer.get("head"), answer.get("admitted", 0), answer.get("refs") or []
        if not (isinstance(head, dict) and isinstance(admitted, int) and isinstance(said, list)
                and isinstance(head.get("moved"), bool) and isinstance(head.get("forced", False), bool)
                and all(isinstance(r, dict) for r in said)):
            raise TransportError(f"remote {self.url}: its answer to the push of {request.session} is not a push's "
                                 "answer (RFC 0003: head.moved, a boolean, says whether the head moved)")
        refs = [
            RefResult(str(r.get("name")), bool(r.get("moved")), r.get("current"), r.get("why"), bool(r.get("changed")))
            for r in said
        ]
        outcome, previous = _push_outcome(request, head)
        return Admission(
            session=request.session, created=bool(answer.get("created")), admitted=admitted,
            previous=previous, head=head.get("current"), outcome=outcome,
            why=head.get("why"), mark=str(answer.get("mark")), refs=refs,
        )

    def _declared(self, session_id: str, answer: dict[str, Any]) -> DeclareResult:
        mark = answer.get("mark")
        if mark not in ("record", "mirror"):
            raise TransportError(f"remote {self.url}: its answer about the mark of {session_id} names none")
        return DeclareResult(session_id, bool(answer.get("changed")), answer.get("head"), str(mark))

    def _incarnation(self, session_id: str) -> dict[str, str]:
        seen = self._seen.get(session_id)
        return {"If-Incarnation": seen} if seen is not None else {}

    def declare_record(self, session_id: str, *, head: str | None) -> DeclareResult:
        answer = self.answer("POST", f"/sessions/{quote(session_id, safe='')}/record", safe=False, keyed=True,
                             json={"basis": "sole_copy", "head": head}, headers=self._incarnation(session_id))
        return self._declared(session_id, answer)

    def release_record(self, session_id: str, *, head: str | None) -> DeclareResult:
        answer = self.answer("POST", f"/sessions/{quote(session_id, safe='')}/handover", safe=False, keyed=True,
                             json={"to": "client", "head": head}, headers=self._incarnation(session_id))
        return self._declared(session_id, answer)

    def resolve_ref(self, name: str) -> dict[str, Any] | None:
        """The server's facts of a ref (``GET /v1/refs/{name}``), a dangling one's (409
        ``ref_dangling``) included, its ``target`` naming a session; None for no ref.
        Another refusal is raised, and an answer naming no target is TransportError."""
        try:
            response = self.request("GET", f"/refs/{name}", safe=True, ok=(409,))
        except NoSuchRefError:
            return None
        facts = self.json_object(response)
        if response.status_code == 409 and facts.get("code") != "ref_dangling":
            raise self._error(response)
        target = facts.get("target")
        if not (isinstance(target, dict) and isinstance(target.get("session"), str)):
            raise TransportError(f"remote {self.url}: its answer about the ref {name} names no session")
        return facts

    def get_ref(self, name: str) -> str | None:
        facts = self.resolve_ref(name)
        return None if facts is None else str(facts["target"]["session"])


def _push_outcome(request: PushRequest, head: Mapping[str, Any]) -> tuple[str, str | None]:
    """A push's head step (:attr:`Admission.outcome`) and the head before it, from RFC
    0003's members of the answer's ``head``: ``moved``, ``forced`` and ``current``. This
    server's extras (``outcome``, ``previous``) only tell apart what those leave open,
    and are used only where they agree with them: a compare-and-swap that moved the head
    (``fast-forward`` or ``moved``; ``fast-forward`` when a server does not say), and the
    head a forced move replaced (None when a server does not say). A head that did not
    move was ``current`` before, and the step was ``unchanged`` when that is the pushed
    head, else ``refused`` (a handover's ``not-moved``: the receiver is the record
    already, its writers past the pushed head; a handover refused is a 409)."""
    said, previous = head.get("outcome"), head.get("previous")
    current = head.get("current")
    if head["moved"]:
        if head.get("forced", False):
            return "forced", previous if isinstance(previous, str) else None
        return (said if said in ("fast-forward", "moved") else "fast-forward"), request.expected
    if current == request.to:
        return "unchanged", current
    return ("not-moved" if request.mark == "record" else "refused"), current


def _whole(read: Callable[[list[tuple[str, str]]], Iterator[tuple[str, str, bytes]]],
           batch: list[tuple[str, str]], stop: threading.Event) -> list[tuple[str, str, bytes]]:
    """A batch read taken whole (on the read-ahead thread), or as far as it got when
    ``stop`` is set (its caller gone: what it read is dropped)."""
    out = []
    for got in read(batch):
        if stop.is_set():
            break
        out.append(got)
    return out
