"""The damage matrix: each kind of damage to a file store, met by every command an operator runs.

One small store is built per module (a recorded session of loose objects, one of
packed objects, one whose log is compacted to a snapshot); each damage kind is made
once, on its own copy (module-scoped), and every command runs against it through
the click runner, in process, under ``--json`` where it has it. Each must say what
is wrong with a machine code and name the damaged file relative to the store (never
the store's absolute path, which only the advice's command to run names, as its
``--store``), exit non-zero where what it reads is damaged, and leave
the store's bytes as they were; then ``repair`` of the session, where the damage is
repairable, leaves ``fsck`` clean and every entry the session held still held.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, make_entry
from agentsession_cas.backends.files import sessions as file_sessions
from agentsession_cas.errors import AgentSessionError
from agentsession_cas.store import Store
from agentsession_cli.main import main
from storetools import files

# -- the store ------------------------------------------------------------------------------


def _item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _session(st: Store, sid: str, n: int, *, durable: bool = True) -> list[str]:
    s = st.create(Header.new(sid))
    ids = [s.append(make_entry("item", s.head, item=_item(f"{sid} entry {i}"),
                               ts=f"2026-10-05T12:00:{i:02d}Z").data, durable=durable).id for i in range(n)]
    s.close()
    return ids


def build(root: Path) -> dict[str, list[str]]:
    """pk: entries in a pack (packed before the others exist); cmp: a log compacted to a
    snapshot at close; rec: durable appends, loose objects."""
    held: dict[str, list[str]] = {}
    with Store.init(root) as st:
        held["pk"] = _session(st, "pk", 5, durable=False)
        st.pack()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(file_sessions, "COMPACT_AT_CLOSE", 1)  # (forced: a close then always compacts)
            held["cmp"] = _session(st, "cmp", 4)
        held["rec"] = _session(st, "rec", 4)
    return held


# -- the damage -----------------------------------------------------------------------------


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _middle_of_line(path: Path, n: int) -> int:
    """The offset of the middle of line ``n`` (1-based) of a log."""
    lines = _lines(path)
    return sum(len(x) for x in lines[: n - 1]) + len(lines[n - 1]) // 2


def _loose(root: Path, space: str, name: str) -> Path:
    return root / "objects" / space / name[7:9] / name[9:]


def _pack(root: Path, suffix: str) -> Path:
    [path] = (root / "objects" / "pack").glob(f"pack-*{suffix}")
    return path


def _content_of(root: Path, entry: str) -> str:
    return json.loads(_loose(root, "entries", entry).read_bytes())["content"]


S = "sessions"
#: Each kind of damage: the session it hurts, the file it damages (relative to the store;
#: a glob for a pack), and how.
DAMAGE: dict[str, tuple[str, str, Callable[[Path, dict[str, list[str]]], None]]] = {
    "header missing": ("rec", f"{S}/rec/header", lambda r, h: (r / S / "rec/header").unlink()),
    "header garbled": ("rec", f"{S}/rec/header", lambda r, h: (r / S / "rec/header").write_bytes(b"{not json\n")),
    "HEAD missing": ("rec", f"{S}/rec/HEAD", lambda r, h: (r / S / "rec/HEAD").unlink()),
    "HEAD garbled": ("rec", f"{S}/rec/HEAD", lambda r, h: (r / S / "rec/HEAD").write_bytes(b"sha256:not a hash\n")),
    "HEAD stale": ("rec", f"{S}/rec/HEAD", lambda r, h: (r / S / "rec/HEAD").write_text(h["rec"][1] + "\n")),
    "log missing": ("rec", f"{S}/rec/log", lambda r, h: (r / S / "rec/log").unlink()),
    "log truncated mid-record": ("rec", f"{S}/rec/log", lambda r, h: (r / S / "rec/log").write_bytes(
        (r / S / "rec/log").read_bytes()[: _middle_of_line(r / S / "rec/log", 6)])),
    "log garbled": ("rec", f"{S}/rec/log", lambda r, h: _flip(r / S / "rec/log", _middle_of_line(r / S / "rec/log", 4))),
    "log cut at a record boundary": ("rec", f"{S}/rec/log", lambda r, h: (r / S / "rec/log").write_bytes(
        b"".join(_lines(r / S / "rec/log")[:5]))),
    "loose object missing": ("rec", "objects/entries/", lambda r, h: _loose(r, "entries", h["rec"][2]).unlink()),
    "loose object corrupt": ("rec", "objects/contents/", lambda r, h: _flip(
        _loose(r, "contents", _content_of(r, h["rec"][1])), 20)),
    "pack data corrupt": ("pk", "objects/pack/", lambda r, h: _flip(_pack(r, ".pack"), 100)),
    "pack index corrupt": ("pk", "objects/pack/", lambda r, h: _flip(_pack(r, ".idx"), 1100)),
    "summary corrupt": ("rec", f"{S}/rec/summary", lambda r, h: _flip(r / S / "rec/summary", 100)),
    "snapshot corrupt": ("cmp", f"{S}/cmp/log", lambda r, h: _flip(r / S / "cmp/log", _middle_of_line(r / S / "cmp/log", 2))),
}


def run(root: Path, *args: str) -> Any:
    return CliRunner().invoke(main, ["--store", str(root), *args], catch_exceptions=False)


#: The commands, each given the damaged session.
COMMANDS: dict[str, Callable[[str], list[str]]] = {
    "verify": lambda sid: ["verify", sid, "--json"],
    "fsck": lambda sid: ["fsck", "--json"],
    "list": lambda sid: ["list", "--json"],
    "show": lambda sid: ["show", sid, "--json"],
    "export": lambda sid: ["export", sid, "--json"],
    "log": lambda sid: ["log", sid, "--json"],
    "sweep": lambda sid: ["sweep", "--dry-run", "--grace", "0", "--json"],
}

#: Where a command may name each damage (relative to the store): the damaged file, or
#: the one that shows it (the log line that needs a lost object, the HEAD that names
#: what a cut log lost).
NAMED: dict[str, tuple[str, ...]] = {
    "log truncated mid-record": (f"{S}/rec/log", f"{S}/rec/HEAD"),
    "log cut at a record boundary": (f"{S}/rec/log", f"{S}/rec/HEAD"),
    "loose object missing": ("objects/entries/", f"{S}/rec/log"),
    "loose object corrupt": ("objects/contents/", f"{S}/rec/log"),
}

_LOG = {"log missing", "log truncated mid-record", "log garbled", "log cut at a record boundary", "snapshot corrupt"}
_OBJECTS = {"loose object missing", "loose object corrupt", "pack data corrupt", "pack index corrupt"}
_ALL = set(COMMANDS)
#: The commands that must fail (exit non-zero with a code naming the damage), by damage;
#: every other command must succeed. The index files (HEAD, a header file the log holds,
#: summary) are not the session's record: only fsck holds them to the log (a writer may
#: be behind with HEAD: fsck alone looks for one), the reads go by the log.
FAILS: dict[str, set[str]] = {
    "header missing": {"verify", "fsck", "list", "show", "export", "log"},
    "header garbled": set(),
    "HEAD missing": {"fsck"},
    "HEAD garbled": {"fsck"},
    "HEAD stale": {"fsck"},
    **{kind: _ALL for kind in _LOG},
    "loose object missing": {"verify", "fsck", "show", "export"},
    **{kind: {"verify", "fsck", "show", "export", "sweep"} for kind in _OBJECTS - {"loose object missing"}},
    "summary corrupt": set(),
}
#: A remark a command that succeeds must still make, by damage: (command, code).
REMARKS: dict[str, set[tuple[str, str]]] = {
    "header garbled": {("verify", "stale-header"), ("fsck", "stale-header")},
}
#: What repair does not make good alone, and the command that does.
AFTER_REPAIR: dict[str, list[str]] = {"pack data corrupt": ["pack"], "pack index corrupt": ["pack"]}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, dict[str, list[str]]]:
    root = tmp_path_factory.mktemp("matrix") / "store"
    return root, build(root)


@pytest.fixture(scope="module")
def damaged(pristine, tmp_path_factory) -> Callable[[str], Path]:
    """The store damaged one way, made once for the module (the commands it serves read only)."""
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            root = tmp_path_factory.mktemp(kind.replace(" ", "-")) / "store"
            shutil.copytree(pristine[0], root, symlinks=True)
            DAMAGE[kind][2](root, pristine[1])
            made[kind] = root
        return made[kind]

    return get


def _reports(r: Any, command: str) -> list[dict[str, Any]]:
    """The JSON a command printed that says what is wrong: its error (stderr), and its
    problems, warnings and notes, or a listing's rows that carry an error (stdout)."""
    out: list[dict[str, Any]] = []
    for line in r.stderr.splitlines():
        if line.startswith('{"error"'):
            error = json.loads(line)["error"]
            out.append(error)
            out.extend(error.get("problems") or [])
    if command == "export" or not r.stdout.strip():
        return out
    doc = json.loads(r.stdout)
    if isinstance(doc, list):
        return out + [row for row in doc if isinstance(row, dict) and "code" in row]
    for key in ("problems", "warnings", "notes"):
        out.extend(doc.get(key) or [])
    return out


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_command_names_the_damage_by_code_and_path_and_changes_nothing(damaged, kind, command):
    root = damaged(kind)
    sid, _, _ = DAMAGE[kind]
    before = files(root)
    r = run(root, *COMMANDS[command](sid))
    assert files(root) == before, f"{command} changed the store"
    reports = _reports(r, command)
    for rep in reports:
        assert rep["code"] and rep["code"] != "error", rep
        # the store is named once, as the `--store` of the command a damaged session's
        # advice gives to run (`agentsession --store STORE repair ID`); a file never by it
        said = json.dumps(rep).replace(f"--store {shlex.quote(str(root))} ", "")
        assert str(root) not in said, f"the store's absolute path in {rep}"
    if command not in FAILS[kind]:
        assert r.exit_code == 0, (r.stdout, r.stderr)
        for cmd, code in REMARKS.get(kind, ()):
            if cmd == command:
                assert any(rep["code"] == code and DAMAGE[kind][1] in json.dumps(rep) for rep in reports), reports
        return
    assert r.exit_code == 1, (r.stdout, r.stderr)
    assert reports, f"{command} failed without a coded error or problem: {r.stdout} {r.stderr}"
    named = NAMED.get(kind, (DAMAGE[kind][1],))
    assert any(path in json.dumps(rep) for rep in reports for path in named), (named, reports)


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_repair_leaves_fsck_clean_and_every_entry_held(pristine, damaged, kind, tmp_path):
    """`repair` of the damaged session (then `pack`, for a pack's damage, which repair of
    a session does not rewrite) leaves a store fsck finds clean, the session holding
    every entry it held, none acknowledged lost."""
    sid, _, _ = DAMAGE[kind]
    root = tmp_path / "store"
    shutil.copytree(damaged(kind), root, symlinks=True)
    r = run(root, "repair", "--json", "--yes", sid)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    out = json.loads(r.stdout)
    assert out["dropped"] == [] and out["unrestorable"] == [], out
    for command in AFTER_REPAIR.get(kind, []):
        assert run(root, command, "--json").exit_code == 0
    r = run(root, "fsck", "--json")
    report = json.loads(r.stdout)
    assert r.exit_code == 0 and report["problems"] == [] and report["warnings"] == [], report
    with Store(root, readonly=True) as st:
        for s, ids in pristine[1].items():
            assert st.read(s).log_order == ids, s


def _error_codes(cls: type = AgentSessionError) -> set[str]:
    return {cls.code} | {code for sub in cls.__subclasses__() for code in _error_codes(sub)}  # type: ignore[attr-defined]


def test_every_code_the_matrix_meets_is_documented(damaged):
    """A code a script may match is an error's (errors.py) or one the docs list (fsck.md,
    cli.md, repair.md): one code per fault, and each written down."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    text = "".join((docs / name).read_text() for name in ("fsck.md", "cli.md", "repair.md"))
    errors = _error_codes()
    seen: set[str] = set()
    for kind, (sid, _, _) in DAMAGE.items():
        for command in COMMANDS:
            seen.update(rep["code"] for rep in _reports(run(damaged(kind), *COMMANDS[command](sid)), command))
    assert seen, "no code met"
    assert not [code for code in seen - errors if f"`{code}`" not in text], seen
