"""The store's domain (RFC 0002): sessions, append, head, forks, projection and import."""

from .core import LAYOUT, AppendResult, Session, Store, default_store_path

__all__ = ["LAYOUT", "AppendResult", "Session", "Store", "default_store_path"]
