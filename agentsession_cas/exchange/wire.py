"""What RFC 0003 spells differently from the library, in one place for both ends of the
wire: object space names, append outcome names, errors as problem bodies, and the
framing of many objects in one body (this server's batch extensions).

The server (:mod:`agentsession_cas.server`) writes with these and the HTTP client
(:mod:`.http_client`) reads with them, so an error raised by the store behind a
server reaches a client's caller as the same class, with the same code and
message, that a local store would have raised.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .. import errors as E
from ..backends.base import Space
from ..format.hashing import is_hash

__all__ = [
    "OBJECTS",
    "OUTCOMES",
    "FrameReader",
    "end_frame",
    "error_frame",
    "object_frame",
    "parse_frames",
    "PROBLEM_TYPE",
    "error_from_problem",
    "frame_problem",
    "stream_frame",
    "problem_body",
    "wire_status",
    "space_from_wire",
    "space_to_wire",
]

#: The media type of a body of object frames (:func:`object_frame`).
OBJECTS = "application/x-agentsession-objects"

#: The longest frame line (``<space> <hash> <length>``, ``end <count>``, ``error <length>``).
_LINE_MAX = 200

#: The library's object spaces as RFC 0003 names them (a sidecar blob is ``media``).
_SPACE_TO_WIRE: dict[str, str] = {"entries": "entries", "contents": "contents", "blobs": "media"}
_SPACE_FROM_WIRE: dict[str, Space] = {"entries": "entries", "contents": "contents", "media": "blobs"}

#: The library's append outcomes as RFC 0003 names them.
OUTCOMES: dict[str, str] = {
    "continued": "continued",
    "branched": "branched",
    "no-op": "held",
    "head-moved": "leaf_moved",
    "head-not-moved": "leaf_not_moved",
}

#: The problem ``type`` prefix (RFC 9457); the code follows it.
PROBLEM_TYPE = "urn:agentsession:problem:"


def space_to_wire(space: str) -> str:
    return _SPACE_TO_WIRE[space]


def space_from_wire(space: str) -> Space:
    """The library's space for a wire name; BadNameError for an unknown one."""
    try:
        return _SPACE_FROM_WIRE[space]
    except KeyError:
        raise E.unknown_object_space(space, list(_SPACE_FROM_WIRE)) from None


#: The status RFC 0003's error table gives each code (a class whose code a refusal
#: overrides, an AppendRefusedError carrying ``no_entry``, answers the code's status).
STATUS: dict[str, int] = {
    "no_session": 404, "session_exists": 409, "session_replaced": 409, "no_entry": 404, "no_object": 404,
    "no_ref": 404, "ref_dangling": 409, "ref_moved": 409, "ref_name": 400, "head_moved": 409, "head_target": 422,
    "session_locked": 409, "lease_lost": 409, "mirror": 409, "not_record": 409, "header_differs": 409,
    "call_id_repeated": 409, "synthetic": 422, "bad_entry": 422, "base_rule": 422, "bad_base": 422,
    "bad_object": 422, "missing_object": 409, "bad_ref_target": 422, "format": 422, "read_only": 403,
    "unsupported": 501, "auth": 401, "scope": 403,
}


def wire_status(exc: E.AgentSessionError) -> int:
    """The HTTP status of an error: the table's for a protocol code, else the class's."""
    if exc.code in STATUS and exc.status != 405 and not (exc.code == "unsupported" and exc.status == 404):
        return STATUS[exc.code]
    return exc.status


