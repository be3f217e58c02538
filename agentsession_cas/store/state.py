"""A session's state, replayed from its log: the one function every reader of a log uses.

A session's log is its record (RFC 0002 "A log per session"): the head, the
mark, the own entries and their order are whatever its records say, and any
index a backend keeps beside it is rebuilt from it. :func:`replay` turns the
records into a :class:`SessionState`; opening a session, fsck, repair, the
stored-session ``verify`` and exchange's committed view all call it, so they
read one log one way.

Replay also finds **damage** a checksum cannot: records that contradict each
other (an append before the create, a head move to an entry no append holds),
and, through :func:`index_damage`, an index naming an entry the log lacks or a
length it does not reach, which is what a log cut short at a record boundary
looks like (its committed appends gone, each remaining record still sound).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field
from typing import Any

from ..backends.base import COMMIT_POINTS, Mark
from ..format.hashing import is_hash
from ..format.tree import head_may_rest
from ..lean import dataclass
from .own import OwnOrder, OwnSeqs, own_of

__all__ = ["SessionState", "replay", "index_damage", "stale_head"]


@dataclass
class SessionState:
    """What a session's log says: base, head, mark, own entries in log order.

    ``own`` maps each own entry to its sequence number; sequence numbers grow in
    log order, so the committed entries are those with ``seq <= committed_seq``.
    Both hold what a compacted log's snapshot names as its digests (:mod:`.own`).
    ``max_seq`` is the highest number ever used (a lost append's too: numbers
    are never reused). ``damage`` lists contradictions found while replaying."""

    base: str | None = None
    head: str | None = None
    mark: Mark = "mirror"
    own: OwnSeqs = field(default_factory=OwnSeqs)
    log_order: OwnOrder = field(default_factory=OwnOrder)
    leaf_labels: set[str] = field(default_factory=set)
    committed_seq: int = 0
    max_seq: int = 0
    created: bool = False
    #: (code, message) for each contradiction: ``log-order`` (records out of place),
    #: ``head-rule`` (a head moved where it may not rest), ``bad-record``.
    damage: list[tuple[str, str]] = field(default_factory=list)
    #: Records replayed, and the index of the last commit (or create) among them.
    records: int = 0
    last_commit: int = -1

    def copy(self) -> SessionState:
        return SessionState(
            self.base, self.head, self.mark, self.own.copy(), self.log_order.copy(), set(self.leaf_labels),
            self.committed_seq, self.max_seq, self.created, list(self.damage), self.records, self.last_commit,
        )

    def is_committed(self, entry_id: str) -> bool:
        seq = self.own.get(entry_id)
        return seq is not None and seq <= self.committed_seq

    def may_hold_head(self, target: str | None) -> bool:
        """RFC 0002's head rule: the base or an own entry that is not a ``leaf`` label
        (no head only without a base)."""
        return head_may_rest(target, self.base, self.own, self.leaf_labels)

    # -- applying records (replay, and a writer keeping its state current) ----------

    def apply(self, record: Mapping[str, Any], index: int | None = None) -> None:
        """Apply one record, as it was (or is being) written to the log."""
        op = record.get("op")
        i = self.records if index is None else index
        self.records = i + 1
        if op == "create":
            if self.created:
                self.damage.append(("log-order", f"record {i + 1}: a second create record"))
                return
            self.created = True
            base = record.get("base")
            if base is not None and not is_hash(base):
                self.damage.append(("bad-record", f"record {i + 1}: the create record names base {base!r}, not an entry id"))
                base = None
            self.base = base
            self.head = base
            mark = record.get("mark")
            self.mark = "record" if mark == "record" else "mirror"
            self.last_commit = i
            return
        if not self.created:
            self.damage.append(("log-order", f"record {i + 1}: a {op} record before the create record"))
            return
        if op == "append":
            self._append(record, i)
        elif op == "head":
            self._move_head(record.get("head"), f"record {i + 1}: a head move")
        elif op == "mark":
            mark = record.get("mark")
            if mark in ("record", "mirror"):
                self.mark = mark
            else:
                self.damage.append(("bad-record", f"record {i + 1}: mark {mark!r} is neither record nor mirror"))
        elif op == "commit":
            self.last_commit = i
            self.committed_seq = self.max_seq
        elif op in ("loss", "repair"):
            seq = record.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool):
                self.max_seq = max(self.max_seq, seq)
        elif op == "snapshot":
            self._snapshot(record, i)

    def _snapshot(self, record: Mapping[str, Any], i: int) -> None:
        """Load what a compacted log's snapshot stands for at once (its records replay
        to the same state, one by one; ``docs/storage-format.md``): the own entries in
        log order with their sequence numbers, the leaf labels, the head (held to the
        head rule as any move), the mark, the numbers spent; all of it committed."""
        if self.log_order:
            self.damage.append(("log-order", f"record {i + 1}: a snapshot record after appends"))
            return
        entries, seqs = record["entries"], record["seqs"]
        held = own_of(entries, seqs) if len(entries) == len(seqs) else None
        if held is None:
            self.damage.append(("bad-record", f"record {i + 1}: a snapshot naming an entry twice or not by id"))
            return
        self.log_order, self.own = held
        self.leaf_labels = set(record["leaf_labels"])
        self.max_seq = max(self.max_seq, record["seq"], seqs[-1] if seqs else 0)
        mark = record.get("mark")
        if mark in ("record", "mirror"):
            self.mark = mark
        self._move_head(record.get("head"), f"record {i + 1}: a snapshot")
        self.committed_seq = self.max_seq
        self.last_commit = i

    def _append(self, record: Mapping[str, Any], i: int) -> None:
        entry = record.get("entry")
        if not isinstance(entry, str) or not is_hash(entry):
            self.damage.append(("bad-record", f"record {i + 1}: an append naming {entry!r}, not an entry id"))
            return
        seq = record.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            seq = self.max_seq + 1
        self.max_seq = max(self.max_seq, seq)
        if self.own.add(entry, seq):
            self.log_order.append(entry)
            if record.get("leaf_label"):
                self.leaf_labels.add(entry)
        if "head" in record:
            self._move_head(record.get("head"), f"record {i + 1}: an append")

    def _move_head(self, head: Any, what: str) -> None:
        """A head move a record makes, held to the head rule: one it breaks is damage
        (no writer of the store writes it), and the head stays where it was."""
        if self.may_hold_head(head):
            self.head = head
            return
        if head is None:
            why = "no head, though the session has a base"
        elif head in self.leaf_labels:
            why = f"{head}, a leaf label"
        elif head in self.own or head == self.base:
            why = str(head)
        else:
            why = f"{head}, which no append of the log holds"
        self.damage.append(("head-rule", f"{what} moves the head to {why}"))


def replay(records: Iterable[Mapping[str, Any]]) -> SessionState:
    """The state a log's records give, in order; contradictions are in ``damage``.

    Every commit record commits what came before it; a log that ends without
    one has uncommitted appends (``committed_seq`` below ``max_seq``), which is
    what a writer's working state looks like."""
    state = SessionState()
    for i, record in enumerate(records):
        state.apply(record, i)
    if not state.created:
        state.damage.append(("log-order", "the log holds no create record"))
    return state


