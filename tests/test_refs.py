"""Named refs (agentsession_cas.store.refs, `agentsession ref`): the rules on names, conflicts,
compare-and-swap, the files written, two real processes racing, and the CLI."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentsession_cas import canonical_bytes
from agentsession_cas.backends.files import refs as refs_module
from agentsession_cas.backends.files.locks import FileLock
from agentsession_cas.backends.files.refs import ref_file_name
from agentsession_cas.errors import (
    BadNameError,
    BadRefNameError,
    DanglingRefError,
    NoSuchRefError,
    NoSuchSessionError,
    ReadOnlyError,
    RefConflictError,
    RefMovedError,
    StoreError,
)
from agentsession_cas.format.entry import Header
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.store import Store
from agentsession_cas.store.refs import (
    MAX_REF_NAME,
    Ref,
    Refs,
    check_ref_conflict,
    check_ref_name,
    check_ref_prefix,
    header_ident,
)
from agentsession_cli.main import main

REPO = Path(__file__).resolve().parents[1]


# -- helpers ----------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    st = Store.init(path)
    for sid in ("s1", "s2", "s3"):
        st.create(Header.new(sid))
    st.close()
    return path


@pytest.fixture
def refs(root: Path):
    st = Store(root)
    yield Refs(st)
    st.close()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under the store with its bytes (files) or None (directories), less
    ``refs.lock``: the first write makes that empty lock file, and it is never removed."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (None,)
        for name in filenames:
            p = os.path.join(dirpath, name)
            out[os.path.relpath(p, root)] = (Path(p).read_bytes(), os.stat(p).st_mtime_ns)
    out.pop("refs.lock", None)
    return out


def ref_files(root: Path) -> list[str]:
    d = root / "refs"
    return sorted(os.listdir(d)) if d.is_dir() else []


# -- names: the rules on the name alone -------------------------------------------

VALID = [
    "a",
    "chat/slack/C123",
    "a.b",
    ".hidden",
    "a/.b",
    "a_b-c",
    "-",
    "x" * MAX_REF_NAME,
    "/".join(["ab"] * 67),  # 200 bytes in 67 segments
    "con1",
    "console",
    "conx.txt",
    "com10",
    "com0",
    "lpt0",
    "COM",
    "LPT",
    "nul_x",
    "a/b.c/d",
    "a..b",
    "...a",
]

INVALID = [
    ("", "not empty"),
    ("/a", "segment 1 is empty"),
    ("a/", "segment 2 is empty"),
    ("a//b", "segment 2 is empty"),
    (".", "segment 1 is '.'"),
    ("..", "segment 1 is '..'"),
    ("a/./b", "segment 2 is '.'"),
    ("a/../b", "segment 2 is '..'"),
    ("a.", "ends in a dot"),
    ("a/b..", "ends in a dot"),
    ("a b", "holds ' '"),
    ("a:b", "holds ':'"),
    ("a\\b", "holds '\\\\'"),
    ("a%b", "holds '%'"),
    ("a~", "holds '~'"),
    ("a\nb", "holds '\\n'"),
    ("é", "only A-Z a-z 0-9"),
    ("con", "Windows device"),
    ("CON", "Windows device"),
    ("Con.txt", "Windows device"),
    ("a/nul", "segment 2 'nul' names a Windows device"),
    ("aux.tar.gz", "Windows device"),
    ("prn", "Windows device"),
    ("com1", "Windows device"),
    ("COM9.log", "Windows device"),
    ("lpt5", "Windows device"),
    ("Lpt1/x", "Windows device"),
    ("x" * (MAX_REF_NAME + 1), "201 bytes long"),
    ("/".join(["ab"] * 67) + "c", "201 bytes long"),
]


@pytest.mark.parametrize("name", VALID)
def test_valid_names(name):
    assert check_ref_name(name) == name
    assert "/" not in ref_file_name(name) and ref_file_name(name).replace("%", "/") == name


@pytest.mark.parametrize("name,why", INVALID)
def test_invalid_names_say_why(name, why):
    with pytest.raises(BadRefNameError) as info:
        check_ref_name(name)
    assert why in str(info.value)
    assert str(info.value).startswith("invalid ref name")
    assert isinstance(info.value, BadNameError)  # one hierarchy: a bad name is a bad name


@pytest.mark.parametrize("value", [None, 7, b"abc", ["a"]])
def test_non_strings_are_not_names(value):
    with pytest.raises(BadRefNameError):
        check_ref_name(value)


_DEVICES = {"con", "prn", "aux", "nul"} | {f"com{d}" for d in "123456789"} | {f"lpt{d}" for d in "123456789"}
_ALLOWED = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def oracle_valid(name: str) -> bool:
    """The rules, written out again independently of the implementation."""
    if name == "" or len(name.encode("utf-8")) > 200:
        return False
    for seg in name.split("/"):
        if seg in ("", ".", "..") or seg[-1] == ".":
            return False
        if not set(seg) <= _ALLOWED:
            return False
        if seg.partition(".")[0].lower() in _DEVICES:
            return False
    return True


_pieces = st.one_of(
    st.sampled_from(["", ".", "..", "a.", ".a", "con", "CoN", "nul.x", "com1", "COM0", "lpt9", "lpt10", "aux.", "x"]),
    st.text(alphabet="abcCON019._-%: é\\", min_size=0, max_size=8),
)
_names = st.lists(_pieces, min_size=1, max_size=5).map("/".join)


@settings(max_examples=600, deadline=None)
@given(_names)
@example("a" * 199 + "/")
@example("a" * 200)
@example("a" * 201)
def test_name_rules_match_an_independent_reading(name):
    if oracle_valid(name):
        assert check_ref_name(name) == name
    else:
        with pytest.raises(BadRefNameError):
            check_ref_name(name)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_any_text_is_a_name_or_a_bad_name_error(text):
    try:
        assert check_ref_name(text) == text
    except BadRefNameError:
        assert not oracle_valid(text)
    else:
        assert oracle_valid(text)


@pytest.mark.parametrize("prefix", ["", "chat/", "c", "a/b-", "a/b/", "."])
def test_valid_prefixes(prefix):
    assert check_ref_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["a b", "a%", "é", "a:"])
def test_invalid_prefixes(prefix):
    with pytest.raises(BadRefNameError, match="invalid ref prefix"):
        check_ref_prefix(prefix)


# -- names: conflicts with the refs held -------------------------------------------


@pytest.mark.parametrize(
    "name,existing,clash",
    [
        ("a/b", ["a"], "'a/b' would be a ref under the ref 'a'"),
        ("a", ["a/b"], "'a/b' would be a ref under the ref 'a'"),
        ("a/b/c", ["x", "a/b"], "'a/b/c' would be a ref under the ref 'a/b'"),
        ("a", ["a/b/c"], "under the ref 'a'"),
        ("A/x", ["a/y"], "'A' differs only in case from 'a'"),
        ("Chat", ["chat"], "'Chat' differs only in case from 'chat'"),
        ("a/B/c", ["a/b/d"], "'a/B' differs only in case from 'a/b'"),
        ("A/b", ["a"], "differs only in case"),
        ("a", ["A/b"], "differs only in case"),
    ],
)
def test_conflicts(name, existing, clash):
    with pytest.raises(RefConflictError) as info:
        check_ref_conflict(name, existing)
    assert clash in str(info.value)
    assert info.value.existing in existing and info.value.name == name
    assert isinstance(info.value, BadRefNameError)


@pytest.mark.parametrize(
    "name,existing",
    [
        ("a", []),
        ("a", ["a"]),  # the same ref, spelled the same: creates nothing new
        ("a/b", ["a/c", "ab", "a-b/c"]),
        ("ab/x", ["a/y"]),  # 'a' is not a segment of 'ab'
        ("a/x", ["ab/y"]),
        ("chat/one", ["chat/two", "Chatter"]),
        ("a.b", ["a"]),
    ],
)
def test_no_conflicts(name, existing):
    check_ref_conflict(name, existing)


def fs_model_conflict(name: str, existing: list[str]) -> bool:
    """Would creating ``name`` as a nested path clash on a case-insensitive,
    case-preserving file system holding ``existing`` (files at nested paths)?"""
    tree: dict = {}
    for e in existing:
        node = tree
        segs = e.split("/")
        for i, seg in enumerate(segs):
            spelled, child = node.setdefault(seg.lower(), (seg, None if i == len(segs) - 1 else {}))
            node = child if child is not None else {}
    node = tree
    segs = name.split("/")
    for i, seg in enumerate(segs):
        if seg.lower() not in node:
            return False
        spelled, child = node[seg.lower()]
        if spelled != seg:
            return True
        last = i == len(segs) - 1
        if child is None:
            return not last  # a file where a directory is needed; the same file is the same ref
        if last:
            return True  # a directory (refs under it) where the file would go
        node = child
    return False


_small_names = st.lists(st.sampled_from(["a", "A", "b", "B", "ab", "aB"]), min_size=1, max_size=3).map("/".join)


@settings(max_examples=500, deadline=None)
@given(st.lists(_small_names, max_size=6), _small_names)
def test_conflicts_match_a_case_insensitive_file_system(candidates, name):
    existing: list[str] = []
    for c in candidates:  # a store only ever holds names that do not clash with each other
        if c not in existing and not fs_model_conflict(c, existing):
            existing.append(c)
    if fs_model_conflict(name, existing):
        with pytest.raises(RefConflictError):
            check_ref_conflict(name, existing)
    else:
        check_ref_conflict(name, existing)


def test_conflict_check_refuses_a_bad_name_first():
    with pytest.raises(BadRefNameError, match="Windows device"):
        check_ref_conflict("con", [])


# -- the store: compare-and-swap ----------------------------------------------------


def test_create_read_and_the_file_written(root, refs):
    result = refs.update("chat/one", "s1", expected=None)
    assert (result.name, result.old, result.new, result.changed, result.created) == ("chat/one", None, "s1", True, True)
    ref = refs.get("chat/one")
    header = json.loads((root / "sessions" / "s1" / "header").read_bytes())
    ident = sha256_ref(canonical_bytes({k: v for k, v in header.items() if k != "format"}))
    assert ref == Ref("chat/one", "s1", ident)
    assert ident == header_ident(header) == refs.session_ident("s1")
    line = b'{"ident":"' + ident.encode() + b'","name":"chat/one","session":"s1"}\n'
    assert (root / "refs" / "chat%one").read_bytes() == line + b"sha256:" + hashlib.sha256(line).hexdigest().encode() + b"\n"
    assert ref_files(root) == ["chat%one"]
    assert os.listdir(root / "tmp") == []  # the temp file was renamed, not left
    assert refs.state(ref) == "ok" and refs.resolve("chat/one") == "s1"
    assert "chat/one" in refs and "chat/two" not in refs and "bad name" not in refs
    assert (root / "refs.lock").exists()


def test_ident_ignores_format_only():
    h = {"type": "session", "id": "s", "format": "agentsession/0.13", "created_at": "2026-01-01T00:00:00Z"}
    assert header_ident(h) == header_ident({**h, "format": "agentsession/0.14"})
    assert header_ident(h) != header_ident({**h, "created_at": "2026-01-01T00:00:01Z"})


def test_cas_moves_from_the_expected_session(root, refs):
    refs.update("r", "s1", expected=None)
    result = refs.update("r", "s2", expected="s1")
    assert (result.old, result.new, result.changed, result.created) == ("s1", "s2", True, False)
    assert refs.get("r").session == "s2"


@pytest.mark.parametrize(
    "setup,expected,message",
    [
        (None, "s1", "ref r moved: it is absent, where it was expected to hold session s1"),
        ("s2", None, "ref r moved: it holds session s2, where it was expected to be absent"),
        ("s2", "s1", "ref r moved: it holds session s2, where it was expected to hold session s1"),
    ],
)
def test_a_wrong_expectation_says_what_the_ref_holds_and_writes_nothing(root, refs, setup, expected, message):
    if setup:
        refs.update("r", setup, expected=None)
    before = snapshot(root)
    with pytest.raises(RefMovedError) as info:
        refs.update("r", "s3", expected=expected)
    assert str(info.value) == message
    assert (info.value.name, info.value.expected, info.value.current) == ("r", expected, setup)
    assert snapshot(root) == before


def test_setting_the_same_incarnation_writes_nothing(root, refs):
    refs.update("r", "s1", expected=None)
    before = snapshot(root)
    result = refs.update("r", "s1", expected="s1")
    assert (result.old, result.new, result.changed) == ("s1", "s1", False)
    assert snapshot(root) == before


def test_a_ref_names_a_session_the_store_holds(root, refs):
    before = snapshot(root)
    with pytest.raises(NoSuchSessionError, match="no such session: nope"):
        refs.update("r", "nope", expected=None)
    with pytest.raises(BadNameError, match="session id"):
        refs.update("r", "../s1", expected=None)
    with pytest.raises(BadNameError, match="session id"):
        refs.update("r", "s1", expected="a/b")
    with pytest.raises(BadRefNameError):
        refs.update("a//b", "s1", expected=None)
    assert snapshot(root) == before
    assert {k for k in snapshot(root) if k.startswith("refs")} <= {"refs"}
    assert refs.list() == []


@pytest.mark.parametrize(
    "held,new,fragment",
    [
        (["a"], "a/b", "under the ref 'a'"),
        (["a/b"], "a", "under the ref 'a'"),
        (["a/y"], "A/x", "'A' differs only in case from 'a'"),
        (["chat"], "Chat", "differs only in case"),
    ],
)
def test_creations_that_conflict_are_refused(root, refs, held, new, fragment):
    for name in held:
        refs.update(name, "s1", expected=None)
    before = snapshot(root)
    with pytest.raises(RefConflictError, match=fragment):
        refs.update(new, "s2", expected=None)
    assert snapshot(root) == before


def test_a_deleted_ref_frees_its_name_for_refs_under_it(refs):
    refs.update("a", "s1", expected=None)
    refs.update("a", None, expected="s1")
    refs.update("a/b", "s2", expected=None)
    assert [r.name for r in refs.list()] == ["a/b"]


def test_delete_by_compare_and_swap(root, refs):
    refs.update("r", "s1", expected=None)
    before = snapshot(root)
    with pytest.raises(RefMovedError, match="it holds session s1, where it was expected to hold session s2"):
        refs.delete("r", expected="s2")
    assert snapshot(root) == before
    result = refs.delete("r", expected="s1")
    assert (result.old, result.new, result.changed, result.deleted) == ("s1", None, True, True)
    assert refs.get("r") is None and ref_files(root) == []
    with pytest.raises(RefMovedError, match="it is absent, where it was expected to hold session s1") as info:
        refs.delete("r", expected="s1")
    assert info.value.current is None
    with pytest.raises(BadNameError):
        refs.delete("r", expected=None)  # type: ignore[arg-type]
    # moving an absent ref from absent to absent changes nothing and succeeds
    assert refs.update("r", None, expected=None).changed is False


def test_dangling_and_replaced_refs(root, refs):
    refs.update("r", "s1", expected=None)
    with Store(root) as st:
        st.delete("s1")
    ref = refs.get("r")
    assert ref.session == "s1" and refs.state(ref) == "dangling"
    with pytest.raises(DanglingRefError, match="not in the store") as info:
        refs.resolve("r")
    assert isinstance(info.value, NoSuchSessionError)
    assert (info.value.name, info.value.session, info.value.state) == ("r", "s1", "dangling")
    with Store(root) as st:  # another session under the same id: not the one the ref was set to
        st.create(Header.new("s1", created_at="2030-01-01T00:00:00Z"))
    assert refs.state(refs.get("r")) == "replaced"
    with pytest.raises(DanglingRefError, match="deleted and created again") as info:
        refs.resolve("r")
    assert info.value.state == "replaced"
    # re-pointing at the new incarnation is a real write, by compare-and-swap as ever
    result = refs.update("r", "s1", expected="s1")
    assert result.changed and refs.state(refs.get("r")) == "ok" and refs.resolve("r") == "s1"
    with pytest.raises(NoSuchRefError, match="no such ref: nope"):
        refs.resolve("nope")


def test_a_file_without_ident_or_with_unknown_members_reads(root, refs):
    refs.update("r", "s1", expected=None)
    (root / "refs" / "r").write_bytes(b'{"name":"r","session":"s1"}\n')
    assert refs.get("r") == Ref("r", "s1", None)
    assert refs.resolve("r") == "s1"
    (root / "refs" / "r").write_bytes(b'{"entry":"sha256:' + b"0" * 64 + b'","name":"r","session":"s2"}\n')
    assert refs.get("r") == Ref("r", "s2", None)


# -- listing ------------------------------------------------------------------------


def test_list_in_name_order_with_prefixes(refs):
    for name in ["b", "a/c", "a-b", "chat/two", "chat/one", "cho"]:
        refs.update(name, "s1", expected=None)
    # '-' sorts before '/' in names although the file '%' sorts before '-'
    assert refs.names() == ["a-b", "a/c", "b", "chat/one", "chat/two", "cho"]
    assert [r.name for r in refs.list()] == refs.names()
    assert refs.names("chat/") == ["chat/one", "chat/two"]
    assert refs.names("ch") == ["chat/one", "chat/two", "cho"]  # a prefix need not end at a boundary
    assert refs.names("a") == ["a-b", "a/c"]
    assert refs.names("zzz") == []
    with pytest.raises(BadRefNameError):
        refs.list("a b")


def test_stray_files_in_refs_are_not_refs(root, refs):
    refs.update("r", "s1", expected=None)
    (root / "refs" / "notes~").write_text("x")
    (root / "refs" / ".tmp-1").write_bytes(b'{"name":"zz","session":"s1"}\n')  # a name, but another ref's bytes
    with pytest.raises(StoreError, match="holds the ref 'zz', not '.tmp-1'"):
        refs.list()
    os.unlink(root / "refs" / ".tmp-1")
    assert refs.names() == ["r"]


def test_a_damaged_ref_file_is_reported_with_its_path(root, refs):
    refs.update("a", "s1", expected=None)
    refs.update("b", "s1", expected=None)
    (root / "refs" / "b").write_bytes(b"{not json")
    seen = []
    with pytest.raises(StoreError, match=r"ref file .*refs/b is damaged"):
        for r in refs.iter():
            seen.append(r.name)
    assert seen == ["a"]
    for data, what in [
        (b'["r"]', "not a JSON object"),
        (b'{"name":"b","session":"../x"}', "'session'"),
        (b'{"name":"b","session":"s1","ident":"md5:1"}', "'ident'"),
        (b'{"session":"s1"}', "'name'"),
    ]:
        (root / "refs" / "b").write_bytes(data)
        with pytest.raises(StoreError, match=what):
            refs.get("b")
    # a damaged file is never overwritten by a compare-and-swap that could not read it
    with pytest.raises(StoreError):
        refs.update("b", "s2", expected="s1")
    assert (root / "refs" / "b").read_bytes() == b'{"session":"s1"}'


def test_a_case_insensitive_file_system_never_answers_for_another_ref(root, refs):
    refs.update("chat", "s1", expected=None)
    # what a case-insensitive file system shows: refs/Chat opens the file of 'chat'
    os.link(root / "refs" / "chat", root / "refs" / "Chat")
    assert refs.get("Chat") is None
    assert refs.names() == ["Chat", "chat"] and [r.name for r in refs.list()] == ["chat"]
    with pytest.raises(RefConflictError, match="differs only in case"):
        refs.update("Chat", "s2", expected=None)
    assert refs.get("chat").session == "s1"


def test_reads_touch_only_the_refs_and_the_headers_they_name(root, monkeypatch):
    with Store(root) as st:
        for i in range(40):
            st.create(Header.new(f"many{i}"))
        r = Refs(st)
        r.update("x/one", "s1", expected=None)
        r.update("x/two", "s2", expected=None)
    opened: list[str] = []
    listed: list[str] = []
    real_open, real_listdir, real_scandir = builtins.open, os.listdir, os.scandir
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: (opened.append(os.fspath(p)), real_open(p, *a, **k))[1])
    monkeypatch.setattr(os, "listdir", lambda p=".": (listed.append(os.fspath(p)), real_listdir(p))[1])
    monkeypatch.setattr(os, "scandir", lambda p=".": (listed.append(os.fspath(p)), real_scandir(p))[1])
    real_os_open = os.open  # small files (layout, refs) are opened with os.open (fsutil.read_small)
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (opened.append(os.fspath(p)), real_os_open(p, *a, **k))[1])
    ro = Refs(Store(root, readonly=True))
    states = [ro.state(r) for r in ro.list("x/")]
    assert states == ["ok", "ok"] and ro.resolve("x/one") == "s1"
    rel = {os.path.relpath(p, root) for p in opened}
    # each header named, checked against its log's first line (the log holds the header)
    assert rel == {"layout", "refs/x%one", "refs/x%two", "sessions/s1/header", "sessions/s2/header",
                   "sessions/s1/log", "sessions/s2/log"}
    assert {os.path.relpath(p, root) for p in listed} == {"refs"}


# -- read-only, locking, durability -------------------------------------------------


def test_a_read_only_store_lists_and_shows_and_writes_nothing(root, refs):
    refs.update("r", "s1", expected=None)
    before = snapshot(root)
    ro = Refs(Store(root, readonly=True))
    assert ro.list() == [refs.get("r")] and ro.resolve("r") == "s1"
    with pytest.raises(ReadOnlyError, match="read-only"):
        ro.update("r", "s2", expected="s1")
    with pytest.raises(ReadOnlyError):
        ro.delete("r", expected="s1")
    with pytest.raises(ReadOnlyError):
        ro.update("new", "s2", expected=None)
    assert snapshot(root) == before


def test_a_store_without_refs_lists_none(root):
    ro = Refs(Store(root, readonly=True))
    assert ro.list() == [] and ro.names("a") == [] and ro.get("a") is None
    assert not (root / "refs").exists()


def test_writes_wait_for_the_refs_lock(root, refs, monkeypatch):
    monkeypatch.setattr(refs_module, "LOCK_TIMEOUT", 0.2)
    holder = FileLock(str(root / "refs.lock"))
    holder.acquire()
    try:
        with pytest.raises(StoreError, match="stayed locked"):
            refs.update("r", "s1", expected=None)
        assert refs.get("r") is None
        assert refs.list() == []  # reads take no lock
    finally:
        holder.release()
    refs.update("r", "s1", expected=None)


def test_a_failed_write_leaves_the_ref_as_it_was(root, refs, monkeypatch):
    refs.update("r", "s1", expected=None)
    before = (root / "refs" / "r").read_bytes()

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(refs_module, "write_atomic", no_space)
    with pytest.raises(OSError):
        refs.update("r", "s2", expected="s1")
    assert (root / "refs" / "r").read_bytes() == before and ref_files(root) == ["r"]
    monkeypatch.undo()
    refs.update("r", "s2", expected="s1")  # the lock was released
    assert refs.get("r").session == "s2"


def test_writes_are_fsynced_file_then_directory(root, refs, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    refs.update("a/b", "s1", expected=None)
    # the first write made refs/ (its name fsynced in the root), then the temp file, then
    # refs/; then the line of refs.log, and the root for the log's new name
    rel = [os.path.relpath(p, root) for p in synced]
    assert rel[0] == "." and rel[1].startswith("tmp/.tmp-") and rel[2:] == ["refs", "refs.log", "."]
    synced.clear()
    refs.delete("a/b", expected="s1")
    assert [os.path.relpath(p, root) for p in synced] == ["refs", "refs.log"]


# -- two real processes -------------------------------------------------------------

WORKER = r"""
import os, sys, time
from agentsession_cas.store import Store
from agentsession_cas.backends.files.refs import ref_file_name
from agentsession_cas.store.refs import Refs
from agentsession_cas.errors import RefConflictError, RefMovedError

