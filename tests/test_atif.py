"""The ATIF projection (RFC 0001 "Projections"): documents checked against the `atif`
package's models and against expectations written by hand in fixtures/atif/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import atif
import pytest
from click.testing import CliRunner

from agentsession_cas import Header, SessionBuilder, read_session
from agentsession_cas.errors import ContextError, NoSuchEntryError
from agentsession_cas.format.atif import document_name, trajectories, trajectory_at
from agentsession_cas.format.reader import SessionFile
from agentsession_cas.store import Store
from agentsession_cli.main import main

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = REPO / "fixtures"
EXPECTATIONS = sorted((FIXTURES / "atif").glob("*.json"))
CHILD_ID = "7ebb4d3f-299d-56dc-8d38-e304b7919ab6"


def run(*args: str, input: bytes | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def _source(name: str) -> Path:
    if name.startswith("corpus/"):
        path = SHARED / name
        if not path.exists():
            pytest.skip(f"reference corpus not found at {path}")
        return path
    return REPO / name


def _line_ids(path: Path) -> dict[str, str]:
    """'@N' -> the id of the entry on line N of a session file."""
    sf = read_session(path)
    return {f"@{i + 2}": e.id for i, e in enumerate(sf.entries)}


def _resolve(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str) and value in names:
        return names[value]
    if isinstance(value, dict):
        return {k: _resolve(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, names) for v in value]
    return value


def _match(expected: Any, actual: Any, where: str = "$") -> None:
    """Every member ``expected`` names is in ``actual`` with a matching value; lists match
    element by element and in length; anything else is equal."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
        for k, v in expected.items():
            assert k in actual, f"{where}: no member {k!r} (has {sorted(actual)})"
            _match(v, actual[k], f"{where}.{k}")
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{where}: expected a list, got {actual!r}"
        assert len(actual) == len(expected), f"{where}: {len(actual)} elements, expected {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            _match(e, a, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def _absent(doc: Any, dotted: str) -> bool:
    node = doc
    for part in dotted.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return True
    return False


def _children(spec: dict[str, str]):
    files = {sid: read_session(_source(p)) for sid, p in spec.items()}

    def resolve(child: str, leaf: str | None) -> tuple[SessionFile, str] | None:
        sf = files.get(child)
        if sf is None:
            return None
        at = leaf if leaf is not None else sf.leaf
        return (sf, at) if at is not None and at in sf.tree else None

    return resolve


@pytest.mark.parametrize("path", EXPECTATIONS, ids=[p.stem for p in EXPECTATIONS])
def test_documents_match_the_hand_written_expectations(path):
    spec = json.loads(path.read_text())
    source = _source(spec["session"])
    sf = read_session(source)
    names = _line_ids(source)
    for child in spec.get("children", {}).values():
        names.update({f"child{k}": v for k, v in _line_ids(_source(child)).items()})
    at = names[spec["at"]] if spec.get("at") else sf.leaf
    resolver = _children(spec["children"]) if "children" in spec else None
    doc = trajectory_at(sf, at, resolve_child=resolver)
    atif.Trajectory.model_validate(doc)
    _match(_resolve(spec["expect"], names), doc)
    for dotted in spec.get("absent", []):
        assert _absent(doc, dotted), f"{path.name}: {dotted} should be absent"
    for word in spec.get("notes_mention", []):
        assert word in doc.get("notes", ""), doc.get("notes")


def _all_sessions() -> list[Path]:
    out = sorted(FIXTURES.glob("*.jsonl")) + sorted((FIXTURES / "projections").glob("*.jsonl"))
    corpus = SHARED / "corpus" / "sessions"
    if corpus.is_dir():
        out += [p for p in sorted(corpus.glob("*.jsonl")) if p.stem not in ("unsupported-format", "bad-first-kept")]
    return out


