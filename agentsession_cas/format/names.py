"""Names that become paths: checked before any path is built from them."""

from __future__ import annotations

import re

from ..errors import BadNameError

__all__ = ["check_session_id", "MAX_SESSION_ID"]

MAX_SESSION_ID = 200
_SESSION_ID = re.compile(r"[A-Za-z0-9._-]+")


def check_session_id(session_id: object) -> str:
    """Return the id if it may name a session directory, else raise :class:`BadNameError`.

    Allowed: 1 to 200 characters of ASCII letters, digits, ``.``, ``_`` and
    ``-``, and not ``.`` or ``..``; so no id can climb out of ``sessions/``.
    """
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        raise BadNameError(
            f"session id {session_id!r} is not usable: use 1 to {MAX_SESSION_ID} of A-Z a-z 0-9 . _ -"
        )
    if session_id in (".", ".."):
        raise BadNameError(f"session id {session_id!r} is not usable")
    if len(session_id) > MAX_SESSION_ID:
        raise BadNameError(f"session id is {len(session_id)} characters long; at most {MAX_SESSION_ID} are allowed")
    return session_id
