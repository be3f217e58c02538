"""Who is calling, and what they may do: bearer tokens with scopes (RFC 0003, Security).

``--auth FILE`` names a JSON file ``{"tokens": [{"token": "...", "scopes": [...],
"sessions": "<optional id prefix>", "name": "<optional label>"}]}``. A token with
``sessions`` may touch only sessions whose id starts with it. Without a file the
server serves loopback callers only and every caller holds every scope (the
serve command refuses any other listening address).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

from ..errors import AuthError, ScopeError, StoreError
from ..lean import dataclass

__all__ = ["SCOPES", "LOCAL", "Principal", "Tokens", "load_tokens"]

#: The scopes RFC 0003 names (Security considerations).
SCOPES = ("read", "write", "refs", "exchange", "admin")


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a label (never the token), its scopes, and the session
    id prefix it is confined to (empty: every session)."""

    name: str
    scopes: frozenset[str]
    sessions: str = ""
    #: What the server keys a caller's state by (replies, uploads): a digest of the
    #: token, never the token, and unique even where two tokens share a name.
    key: str = "local"

    def need(self, scope: str) -> None:
        """ScopeError unless the caller holds ``scope``."""
        if scope not in self.scopes:
            raise ScopeError(f"this token ({self.name}) lacks the {scope!r} scope this request needs")

    def may_touch(self, session_id: str) -> bool:
        return session_id.startswith(self.sessions)

    def may_read(self, session_id: str) -> bool:
        """Read a session: read scope (or exchange, whose fetch and push read) within the prefix."""
        return bool(self.scopes & {"read", "exchange"}) and self.may_touch(session_id)

    def need_session(self, session_id: str, scope: str) -> None:
        """ScopeError unless the caller holds ``scope`` for this session id. Refused
        whether or not the session exists, so the answer says nothing of it."""
        self.need(scope)
        if not self.may_touch(session_id):
            raise ScopeError(f"this token ({self.name}) may touch only sessions whose id starts with {self.sessions!r}")


#: The caller of a server with no token file: loopback only, every scope.
LOCAL = Principal("local", frozenset(SCOPES))


class Tokens:
    """The token table: looks a presented token up in constant time per entry."""

    def __init__(self, entries: list[tuple[bytes, Principal]]):
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    def principal(self, authorization: str | None) -> Principal:
        """The principal an ``Authorization: Bearer`` header names; AuthError otherwise."""
        if not authorization:
            raise AuthError("this server needs a bearer token (Authorization: Bearer ...)")
        kind, _, token = authorization.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            raise AuthError("this server takes bearer tokens only (Authorization: Bearer ...)")
        digest = hashlib.sha256(token.strip().encode("utf-8")).digest()
        found = None
        for want, principal in self._entries:
            if hmac.compare_digest(want, digest):
                found = principal
        if found is None:
            raise AuthError("the bearer token is not one this server accepts")
        return found


def load_tokens(path: str | os.PathLike[str]) -> Tokens:
    """Read a token file; a file that is not as documented is a StoreError naming what."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as f:
            data = json.loads(f.read())
    except OSError as exc:
        raise StoreError(f"auth file {where}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise StoreError(f"auth file {where}: not JSON ({exc})") from None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not tokens:
        raise StoreError(f"auth file {where}: expected {{\"tokens\": [{{\"token\", \"scopes\", ...}}, ...]}}")
    entries: list[tuple[bytes, Principal]] = []
    seen: set[bytes] = set()
    for i, t in enumerate(tokens):
        at = f"auth file {where}: tokens[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("token"), str) or len(t["token"]) < 16:
            raise StoreError(f"{at}: 'token' must be a string of at least 16 characters")
        scopes = t.get("scopes")
        if not isinstance(scopes, list) or not all(isinstance(s, str) and s in SCOPES for s in scopes):
            raise StoreError(f"{at}: 'scopes' must be a list of {', '.join(SCOPES)}")
        prefix = t.get("sessions", "")
        if not isinstance(prefix, str):
            raise StoreError(f"{at}: 'sessions' must be a session id prefix (a string)")
        name = t.get("name", f"token {i}")
        if not isinstance(name, str):
            raise StoreError(f"{at}: 'name' must be a string")
        digest = hashlib.sha256(t["token"].encode("utf-8")).digest()
        if digest in seen:
            raise StoreError(f"{at}: the same token twice")
        seen.add(digest)
        entries.append((digest, Principal(name, frozenset(scopes), prefix, digest.hex()[:32])))
    return Tokens(entries)
