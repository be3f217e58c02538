"""What one pass of the rules over a session file holds at its end, an entry (a bound, not a time).

``verify FILE`` and ``import FILE`` keep the pass's state (the path checker's tables,
the record walker's and the context builder's undo records, the parked entries) until
the report is read; an import then frees it in its tail, which no other core shares.
Its size an entry is what this guards: tests/bench/README.md, session 36.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from pathlib import Path

import pytest

from agentsession_cas.format.reader import verify_file

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
from bench_verify import generate  # the benchmark's coding-agent session

#: Bytes an entry the pass may still hold once it is over, with its report (traced by
#: tracemalloc, the 64 entries of the parking window and the file's line table included).
#: Session 35 held 1,510 on this session; session 36, 1,185; session 37, 1,070 (a parked
#: entry drops its content hash, which only its own add read).
RETAINED_PER_ENTRY = 1_130


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pass") / "generated.jsonl"
    path.write_bytes(generate(2_000, 20260917)[0])
    return path


@pytest.mark.parametrize("processes", [False, True], ids=["one-process", "helper"])
def test_the_pass_holds_little_an_entry(session: Path, processes: bool) -> None:
    """At the end of a verify of a 2,000-entry generated session (linear, as a harness
    records), what the pass holds, traced, stays under :data:`RETAINED_PER_ENTRY` bytes an
    entry, whether the line rules ran here or in the helper process."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        report = verify_file(session, processes=processes, objects=False)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert report.ok and report.entries == 2_000
    assert held / report.entries < RETAINED_PER_ENTRY, f"{held / report.entries:.0f} bytes an entry"