root, name, session, expected, go = sys.argv[1:6]
refs = Refs(Store(root))
# Widen the window between reading the ref and writing it: without the lock, both
# processes would read the same old value and both would "win".
real_ident = Refs.session_ident
def slow_ident(self, sid):
    time.sleep(0.15)
    return real_ident(self, sid)
Refs.session_ident = slow_ident
print("READY", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
try:
    refs.update(name, session, expected=expected or None)
    print("WON", flush=True)
except RefMovedError as e:
    print("MOVED", e.current or "-", flush=True)
except RefConflictError as e:
    print("CONFLICT", e.existing, flush=True)
"""


def race(root: Path, tmp_path: Path, jobs: list[tuple[str, str, str]], tag: str) -> list[list[str]]:
    go = tmp_path / f"go-{tag}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), name, session, expected, str(go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
        )
        for name, session, expected in jobs
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "READY", p.stderr.read()
    go.write_text("")
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr
        out.append(stdout.split())
    return out


def test_two_processes_racing_one_wins_one_is_told_it_moved(root, refs, tmp_path):
    refs.update("chat/x", "s1", expected=None)
    for round_ in range(3):
        start = refs.get("chat/x").session
        a, b = [s for s in ("s1", "s2", "s3") if s != start][:2]
        out = race(root, tmp_path, [("chat/x", a, start), ("chat/x", b, start)], str(round_))
        assert sorted(o[0] for o in out) == ["MOVED", "WON"], out
        winner = a if out[0][0] == "WON" else b
        loser_saw = next(o for o in out if o[0] == "MOVED")[1]
        assert loser_saw == winner
        assert refs.get("chat/x").session == winner


def test_two_processes_creating_conflicting_names_one_wins(root, refs, tmp_path):
    for round_, (x, y) in enumerate([("a", "a/b"), ("q/r", "Q/s"), ("same", "same")]):
        out = race(root, tmp_path, [(x, "s1", ""), (y, "s2", "")], f"c{round_}")
        assert sorted(o[0] for o in out)[1] == "WON" and sorted(o[0] for o in out)[0] in ("CONFLICT", "MOVED"), out
        assert len(refs.names()) == round_ + 1


# -- the command line ---------------------------------------------------------------


def cli(root: Path, *args: str):
    return CliRunner().invoke(main, ["--store", str(root), *args], catch_exceptions=False)


def ok(result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def one_error(result, *needles: str) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentsession: error: "), result.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert "Traceback" not in result.output
    return lines[0]


def test_cli_list_of_an_empty_store(root):
    assert ok(cli(root, "ref", "list")) == ""
    assert json.loads(ok(cli(root, "ref", "list", "--json"))) == []


def test_cli_update_show_list_delete(root):
    assert ok(cli(root, "ref", "update", "chat/one", "s1")) == ""
    assert json.loads(ok(cli(root, "ref", "update", "chat/two", "s2", "--expect", "", "--json"))) == {
        "name": "chat/two", "session": "s2", "previous": None, "changed": True,
    }
    assert json.loads(ok(cli(root, "ref", "update", "chat/one", "s3", "--expect", "s1", "--json"))) == {
        "name": "chat/one", "session": "s3", "previous": "s1", "changed": True,
    }
    ok(cli(root, "ref", "update", "base", "s1"))

    lines = ok(cli(root, "ref", "list")).splitlines()
    assert [line.split() for line in lines] == [
        ["NAME", "SESSION", "STATE"], ["base", "s1", "ok"], ["chat/one", "s3", "ok"], ["chat/two", "s2", "ok"],
    ]
    first = [line.split()[0] for line in ok(cli(root, "ref", "list", "chat/")).splitlines()]
    assert first == ["NAME", "chat/one", "chat/two"]
    listed = json.loads(ok(cli(root, "ref", "list", "--json", "chat/")))
    assert [(r["name"], r["session"], r["state"]) for r in listed] == [
        ("chat/one", "s3", "ok"), ("chat/two", "s2", "ok"),
    ]
    assert all(r["ident"].startswith("sha256:") for r in listed)

    assert [line.split() for line in ok(cli(root, "ref", "show", "chat/one")).splitlines()] == [
        ["ref", "chat/one"], ["session", "s3"], ["state", "ok"],
    ]
    shown = json.loads(ok(cli(root, "ref", "show", "chat/one", "--json")))
    assert (shown["name"], shown["session"], shown["state"]) == ("chat/one", "s3", "ok")

    assert json.loads(ok(cli(root, "ref", "delete", "chat/one", "--expect", "s3", "--json"))) == {
        "name": "chat/one", "session": None, "previous": "s3", "changed": True,
    }
    assert ok(cli(root, "ref", "delete", "chat/two")) == ""  # without --expect: what it holds when read
    assert [line.split()[0] for line in ok(cli(root, "ref", "list")).splitlines()] == ["NAME", "base"]


def test_cli_refusals_are_one_line_and_exit_1(root):
    ok(cli(root, "ref", "update", "a", "s1"))
    before = snapshot(root)
    one_error(cli(root, "ref", "update", "a", "s2"), "ref a moved: it holds session s1, where it was expected to be absent",
              "pass --expect s1")
    one_error(cli(root, "ref", "update", "a", "s2", "--expect", "s3"),
              "ref a moved: it holds session s1, where it was expected to hold session s3")
    one_error(cli(root, "ref", "update", "a/b", "s2"), "invalid ref name 'a/b'", "under the ref 'a'")
    one_error(cli(root, "ref", "update", "A", "s2"), "invalid ref name 'A'", "differs only in case")
    one_error(cli(root, "ref", "update", "bad name", "s2"), "invalid ref name 'bad name'")
    one_error(cli(root, "ref", "update", "con.txt", "s2"), "Windows device")
    one_error(cli(root, "ref", "update", "b", "nope"), "no such session: nope")
    one_error(cli(root, "ref", "update", "b", "../x"), "session id")
    one_error(cli(root, "ref", "delete", "a", "--expect", "s2"), "ref a moved: it holds session s1, where it was expected to hold session s2")
    one_error(cli(root, "ref", "delete", "nope"), "no such ref: nope")
    one_error(cli(root, "ref", "delete", "nope", "--expect", "s1"), "ref nope moved: it is absent")
    one_error(cli(root, "ref", "show", "nope"), "no such ref: nope")
    one_error(cli(root, "ref", "show", "a//b"), "invalid ref name")
    one_error(cli(root, "ref", "list", "a b"), "invalid ref prefix")
    assert snapshot(root) == before


@pytest.mark.parametrize(
    "args",
    [["ref"], ["ref", "update"], ["ref", "update", "a"], ["ref", "show"], ["ref", "delete"],
     ["ref", "delete", "a", "--expect", ""], ["ref", "list", "a", "b"], ["ref", "nope"]],
)
def test_cli_usage_errors_exit_2(root, args):
    result = cli(root, *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Usage" in result.stderr or "Usage" in result.stdout


def test_cli_no_change_is_a_note(root):
    ok(cli(root, "ref", "update", "a", "s1"))
    result = cli(root, "ref", "update", "a", "s1", "--expect", "s1", "--json")
    assert json.loads(ok(result))["changed"] is False
    assert "agentsession: note: ref a already holds session s1; nothing was written" in result.stderr


def test_cli_dangling_refs_are_shown(root):
    ok(cli(root, "ref", "update", "gone", "s1"))
    ok(cli(root, "delete", "s1"))
    assert [line.split()[:3] for line in ok(cli(root, "ref", "list")).splitlines()][1] == ["gone", "s1", "dangling"]
    text = ok(cli(root, "ref", "show", "gone"))
    assert "state    dangling: the session is not in the store" in text
    assert json.loads(ok(cli(root, "ref", "show", "gone", "--json")))["state"] == "dangling"


@pytest.mark.parametrize("command", ["show", "verify", "export", "log", "head"])
@pytest.mark.parametrize("written", ["ref:gone", "gone"])
def test_cli_a_dangling_ref_read_says_it_dangles(root, command, written):
    """Commands that take a file or a session said "no such file, nor a session" of a
    dangling ref (a NoSuchSessionError they reworded): the ref's own error says more."""
    ok(cli(root, "ref", "update", "gone", "s1"))
    ok(cli(root, "delete", "s1"))
    result = cli(root, command, written)
    one_error(result, "ref gone is dangling")
    assert "no such file" not in result.stderr
    if command in ("show", "verify", "log"):
        result = cli(root, command, "--json", written)
        assert result.exit_code == 1 and result.stdout == ""
        assert json.loads(result.stderr)["error"]["code"] == "ref_dangling"


def test_cli_reads_write_nothing_and_a_damaged_file_fails_the_listing(root):
    ok(cli(root, "ref", "update", "a", "s1"))
    ok(cli(root, "ref", "update", "b", "s2"))
    before = snapshot(root)
    ok(cli(root, "ref", "list"))
    ok(cli(root, "ref", "show", "a"))
    assert snapshot(root) == before
    (root / "refs" / "b").write_bytes(b"garbage")
    result = cli(root, "ref", "list")
    assert result.exit_code == 1
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["NAME", "a"]  # what was read is printed
    assert "refs/b is damaged" in result.stderr


def test_cli_ref_on_a_missing_store(tmp_path):
    one_error(cli(tmp_path / "none", "ref", "list"), "no store at")


def test_a_flipped_byte_in_a_ref_file_is_damage_never_another_session(root, refs):
    """A ref file carries a checksum line: a byte flipped inside the session's name (which
    still parses, naming another session) is found by the read and by fsck (issue 16)."""
    from agentsession_cas.maintenance.fsck import fsck

    refs.update("chat/one", "s1", expected=None)
    path = root / "refs" / "chat%one"
    data = bytearray(path.read_bytes())
    at = data.index(b'"session":"s1"') + len('"session":"s')
    data[at] ^= 0x03  # s1 -> s2
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="does not match its checksum"):
        refs.get("chat/one")
    report = fsck(root)
    assert not report.ok and any("refs/chat%one" in str(p) for p in report.errors)


