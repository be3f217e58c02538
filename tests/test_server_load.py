"""Load on one server (issue 12), bounded and on loopback only: 16 client processes each
record sessions locally and push them for a fixed time while two followers follow two
of those sessions over the wire. Afterwards every acknowledged entry is on the server,
each follower saw every commit of its session in order, and fsck of the server's store
is clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from server_helpers import ServerProcess

WRITERS = 16
SECONDS = float(os.environ.get("AGENTSESSION_LOAD_SECONDS", "60"))

WRITER = r"""
import json, sys, time
from agentsession_cas import Header
from agentsession_cas.exchange import push
from agentsession_cas.exchange.http_client import HttpTransport
from agentsession_cas.store import Store

url, root, n, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
remote = HttpTransport(url)
acked = {}
deadline = time.monotonic() + seconds
with Store.init(root, sync="never") as st:
    k = 0
    while k < 1000 and (k == 0 or time.monotonic() < deadline):  # the first session is followed: whole
        sid = f"w{n}-s{k}"
        s = st.create(Header.new(sid, created_at="2026-09-17T12:00:00Z"))
        s.append({"type": "config", "ts": "2026-09-17T12:00:00Z", "model": "m"})
        for turn in range(40):
            s.append({"type": "item", "ts": "2026-09-17T12:00:01Z",
                      "item": {"type": "message", "role": "user", "content": f"{sid} {turn}"}})
            if turn % 5 == 4:
                r = push(st, remote, sid)
                acked[sid] = r.head_after
            if k > 0 and time.monotonic() >= deadline:
                break
        r = push(st, remote, sid)
        acked[sid] = r.head_after
        k += 1
print(json.dumps(acked), flush=True)
"""

@pytest.mark.slow
def test_sixteen_writers_and_two_followers_on_one_server(tmp_path: Path):
    Store.init(tmp_path / "served").close()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with ServerProcess(tmp_path / "served", extra=("--sync", "never")) as server:
        writers = [
            subprocess.Popen([sys.executable, "-c", WRITER, server.url, str(tmp_path / f"w{n}"), str(n), str(SECONDS)],
                             stdout=subprocess.PIPE, env=env)
            for n in range(WRITERS)
        ]
        # The followers follow the first session of two writers; they stop once they saw
        # the head that writer's first session ends at (its 41st entry): each writer ends
        # its first session whole, past its time if this machine is slow.
        followers = []
        for n in (0, 1):
            followers.append(subprocess.Popen(
                [sys.executable, "-c", _FOLLOW_WHEN_THERE, server.url, f"w{n}-s0"], stdout=subprocess.PIPE, env=env))
        acked: dict[str, str] = {}
        for w in writers:
            out, _ = w.communicate(timeout=SECONDS + 600)
            assert w.returncode == 0
            acked.update(json.loads(out))
        seen = []
        for f in followers:
            out, _ = f.communicate(timeout=600)
            assert f.returncode == 0
            seen.append(json.loads(out))
    assert len(acked) >= WRITERS
    with Store(tmp_path / "served") as st:
        for sid, head in acked.items():
            s = st.read(sid)
            assert s.head == head, sid
            assert head in s.own
        for n, order in enumerate(seen):
            assert order == st.read(f"w{n}-s0").log_order
        report = fsck(st)
        assert report.ok, [str(p) for p in report.errors]


#: A follower that waits for the session to exist (its writer's first push), then
#: follows it until its head has stopped at the writer's last entry of that session.
_FOLLOW_WHEN_THERE = r"""
import json, sys, time
from agentsession_cas.errors import NoSuchSessionError
from agentsession_cas.exchange.following import follow_remote
from agentsession_cas.exchange.http_client import HttpTransport
url, sid = sys.argv[1], sys.argv[2]
t = HttpTransport(url)
deadline = time.monotonic() + 600
while t.session_header(sid) is None and time.monotonic() < deadline:
    time.sleep(0.05)
seen = []
for change in follow_remote(t, sid):
    if change.entry is not None:
        seen.append(change.entry.id)
    if len(seen) == 41:
        break
print(json.dumps(seen), flush=True)
"""
