"""Maintenance racing work (issue 16), played against a store at any URL.

Worker processes (race_worker.py) append to two sessions, push sessions in from a
store of their own, fork an appender's session while its writer holds it, and create
and delete sessions; meanwhile ``pack`` and ``sweep`` (at the default grace) run in one
loop of command processes and ``fsck`` in another. The race lasts a bounded time, and
at least a few operations of each kind whatever the machine's speed. Afterwards every
acknowledged append, push, fork and kept session is there whole, every deleted one is
gone, and ``fsck`` is clean. ``play`` returns what happened; the tests assert on it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from agentsession_cas.store.url import open_store

WORKER = Path(__file__).with_name("race_worker.py")
#: Each kind of operation, and each maintenance command, is done at least this often.
LEAST = 4


@dataclass
class Race:
    acks: Counter = field(default_factory=Counter)
    maintenance: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    fsck_during: Counter = field(default_factory=Counter)

    def figures(self) -> str:
        ops = ", ".join(f"{n} {k}" for k, n in sorted(self.acks.items()))
        runs = ", ".join(f"{n} {k}" for k, n in sorted(self.maintenance.items()))
        return f"acknowledged: {ops}; maintenance runs: {runs}; failures: {len(self.failures)}"


def command(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentsession_cas", "--store", url, *args],
                          capture_output=True, text=True, timeout=300)


def _wait_for_line(path: Path, limit: float = 120.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if path.exists() and path.read_text().strip():
            return
        time.sleep(0.05)
    raise AssertionError(f"{path.name}: the worker acknowledged nothing in {limit:.0f} s")


def play(url: str, work: Path, seconds: float, maintenance: tuple[tuple[str, ...], ...]) -> Race:
    """Race the workers against ``maintenance`` (command lines, looped) and ``fsck``."""
    race = Race()
    stop = work / "stop"
    procs: dict[str, tuple[subprocess.Popen, Path]] = {}

    def start(role: str, name: str, extra: str = "") -> None:
        out = work / f"{name}.acks"
        with open(out, "w") as f:
            p = subprocess.Popen([sys.executable, str(WORKER), role, url, name, str(stop), str(LEAST), extra],
                                 stdout=f, stderr=subprocess.STDOUT)
        procs[name] = (p, out)

    done = threading.Event()

    def loop(cmds: tuple[tuple[str, ...], ...], key: str) -> None:
        rounds = 0
        while not done.is_set() or rounds < LEAST:
            rounds += 1
            for cmd in cmds:
                r = command(url, *cmd)
                race.maintenance[cmd[0]] += 1
                text = r.stdout + r.stderr
                if "Traceback" in text or "internal error" in text:
                    race.failures.append(f"{' '.join(cmd)}: a traceback: {text[-600:]}")
                if cmd[0] == "fsck":
                    race.fsck_during[r.returncode] += 1
                    if r.returncode != 0:
                        race.failures.append(f"fsck during the race exit {r.returncode}: {text[-600:]}")
                elif r.returncode != 0:
                    race.failures.append(f"{' '.join(cmd)} exit {r.returncode}: {text[-400:]}")

    start("append", "a1")
    start("append", "a2")
    _wait_for_line(work / "a1.acks")
    start("fork", "f", "a1")
    start("push", "p", str(work / "pusher"))
    start("delete", "d")
    loops = [threading.Thread(target=loop, args=(maintenance, "maint")),
             threading.Thread(target=loop, args=((("fsck",),), "fsck"))]
    for t in loops:
        t.start()
    time.sleep(seconds)
    stop.write_text("stop")
    done.set()
    for t in loops:
        t.join(timeout=600)
    for name, (p, _) in procs.items():
        try:
            rc = p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        if rc != 0:
            race.failures.append(f"worker {name} exit {rc}")
    check(race, url, str(work / "pusher"), {name: out for name, (_, out) in procs.items()}, _fsck_command)
    return race


def _fsck_command(url: str) -> str | None:
    after = command(url, "fsck")
    text = after.stdout + after.stderr
    return None if after.returncode == 0 and "0 problem(s)" in text else text[-800:]


def _fsck_library(url: str) -> str | None:
    from agentsession_cas.maintenance.fsck import fsck

    report = fsck(url)
    return None if report.ok else "; ".join(p.message for p in report.errors)[:800]


def play_threads(url: str, work: Path, seconds: float) -> Race:
    """The same race inside this process, for a store only this process reaches (memory:):
    the workers are threads, and sweep, pack and fsck run through the library in loops."""
    from race_worker import work as worker

    from agentsession_cas.maintenance.fsck import fsck

    race = Race()
    done = threading.Event()
    outs: dict[str, Path] = {}
    first = threading.Event()

    def start(role: str, name: str, extra: str = "") -> threading.Thread:
        out = outs[name] = work / f"{name}.acks"
        lock = threading.Lock()

        def say(line: str) -> None:
            with lock, open(out, "a") as f:
                f.write(line + "\n")
            first.set()

        t = threading.Thread(target=worker, args=(role, url, name, done.is_set, LEAST, extra, say))
        t.start()
        return t

    def loop(what: str) -> None:
        store = open_store(url)
        rounds = 0
        try:
            while not done.is_set() or rounds < LEAST:
                rounds += 1
                race.maintenance[what] += 1
                try:
                    if what == "fsck":
                        report = fsck(store)
                        race.fsck_during[0 if report.ok else 1] += 1
                        if not report.ok:
                            race.failures.append("fsck during the race: " + "; ".join(p.message for p in report.errors)[:600])
                    elif what == "sweep":
                        store.sweep()
                    else:
                        store.pack()
                except Exception as exc:  # a failure of maintenance is what the test looks for
                    race.failures.append(f"{what}: {type(exc).__name__}: {exc}")
                time.sleep(0.01)
        finally:
            store.close()

    threads = [start("append", "a1"), start("append", "a2")]
    first.wait(60)
    threads += [start("fork", "f", "a1"), start("push", "p", url + "-pusher"), start("delete", "d")]
    loops = [threading.Thread(target=loop, args=(w,)) for w in ("pack", "sweep", "fsck")]
    for t in loops:
        t.start()
    time.sleep(seconds)
    done.set()
    for t in threads + loops:
        t.join(timeout=600)
        if t.is_alive():
            race.failures.append("a thread did not end")
    check(race, url, url + "-pusher", outs, _fsck_library)
    return race


def check(race: Race, url: str, pusher: str, outs: dict[str, Path], fsck_after) -> None:  # type: ignore[no-untyped-def]
    """Every acknowledged operation is there whole; every deleted session is gone."""
    heads: dict[str, str] = {}
    appended: dict[str, list[str]] = {}
    deleted: set[str] = set()
    for name, out in outs.items():
        lines = out.read_text().splitlines()
        for line in lines:
            parts = line.split()
            kind = parts[0] if parts else ""
            if kind == "error" or kind not in ("append", "push", "fork", "kept", "deleted"):
                race.failures.append(f"worker {name}: {line[:500]}")
                continue
            race.acks[kind] += 1
            if kind == "append":
                appended.setdefault(parts[1], []).append(parts[2])
                heads[parts[1]] = parts[2]
            elif kind == "deleted":
                deleted.add(parts[1])
            else:
                heads[parts[1]] = parts[2]
    for kind in ("append", "push", "fork", "kept", "deleted"):
        if race.acks[kind] < 1:
            race.failures.append(f"no {kind} was acknowledged: the race proved nothing of it")
    problem = fsck_after(url)
    if problem is not None:
        race.failures.append(f"fsck after the race: {problem}")
    store = open_store(url)
    try:
        held = set(store.list())
        for sid in deleted & held:
            race.failures.append(f"session {sid}: deleted, still there")
        for sid, head in heads.items():
            if sid not in held:
                race.failures.append(f"session {sid}: acknowledged, gone")
                continue
            s = store.read(sid)
            try:
                if s.head != head:
                    race.failures.append(f"session {sid}: head {s.head}, acknowledged {head}")
                lost = [e for e in appended.get(sid, []) if e not in s]
                if lost:
                    race.failures.append(f"session {sid}: {len(lost)} acknowledged append(s) lost")
            finally:
                s.close()
        pushed = [sid for sid in heads if sid.startswith("p-")]
        if pushed:
            source = open_store(pusher)
            try:
                for sid in pushed:
                    if sid in held and store.export(sid) != source.export(sid):
                        race.failures.append(f"session {sid}: the pushed session exports otherwise")
            finally:
                source.close()
    finally:
        store.close()