def test_a_ref_file_of_one_line_from_before_the_checksum_still_reads(root, refs):
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "old").write_bytes(b'{"name":"old","session":"s1"}\n')
    assert refs.get("old").session == "s1"


# -- the refs' history (RFC 0003's ref log) ------------------------------------------------


@pytest.mark.parametrize("url", ["files", "memory"])
def test_ref_log_keeps_every_change_newest_first(tmp_path, url):
    """Every change of a ref is kept with what it held before and after, when, and why;
    an update that changes nothing is not; other refs' changes are not this one's."""
    target = str(tmp_path / "st") if url == "files" else f"memory:reflog-{tmp_path.name}"
    with Store.init(target) as st:
        for sid in ("s1", "s2"):
            st.create(Header.new(sid)).close()
        refs = Refs(st)
        assert refs.log("conv/x") == []
        refs.update("conv/x", "s1", expected=None, reason="start")
        refs.update("conv/x", "s1", expected="s1")  # nothing changes, nothing logged
        refs.update("conv/y", "s2", expected=None)
        refs.update("conv/x", "s2", expected="s1", reason="continued")
        refs.delete("conv/x", expected="s2")
        log = refs.log("conv/x")
        assert [(m["old"], m["new"], m.get("reason")) for m in log] == [
            ("s2", None, None), ("s1", "s2", "continued"), (None, "s1", "start")]
        assert log[1]["ident"] == st.session_ident("s2") and all(m["at"] for m in log)
        assert [(m["old"], m["new"]) for m in refs.log("conv/y")] == [(None, "s2")]
        with pytest.raises(BadRefNameError):
            refs.log("bad name")


