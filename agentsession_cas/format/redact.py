"""Redaction at export (RFC 0001 header ``redacted``): a session file rewritten with
text taken out, every hash recomputed, and the header saying so.

RFC 0001's rule, applied in file order: each entry's body is rewritten, its content
hash and ``id`` are recomputed over the rewritten body, and ``parent``, every
entry-naming member (``parents`` into this file, ``target``, ``first_kept``, ``from``,
``queued_from``) and last the header's ``base`` are re-pointed at the ids assigned
earlier in the file; a reference into another session is left as it was, since it
names the unredacted original. The header gains ``redacted: true`` (and, from format
0.13, ``redacted_from`` naming the original and the profile) and a session id of its
own, derived from the original's and the profile. The result walks and verifies
against itself; its ``request_hash`` values are the original's and no longer match
where the redaction touched a request (verify notes them, ``redacted-request``).

What is rewritten: every string value at any depth of a body, and the paths an
``env`` entry's ``files`` are keyed by; never a member name the format defines, an
entry reference, a hash, a ``call_id`` or a ``sidecar:`` media reference (media is
carried as written: RFC 0001 forbids converting it, and its bytes are not text).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Any

from ..errors import RedactionError
from ..lean import dataclass
from .canonical import canonical_bytes
from .entry import REDACTED_FROM_MINOR, Entry, Header, make_entry, parse_format
from .hashing import is_hash
from .links import nil_uuid5
from .reader import SessionFile

__all__ = ["REDACTED", "RedactOptions", "Redacted", "redact", "redacted_session_id"]

#: What a secret is replaced with.
REDACTED = "REDACTED"
#: The top-level members of an entry that name an entry of this file by id.
_REFERENCES = ("target", "first_kept", "from", "queued_from")
#: Strings never rewritten wherever they stand: they name, they are not text.
_NOT_TEXT = ("call_id", "request_hash", "legacy_id", "response_id", "run_id")
#: Header members a redaction writes or re-points, left out of the text rewrite.
_HEADER_KEPT = ("type", "format", "id", "created_at", "payload", "records", "media", "base", "parent_session",
                "spawned_by", "redacted", "redacted_from")


@dataclass(frozen=True)
class RedactOptions:
    """What to take out: the home directory (replaced by ``~``), the contents of every
    ``env`` entry (kept in its place with nothing but its type), and every match of
    each ``secrets`` regular expression (replaced by ``REDACTED``)."""

    home: str | None = None
    env: bool = False
    secrets: Sequence[str] = ()

    def profile(self) -> str:
        """The name of this set of rules, for ``redacted_from`` and the derived id: two
        redactions under one profile are one session. The expressions are hashed, never
        written: a secret's pattern can say what it hides."""
        parts = ["agentsession-cas/redact/1", f"home={'1' if self.home else '0'}", f"env={'1' if self.env else '0'}"]
        if self.secrets:
            digest = hashlib.sha256(canonical_bytes(list(self.secrets))).hexdigest()
            parts.append(f"secrets=sha256:{digest}")
        return ";".join(parts)

    def rewriter(self) -> Callable[[str], str]:
        """The text rewrite: secrets first (a secret may hold the home path), then home."""
        patterns = []
        for s in self.secrets:
            if not s:
                raise RedactionError("an empty --secret pattern would match everywhere")
            try:
                patterns.append(re.compile(s))
            except re.error as exc:
                raise RedactionError(f"--secret {s!r} is not a regular expression: {exc}") from None
        home = None
        if self.home is not None:
            h = self.home.rstrip("/")
            if not h:
                raise RedactionError("the home directory to redact is empty or /")
            home = re.compile(re.escape(h) + r"(?=/|$|[^\w.\-])")

        def rewrite(text: str) -> str:
            for p in patterns:
                text = p.sub(REDACTED, text)
            if home is not None:
                text = home.sub("~", text)
            return text

        return rewrite


def redacted_session_id(original: str, profile: str) -> str:
    """The id of the redacted session: a UUIDv5 under the nil namespace over the
    canonical JSON array ``["redacted", original, profile]`` (as the reference library
    derives it), so one original under one profile is one redacted session."""
    name = canonical_bytes(["redacted", original, profile]).decode("utf-8")
    return nil_uuid5(name)


@dataclass
class Redacted:
    """A redacted file: its bytes, its session id, and each original id's new id."""

    data: bytes
    session_id: str
    ids: dict[str, str] = field(default_factory=dict)