def problem_body(exc: E.AgentSessionError) -> dict[str, Any]:
    """An error as an RFC 9457 problem body: ``code`` is the protocol's (RFC 0003's table,
    ``store_fault`` for the library's own), ``library_code`` the library's, and the
    members a caller needs to act (the hashes a push lacks, a ref's current target, the
    rule an entry broke)."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE + exc.wire_code,
        "title": exc.wire_code.replace("_", " "),
        "status": wire_status(exc),
        "detail": str(exc),
        "code": exc.wire_code,
        "library_code": exc.code,
    }
    if isinstance(exc, E.MissingObjectsError):
        body["missing"] = {space_to_wire(s): list(v) for s, v in exc.missing.items()}
    elif isinstance(exc, E.RefMovedError):
        body.update(name=exc.name, expected=exc.expected, current=exc.current)
    elif isinstance(exc, E.DanglingRefError):
        body.update(name=exc.name, target={"session": exc.session}, state=exc.state)
    elif isinstance(exc, E.AppendRefusedError):
        body.update(reason=exc.rule, entry=exc.entry)
    elif isinstance(exc, E.AmbiguousNameError):
        body["candidates"] = exc.candidates
    elif isinstance(exc, E.HeadMovedError) and exc.knows_current:
        body["current"] = exc.current
    return body


#: One class per library code, for a problem that needs no members to rebuild.
_PLAIN: dict[str, type[E.AgentSessionError]] = {
    cls.code: cls
    for cls in (
        E.NoSuchSessionError, E.SessionExistsError, E.SessionLockedError, E.NoSuchEntryError, E.NoSuchObjectError,
        E.NoSuchRefError, E.BadRefNameError, E.HeadMovedError, E.MirrorError, E.NotRecordError, E.HeaderDiffersError,
        E.BadBaseError, E.BadObjectError, E.ReadOnlyError, E.UnsupportedError, E.IncompletePushError,
        E.BadNameError, E.SessionReplacedError, E.LeaseLostError, E.AuthError, E.ScopeError, E.TooLargeError,
        E.TransportError, E.LayoutError, E.HandoverIncompleteError, E.BadRefTargetError, E.FormatVersionError,
        E.BadArgumentError,
    )
}


#: What a bodiless answer's status says, where RFC 0003 gives the status one code: a
#: ``HEAD``'s answer carries no problem body, so its status is all it says.
_BY_STATUS: dict[int, type[E.AgentSessionError]] = {401: E.AuthError, 403: E.ScopeError, 501: E.UnsupportedError}


def error_from_problem(status: int, body: Any, *, where: str, head: bool = False) -> E.AgentSessionError:
    """The library error a problem body stands for, its message led by ``where`` (the
    remote that answered) and the protocol's code: ``remote URL (no_session): no such
    session: x``, so a person sees which store refused and how, and a caller branches
    on ``code`` as ever."""
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        if head and status in _BY_STATUS:  # (``head``: the request was a HEAD, whose answer has no body)
            said = _BY_STATUS[status](f"{where} ({_BY_STATUS[status].code}): HTTP {status} to a HEAD")
            said.status = status
            return said
        return E.TransportError(f"{where} answered HTTP {status} without a problem body")
    code = body["code"]
    lib: str = body["library_code"] if isinstance(body.get("library_code"), str) else code
    detail = str(body.get("detail") or body.get("title") or code)
    exc: E.AgentSessionError
    if lib == "missing_object":
        missing = body["missing"] if isinstance(body.get("missing"), dict) else {}
        exc = E.MissingObjectsError(
            detail, missing={_SPACE_FROM_WIRE[s]: [str(h) for h in v] for s, v in missing.items()
                             if s in _SPACE_FROM_WIRE and isinstance(v, list)}
        )
    elif lib == "ref_moved":
        exc = E.RefMovedError(detail, name=str(body.get("name")), expected=body.get("expected"), current=body.get("current"))
    elif lib == "ref_dangling":
        target = body["target"] if isinstance(body.get("target"), dict) else {}
        exc = E.DanglingRefError(detail, name=str(body.get("name")), session=str(target.get("session")),
                                 state=str(body.get("state")))
    elif lib in ("bad_entry", "base_rule", "call_id_repeated", "synthetic", "head_target"):
        exc = E.AppendRefusedError(detail, rule=body.get("reason"), code=lib, entry=body.get("entry"))
    elif lib == "ambiguous":
        exc = E.AmbiguousNameError(detail, candidates=list(body.get("candidates") or []))
    elif lib == "head_moved" and "current" in body:
        current = body["current"]
        exc = E.HeadMovedError(detail, current=current if isinstance(current, str) else None)
    elif lib in _PLAIN:
        exc = _PLAIN[lib](detail)
    else:
        exc = E.StoreError(detail)
        exc.code = lib  # the library's code is kept: a caller branches on it
    exc.status = status
    exc.args = (f"{where} ({body['code']}): {detail}",)
    return exc


def stream_frame(line: str | bytes, *, where: str) -> dict[str, Any]:
    """One line of a stream (an NDJSON answer's, a follow's) as the JSON object it is;
    TransportError naming ``where`` (the remote and the stream) for a line that is none,
    never the parser's own error."""
    try:
        frame = json.loads(line)
    except ValueError:
        frame = None
    if not isinstance(frame, dict):
        raise E.TransportError(f"{where} holds a line that is no JSON object")
    return frame


def frame_problem(body: Any, *, where: str) -> E.AgentSessionError:
    """The error a stream's ``error`` frame (or event) carries: its problem body as
    :func:`error_from_problem` reads one, a ``status`` that is no number read as 500."""
    status = body.get("status") if isinstance(body, dict) else None
    return error_from_problem(status if isinstance(status, int) else 500, body, where=where)


