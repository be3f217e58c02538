"""agentsession-cas: a git-like content-addressed store for Agent Session Format records.

The public API, from the packages that hold it (``docs/architecture.md``):
the format core (:mod:`.format`: reading, verifying and writing session
files, context and request hashes, runs and calls), the store
(:func:`open_store`, :class:`Store`, :class:`Session`; :mod:`.store`), the
storage seam and its backends (:mod:`.backends`), exchange between stores
(:mod:`.exchange`) and maintenance (:mod:`.maintenance`). Every error is an
:class:`AgentSessionError` carrying a machine ``code``.
"""

from .errors import (
    AgentSessionError,
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
    Context,
    ContextBuilder,
    ContextHasher,
    RequestCheck,
    RequestReport,
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
from .format.rules import (
    RULES,
    OpenRun,
    PathChecker,
    Rule,
    SessionChecker,
    TreeState,
    Trial,
    VerifyReport,
    analyze_runs,
    check_line,
    verify_records,
    verify_requests,
    verify_session,
)
from .format.runs import CallInfo, RecordsCheck, RunInfo, RunsReport, render_runs
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