@pytest.mark.parametrize("path", _all_sessions(), ids=lambda p: p.stem)
def test_every_path_of_every_session_is_a_valid_atif_document(path):
    sf = read_session(path)
    docs = list(trajectories(sf))
    assert docs or not sf.entries
    names = [n for n, _ in docs]
    assert len(set(names)) == len(names)
    for _, doc in docs:
        model = atif.Trajectory.model_validate(doc)
        assert model.session_id == sf.header.id
        assert doc["trajectory_id"] in sf.tree
        # A document's steps are numbered from 1 and its total counts at least them.
        assert doc["final_metrics"]["total_steps"] >= len(doc["steps"])
        # Round trip through the models keeps every member this projection wrote.
        assert model.to_json_dict() == json.loads(json.dumps(doc))
    if docs and sf.leaf is not None and sf.leaf in {d["trajectory_id"] for _, d in docs}:
        assert names[0] == f"{sf.header.id}.json"


def test_one_document_per_leaf_current_first(tmp_path):
    sf = read_session(FIXTURES / "projections" / "delegate.jsonl")
    docs = list(trajectories(sf))
    assert [d["trajectory_id"] for _, d in docs] == [sf.leaf, sf.entries[-2].id]
    assert docs[0][0] == f"{sf.header.id}.json"
    assert docs[1][0] == document_name(sf.header.id, sf.entries[-2].id, sf.leaf)
    assert docs[1][0] != docs[0][0] and docs[1][0].startswith(sf.header.id + "_")


def test_a_document_at_an_inner_entry_is_the_path_to_it():
    # The document a score names must be reproducible from the entry it targets.
    sf = read_session(FIXTURES / "projections" / "delegate.jsonl")
    answer = next(e for e in sf.entries if e.type == "response" and e.get("response_id") == "resp_2")
    doc = trajectory_at(sf, answer.id)
    atif.Trajectory.model_validate(doc)
    assert doc["trajectory_id"] == answer.id
    assert [s["source"] for s in doc["steps"]] == ["user", "agent", "agent"]
    # The run's end is after the entry: the run travels without it.
    assert "reason" not in doc["steps"][0]["extra"]["run"][0]
    assert "records" not in doc["extra"]
    with pytest.raises(NoSuchEntryError):
        trajectory_at(sf, "sha256:" + "0" * 64)


def test_a_subsession_without_its_child_is_a_file_reference():
    sf = read_session(FIXTURES / "projections" / "delegate.jsonl")
    doc = trajectory_at(sf, sf.leaf)
    ref = doc["steps"][1]["observation"]["results"][0]["subagent_trajectory_ref"][0]
    child_leaf = read_session(FIXTURES / "projections" / "delegate-child.jsonl").leaf
    assert ref["session_id"] == CHILD_ID
    assert ref["trajectory_path"] == document_name(CHILD_ID, child_leaf, None)
    assert ref["extra"]["leaf"] == child_leaf and ref["extra"]["leaf_chosen"] is False
    assert "subagent_trajectories" not in doc
    atif.Trajectory.model_validate(doc)


def _session(*entries: tuple[str, dict]) -> SessionFile:
    b = SessionBuilder(Header.new("atif-edge", created_at="2026-09-17T12:00:00Z", harness={"name": "h", "version": "0"}))
    for i, (kind, body) in enumerate(entries):
        b.append(kind, ts=f"2026-09-17T12:00:{i:02d}Z", **body)
    from agentsession_cas import read_session_bytes

    return read_session_bytes(b.to_bytes(), source="edge")


