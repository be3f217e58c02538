"""Opening a store by URL: ``open_store`` takes what ``--store`` and ``AGENTSESSION_STORE``
take (see :func:`agentsession_cas.backends.open_backend` for the schemes served)."""

from __future__ import annotations

from os import PathLike
from typing import Any

from ..backends import SCHEMES, default_store_path, open_backend, store_url_kind
from .store import Store

__all__ = ["SCHEMES", "open_store", "store_url_kind"]


def open_store(url: str | PathLike[str] | None = None, *, create: bool = False, readonly: bool = False, **kwargs: Any) -> Store:
    """Open the store ``url`` names (default: ``$AGENTSESSION_STORE``, else ``~/.agent/cas``).

    ``create`` makes the store where there is none (``agentsession init``);
    ``readonly`` opens it without taking any hold or writing anything;
    other keywords go to :class:`Store` (``sync``)."""
    target = url if url is not None else default_store_path()
    return Store(open_backend(target, create=create, readonly=readonly), **kwargs)