def committed_view(records: Sequence[Mapping[str, Any]]) -> SessionState:
    """The state as of the last commit (what exchange may serve of a session another
    process is writing: never its working state)."""
    last = max((i for i, r in enumerate(records) if r.get("op") in COMMIT_POINTS), default=-1)
    return replay(records[: last + 1])


def log_loss(
    records: Sequence[Mapping[str, Any]], head_index: str | None, length_index: tuple[int, int] | None = None,
    *, summary: Mapping[str, Any] | None = None, rules: Mapping[str, Any] | None = None,
) -> str | None:
    """Why a whole-reading log lost records a sweep must not sweep the objects of, or None:
    it is empty or does not open with its create record, or an index contradicts it
    (:func:`index_damage`: the head names an entry it does not hold, or the length index,
    where the backend keeps one, runs past its last record; the head alone misses rows
    lost after an entry the head was moved back to). ``repair`` takes such entries back
    from the objects while they are held; every backend's sweep refuses the store on this."""
    if not records or records[0].get("op") != "create":
        return "it is empty or does not open with its create record"
    return index_damage(replay(records), head_index, length_index, summary=summary, rules=rules)


def index_damage(
    state: SessionState, head_index: str | None, length_index: tuple[int, int] | None = None,
    *, summary: Mapping[str, Any] | None = None, rules: Mapping[str, Any] | None = None,
) -> str | None:
    """Why an index contradicts the log, or None: committed records were lost (the log
    was cut short: fsck's ``log-cut``, what every backend's open refuses on).

    A backend writes its indexes only after the log is committed (or in the same
    transaction), so an index may lag the log (a crash before it was rewritten) but
    never lead it: a head index naming an entry that is neither the base nor an own
    entry of the log, or a length index (``(the length it says, the position of the
    log's last record)``, where the backend keeps one: PostgreSQL's ``last_pos``)
    beyond the log's last record, means committed records were lost, and the log must
    not be written over (the sequence numbers and the head would be reused and the
    evidence erased).

    The head alone misses a loss the head does not point into (an append on a branch,
    or after the head was moved back), so the other indexes written only after a commit
    are held to the log the same way, where the backend keeps them: the ``summary``
    (``list``'s, :mod:`.summary`: ``seq``, ``last_entry``) and the append ``rules``'
    state (:mod:`.rulestate`: ``last_seq``, ``last``). A number beyond every one the
    log spent (``max_seq``: loss and repair records and a compacted log's snapshot keep
    the numbers of what they drop, so a repaired or compacted log still reaches it), or,
    for the rules' state, a last entry the log does not hold (a repair removes that file;
    it keeps the summary, whose last entry may be one it dropped), means the same."""
    if head_index is not None and is_hash(head_index) and head_index != state.base and head_index not in state.own:
        return (
            f"its head index names {head_index}, which the log does not hold: the log has lost committed records "
            "(cut short?)"
        )
    if length_index is not None and length_index[0] > length_index[1]:
        said, last = length_index
        return (
            f"its length index says the log holds {said} record(s), its last is record {last}: the log has lost "
            "committed records (cut short?)"
        )
    for what, kept, seq_key, entry_key in (("summary", summary, "seq", "last_entry"), ("rules' state", rules, "last_seq", "last")):
        if not kept:
            continue
        seq, entry = kept.get(seq_key), kept.get(entry_key)
        if type(seq) is int and seq > state.max_seq:
            return (
                f"its kept {what} counts sequence number {seq}"
                + (f" (entry {entry})" if isinstance(entry, str) else "")
                + f", beyond every one the log spent ({state.max_seq}): the log has lost committed records (cut short?)"
            )
        if kept is rules and isinstance(entry, str) and is_hash(entry) and entry != state.base and entry not in state.own:
            return (
                f"its kept {what} names {entry} as its last entry, which the log does not hold: the log has lost "
                "committed records (cut short?)"
            )
    return None


def stale_head(state: SessionState, head_index: str | None) -> str | None:
    """Why a head index the log holds is stale rather than lagging, or None: it names an
    entry no head rests on (a ``leaf`` label: RFC 0002's head rule, :meth:`SessionState.may_hold_head`),
    so no writer ever wrote it there (fsck's ``stale-head``, whether or not a writer holds
    the session). An index the log does not hold is :func:`index_damage`'s."""
    if head_index is None or head_index not in state.own or state.may_hold_head(head_index):
        return None
    return (
        f"its head index names {head_index}, where no head rests (a leaf label), but the log's head is "
        f"{state.head or 'none'}"
    )