# -- object frames ---------------------------------------------------------------------------
#
# A batch upload (``POST /v1/objects``) and a batch read (``POST /v1/objects/read``) carry
# many objects in one body, each as ``<space> <hash> <length>\n`` and its bytes. A read's
# answer is streamed, so it also ends with ``end <count>\n`` (a body cut before it is an
# error, never a short answer) or, when the server fails part way, ``error <length>\n`` and
# a problem body.


def object_frame(space: str, name: str, data: bytes) -> bytes:
    """One object's frame (``space`` the library's name)."""
    return f"{space_to_wire(space)} {name} {len(data)}\n".encode("ascii") + data


def end_frame(count: int) -> bytes:
    return f"end {count}\n".encode("ascii")


def error_frame(exc: E.AgentSessionError) -> bytes:
    body = json.dumps(problem_body(exc), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return f"error {len(body)}\n".encode("ascii") + body


def _frame_head(line: bytes, n: int, max_object: int) -> tuple[Space, str, int]:
    """The space, name and length of frame ``n``'s line; BadNameError naming what is wrong."""
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].isdigit():
        raise E.BadNameError(f"object frame {n}: expected '<space> <hash> <length>'")
    space = space_from_wire(parts[0].decode("ascii", "replace"))
    name, size = parts[1].decode("ascii", "replace"), int(parts[2])
    if not is_hash(name):
        raise E.BadNameError(f"object frame {n}: {E.not_an_object_name(name)}")
    if size > max_object:
        raise E.TooLargeError(f"object {name} is {size} bytes; objects of at most {max_object} are taken")
    return space, name, size


def parse_frames(raw: bytes, max_object: int) -> list[tuple[Space, str, bytes]]:
    """The objects of a whole batch upload body; BadNameError naming the first malformed frame."""
    out: list[tuple[Space, str, bytes]] = []
    pos = 0
    while pos < len(raw):
        end = raw.find(b"\n", pos, pos + _LINE_MAX)
        if end < 0:
            raise E.BadNameError(f"object frame {len(out)} has no '<space> <hash> <length>' line")
        space, name, size = _frame_head(raw[pos:end], len(out), max_object)
        data = raw[end + 1 : end + 1 + size]
        if len(data) != size:
            raise E.BadNameError(f"object frame {len(out)} ({name}) is cut short")
        out.append((space, name, data))
        pos = end + 1 + size
    return out


class FrameReader:
    """The objects of a streamed batch read, as its chunks arrive: :meth:`feed` yields each
    whole frame's ``(space, name, bytes)``; the ``end`` frame sets :attr:`ended`, an
    ``error`` frame raises the problem it carries (``where`` names the remote)."""

    def __init__(self, *, where: str, max_object: int):
        self.where = where
        self.max_object = max_object
        self.ended = False
        self.count = 0
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> Iterator[tuple[Space, str, bytes]]:
        buf = self._buf
        buf += chunk
        pos = 0
        try:
            while not self.ended:
                end = buf.find(b"\n", pos, pos + _LINE_MAX)
                if end < 0:
                    if len(buf) - pos >= _LINE_MAX:
                        raise E.TransportError(f"{self.where}: object frame {self.count} has no frame line")
                    return
                line = bytes(buf[pos:end])
                if line.startswith(b"end "):
                    if not line[4:].isdigit() or int(line[4:]) != self.count or end + 1 != len(buf):
                        raise E.TransportError(f"{self.where}: the batch read's end frame does not close its answer")
                    self.ended = True
                    pos = end + 1
                    return
                if line.startswith(b"error "):
                    size = int(line[6:]) if line[6:].isdigit() else -1
                    if size < 0 or len(buf) < end + 1 + size:
                        if size < 0:
                            raise E.TransportError(f"{self.where}: a malformed error frame")
                        return
                    try:
                        body = json.loads(bytes(buf[end + 1 : end + 1 + size]))
                    except ValueError:
                        body = None  # (error_from_problem: an answer "without a problem body")
                    raise frame_problem(body, where=self.where)
                try:
                    space, name, size = _frame_head(line, self.count, self.max_object)
                except E.AgentSessionError as exc:
                    raise E.TransportError(f"{self.where}: {exc}") from None
                if len(buf) < end + 1 + size:
                    return
                data = bytes(buf[end + 1 : end + 1 + size])
                pos = end + 1 + size
                self.count += 1
                yield space, name, data
        finally:
            del buf[:pos]

