"""The PostgreSQL backend under killed writers, a killed server, and many writers at once
(issue 13 "Tests" and "Concurrency"). Both are slow and run in CI.

* Crash: tests/crash_worker.py appends to one session of a store in a server of this
  test's own, and is SIGKILLed at random moments; now and then the server is killed
  (SIGKILL to the postmaster and its children) and restarted instead. After each kill
  every append the worker had acknowledged as durable is in the session, every
  append it acknowledged at all is there after a client kill (a lazy append is a
  committed transaction; only the server's crash may take the last asynchronous
  ones), no entry is there in part, and the session verifies.
* Concurrency: 16 processes append to 16 sessions, 4 race head compare-and-swaps on
  one shared session and 4 race ref compare-and-swaps on one ref, while a sweep runs
  with no grace; nothing acknowledged is lost, no two compare-and-swaps both succeed
  from the same value, and fsck is clean.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pg_server
from agentsession_cas import Header, read_session_bytes
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store.refs import Refs
from agentsession_cas.store.url import open_store
from test_crash import out_lines, parse_ops, spawn, stderr_of, wait_for_count, wait_for_line

SID = "crash-session"
WORKER = Path(__file__).with_name("pg_worker.py")


def check(url: str, durable: set[str], acked: set[str] | None) -> list[str]:
    """Open the store as the next writer would and check the session; its own entries."""
    store = open_store(url)
    try:
        if SID not in store:
            assert not durable
            return []
        s = store.session(SID)
        own = set(s.own)
        missing = durable - own
        assert not missing, f"{len(missing)} append(s) acknowledged durable are missing: {sorted(missing)[:3]}"
        if acked is not None:
            assert acked <= own, f"a client kill lost {len(acked - own)} acknowledged append(s)"
        for entry_id in s.log_order:
            assert store.entry(entry_id).id == entry_id  # whole, verified
        assert s.head is None or (s.head in own and s.head not in s.leaf_labels)
        sf = read_session_bytes(s.projection(), source="projection")
        assert sf.problems == [], sf.problems
        return list(s.log_order)
    finally:
        store.close()


@pytest.mark.slow
def test_killed_writers_and_a_killed_server_lose_no_durable_append(tmp_path):
    seed = int(os.environ.get("AGENTSESSION_CRASH_SEED", 20261201))
    kills = int(os.environ.get("AGENTSESSION_CRASH_KILLS", 16))
    rng = random.Random(seed)
    server = pg_server.PgServer()
    try:
        url = server.store_url("crash")
        open_store(url, create=True).close()
        durable: set[str] = set()
        server_kills = 0
        for i in range(kills):
            lazy = rng.random() < 0.5
            policy, every = ("never", rng.choice([0, 1, 3, 7])) if lazy else ("always", 0)
            kill_server = i % 4 == 3
            out = tmp_path / f"run{i}.out"
            proc = spawn("append", url, SID, policy, str(every), str(rng.randrange(1 << 30)), "1000000", out=out)
            try:
                wait_for_line(proc, out, "READY", timeout=60)
                wait_for_count(proc, out, "ACK A ", rng.randint(1, 25), timeout=60)
                if kill_server:
                    server.kill()
                    server_kills += 1
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            if kill_server:
                server.start()  # PostgreSQL's own recovery replays its WAL
            _, _, _, ops = parse_ops(out_lines(out))
            acked = {op.id for op in ops if op.kind == "A" and op.acked}
            run_durable = {op.id for op in ops if op.kind == "A" and op.acked and op.durable}
            if policy == "always":
                assert run_durable == acked
            durable |= run_durable
            try:
                check(url, durable, None if kill_server else acked)
            except AssertionError as exc:
                raise AssertionError(f"kill {i + 1} (seed {seed}, server killed: {kill_server}): {exc}; "
                                     f"worker stderr: {stderr_of(out)[-500:]}") from exc
        assert server_kills >= 3 and len(durable) > kills
        assert fsck(url).ok
    finally:
        server.remove()


def _start(args: list[str], out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), *args], stdin=subprocess.PIPE,
                            stdout=open(out, "wb"), stderr=open(out.with_suffix(".err"), "wb"))


def _chain_of(lines: list[str], initial: str | None) -> list[str | None]:
    """The successful compare-and-swaps as one chain from ``initial``: each must start
    where the one before it ended (two from one value would both have succeeded)."""
    moves: dict[str | None, str] = {}
    for line in lines:
        _, expected, new = line.split()
        key = None if expected == "None" else expected
        assert key not in moves, f"two compare-and-swaps from {key} both succeeded"
        moves[key] = new
    chain: list[str | None] = [initial]
    while chain[-1] in moves:
        chain.append(moves.pop(chain[-1]))
    assert not moves, f"compare-and-swaps from values never held: {moves}"
    return chain


@pytest.mark.slow
def test_sixteen_appenders_racing_cas_and_a_sweep(tmp_path):
    url = pg_server.fresh_schema("stress")
    store = open_store(url, create=True)
    shared = store.create(Header.new("shared"))
    entries = [shared.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"shared {i}"}}).id
               for i in range(80)]
    first_head = shared.head
    shared.close()
    targets = [store.create(Header.new(f"target-{i}")) for i in range(40)]
    for t in targets:
        t.close()
    Refs(store).update("race/current", "target-0", expected=None)
    store.close()
    procs: list[tuple[str, subprocess.Popen, Path]] = []
    for i in range(16):
        out = tmp_path / f"append{i}.out"
        procs.append(("append", _start(["append", url, f"writer-{i:02d}", "25"], out), out))
    for i in range(4):
        mine = [e for j, e in enumerate(entries[:-1]) if j % 4 == i][:12]
        out = tmp_path / f"head{i}.out"
        procs.append(("head", _start(["head", url, "shared", ",".join(mine)], out), out))
    for i in range(4):
        mine = [f"target-{j}" for j in range(1 + i, 40, 4)]
        out = tmp_path / f"ref{i}.out"
        procs.append(("ref", _start(["ref", url, "race/current", ",".join(mine)], out), out))
    out = tmp_path / "sweep.out"
    procs.append(("sweep", _start(["sweep", url, "3"], out), out))
    try:
        for _, p, out in procs:
            wait_for_line(p, out, "READY", timeout=120)
        for _, p, _ in procs:  # all at once
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.flush()
        deadline = time.monotonic() + 600
        for _, p, out in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert p.returncode == 0, f"worker failed: {stderr_of(out)}"
    finally:
        for _, p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    store = open_store(url)
    try:
        for i in range(16):
            acked = [ln.split()[1] for ln in out_lines(tmp_path / f"append{i}.out") if ln.startswith("ACK ")]
            assert len(acked) == 25 and store.read(f"writer-{i:02d}").log_order == acked
        head_cas = [ln for i in range(4) for ln in out_lines(tmp_path / f"head{i}.out") if ln.startswith("CAS ")]
        chain = _chain_of(head_cas, first_head)
        assert store.read("shared").head == chain[-1] and len(head_cas) >= 1
        ref_cas = [ln for i in range(4) for ln in out_lines(tmp_path / f"ref{i}.out") if ln.startswith("CAS ")]
        ref_chain = _chain_of(ref_cas, "target-0")
        current = Refs(store).get("race/current")
        assert current is not None and current.session == ref_chain[-1] and len(ref_cas) >= 1
        swept = [ln for ln in out_lines(tmp_path / "sweep.out") if ln.startswith("SWEPT ")]
        assert len(swept) == 3
        report = fsck(store, deep=True)
        assert report.ok, report.as_dict()["problems"][:3]
    finally:
        store.close()
