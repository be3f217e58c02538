"""The store's domain (RFC 0002): sessions, append, head, forks, projection and import.

Nothing in this package touches a file: it works through the seam of
:mod:`agentsession_cas.backends`."""

from .session import AppendResult, PreparedBatch, Session
from .state import SessionState, replay
from .store import DEFAULT_STORE, SYNC_POLICIES, HeadAdjusted, Store, default_store_path

__all__ = [
    "DEFAULT_STORE",
    "SYNC_POLICIES",
    "AppendResult",
    "HeadAdjusted",
    "PreparedBatch",
    "Session",
    "SessionState",
    "Store",
    "default_store_path",
    "replay",
]