def _user(text: str) -> dict:
    return {"item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def test_a_run_that_produces_no_step_travels_at_the_top_level_in_order():
    # A refusal on resume: the run holds no step, and the next run's record must not
    # replace it.
    sf = _session(
        ("config", {"model": "m"}),
        ("run", {"run_id": "r1", "phase": "start", "source": "input", "ref": "first"}),
        ("run", {"run_id": "r1", "phase": "end", "reason": "aborted", "pending": [], "ref": "refused"}),
        ("run", {"run_id": "r2", "phase": "start", "source": "input", "ref": "second"}),
        ("run", {"run_id": "r2", "phase": "end", "reason": "aborted", "pending": []}),
        ("run", {"run_id": "r3", "phase": "start", "source": "input"}),
        ("item", _user("hello")),
    )
    doc = trajectory_at(sf, sf.leaf)
    atif.Trajectory.model_validate(doc)
    top = doc["extra"]["run"]
    assert [(r["run_id"], r["trigger"], r["reason"], r.get("cause")) for r in top] == [
        ("r1", "first", "aborted", "refused"), ("r2", "second", "aborted", None)]
    assert [r["run_id"] for r in doc["steps"][0]["extra"]["run"]] == ["r3"]


def test_arguments_that_are_not_an_object_and_an_output_without_its_call():
    sf = _session(
        ("config", {"model": "m"}),
        ("item", _user("go")),
        ("item", {"response": "r1", "item": {"type": "function_call", "call_id": "c1", "name": "t", "arguments": "[1, 2]"}}),
        ("response", {"response_id": "r1", "model": "m", "attempts": 3}),
        ("item", {"item": {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "done"}]}}),
        ("item", {"item": {"type": "function_call_output", "call_id": "elsewhere", "output": "orphan"}}),
    )
    doc = trajectory_at(sf, sf.leaf)
    atif.Trajectory.model_validate(doc)
    agent = doc["steps"][1]
    assert agent["tool_calls"] == [{"tool_call_id": "c1", "function_name": "t", "arguments": {}, "extra": {"arguments": "[1, 2]"}}]
    assert agent["llm_call_count"] == 3 and "metrics" not in agent
    assert agent["observation"]["results"][0]["content"] == "done"
    orphan = doc["steps"][2]
    assert orphan["source"] == "system"
    assert orphan["observation"]["results"][0]["extra"]["call_id"] == "elsewhere"
    assert "source_call_id" not in orphan["observation"]["results"][0]


def test_a_path_whose_compaction_cannot_apply_is_refused():
    path = SHARED / "corpus" / "sessions" / "bad-first-kept.jsonl"
    if not path.exists():
        pytest.skip("reference corpus not found")
    sf = read_session(path)
    with pytest.raises(ContextError):
        list(trajectories(sf))


def test_the_projection_fixtures_regenerate_byte_for_byte(tmp_path):
    subprocess.run([sys.executable, str(FIXTURES / "projections" / "generate.py"), str(tmp_path)], check=True)
    for name in ("delegate.jsonl", "delegate-child.jsonl"):
        assert (tmp_path / name).read_bytes() == (FIXTURES / "projections" / name).read_bytes()


# -- the command ----------------------------------------------------------------


def test_export_atif_of_a_file_prints_a_document_per_line_and_embeds_a_child_beside_it(tmp_path):
    src = FIXTURES / "projections"
    (tmp_path / "parent.jsonl").write_bytes((src / "delegate.jsonl").read_bytes())
    r = run("export", "--format", "atif", str(tmp_path / "parent.jsonl"))
    assert r.exit_code == 0, r.output
    docs = [json.loads(line) for line in r.output.splitlines()]
    assert len(docs) == 2
    for d in docs:
        atif.Trajectory.model_validate(d)
    assert "subagent_trajectories" not in docs[0]
    # The child's file beside the exported one is embedded.
    (tmp_path / f"{CHILD_ID}.jsonl").write_bytes((src / "delegate-child.jsonl").read_bytes())
    r = run("export", "--format", "atif", str(tmp_path / "parent.jsonl"))
    docs = [json.loads(line) for line in r.output.splitlines()]
    assert [s["session_id"] for s in docs[0]["subagent_trajectories"]] == [CHILD_ID]


