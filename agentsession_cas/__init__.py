"""agentsession-cas: a git-like content-addressed store for Agent Session Format records.

The public API, from the packages that hold it (``docs/architecture.md``):
the format core (:mod:`.format`: reading, verifying and writing session
files, context and request hashes, runs and calls), the store
(:func:`open_store`, :class:`Store`, :class:`Session`; :mod:`.store`), the
storage seam and its backends (:mod:`.backends`), exchange between stores
(:mod:`.exchange`) and maintenance (:mod:`.maintenance`). Every error is an
:class:`AgentSessionError` carrying a machine ``code``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, eagerly, for type checkers
    from .errors import (
        AgentSessionError,
        BadArgumentError,
        ContextError,
        EntryError,
        IJSONError,
        NoSuchEntryError,
        Problem,
        SessionFormatError,
        TimestampError,
    )
    from .format.canonical import canonical_bytes, loads
    from .format.context import (
        ContextBuilder,
        ContextHasher,
        RequestCheck,
        Settings,
        build_context,
        canonical_request,
        context_at,
        context_hash_step,
        output_entries,
        request_context,
        request_hash,
        request_hash_for,
        verify_response,
    )
    from .format.entry import FORMAT_WRITTEN, LEAF_LABEL, Entry, Header, ParentRef, make_entry, short_id
    from .format.hashing import content_hash, entry_hashes, is_hash
    from .format.reader import SessionFile, read_session, read_session_bytes
    from .format.results import CallInfo, Context, RecordsCheck, RequestReport, RunInfo, RunsReport, VerifyReport
    from .format.rules import (
        RULES,
        OpenRun,
        PathChecker,
        Rule,
        SessionChecker,
        TreeState,
        Trial,
        analyze_runs,
        check_line,
        verify_records,
        verify_requests,
        verify_session,
    )
    from .format.runs import render_runs
    from .format.timestamps import check_ts, format_ts, is_valid_ts, now_ts
    from .format.tree import Tree
    from .format.writer import SessionBuilder, session_bytes, write_session
    from .store import AppendResult, PreparedBatch, Session, Store
    from .store.url import open_store

__version__ = "0.1.0"

__all__ = [
    "AppendResult",
    "PreparedBatch",
    "Session",
    "Store",
    "open_store",
    "AgentSessionError",
    "BadArgumentError",
    "Context",
    "ContextBuilder",
    "ContextError",
    "ContextHasher",
    "RequestCheck",
    "RequestReport",
    "Settings",
    "build_context",
    "canonical_request",
    "context_at",
    "context_hash_step",
    "output_entries",
    "request_context",
    "request_hash",
    "request_hash_for",
    "verify_requests",
    "verify_response",
    "CallInfo",
    "EntryError",
    "Entry",
    "FORMAT_WRITTEN",
    "Header",
    "IJSONError",
    "LEAF_LABEL",
    "NoSuchEntryError",
    "ParentRef",
    "Problem",
    "RULES",
    "Rule",
    "OpenRun",
    "PathChecker",
    "SessionChecker",
    "TreeState",
    "Trial",
    "VerifyReport",
    "check_line",
    "verify_session",
    "RecordsCheck",
    "RunInfo",
    "RunsReport",
    "SessionBuilder",
    "SessionFile",
    "SessionFormatError",
    "TimestampError",
    "Tree",
    "analyze_runs",
    "canonical_bytes",
    "check_ts",
    "content_hash",
    "entry_hashes",
    "format_ts",
    "is_hash",
    "is_valid_ts",
    "loads",
    "make_entry",
    "now_ts",
    "read_session",
    "read_session_bytes",
    "render_runs",
    "session_bytes",
    "short_id",
    "verify_records",
    "write_session",
]

#: Where each public name lives: imported on first use (PEP 562), so a program that
#: needs one piece (the command's --version, an error class) does not load them all.
_EXPORTS: dict[str, str] = {
    "AgentSessionError": ".errors",
    "AppendResult": ".store",
    "BadArgumentError": ".errors",
    "CallInfo": ".format.results",
    "Context": ".format.results",
    "ContextBuilder": ".format.context",
    "ContextError": ".errors",
    "ContextHasher": ".format.context",
    "Entry": ".format.entry",
    "EntryError": ".errors",
    "FORMAT_WRITTEN": ".format.entry",
    "Header": ".format.entry",
    "IJSONError": ".errors",
    "LEAF_LABEL": ".format.entry",
    "NoSuchEntryError": ".errors",
    "OpenRun": ".format.rules",
    "ParentRef": ".format.entry",
    "PathChecker": ".format.rules",
    "PreparedBatch": ".store",
    "Problem": ".errors",
    "RULES": ".format.rules",
    "RecordsCheck": ".format.results",
    "RequestCheck": ".format.context",
    "RequestReport": ".format.results",
    "Rule": ".format.rules",
    "RunInfo": ".format.results",
    "RunsReport": ".format.results",
    "Session": ".store",
    "SessionBuilder": ".format.writer",
    "SessionChecker": ".format.rules",
    "SessionFile": ".format.reader",
    "SessionFormatError": ".errors",
    "Settings": ".format.context",
    "Store": ".store",
    "TimestampError": ".errors",
    "Tree": ".format.tree",
    "TreeState": ".format.rules",
    "Trial": ".format.rules",
    "VerifyReport": ".format.results",
    "analyze_runs": ".format.rules",
    "build_context": ".format.context",
    "canonical_bytes": ".format.canonical",
    "canonical_request": ".format.context",
    "check_line": ".format.rules",
    "check_ts": ".format.timestamps",
    "content_hash": ".format.hashing",
    "context_at": ".format.context",
    "context_hash_step": ".format.context",
    "entry_hashes": ".format.hashing",
    "format_ts": ".format.timestamps",
    "is_hash": ".format.hashing",
    "is_valid_ts": ".format.timestamps",
    "loads": ".format.canonical",
    "make_entry": ".format.entry",
    "now_ts": ".format.timestamps",
    "open_store": ".store.url",
    "output_entries": ".format.context",
    "read_session": ".format.reader",
    "read_session_bytes": ".format.reader",
    "render_runs": ".format.runs",
    "request_context": ".format.context",
    "request_hash": ".format.context",
    "request_hash_for": ".format.context",
    "session_bytes": ".format.writer",
    "short_id": ".format.entry",
    "verify_records": ".format.rules",
    "verify_requests": ".format.rules",
    "verify_response": ".format.context",
    "verify_session": ".format.rules",
    "write_session": ".format.writer",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups are plain
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