def test_ref_log_file_skips_a_torn_last_line_and_refuses_a_damaged_one(tmp_path):
    """``refs.log`` is appended under the refs lock: a crash inside an append leaves a torn
    last line, which is not read; a damaged line before the last is an error naming it."""
    with Store.init(tmp_path / "st") as st:
        st.create(Header.new("s1")).close()
        Refs(st).update("r", "s1", expected=None)
    path = tmp_path / "st" / "refs.log"
    good = path.read_bytes()
    path.write_bytes(good + b'{"name":"r","old":"s1"')
    with Store(tmp_path / "st") as st:
        assert [(m["old"], m["new"]) for m in Refs(st).log("r")] == [(None, "s1")]
    path.write_bytes(b"{torn\n" + good)
    with Store(tmp_path / "st") as st, pytest.raises(StoreError, match="line 1"):
        Refs(st).log("r")
    path.write_bytes(good + b"[1]\n" + good)  # JSON, but no move: damage too (it was skipped unsaid)
    with Store(tmp_path / "st") as st, pytest.raises(StoreError, match="line 2 does not read as a JSON object"):
        Refs(st).log("r")


def test_a_move_after_a_torn_last_line_cuts_the_tear_first(tmp_path):
    """The next move after a crash tore ``refs.log``'s last line appends after the last
    whole line: appended to the tear, it would make a damaged line in the middle, and
    every ref's history would stop reading."""
    with Store.init(tmp_path / "st") as st:
        for sid in ("s1", "s2", "s3"):
            st.create(Header.new(sid)).close()
        Refs(st).update("r", "s1", expected=None)
        Refs(st).update("other", "s2", expected=None)
    path = tmp_path / "st" / "refs.log"
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"name":"r","old":"s1","ne')
    with Store(tmp_path / "st") as st:
        refs = Refs(st)
        refs.update("r", "s3", expected="s1")
        assert [(m["old"], m["new"]) for m in refs.log("r")] == [("s1", "s3"), (None, "s1")]
        assert [(m["old"], m["new"]) for m in refs.log("other")] == [(None, "s2")]
    assert path.read_bytes().startswith(whole) and path.read_bytes().count(b"\n") == 3
    path.write_bytes(b'{"name":"r","ol')  # a tear with no whole line before it
    with Store(tmp_path / "st") as st:
        Refs(st).update("r", "s1", expected="s3")
        assert [(m["old"], m["new"]) for m in Refs(st).log("r")] == [("s3", "s1")]


