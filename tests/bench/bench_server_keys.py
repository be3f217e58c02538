#!/usr/bin/env python3
"""Benchmark: what a keyed write costs the server, and a lazy append its HTTP client
(session 35: each token's share of the table of Idempotency-Keys; the HTTP store's
sends apart from its holds).

1. **keyed appends**: a server with ``--auth`` and ``--sync never``, one client with
   a token, one session leased, ``--appends`` appends each one
   ``POST …/entries`` with an ``Idempotency-Key`` of its own: the server's CPU per
   append (``/proc/<pid>/stat``, user + system), which the table's accounting is part
   of.
2. **lazy appends**: a store handle (``open_store(url, sync="never")``) appending
   ``--appends`` entries, then a commit: this process's CPU per append
   (``time.process_time``, the flusher thread's included), which the hold path is
   part of.

Each run starts a fresh server; ``--repeat`` runs, each figure printed and then
their median. No target: the figures are compared across trees (run the script
from each tree's ``tests/bench``).

Run: ``.venv/bin/python tests/bench/bench_server_keys.py [--appends N] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

import httpx  # noqa: E402

from agentsession_cas import Header, open_store  # noqa: E402
from agentsession_cas.exchange.http_client import no_delay_transport  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402
from server_helpers import TOKENS, ServerProcess, token_file  # noqa: E402

TS = "2026-09-17T12:00:00Z"


def cpu_of(pid: int) -> float:
    """The CPU seconds (user + system) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def line(n: int) -> bytes:
    return json.dumps({"type": "item", "ts": "2026-09-17T12:00:01Z",
                       "item": {"type": "message", "role": "user", "content": f"bench {n}"}}).encode()


def keyed_appends(server: ServerProcess, appends: int) -> float:
    """Server CPU milliseconds per keyed append."""
    headers = {"Authorization": f"Bearer {TOKENS['all'][0]}"}
    with httpx.Client(base_url=server.url.rstrip("/"), headers=headers, timeout=60,
                      transport=no_delay_transport()) as c:
        c.post("/v1/sessions", json=Header.new("keyed", created_at=TS).data).raise_for_status()
        token = str(c.post("/v1/sessions/keyed/lease", json={"ttl_ms": 600_000}).json()["token"])
        assert server.proc is not None
        before = cpu_of(server.proc.pid)
        for n in range(appends):
            r = c.post("/v1/sessions/keyed/entries", content=line(n), params={"commit": "false"},
                       headers={"Lease-Token": token, "Idempotency-Key": uuid.uuid4().hex})
            if r.status_code != 200 or r.json()["stopped"] is not None:
                raise SystemExit(f"append refused: {r.text}")
        return (cpu_of(server.proc.pid) - before) / appends * 1000


def lazy_appends(server: ServerProcess, appends: int) -> float:
    """Client CPU microseconds per lazy append (the commit included)."""
    os.environ["AGENTSESSION_TOKEN"] = TOKENS["all"][0]
    with open_store(server.url, sync="never") as st:
        s = st.create(Header.new("lazy", created_at=TS))
        entries = [json.loads(line(n)) for n in range(appends)]
        before = time.process_time()
        for entry in entries:
            s.append(entry)
        s.commit()
        spent = time.process_time() - before
        s.close()
    return spent / appends * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--appends", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    keyed: list[float] = []
    lazy: list[float] = []
    print(f"tree {ROOT}; load {os.getloadavg()[0]:.2f}")
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-keys-") as tmp:
            Store.init(Path(tmp) / "st").close()
            with ServerProcess(Path(tmp) / "st", auth=token_file(Path(tmp)), extra=("--sync", "never")) as server:
                keyed.append(keyed_appends(server, args.appends))
                lazy.append(lazy_appends(server, args.appends * 5))
        print(f"  keyed append: {keyed[-1]:.3f} ms server CPU; lazy append: {lazy[-1]:.1f} us client CPU")
    print(f"median: keyed {statistics.median(keyed):.3f} ms server CPU an append, "
          f"lazy {statistics.median(lazy):.1f} us client CPU an append; load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
