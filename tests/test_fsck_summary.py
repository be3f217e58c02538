"""The `fsck` command's summary line says what the store's walk counted: a store
directory's packs and loose files; on a backend without packs (PostgreSQL, memory) the
objects verified per space and no pack words; through an HTTP client, which walks no
objects, none of either."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import http_store
import pg_server
from agentsession_cas import Header
from agentsession_cas.store import Store
from agentsession_cas.store.url import open_store
from agentsession_cli.main import main


def fill(url: str) -> None:
    st = open_store(url, create=True)
    try:
        s = st.create(Header.new("one"))
        for i in range(2):
            s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"hi {i}"},
                      "ts": f"2026-12-04T02:00:0{i}Z"})
        s.close()
    finally:
        st.close()


def summary(url: str) -> tuple[str, dict]:
    r = CliRunner().invoke(main, ["--store", url, "fsck"])
    assert r.exit_code == 0, r.output
    line = " ".join(r.output.split("\n")[0:2]).replace("  ", " ")  # (the line wraps)
    j = CliRunner().invoke(main, ["--store", url, "fsck", "--json"])
    return line, json.loads(j.output)["counts"]


def test_a_store_directory_says_its_packs_and_loose_files(tmp_path):
    root = tmp_path / "store"
    Store.init(root).close()
    fill(str(root))
    line, counts = summary(str(root))
    assert f"fsck: 4 object(s) verified (0 packed in 0 pack(s), 4 loose), 1 session(s), {counts['log_records']} log record(s);" in line


def test_postgresql_says_the_objects_it_verified_per_space_and_no_packs():
    url = pg_server.fresh_schema("summary")
    fill(url)
    line, counts = summary(url)
    assert "pack" not in line and "loose" not in line, line
    assert (counts["objects"], counts["entries"], counts["contents"]) == (4, 2, 2)
    assert line.startswith(f"fsck: 4 object(s) verified (2 entries, 2 contents, 0 blobs), 1 session(s), "
                           f"{counts['log_records']} log record(s); unreferenced: 0 entries, 0 contents, 0 blobs"), line


def test_a_memory_store_says_the_objects_it_verified_per_space_and_no_packs():
    url = "memory:fsck-summary"
    fill(url)
    line, counts = summary(url)
    assert "pack" not in line and "loose" not in line and "log record" not in line, line
    assert (counts["objects"], counts["entries"], counts["contents"], counts["blobs"]) == (4, 2, 2, 0)
    assert line.startswith("fsck: 4 object(s) verified (2 entries, 2 contents, 0 blobs), 1 session(s); "
                           "unreferenced: 0 entries, 0 contents, 0 blobs"), line


def test_a_memory_store_names_an_object_that_does_not_hash_to_its_name():
    """The memory walk reads every object to count what is unreferenced: one that does
    not read is an error there, as on the other backends, not passed over."""
    url = "memory:fsck-corrupt"
    fill(url)
    st = open_store(url)
    try:
        from agentsession_cas.format.hashing import sha256_ref

        name = sha256_ref(b"the real bytes")
        st.objects.put("blobs", name, b"other bytes", durable=True)
    finally:
        st.close()
    r = CliRunner().invoke(main, ["--store", url, "fsck"])
    assert r.exit_code == 1, r.output
    assert f"error: corrupt-object: blobs object {name} does not hash to its name" in r.output
    assert "fsck: 5 object(s) verified (2 entries, 2 contents, 1 blobs)" in " ".join(r.output.split())


def test_through_http_no_object_is_walked_and_none_is_said(tmp_path: Path):
    url = http_store.served_url(tmp_path, "fsck-summary", "a")
    try:
        fill(url)
        line, counts = summary(url)
    finally:
        http_store.release(tmp_path, "fsck-summary")
    assert "objects" not in counts
    assert line.startswith("fsck: 1 session(s); unreferenced: not counted (the store cannot be swept from here)"), line