def test_a_whole_last_line_without_its_newline_is_kept_by_the_next_move(tmp_path):
    """A move whose append lost only its LF (a write cut a byte short) reads as a move;
    the next move ends that line rather than cutting it, so the history keeps it."""
    with Store.init(tmp_path / "st") as st:
        for sid in ("s1", "s2", "s3"):
            st.create(Header.new(sid)).close()
        Refs(st).update("r", "s1", expected=None)
        Refs(st).update("r", "s2", expected="s1")
    path = tmp_path / "st" / "refs.log"
    path.write_bytes(path.read_bytes()[:-1])
    with Store(tmp_path / "st") as st:
        assert [(m["old"], m["new"]) for m in Refs(st).log("r")] == [("s1", "s2"), (None, "s1")]
        Refs(st).update("r", "s3", expected="s2")
        assert [(m["old"], m["new"]) for m in Refs(st).log("r")] == [("s2", "s3"), ("s1", "s2"), (None, "s1")]


def test_a_refs_log_that_is_a_symbolic_link_is_named_by_fsck(tmp_path):
    """``refs.log`` as a link (the store makes none; a move's append refuses to follow
    one) is a ``bad-refs-log`` finding, and one that links to itself no crash of fsck."""
    with Store.init(tmp_path / "st") as st:
        st.create(Header.new("s1")).close()
    root = tmp_path / "st"
    from agentsession_cas.maintenance.fsck import fsck

    (root / "real.log").write_bytes(b"")
    for target in ("real.log", "refs.log"):
        link = root / "refs.log"
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(target, link)
        report = fsck(root)
        assert not report.ok and any(p.code == "bad-refs-log" for p in report.errors), target
