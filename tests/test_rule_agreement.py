"""One verdict on the same bytes: every command that consults the rule set agrees.

For every case file of tests/test_rules.py (together they break every rule of
``format/rules.py``) and every file of the reference corpus, the verdict of
``verify`` of the file is compared with what each consulting command does with
the same entries:

* **import** refuses exactly the files verify rejects, naming verify's codes;
* **append**, fed the file's entries one at a time, refuses the first entry
  verify finds a refusing rule broken at, with that rule's code, and takes every
  entry before it (a ``request_hash`` that does not match is taken and returned
  as a finding);
* **push** (exchange admission) refuses the entries with a refusing rule broken,
  with the rule's code, and admits the others;
* **stored verify** and ``fsck --deep`` of a session holding the same entries
  (written through the backend seam, which checks nothing) name verify's codes;
* a rule whose store policy is ``keep`` (``header-member``) refuses nothing an
  import, a push or a stored session holds: import keeps the header and returns
  the problems as ``header_findings``, ``fsck`` calls them warnings;
* ``fsck`` of a store holding every corpus file verify accepts is clean.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentsession_cas import open_store
from agentsession_cas.backends.base import Append
from agentsession_cas.errors import AgentSessionError, AppendRefusedError, SessionFormatError, StoreError
from agentsession_cas.exchange.endpoint import StoreEndpoint
from agentsession_cas.exchange.transport import PushRequest
from agentsession_cas.format.canonical import canonical_bytes
from agentsession_cas.format.entry import Header
from agentsession_cas.format.hashing import entry_objects
from agentsession_cas.format.reader import read_session_bytes, split_lines
from agentsession_cas.format.rules import RULES, verify_session
from agentsession_cas.maintenance.check import verify_stored
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from test_rules import FILES

_COUNTER = iter(range(10**9))


def memory_store() -> Store:
    return open_store(f"memory:agree-{next(_COUNTER)}", create=True)


# ---------------------------------------------------------------------------
# verify's verdict


def verdict(data: bytes) -> list[Any]:
    """The errors verify of the file reports (notes fail nothing)."""
    try:
        sf = read_session_bytes(data)
    except SessionFormatError as exc:
        return [p for p in exc.problems if p.severity == "error"]
    return list(verify_session(sf).problems)


def notes_of(data: bytes) -> list[Any]:
    """The notes verify of the file makes (they fail nothing)."""
    try:
        return list(verify_session(read_session_bytes(data)).notes)
    except SessionFormatError:
        return []


def refusing(problems: list[Any]) -> list[Any]:
    return [p for p in problems if RULES[p.code].store == "refuse"]


def kept(problems: list[Any]) -> list[Any]:
    """What a store keeps as a session has it and reports (store policy ``keep``)."""
    return [p for p in problems if RULES[p.code].store == "keep"]


def parsed_lines(data: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The header and entry lines as plain JSON objects, or None when one does not parse."""
    try:
        objs = [json.loads(line) for line in split_lines(data)]
    except ValueError:
        return None
    if not objs or not all(isinstance(o, dict) for o in objs):
        return None
    return objs[0], objs[1:]