def _text(value: Any, f: Callable[[str], str], *, key: str | None = None) -> Any:
    """Every string at any depth rewritten, but those that name rather than say."""
    if isinstance(value, str):
        if key in _NOT_TEXT or is_hash(value) or value.startswith("sidecar:"):
            return value
        return f(value)
    if isinstance(value, list):
        return [_text(v, f, key=key) for v in value]
    if isinstance(value, dict):
        return {k: _text(v, f, key=k) for k, v in value.items()}
    return value


def _rekey(files: Any, f: Callable[[str], str], where: str) -> Any:
    """An env entry's ``files``: each path key rewritten, refusing two paths made one."""
    if not isinstance(files, dict):
        return _text(files, f)
    out: dict[str, Any] = {}
    for kind, paths in files.items():
        if not isinstance(paths, dict):
            out[kind] = _text(paths, f)
            continue
        renamed: dict[str, Any] = {}
        for path, digest in paths.items():
            new = f(path)
            if new in renamed:
                raise RedactionError(f"{where}: the redaction makes two paths of files.{kind} one ({new!r})")
            renamed[new] = _text(digest, f)
        out[kind] = renamed
    return out


def _body(e: Entry, f: Callable[[str], str], options: RedactOptions, ids: Mapping[str, str]) -> dict[str, Any]:
    if e.type == "env" and options.env:
        return {}
    out: dict[str, Any] = {}
    for k, v in e.body.items():
        if k in _REFERENCES and isinstance(v, str):
            out[k] = ids.get(v, v)
        elif k == "files" and e.type == "env":
            out[k] = _rekey(v, f, f"line {e.line}")
        else:
            out[k] = _text(v, f, key=k)
    return out


def _parents(e: Entry, session: str, new_id: str, ids: Mapping[str, str], f: Callable[[str], str]) -> list[Any] | None:
    """``parents`` re-pointed: a reference into this file (no ``session``, or this one)
    names the id assigned its entry (and, naming this session, the redacted session's
    id); every reference keeps the members RFC 0001 does not define (it preserves them),
    their strings redacted as any other text, and a reference into another session keeps
    its ``entry`` and ``session``."""
    refs = e.data.get("parents")
    if not refs:
        return None
    out = []
    for ref in refs:  # (every one a reference with a string entry: a file with a problem is refused)
        named = ref.get("session")
        ref = {k: v if k in ("entry", "session") else _text(v, f, key=k) for k, v in ref.items()}
        if named is None or named == session:
            ref["entry"] = ids.get(ref["entry"], ref["entry"])
            if named is not None:
                ref["session"] = new_id
        out.append(ref)
    return out


def _header(header: Header, f: Callable[[str], str], options: RedactOptions, new_id: str, base: str | None) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for k, v in header.data.items():
        data[k] = v if k in _HEADER_KEPT else _text(v, f, key=k)
    original, profile = header.id, options.profile()
    data["id"] = new_id
    data["redacted"] = True
    version = parse_format(header.data.get("format"))
    if version is not None and version >= (0, REDACTED_FROM_MINOR):
        data["redacted_from"] = {"session": original, "profile": profile}
    if base is not None:
        data["base"] = base
    return data


def redact(sf: SessionFile, options: RedactOptions) -> Redacted:
    """The redacted form of a session file (see the module). Refuses a file with
    problems (a redaction of a broken file would hide them), one already redacted, and
    a rewrite that makes two entries one."""
    if sf.header.data.get("redacted") is not None:
        raise RedactionError(f"{sf.source}: already redacted; redact the original")
    if sf.migrated:
        raise RedactionError(f"{sf.source}: a file from before 0.5 is migrated on read; import or export it first")
    errors = [p for p in sf.all_problems() if p.severity == "error"]
    if errors or sf.truncated is not None:
        first = errors[0] if errors else sf.truncated
        raise RedactionError(f"{sf.source}: does not verify ({first}); a redaction would hide what is wrong")
    f = options.rewriter()
    session = sf.header.id
    new_id = redacted_session_id(session, options.profile())
    ids: dict[str, str] = {}
    lines: list[bytes] = []
    made: dict[str, int | None] = {}
    for e in sf.entries:
        body = _body(e, f, options, ids)
        parent = ids.get(e.parent, e.parent) if e.parent is not None else None
        new = make_entry(e.type, parent, ts=e.ts, parents=_parents(e, session, new_id, ids, f), **body)
        if new.id in made:
            raise RedactionError(f"line {e.line}: the redaction makes it the same entry as line {made[new.id]}; "
                                 "redact with other rules")
        made[new.id] = e.line
        ids[e.id] = new.id
        lines.append(new.canonical_line())
    base = sf.header.base
    header = _header(sf.header, f, options, new_id, ids.get(base, base) if base is not None else None)
    data = canonical_bytes(header) + b"\n" + b"".join(lines)
    return Redacted(data, new_id, ids)
