"""Storage backends behind one seam (:mod:`.base`): files (:mod:`.files`) and memory (:mod:`.memory`)."""

from .base import Append, Backend, Capabilities, LogOpen, ObjectStore, RefStore, RemoteStore, SessionLog, SessionStore

__all__ = ["Append", "Backend", "Capabilities", "LogOpen", "ObjectStore", "RefStore", "RemoteStore", "SessionLog", "SessionStore"]
