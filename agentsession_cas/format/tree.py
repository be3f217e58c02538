"""The entry tree of a session: children in file order, leaves, paths, and the resume rule.

``parent`` is the only edge walked; ``parents`` is provenance and never
widens a path. The tree works on ids so it serves a file's entries and,
later, a store's log alike.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Literal

from ..errors import NoSuchEntryError
from .entry import Entry

__all__ = ["Tree", "head_may_rest", "head_refusal", "Either"]


class Tree:
    """Index over entries in file (or log) order.

    ``prefix`` is the set of ids above the base (the base itself excluded),
    where a leaf label may not rest; ``base`` is the base's id or None.
    """

    def __init__(
        self,
        entries: Sequence[Entry],
        *,
        base: str | None = None,
        prefix: Iterable[str] = (),
    ):
        self.entries = list(entries)
        self.base = base
        self.prefix = frozenset(prefix)
        self.by_id: dict[str, Entry] = {}
        self.position: dict[str, int] = {}
        self._children: dict[str | None, list[Entry]] = {}
        for i, e in enumerate(self.entries):
            self.by_id[e.id] = e
            self.position[e.id] = i
            self._children.setdefault(e.parent, []).append(e)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.by_id

    def get(self, entry_id: str) -> Entry | None:
        return self.by_id.get(entry_id)

    def children(self, entry_id: str | None) -> list[Entry]:
        """Entries whose parent is ``entry_id`` (None: the roots), in file order."""
        return list(self._children.get(entry_id, ()))

    def roots(self) -> list[Entry]:
        """Entries with no parent in this tree (a null parent, or one the tree lacks)."""
        return [e for e in self.entries if e.parent is None or e.parent not in self.by_id]

    def leaves(self) -> list[Entry]:
        """Entries with no children, in file order."""
        return [e for e in self.entries if e.id not in self._children]

    def path(self, entry_id: str) -> list[Entry]:
        """Entries from the root to ``entry_id``, following ``parent`` alone."""
        out: list[Entry] = []
        e = self.by_id.get(entry_id)
        if e is None:
            raise NoSuchEntryError(f"no such entry: {entry_id}")
        seen: set[str] = set()
        while e is not None and e.id not in seen:
            seen.add(e.id)
            out.append(e)
            e = self.by_id.get(e.parent) if e.parent is not None else None
        out.reverse()
        return out

    def is_ancestor(self, ancestor: str | None, entry_id: str) -> bool:
        """True when ``ancestor`` is on the path to ``entry_id`` (itself included);
        None (the universal root) is an ancestor of everything."""
        if ancestor is None:
            return True
        return any(e.id == ancestor for e in self.path(entry_id))

    # -- the resume rule -----------------------------------------------------

    def _label_in_force_target(self, label: Entry) -> bool:
        """May a leaf label naming this target be in force? (A label without a
        ``target`` member names nothing.)"""
        if "target" not in label.data:
            return False
        target = label.get("target")
        if target is None:
            # The universal root: a head only a baseless session may have.
            return self.base is None
        if not isinstance(target, str) or target not in self.by_id:
            return False
        if target in self.prefix:
            return False
        return not self.by_id[target].is_leaf_label

    def leaf_label_in_force(self) -> Entry | None:
        """The last ``leaf`` label in force, or None.

        A label is out of force when its target is not in the file, is on the
        prefix above the base, or is itself a leaf label, or when a later
        label with ``label: null`` names the same target.
        """
        marks: list[Entry] = []
        for e in self.entries:
            if e.type != "label":
                continue
            if e.is_leaf_label:
                if self._label_in_force_target(e):
                    marks.append(e)
            elif e.get("label") is None:
                target = e.get("target")
                marks = [m for m in marks if m.get("target") != target]
        return marks[-1] if marks else None

    def _not_a_leaf_label(self, e: Entry | None) -> Entry | None:
        """A leaf that is itself a leaf label resolves to its nearest ancestor that is not one."""
        seen: set[str] = set()
        while e is not None and e.is_leaf_label and e.id not in seen:
            seen.add(e.id)
            e = self.by_id.get(e.parent) if e.parent is not None else None
        return None if e is not None and e.is_leaf_label else e

    def resume_leaf(self) -> str | None:
        """The leaf a reader resumes at (RFC 0001 "File"), or None for the universal root
        (an empty tree, or a leaf label naming the root with nothing written after it)."""
        found, named = self._resume_found()
        if found is None:
            return named
        e = self._not_a_leaf_label(found)
        return e.id if e is not None else None

    def resume_named(self) -> str | None:
        """Where the resume rule lands before a ``leaf`` label found there resolves to its
        nearest ancestor that is not one (:meth:`resume_leaf` is that resolution): the
        entry a file names as its head, which an import reports when it holds another
        (RFC 0002 "Projection to JSONL")."""
        found, named = self._resume_found()
        return found.id if found is not None else named

    def _resume_found(self) -> tuple[Entry | None, str | None]:
        """The rule's landing: (the entry found, None): the last line, or the last entry
        written below the label in force, after it; or (None, the id the label in force
        names) when nothing was written below it after it (None: the root, or an empty tree)."""
        if not self.entries:
            return None, None
        mark = self.leaf_label_in_force()
        if mark is None:
            return self.entries[-1], None
        target = mark.get("target")
        start = self.position[mark.id]
        if target is None:
            later = [e for e in self.entries[start + 1 :]]
        else:
            descendants = {target}
            later = []
            for e in self.entries[self.position[target] + 1 :]:
                if e.parent in descendants:
                    descendants.add(e.id)
                    if self.position[e.id] > start:
                        later.append(e)
        later = [e for e in later if e.id != mark.id]
        if not later:
            return None, target
        return later[-1], None


def head_may_rest(target: str | None, base: str | None, own: Container[str], leaf_labels: Container[str]) -> bool:
    """RFC 0002 Head: a session's head rests on its base or an own entry that is not a
    ``leaf`` label; on no entry only without a base. (The rule, for every holder of a
    session's state: the reader's tree, a store's replay, repair's plan.)"""
    if target is None:
        return base is None
    if target == base:
        return True
    return target in own and target not in leaf_labels


def head_refusal(
    target: str | None, base: str | None, own: Container[str], leaf_labels: Container[str], session_id: str
) -> tuple[str, Literal["head_target", "no_entry"]] | None:
    """Why the head of session ``session_id`` may not rest on ``target`` (the words, and
    RFC 0003's code for a head move: ``no_entry`` for an entry the session does not
    hold), or None when :func:`head_may_rest` lets it: every command that moves a head
    says it in these words."""
    if head_may_rest(target, base, own, leaf_labels):
        return None
    if target is None:
        return f"session {session_id} has a base; its head cannot be empty", "head_target"
    if target in leaf_labels:
        return f"{target} is a leaf label; the head never rests on one", "head_target"
    return f"{target} is neither the base nor an own entry of session {session_id}", "no_entry"


class Either:
    """Two containers looked up as one (what a session holds and what a batch adds,
    without a copy of the session's own entries)."""

    __slots__ = ("a", "b")

    def __init__(self, a: Container[str], b: Container[str]):
        self.a, self.b = a, b

    def __contains__(self, item: object) -> bool:
        return item in self.a or item in self.b
