"""``export --format atif|otel``: a session's projections other than its file.

Kept apart from ``store_commands.export`` so that command only chooses; the
projections themselves are the library's (``agentsession_cas.format.atif`` and
``agentsession_cas.format.otel``). The argument is a file or a stored session, as
``show`` takes it; a linked subsession is embedded when its session is in the same
store, or its file (``<child id>.jsonl``) lies beside the exported file. A file with a
line that does not read is refused, never projected in part.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agentsession_cas import SessionFile, read_session, read_session_bytes
from agentsession_cas.errors import OutputError
from agentsession_cas.format.atif import ChildResolver, document_name, trajectories, trajectory_at
from agentsession_cas.format.otel import otlp_request
from agentsession_cas.fsutil import write_output
from agentsession_cas.store import Store

from .common import fail, write_bytes


def _dumps(doc: Any, *, indent: int | None) -> bytes:
    return json.dumps(doc, ensure_ascii=False, indent=indent, separators=None if indent else (",", ":")).encode("utf-8", "surrogatepass")


def _store_children(store: Store) -> ChildResolver:
    def resolve(child: str, leaf: str | None) -> tuple[SessionFile, str] | None:
        if child not in store:
            return None
        sf = read_session_bytes(store.read(child).projection(), source=child)
        return _at(sf, leaf)

    return resolve


def _file_children(directory: str) -> ChildResolver:
    def resolve(child: str, leaf: str | None) -> tuple[SessionFile, str] | None:
        path = os.path.join(directory, f"{child}.jsonl")
        if "/" in child or not os.path.isfile(path):
            return None
        return _at(_sound(read_session(path)), leaf)

    return resolve


def _sound(sf: SessionFile) -> SessionFile:
    """A file read whole, or refused naming its problems, as ``import`` refuses it: a
    projection is lossless (RFC 0001), and one of the lines that did read is not."""
    if sf.all_problems():
        sf.raise_for_problems()
    return sf


def _at(sf: SessionFile, leaf: str | None) -> tuple[SessionFile, str] | None:
    """The child's entry to build at: the named leaf when the child holds it, else its
    current leaf (the projection's choice, which the reference says it made)."""
    if leaf is not None and leaf in sf.tree:
        return sf, leaf
    return (sf, sf.leaf) if sf.leaf is not None and leaf is None else None


def export_projection(sf: SessionFile, store: Store | None, arg: str, fmt: str, at: str | None, output: str | None) -> None:
    """Write the ATIF documents (one per leaf, or the one at ``at``) or the OTLP request
    of ``sf``, read from ``arg``: a file, or a session of ``store``."""
    resolver: ChildResolver
    if store is not None:
        resolver = _store_children(store)
    else:
        resolver = _file_children(os.path.dirname(os.path.abspath(arg)) if arg != "-" else os.getcwd())
    _sound(sf)
    if not sf.entries:
        fail(f"{arg}: the session has no entries, so it has no {fmt} projection", code="empty")
    where = f"session {sf.source}" if store is not None else None  # (a stored session's source is its id)
    entry = sf.resolve(at, where=where).id if at is not None else None
    if fmt == "otel":
        data = _dumps(otlp_request(sf, at=entry), indent=2) + b"\n"
        if output is None or output == "-":
            write_bytes(data)
        else:
            write_output(output, data)
        return
    if entry is not None:
        docs = [(document_name(sf.header.id, entry, sf.leaf), trajectory_at(sf, entry, resolve_child=resolver))]
    else:
        docs = list(trajectories(sf, resolve_child=resolver))
    if output is None or output == "-":
        write_bytes(b"".join(_dumps(doc, indent=None) + b"\n" for _, doc in docs))
        return
    if os.path.lexists(output) and not os.path.isdir(output):
        raise OutputError(f"cannot write {output}: it is not a directory, and an ATIF export writes one document "
                          "per path into the directory -o names")
    try:
        os.makedirs(output, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot write {output}: {exc.strerror}") from None
    for name, doc in docs:
        write_output(os.path.join(output, name), _dumps(doc, indent=2) + b"\n")

