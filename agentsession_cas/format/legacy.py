"""In-memory migration of files written before format 0.5 (RFC 0001 "Versioning").

Before 0.5 an entry's ``id`` was any string. A reader walks such a file in
order, rewrites each ``ts`` to the admitted form, rewrites ``parent`` and
every entry-naming member to the hashes already assigned to earlier
entries, keeps the old id in ``legacy_id`` (added before hashing, so two
readers assign the same ids), and computes the new hashes. The file on
disk is never touched.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import EntryError, IJSONError, Problem, TimestampError
from .hashing import entry_hashes
from .rules import problem
from .timestamps import normalise_ts

__all__ = ["ENTRY_NAMING_MEMBERS", "migrate_entry"]

#: Top-level members, besides ``parent`` and ``parents``, that name an entry by id.
ENTRY_NAMING_MEMBERS = ("target", "first_kept", "from", "queued_from")


def migrate_entry(
    obj: dict[str, Any], line: int, assigned: dict[str, str], session_id: str | None
) -> tuple[dict[str, Any], list[Problem]]:
    """Migrate one pre-0.5 entry object given the ids ``assigned`` so far (old -> new).

    Returns the migrated object (with its new ``id``) and notes on what could
    not be rewritten. The caller records the new id in ``assigned``.
    """
    notes: list[Problem] = []
    old_id = obj.get("id")
    out = {k: v for k, v in obj.items() if k != "id"}
    if "content" in out:
        notes.append(
            problem(line, "unresolved", "body carries 'content', a name 0.5 reserves; this file must not be re-emitted as 0.5 or later")
        )
    if isinstance(old_id, str):
        out["legacy_id"] = old_id
    ts = out.get("ts")
    if isinstance(ts, str):
        try:
            out["ts"] = normalise_ts(ts)
        except TimestampError:
            pass  # left as written; the reader reports the spelling
    parent = out.get("parent")
    if isinstance(parent, str) and parent in assigned:
        out["parent"] = assigned[parent]
    parents = out.get("parents")
    if isinstance(parents, list):
        rewritten = []
        for ref in parents:
            if isinstance(ref, dict) and isinstance(ref.get("entry"), str):
                session = ref.get("session")
                in_file = session is None or session == session_id
                if in_file and ref["entry"] in assigned:
                    ref = {**ref, "entry": assigned[ref["entry"]]}
                else:
                    notes.append(problem(line, "unresolved", f"parents names {json.dumps(ref['entry'])}, which this reader cannot rewrite"))
            rewritten.append(ref)
        out["parents"] = rewritten
    for name in ENTRY_NAMING_MEMBERS:
        value = out.get(name)
        if isinstance(value, str):
            if value in assigned:
                out[name] = assigned[value]
            else:
                notes.append(problem(line, "unresolved", f"{name} names {json.dumps(value)}, which is not an earlier entry of this file"))
    try:
        new_id, _ = entry_hashes(out, parsed=True, allow_reserved=True)
    except (EntryError, IJSONError):
        # Left without an id; the reader reports what is wrong with the line.
        return out, notes
    out["id"] = new_id
    return out, notes