def test_export_atif_writes_a_directory_and_at_builds_one_document(tmp_path):
    src = FIXTURES / "projections" / "delegate.jsonl"
    sf = read_session(src)
    out = tmp_path / "out"
    r = run("export", "--format", "atif", "-o", str(out), str(src))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == sorted(n for n, _ in trajectories(sf))
    first = json.loads((out / f"{sf.header.id}.json").read_text())
    assert first["trajectory_id"] == sf.leaf
    inner = sf.entries[3].id
    r = run("export", "--format", "atif", "--at", inner[7:19], str(src))
    assert r.exit_code == 0, r.output
    (doc,) = [json.loads(line) for line in r.output.splitlines()]
    assert doc["trajectory_id"] == inner
    r = run("export", "--at", inner, str(src))
    assert r.exit_code != 0 and "--format atif or otel" in r.output


def test_export_atif_of_a_stored_session_embeds_its_stored_child(tmp_path):
    root = tmp_path / "store"
    assert run("init", "--store", str(root)).exit_code == 0
    for name in ("delegate-child.jsonl", "delegate.jsonl"):
        r = run("import", "--store", str(root), str(FIXTURES / "projections" / name))
        assert r.exit_code == 0, r.output
    parent_id = read_session(FIXTURES / "projections" / "delegate.jsonl").header.id
    r = run("export", "--store", str(root), "--format", "atif", parent_id)
    assert r.exit_code == 0, r.output
    docs = [json.loads(line) for line in r.output.splitlines()]
    assert len(docs) == 2
    atif.Trajectory.model_validate(docs[0])
    (child_doc,) = docs[0]["subagent_trajectories"]
    ref = docs[0]["steps"][1]["observation"]["results"][0]["subagent_trajectory_ref"][0]
    assert ref["trajectory_id"] == child_doc["trajectory_id"]
    with Store(str(root), readonly=True) as store:
        assert store.read(parent_id).head == docs[0]["trajectory_id"]


def test_export_atif_errors_name_what_and_where(tmp_path):
    src = FIXTURES / "projections" / "delegate.jsonl"
    r = run("export", "--format", "atif", "--at", "deadbeef", str(src))
    assert r.exit_code == 1 and "no such entry: deadbeef" in r.output
    target = tmp_path / "a-file"
    target.write_bytes(b"kept")
    r = run("export", "--format", "atif", "-o", str(target), str(src))
    assert r.exit_code == 1 and "is not a directory" in r.output and target.read_bytes() == b"kept"
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(Header.new("empty", created_at="2026-09-17T12:00:00Z").canonical_line())
    r = run("export", "--format", "atif", str(empty))
    assert r.exit_code == 1 and "has no entries" in r.output


@pytest.mark.parametrize("fmt", ["atif", "otel"])
@pytest.mark.parametrize("damage", ["truncated", "middle"])
def test_export_of_a_damaged_file_is_refused_not_projected_in_part(tmp_path, fmt, damage):
    """A file with a line that does not read (a last line cut short, a garbled one in the
    middle) is refused, naming the line, as `import` refuses it: the projection is
    lossless (RFC 0001 "Projections"), and one made of the lines that did read, exit 0
    and not a word, lost the rest silently. Nothing is written."""
    lines = (FIXTURES / "branches.jsonl").read_bytes().splitlines(keepends=True)
    if damage == "truncated":
        lines[-1] = lines[-1][:40]
        where = f"line {len(lines)}: the last line was cut short"
    else:
        lines[5] = b'{"type":"item",' + lines[5][40:]
        where = "line 6: "
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(b"".join(lines))
    out = tmp_path / "out"
    for args in ([], ["-o", str(out)]):
        r = run("export", "--format", fmt, *args, str(path))
        assert r.exit_code == 1, r.output
        assert r.stdout == "" and not out.exists()
        (line,) = r.stderr.splitlines()
        assert line.startswith(f"agentsession: error: {path}: {where}"), line