def whole_entries(data: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The header and entries when the file's bytes are what a store would hold: every
    line parses, and hashes to the id it states (else the store's bytes would differ)."""
    found = parsed_lines(data)
    if found is None:
        return None
    header, entries = found
    for e in entries:
        try:
            if entry_objects(e)[0] != e.get("id"):
                return None
        except (AgentSessionError, ValueError, TypeError):
            return None
    return header, entries


def store_policy(data: bytes) -> str | None:
    """What a store refuses a readable file for whatever verify says (RFC 0002): a
    redacted session (a record to read, not one to hold) and a file from before hashed
    ids holding a reference migration could not rewrite (RFC 0001 forbids re-emitting
    it; one without is imported as migrated). A pattern of the refusal's message."""
    try:
        sf = read_session_bytes(data)
    except SessionFormatError:
        return None
    if sf.header.data.get("redacted") is not None:
        return "redacted"
    if sf.migrated and sf.unresolved:
        return "forbids re-emitting"
    return None


def _header_reads(header: dict[str, Any]) -> bool:
    """A header a store takes as it is: one verify reads, of a format with hashed ids
    (a file before them is imported as migrated, not appended or pushed as written)."""
    h = Header(dict(header))
    return not h.problems() and not h.is_legacy


# ---------------------------------------------------------------------------
# the consumers


def import_codes(data: bytes, tmp: Path) -> list[str] | None | tuple[str, ...]:
    """The codes an import refuses the file with, or, when it is imported, the codes of
    the problems it kept (a tuple, empty when none)."""
    path = tmp / "case.jsonl"
    path.write_bytes(data)
    with memory_store() as st:
        try:
            s = st.import_file(path)
        except SessionFormatError as exc:
            return sorted({p.code for p in exc.problems})
        return tuple(sorted({p.code for p in s.header_findings}))


def append_outcomes(header: dict[str, Any], entries: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Each entry appended in file order: ("ok", finding codes) or ("refused", rule);
    stops at the first refusal."""
    out: list[tuple[str, Any]] = []
    with memory_store() as st:
        s = st.create(Header(dict(header)))
        for e in entries:
            if not all(k in e for k in ("id", "parent", "ts")):
                break  # an append fills these (RFC 0002): it would not hold the file's bytes
            try:
                res = s.append(dict(e))
            except AppendRefusedError as exc:
                out.append(("refused", exc.rule))
                break
            out.append(("ok", (sorted(p.code for p in res.findings), sorted({p.code for p in res.notes}))))
    return out


def split_prefix(header: dict[str, Any], ids: list[str]) -> tuple[list[str], list[str]] | None:
    base = header.get("base")
    if base is None:
        return [], ids
    if base not in ids:
        return None
    cut = ids.index(base) + 1
    return ids[:cut], ids[cut:]


def push_outcome(header: dict[str, Any], entries: list[dict[str, Any]], leaf: str | None) -> str | None:
    """Push the entries to an empty store: the rule a refusal names, or None when admitted."""
    ids = [e["id"] for e in entries]
    parts = split_prefix(header, list(dict.fromkeys(ids)))
    assert parts is not None
    prefix, own = parts
    with memory_store() as st:
        endpoint = StoreEndpoint(st)
        objs: list[tuple[str, str, bytes]] = []
        for e in entries:
            eid, chash, content, env = entry_objects(e)
            objs += [("contents", chash, content), ("entries", eid, env)]
        endpoint.put_objects(objs, len(objs))
        try:
            endpoint.receive(PushRequest(header=dict(header), prefix=prefix, entries=own, to=leaf, expected=None))
        except AppendRefusedError as exc:
            return exc.rule
        finally:
            endpoint.close()
    return None


def forced_store(header: dict[str, Any], entries: list[dict[str, Any]], leaf: str | None) -> Store:
    """A store holding the entries as a session, written through the backend seam (which
    checks no rule): what a store another writer damaged, or an older release, holds."""
    st = memory_store()
    ids = list(dict.fromkeys(e["id"] for e in entries))
    parts = split_prefix(header, ids)
    assert parts is not None
    prefix, own = parts
    objs: list[tuple[Any, str, bytes]] = []
    chash_of: dict[str, str] = {}
    for e in entries:
        eid, chash, content, env = entry_objects(e)
        chash_of[eid] = chash
        objs += [("contents", chash, content), ("entries", eid, env)]
    st.objects.put_many(objs, count=len(objs))
    records: list[Any] = [{"op": "create", "session": header["id"], "base": header.get("base"), "mark": "record"}]
    head = header.get("base")
    for seq, eid in enumerate(own, start=1):
        moved = eid == leaf
        records.append(Append(seq, eid, leaf if moved else head, head_moved=moved, leaf_label=False, lazy=False))
        head = leaf if moved else head
    log = st.backend.sessions.create(
        header["id"], canonical_bytes(header), records, [], head=head, mark="record",
        prefix=[(e, chash_of[e]) for e in prefix],
    )
    log.close()
    return st


# ---------------------------------------------------------------------------
# the walk over every rule


def _codes(problems: list[Any]) -> list[str]:
    return sorted({p.code for p in problems})


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_consulting_command_agrees(name, tmp_path):
    data = FILES[name]
    errors = verdict(data)
    policy = store_policy(data)
    if policy is not None:
        # RFC 0002 keeps some sessions out of a store that verify reads as files.
        path = tmp_path / "case.jsonl"
        path.write_bytes(data)
        with memory_store() as st, pytest.raises((StoreError, SessionFormatError), match=policy):
            st.import_file(path)
        return

    # import: refuses exactly what verify rejects, naming only codes verify names.
    refused = import_codes(data, tmp_path)
    if len(kept(errors)) < len(errors):
        assert isinstance(refused, list), f"import took a file verify rejects with {_codes(errors)}"
        assert set(refused) <= set(_codes(errors))
        assert min(errors, key=lambda p: (p.line or 0)).code in refused or refused == _codes(errors[:1])
    else:
        assert refused == tuple(_codes(errors)), f"import refused a file verify accepts, or kept otherwise: {refused}"
    errors = [p for p in errors if p not in kept(errors)]  # (a header: an append brings none)

    found = parsed_lines(data)
    if found is None or not _header_reads(found[0]) or found[0].get("base") is not None:
        return  # append takes JSON objects, to a session of this format made without a prefix
    if Header(dict(found[0])).member_problems():
        return  # a store makes no such header to append to (create refuses it, tested above)
    header, entries = found

    # append: the first entry a refusing rule is broken at is refused with that rule; the
    # others are taken, with verify's findings and notes at that line.
    notes = notes_of(data)
    outcomes = append_outcomes(header, entries)
    by_line: dict[int, list[Any]] = {}
    for p in errors:
        if p.line is not None:
            by_line.setdefault(p.line, []).append(p)
    for i, (what, detail) in enumerate(outcomes):
        line = i + 2
        here = by_line.get(line, [])
        stop = refusing(here)
        if stop:
            assert what == "refused", f"append took line {line}, which verify rejects with {_codes(stop)}"
            assert detail in _codes(stop), f"line {line}: append names {detail}, verify {_codes(stop)}"
        else:
            assert what == "ok", f"append refused line {line} ({detail}), which verify finds no refusing rule broken at"
            remarks = [p for p in notes if p.line == line and p.code != "duplicate"]  # a repeat is a no-op
            assert detail == (_codes([p for p in here if RULES[p.code].store == "finding"]), _codes(remarks)), line


def _storable(data: bytes) -> bool:
    """A store could hold these very bytes: every line parses and hashes to its id, the
    header is of this format, the base is in the file, and RFC 0002 lets a store hold it."""
    found = whole_entries(data)
    if found is None or not _header_reads(found[0]) or store_policy(data) is not None:
        return False
    return split_prefix(found[0], [e["id"] for e in found[1]]) is not None


STORABLE = sorted(name for name, data in FILES.items() if _storable(data))


def test_the_storable_cases_break_every_tree_record_and_context_rule():
    seen = {p.code for name in STORABLE for p in verdict(FILES[name])}
    wanted = {c for c, r in RULES.items() if r.scope not in ("line", "media", "store") and r.severity == "error" and c != "empty"}
    assert wanted <= seen, sorted(wanted - seen)


@pytest.mark.parametrize("name", STORABLE)
def test_push_and_stored_verify_agree_with_verify(name):
    data = FILES[name]
    found = whole_entries(data)
    assert found is not None
    header, entries = found
    every = [p for p in verdict(data) if p.code != "duplicate"]
    errors = [p for p in every if p not in kept(every)]
    try:
        leaf = read_session_bytes(data).tree.resume_leaf()
    except SessionFormatError:
        leaf = entries[-1]["id"] if entries else None

    rule = push_outcome(header, entries, leaf)
    stop = refusing(errors)
    if stop:
        assert rule in _codes(stop), f"push names {rule}, verify {_codes(stop)}"
    else:
        assert rule is None, f"push refused with {rule} what verify finds no refusing rule broken in"

    # A session holding these entries, as stored verify and fsck --deep see it.
    with forced_store(header, entries, leaf) as st:
        check = verify_stored(st, header["id"])
        stored = sorted({p["code"] for p in check.problems if p["code"] != "head"})
        assert stored == _codes(errors)
        report = fsck(st, deep=True)
        for code in _codes(errors):
            assert any(p.code == code for p in report.errors), (code, [str(p) for p in report.errors])
        for code in _codes(kept(every)):  # kept as the session has it: a warning, never damage
            assert any(p.code == code for p in report.warnings) and not any(p.code == code for p in report.errors)


def test_the_walk_covers_every_refusing_rule():
    """Each rule the store refuses by is refused, with its code, by some case above."""
    seen: set[str] = set()
    for data in FILES.values():
        seen |= {p.code for p in refusing(verdict(data))}
    assert seen == {c for c, r in RULES.items() if r.store == "refuse"}


# ---------------------------------------------------------------------------
# the reference corpus


def test_every_corpus_file_verify_accepts_imports_and_a_store_of_them_is_clean(corpus, tmp_path):
    stores: list[Store] = []
    accepted = rejected = 0
    for path in sorted((corpus / "sessions").glob("*.jsonl")):
        data = path.read_bytes()
        errors = verdict(data)
        if errors:
            with memory_store() as st, pytest.raises(SessionFormatError) as err:
                st.import_file(path)
            assert {p.code for p in err.value.problems} <= {p.code for p in errors}, path.name
            assert err.value.problems[0].code == errors[0].code, path.name
            rejected += 1
            continue
        sid = json.loads(split_lines(data)[0])["id"]
        home = next((s for s in stores if sid not in s.list()), None)
        if home is None:  # two corpus files share a session id: each store holds one
            home = Store.init(tmp_path / f"store{len(stores)}")
            stores.append(home)
        home.import_file(path)
        accepted += 1
    assert accepted >= 10 and rejected >= 8
    for st in stores:
        report = fsck(st)
        assert report.ok, [str(p) for p in report.errors]
        deep = fsck(st, deep=True)
        assert deep.ok, [str(p) for p in deep.errors]
        st.close()


def test_an_append_says_the_note_verify_says():
    """Where an RFC lets a case be reported rather than refused (an ``of`` the path cannot
    resolve, an output naming no call), the append takes the entry and says verify's note."""
    header = Header.new("s-notes", created_at="2026-10-05T11:00:00Z")
    with memory_store() as st:
        s = st.create(header)
        s.append({"type": "config", "model": "m", "ts": "2026-10-05T11:00:01Z"})
        of = s.append({"type": "config", "ts": "2026-10-05T11:00:02Z",
                       "instructions_omitted": [{"keep": 1, "of": "sha256:" + "0" * 64}]})
        orphan = s.append({"type": "item", "ts": "2026-10-05T11:00:03Z",
                           "item": {"type": "function_call_output", "call_id": "nobody", "output": "x"}})
        data = st.export("s-notes")
    assert [n.code for n in of.notes] == ["of"] and [n.code for n in orphan.notes] == ["orphan-output"]
    said = {(n.code, n.message) for n in notes_of(data)}
    assert {(n.code, n.message) for n in of.notes + orphan.notes} <= said
    assert "notes" in of.as_dict() and of.as_dict()["notes"][0]["code"] == "of"
