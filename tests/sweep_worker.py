"""A writer in its own process, appending while tests/test_sweep.py sweeps; not a test module.

``python sweep_worker.py STORE SESSION POLICY SECONDS SEED GENFILE``

Opens the store with sync policy POLICY and appends to SESSION (created when
absent) for SECONDS seconds, and on until the test has written GENFILE.stop (so
that it sweeps beside the writer as often as it means to, however slow the
machine). Bodies come from a small shared pool, tagged
with the generation number the test last wrote to GENFILE, or are unique.
The test writes each generation's pool bodies in a session it deletes at
once, then sweeps: a writer appending one of them re-puts an object the
sweep may be deciding over, which is the race a sweep must survive. Now and then it checkpoints a few appends (loose objects) or many (a
pack), branches from an older own entry, forks a new session from its head,
and closes and reopens the store (a writing close auto-packs and merges).
At the end it closes and prints, in one write, ``DONE <session>=<n> ...``:
every session it wrote and how many entries it appended there.
"""

from __future__ import annotations

import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from agentsession_cas import Header  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402

#: Bodies a test's deleted session also holds (their content objects are garbage there).
POOL = [f"shared body {i}: " + "the quick brown fox " * (i % 5) for i in range(40)]


def item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def pool_body(i: int, gen: int) -> str:
    return f"{POOL[i % len(POOL)]} (generation {gen})"


def generation(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def main() -> None:
    root, sid, policy, seconds, seed = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
    genfile = sys.argv[6]
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    st = Store(root, sync=policy)
    s = st.session(sid) if sid in st else st.create(Header.new(sid))
    own: list[str] = [e.id for e in s]
    end = time.monotonic() + seconds
    n = 0
    forks = 0
    stop = genfile + ".stop"
    while time.monotonic() < end or not os.path.exists(stop):
        n += 1
        gen = generation(genfile)
        text = pool_body(rng.randrange(len(POOL)), gen) if rng.random() < 0.5 else f"{sid} {seed} unique {n} " + "x" * rng.randint(0, 300)
        entry = {"type": "item", "item": item(text)}
        if own and rng.random() < 0.05:
            entry["parent"] = rng.choice(own)  # an abandoned branch
        own.append(s.append(entry).id)
        counts[sid] = counts.get(sid, 0) + 1
        r = rng.random()
        if r < 0.15:
            s.checkpoint()  # a few objects: loose files
        elif r < 0.17:
            for _ in range(40):  # then 80+ objects: a pack
                own.append(s.append({"type": "item", "item": item(pool_body(rng.randrange(len(POOL)), gen))}).id)
                counts[sid] += 1
            s.checkpoint()
        elif r < 0.18:
            s.commit()
        elif r < 0.19 and forks < 3:
            forks += 1
            s.commit()
            s.checkpoint()
            fid = f"{sid}-fork{forks}"
            f = st.create(Header.new(fid, base=s.head))
            for _ in range(rng.randint(1, 5)):
                f.append({"type": "item", "item": item(pool_body(rng.randrange(len(POOL)), gen))})
                counts[fid] = counts.get(fid, 0) + 1
            f.close()
        elif r < 0.20:
            st.close()  # a writing close: checkpoint, auto-pack, merges
            st = Store(root, sync=policy)
            s = st.session(sid)
    st.close()
    os.write(1, ("DONE " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())) + "\n").encode())


if __name__ == "__main__":
    main()
