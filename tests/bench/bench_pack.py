#!/usr/bin/env python3
"""Benchmark: ``Store.pack()`` against git, and reads as packs accumulate.

Issue 6, "Performance". In one process, against baselines measured in the
same run:

1. **pack size**: a store holding the deterministic benchmark session of
   ``bench_verify.py`` (:func:`bench_verify.generate`, 100,000 entries by
   default) plus ``--forks`` forks of it (each a session created with a
   ``base`` on the session's path, the bases spread evenly along it, with 5
   to 20 own entries appended), then ``Store.pack()`` (a full repack). The
   same canonical objects (every envelope, content and blob, read through
   ``FileObjects.names``/``get``) go into a git repository as blobs with
   ``git fast-import``, each at ``<space>/<2 hex>/<62 hex>`` in the tree of one
   commit (so gc keeps them), then ``git gc --aggressive``. Target: our
   ``.pack`` + ``.idx`` at most **half** of git's ``.pack`` + ``.idx``.
2. **pack time**: ``Store.pack()`` against ``git repack -adf`` of that
   repository. Target: at most **twice** git's time.
3. **reads as packs accumulate**: a store of many small sessions written
   with ``sync='never'`` in checkpoint-sized batches, so one pack per session
   (about 50), against the same store with the same blocks in one pack.
   Medians of ``Store(path).session(id)`` + one append + close, and of a
   random ``Store.entry(id)``. Target: ratio (many / one) <= 1.5.

When the size target is missed (or with ``--analyze``), the objects are
compressed again in other ways (per space, zstd levels, block sizes, a
trained dictionary, git's zlib per object) so the numbers say where the
bytes go.

Temp dirs live under ``<repo>/.bench-tmp`` (the repository's filesystem;
checked) and are removed at the end unless ``--keep``. A missed target is a
measurement, not a failure: the exit status is 0 either way; 1 when the
store or git fails or the pack loses an object, 2 on bad arguments.

Run: ``.venv/bin/python tests/bench/bench_pack.py [--quick | --entries N]
[--forks N] [--packs N] [--reps N] [--only size,latency] [--analyze] [--keep]``.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from random import Random

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import zstandard  # noqa: E402

import agentsession_cas  # noqa: E402
from agentsession_cas import Header  # noqa: E402
from agentsession_cas.backends.files.locks import FileLock  # noqa: E402
from agentsession_cas.backends.files.objects import REPACK_BLOCK, REPACK_LEVEL, REPACK_THREADS, SPACES  # noqa: E402
from agentsession_cas.backends.files.packs import BLOCK_TARGET, SPACE_BITS, Pack, PackWriter  # noqa: E402
from agentsession_cas.backends.files.sessions import CHECKPOINT_ENTRIES  # noqa: E402 - after the sys.path set-up
from agentsession_cas.store import Store  # noqa: E402
from bench_verify import generate  # noqa: E402

DEFAULT_ENTRIES, QUICK_ENTRIES = 100_000, 10_000
DEFAULT_FORKS = 100
DEFAULT_PACKS = 50
TARGET_SIZE = 0.5  # our pack+idx / git gc --aggressive pack+idx, at most
TARGET_TIME = 2.0  # Store.pack() / git repack -adf, at most
TARGET_LATENCY = 1.5  # many packs / one pack, at most
BENCHES = ("size", "latency")
TARGET_SESSION = "target-session"
CREATED = "2026-09-17T12:00:00Z"


# ---------------------------------------------------------------------------
# Helpers


def say(*args) -> None:
    print(*args, flush=True)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB"


class Results:
    def __init__(self):
        self.rows: list[tuple[str, float, str, bool]] = []

    def add(self, name: str, value: float, target: str, met: bool) -> None:
        self.rows.append((name, value, target, met))
        say(f"  RESULT {name}: {'MET' if met else 'NOT MET'} ({value:.3f}, target {target})")


class BenchError(Exception):
    """Something the numbers cannot stand on (git failed, an object went missing)."""


def _git(repo: str, *args: str, capture: bool = False) -> str:
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", HOME=repo)  # no user or system config
    proc = subprocess.run(["git", "-C", repo, *args], env=env, capture_output=True)
    if proc.returncode != 0:
        raise BenchError(f"git {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode() if capture else ""


def _pack_files(pack_dir: str) -> dict[str, int]:
    """Bytes by extension (.pack, .idx, others) of the files in a pack directory."""
    out: dict[str, int] = {}
    try:
        names = os.listdir(pack_dir)
    except FileNotFoundError:
        return out
    for n in names:
        ext = os.path.splitext(n)[1] or n
        out[ext] = out.get(ext, 0) + os.path.getsize(os.path.join(pack_dir, n))
        out["#" + ext] = out.get("#" + ext, 0) + 1
    return out


def _loose(store_root: str) -> tuple[int, int]:
    """(count, bytes) of loose objects."""
    files = size = 0
    for space in SPACES:
        for dirpath, _, names in os.walk(os.path.join(store_root, "objects", space)):
            for n in names:
                files += 1
                size += os.path.getsize(os.path.join(dirpath, n))
    return files, size


def _body(entry) -> dict:
    """An entry's members without its id and parent, to append elsewhere."""
    data = dict(entry.data)
    data.pop("id", None)
    data.pop("parent", None)
    return data


# ---------------------------------------------------------------------------
# 1 and 2: a session and its forks, Store.pack() vs git


def resume_path(entries: list, leaf: str) -> list:
    """root..leaf of the generated session."""
    by_id = {e.id: e for e in entries}
    out = []
    cur = leaf
    while cur is not None:
        e = by_id[cur]
        out.append(e)
        cur = e.parent
    out.reverse()
    return out


def fork_plan(path: list, forks: int, seed: int, bodies: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(fork id, base, own entry bodies) for each fork: bases spread evenly along
    the path (never a label), 5-20 own entries each."""
    rng = Random(seed ^ 0x5F0F)
    plan = []
    used = 0
    for i in range(forks):
        at = min(len(path) - 1, (i + 1) * len(path) // (forks + 1))
        while at > 0 and path[at].type == "label":
            at -= 1
        k = rng.randint(5, 20)
        own = [bodies[(used + j) % len(bodies)] for j in range(k)]
        used += k
        plan.append((f"fork-{i:03d}", path[at].id, own))
    return plan


def build_forked_store(root: str, data: bytes, plan) -> dict:
    """Import the session, then create and fill each fork, through the API."""
    stats: dict = {}
    Store.init(root, sync="never").close()
    st = Store(root, sync="never")
    try:
        t0 = time.perf_counter()
        main = st.import_bytes(data, source="<bench>")
        stats["import_s"] = time.perf_counter() - t0
        stats["main_entries"] = len(main)
        t0 = time.perf_counter()
        own_total = 0
        for i, (fid, base, own) in enumerate(plan):
            f = st.create(Header.new(fid, created_at=CREATED, base=base))
            for body in own:
                f.append(body)
            own_total += len(own)
            f.close()
            if (i + 1) % 25 == 0:
                say(f"    ... {i + 1} forks created ({time.perf_counter() - t0:.0f} s)")
        stats["forks_s"] = time.perf_counter() - t0
        stats["fork_entries"] = own_total
    finally:
        st.close()
    return stats


def read_all_objects(root: str) -> list[tuple[str, str, bytes]]:
    """Every object of the store, as (space, name, bytes), through the public reads,
    asked for in the order they lie (hash order would decompress a block per object)."""
    out = []
    with Store(root, readonly=True) as st:
        objs = st.objects
        wanted = [(space, name) for space in SPACES for name in objs.names(space)]

        def where(item):
            found = objs.packs.locate(item[1])
            return (0, found[0].name, found[1].block, found[1].offset) if found else (1, "", 0, 0)

        for space, name in sorted(wanted, key=where):
            out.append((space, name, objs.get(space, name)))
    return out


def pack_order_objects(root: str) -> list[tuple[int, bytes]]:
    """(space bits, bytes) of every object of the store's one pack, in the order they
    lie in it (what our compressor saw)."""
    out = []
    pdir = os.path.join(root, "objects", "pack")
    idxs = sorted(n for n in os.listdir(pdir) if n.endswith(".idx"))
    for n in idxs:
        p = Pack(os.path.join(pdir, n))
        try:
            for b, objs in enumerate(p.objects_by_block()):
                if not objs:
                    continue
                block = p.read_block(b)
                for offset, length, _raw, spaces in objs:
                    out.append((spaces, block.object(offset, length)))
        finally:
            p.close()
    return out


def fast_import(repo: str, objects: list[tuple[str, str, bytes]]) -> float:
    """A bare repository holding every object as a blob at <space>/<2hex>/<62hex>
    of one commit; returns the fast-import's seconds."""
    os.makedirs(repo)
    _git(repo, "init", "-q", "--bare")
    _git(repo, "config", "gc.auto", "0")
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", HOME=repo)
    t0 = time.perf_counter()
    proc = subprocess.Popen(["git", "-C", repo, "fast-import", "--quiet", "--done"], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    w = proc.stdin.write
    for i, (_, _, data) in enumerate(objects, start=1):
        w(b"blob\nmark :%d\ndata %d\n" % (i, len(data)))
        w(data)
        w(b"\n")
    w(b"commit refs/heads/main\ncommitter Bench <bench@example.invalid> 1789646400 +0000\ndata 15\nbench objects\n\n")
    for i, (space, name, _) in enumerate(objects, start=1):
        w(b"M 100644 :%d %s/%s/%s\n" % (i, space.encode(), name[7:9].encode(), name[9:].encode()))
    w(b"\ndone\n")
    proc.stdin.close()
    err = proc.stderr.read() if proc.stderr else b""
    rc = proc.wait()
    if rc != 0:
        raise BenchError(f"git fast-import exited {rc}: {err.decode(errors='replace').strip()}")
    return time.perf_counter() - t0


def git_pack_breakdown(repo: str) -> dict[str, list[int]]:
    """type -> [objects, bytes in pack, deltas] from ``git verify-pack -v``, plus
    per-blob sizes by git name under "sizes"."""
    pdir = os.path.join(repo, "objects", "pack")
    out: dict = {"sizes": {}}
    for n in sorted(os.listdir(pdir)):
        if not n.endswith(".idx"):
            continue
        text = _git(repo, "verify-pack", "-v", os.path.join(pdir, n), capture=True)
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 5 or len(parts[0]) != 40 or parts[1] not in ("blob", "tree", "commit", "tag"):
                continue
            row = out.setdefault(parts[1], [0, 0, 0])
            row[0] += 1
            row[1] += int(parts[3])
            row[2] += len(parts) >= 7
            if parts[1] == "blob":
                out["sizes"][parts[0]] = int(parts[3])
    return out


def bench_size(tmp: str, data: bytes, entries: list, leaf: str, forks: int, seed: int, res: Results,
               analyze: bool) -> bool:
    n = len(entries)
    say(f"\n[1,2] a store of the {n:,}-entry session + {forks} forks: Store.pack() vs git")
    path = resume_path(entries, leaf)
    fork_src = generate(max(40, 20 * forks), seed + 1)[1]  # the forks' own entries: another session's
    bodies = [_body(e) for e in fork_src if e.type in ("item", "response")]
    plan = fork_plan(path, forks, seed, bodies)
    depths = sorted(next(i for i, e in enumerate(path) if e.id == base) + 1 for _, base, _ in plan)
    say(f"    session: {len(data) / 1e6:.1f} MB, resume path {len(path):,} entries; fork bases at depths "
        f"{depths[0]:,}..{depths[-1]:,} (median {statistics.median(depths):,.0f}), "
        f"{sum(len(o) for _, _, o in plan):,} own fork entries")
    root = os.path.join(tmp, "forked")
    stats = build_forked_store(root, data, plan)
    say(f"    built through the API: import {stats['import_s']:.1f} s ({stats['main_entries']:,} entries), "
        f"{forks} forks created and filled in {stats['forks_s']:.1f} s")
    before = _pack_files(os.path.join(root, "objects", "pack"))
    lc, lb = _loose(root)
    say(f"    before pack: {before.get('#.idx', 0)} pack(s) {_mb(before.get('.pack', 0) + before.get('.idx', 0))}, "
        f"{lc:,} loose objects {_mb(lb)}")

    # Ours: a full repack.
    os.sync()
    with Store(root) as st:
        gc.collect()
        t0 = time.perf_counter()
        rp = st.pack()
        ours_s = time.perf_counter() - t0
    if rp.problems:
        raise BenchError(f"Store.pack() reported problems: {rp.problems[:5]}")
    after = _pack_files(os.path.join(root, "objects", "pack"))
    lc2, lb2 = _loose(root)
    ours_pack, ours_idx = after.get(".pack", 0), after.get(".idx", 0)
    ours = ours_pack + ours_idx + lb2
    say(f"    Store.pack() (level {REPACK_LEVEL}, {REPACK_BLOCK // 1024} KiB blocks): {ours_s:.2f} s, "
        f"{rp.objects:,} objects into {after.get('#.idx', 0)} pack")

    objects = read_all_objects(root)
    raw_total = sum(len(d) for *_, d in objects)
    by_space: dict[str, list[int]] = {}
    for space, _, d in objects:
        row = by_space.setdefault(space, [0, 0])
        row[0] += 1
        row[1] += len(d)
    say(f"    objects: {len(objects):,} ({', '.join(f'{s} {c:,} = {_mb(b)}' for s, (c, b) in by_space.items())}), "
        f"raw {_mb(raw_total)}")
    if len(objects) != rp.objects:
        raise BenchError(f"the pack says {rp.objects} objects but the store reads {len(objects)}")

    # Git: the same objects as blobs.
    repo = os.path.join(tmp, "git")
    fi_s = fast_import(repo, objects)
    gdir = os.path.join(repo, "objects", "pack")
    fi = _pack_files(gdir)
    say(f"    git fast-import: {fi_s:.1f} s, {_mb(fi.get('.pack', 0))} pack")
    os.sync()
    t0 = time.perf_counter()
    _git(repo, "repack", "-adf", "-q")
    git_repack_s = time.perf_counter() - t0
    rpk = _pack_files(gdir)
    t0 = time.perf_counter()
    _git(repo, "gc", "--aggressive", "-q")
    git_gc_s = time.perf_counter() - t0
    ggc = _pack_files(gdir)
    git_pack, git_idx = ggc.get(".pack", 0), ggc.get(".idx", 0)
    git_total = git_pack + git_idx
    extra = {k: v for k, v in ggc.items() if k not in (".pack", ".idx") and not k.startswith("#")}
    bd = git_pack_breakdown(repo)
    threads = os.cpu_count()

    say("\n    sizes (pack + index on both sides):")
    say(f"      {'':34} {'.pack':>12} {'.idx':>11} {'together':>12}  ratio to raw")
    say(f"      {'ours: Store.pack()':34} {_mb(ours_pack):>12} {_mb(ours_idx):>11} {_mb(ours):>12}  "
        f"{raw_total / ours:5.2f}x" + (f"   (+ {lc2} loose objects left, {_mb(lb2)}, counted)" if lc2 else ""))
    say(f"      {'git repack -adf':34} {_mb(rpk.get('.pack', 0)):>12} {_mb(rpk.get('.idx', 0)):>11} "
        f"{_mb(rpk.get('.pack', 0) + rpk.get('.idx', 0)):>12}  {raw_total / (rpk.get('.pack', 0) + rpk.get('.idx', 0)):5.2f}x")
    say(f"      {'git gc --aggressive':34} {_mb(git_pack):>12} {_mb(git_idx):>11} {_mb(git_total):>12}  "
        f"{raw_total / git_total:5.2f}x" + (f"   (other files, not counted: {extra})" if extra else ""))
    for typ in ("blob", "tree", "commit"):
        if typ in bd:
            c, b, deltas = bd[typ]
            say(f"        git gc pack, {typ + 's':7}: {c:>8,} objects, {_mb(b):>11} in the pack, {deltas:,} stored as deltas")
    size_ratio = ours / git_total
    say(f"      ratio ours / git gc --aggressive (pack+idx): {size_ratio:.3f}   (target <= {TARGET_SIZE})")
    if "blob" in bd:
        say(f"      (git's blobs alone, without its tree, commit and index: {_mb(bd['blob'][1])}; "
            f"ours / that = {ours / bd['blob'][1]:.3f})")

    time_ratio = ours_s / git_repack_s
    say(f"\n    time (the machine has {threads} cores shared with other users; git's pack.threads defaults to them, "
        f"Store.pack() compresses on {REPACK_THREADS} thread(s) beside its reading):")
    say(f"      ours: Store.pack()       {ours_s:8.2f} s")
    say(f"      git repack -adf          {git_repack_s:8.2f} s")
    say(f"      git gc --aggressive      {git_gc_s:8.2f} s   (for scale)")
    say(f"      ratio ours / git repack -adf: {time_ratio:.3f}   (target <= {TARGET_TIME})")
    res.add("pack size: ours / git gc --aggressive (pack+idx)", size_ratio, f"<= {TARGET_SIZE}", size_ratio <= TARGET_SIZE)
    res.add("pack time: Store.pack() / git repack -adf", time_ratio, f"<= {TARGET_TIME}", time_ratio <= TARGET_TIME)

    if analyze or size_ratio > TARGET_SIZE:
        analyze_size(root, objects, bd, ours_pack, ours_idx, git_total)
    shutil.rmtree(repo, ignore_errors=True)
    return True


# ---------------------------------------------------------------------------
# Where the bytes go


_HEX_RUN = re.compile(rb"[0-9a-f]{24,}")
_B64_RUN = re.compile(rb"[A-Za-z0-9+/]{64,}={0,2}")


def _blocks(items: list[bytes], target: int) -> list[bytes]:
    """Concatenate items into blocks as PackWriter does (close a block at ``target``)."""
    out, buf, n = [], [], 0
    for d in items:
        if n and n + len(d) > target:
            out.append(b"".join(buf))
            buf, n = [], 0
        buf.append(d)
        n += len(d)
        if n >= target:
            out.append(b"".join(buf))
            buf, n = [], 0
    if buf:
        out.append(b"".join(buf))
    return out


def _zstd_blocks(items: list[bytes], level: int, target: int, *, dict_data=None, params=None) -> tuple[int, float]:
    """(compressed bytes, seconds) of items packed in blocks as PackWriter does."""
    if params is not None:
        cctx = zstandard.ZstdCompressor(compression_params=params, dict_data=dict_data)
    else:
        cctx = zstandard.ZstdCompressor(level=level, write_checksum=False, dict_data=dict_data)
    blocks = _blocks(items, target)
    t0 = time.perf_counter()
    total = sum(len(cctx.compress(b)) for b in blocks)
    return total, time.perf_counter() - t0


def _one_read_us(items: list[bytes], level: int, target: int, *, dict_data=None, samples: int = 40) -> float:
    """Median microseconds to decompress one block (what reading one object costs)."""
    blocks = _blocks(items, target)
    step = max(1, len(blocks) // samples)
    cctx = zstandard.ZstdCompressor(level=level, write_checksum=False, dict_data=dict_data)
    dctx = zstandard.ZstdDecompressor(dict_data=dict_data)
    times = []
    for b in blocks[::step][:samples]:
        c = cctx.compress(b)
        t0 = time.perf_counter()
        dctx.decompress(c, max_output_size=len(b))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def analyze_size(root: str, objects, bd, ours_pack: int, ours_idx: int, git_total: int) -> None:
    say("\n    analysis: the same objects compressed other ways (sizes are the compressed object data only,"
        " no index)")
    ordered = pack_order_objects(root)  # what Store.pack() compressed, in its order
    raw = sum(len(d) for _, d in ordered)
    say(f"      our pack's data: {_mb(ours_pack)} for {_mb(raw)} raw ({raw / ours_pack:.2f}x); index {_mb(ours_idx)} "
        f"= {ours_idx / len(ordered):.1f} B/object = {100 * ours_idx / (ours_pack + ours_idx):.1f}% of pack+idx")

    # Per space: ours (zstd, blocks of that space only) and git's (zlib per object,
    # and what git gc actually stored for those blobs).
    git_name = {}
    for space, _name, d in objects:
        git_name.setdefault(space, []).append(hashlib.sha1(b"blob %d\0" % len(d) + d).hexdigest())
    sizes = bd.get("sizes", {})
    say(f"      {'space':10} {'objects':>9} {'raw':>12} {'zstd 9/1MiB':>12} {'ratio':>6} {'zlib/object':>12} "
        f"{'ratio':>6} {'git gc blobs':>13} {'ratio':>6}")
    for space in SPACES:
        bit = SPACE_BITS[space]
        items = [d for s, d in ordered if s & bit]
        if not items:
            continue
        r = sum(len(d) for d in items)
        z, _ = _zstd_blocks(items, REPACK_LEVEL, REPACK_BLOCK)
        zl = sum(len(zlib.compress(d, 6)) for d in items)
        g = sum(sizes.get(h, 0) for h in git_name.get(space, []))
        say(f"      {space:10} {len(items):>9,} {_mb(r):>12} {_mb(z):>12} {r / z:5.2f}x {_mb(zl):>12} {r / zl:5.2f}x "
            f"{_mb(g):>13} {(r / g if g else 0):5.2f}x")

    items = [d for _, d in ordered]
    say(f"      all objects in pack order ({len(items):,}, {_mb(raw)}), zstd in blocks; 'read' is the median time to "
        "decompress one block, what a read of one object pays on a cache miss:")
    say(f"      {'level':>6} {'block':>8} {'compressed':>12} {'ratio':>6} {'MB/s':>7} {'read us':>8}")
    grid = [(3, 256 << 10), (3, 1 << 20), (9, 256 << 10), (9, 1 << 20), (9, 4 << 20), (12, 1 << 20),
            (15, 1 << 20), (19, 1 << 20), (19, 4 << 20)]
    for level, target in grid:
        z, s = _zstd_blocks(items, level, target)
        say(f"      {level:>6} {target // 1024:>6}Ki {_mb(z):>12} {raw / z:5.2f}x {raw / 1e6 / s:7.1f} "
            f"{_one_read_us(items, level, target):8.0f}")
    # Long-distance matching and a bigger window, at the repack's level and block.
    for target in (1 << 20, 16 << 20):
        params = zstandard.ZstdCompressionParameters.from_level(
            REPACK_LEVEL, window_log=24, enable_ldm=True, source_size=target)
        z, s = _zstd_blocks(items, REPACK_LEVEL, target, params=params)
        say(f"      {REPACK_LEVEL:>6} {target // 1024:>6}Ki {_mb(z):>12} {raw / z:5.2f}x {raw / 1e6 / s:7.1f}"
            f"          (long-distance matching, window 16 MiB)")
    # Envelopes and contents in separate blocks (grouped by space, each in pack order).
    env = [d for s, d in ordered if s & SPACE_BITS["entries"]]
    rest = [d for s, d in ordered if not s & SPACE_BITS["entries"]]
    ze, _ = _zstd_blocks(env, REPACK_LEVEL, REPACK_BLOCK)
    zr, _ = _zstd_blocks(rest, REPACK_LEVEL, REPACK_BLOCK)
    say(f"      envelopes and contents in separate blocks, level {REPACK_LEVEL}, {REPACK_BLOCK // 1024} KiB: "
        f"{_mb(ze + zr)} ({raw / (ze + zr):.2f}x; envelopes {_mb(ze)}, the rest {_mb(zr)})")
    # A dictionary trained on the store's own objects: per block and per object.
    rng = Random(7)
    sample = rng.sample(items, min(len(items), 20_000))
    for dsize in (110 * 1024, 1 << 20):
        t0 = time.perf_counter()
        d = zstandard.train_dictionary(dsize, sample, k=1024, d=8, level=REPACK_LEVEL, threads=1)
        train_s = time.perf_counter() - t0
        dd = d.as_bytes()
        zb, _ = _zstd_blocks(items, REPACK_LEVEL, 256 << 10, dict_data=d)
        cctx = zstandard.ZstdCompressor(level=REPACK_LEVEL, dict_data=d, write_checksum=False,
                                        write_content_size=True, write_dict_id=False)
        t0 = time.perf_counter()
        zo = sum(len(cctx.compress(x)) for x in items)
        per_obj_s = time.perf_counter() - t0
        say(f"      dictionary of {len(dd) // 1024} KiB trained on {len(sample):,} objects ({train_s:.1f} s): "
            f"256 KiB blocks {_mb(zb + len(dd))} ({raw / (zb + len(dd)):.2f}x); each object alone "
            f"{_mb(zo + len(dd))} ({raw / (zo + len(dd)):.2f}x, {raw / 1e6 / per_obj_s:.1f} MB/s)")
    # The floor no compressor goes below: random material (hex ids and hashes, base64
    # payloads) costs its entropy, each distinct run counted once.
    hex_runs: set[bytes] = set()
    b64_runs: set[bytes] = set()
    for d in items:
        hex_runs.update(_HEX_RUN.findall(d))
        b64_runs.update(_B64_RUN.findall(d))
    hex_b, b64_b = sum(map(len, hex_runs)), sum(map(len, b64_runs))
    floor = hex_b // 2 + b64_b * 3 // 4
    say(f"      random material in the objects (distinct runs): hex ids and hashes {_mb(hex_b)} "
        f"(entropy {_mb(hex_b // 2)}), base64 {_mb(b64_b)} (entropy {_mb(b64_b * 3 // 4)}); "
        f"together {100 * (hex_b + b64_b) / raw:.0f}% of raw, a floor of {_mb(floor)}")
    say(f"      even at that floor for the data, with the rest free: {_mb(floor + ours_idx)} with our index = "
        f"{(floor + ours_idx) / git_total:.3f} of git's pack+idx (target {TARGET_SIZE}); our data is "
        f"{ours_pack / floor:.2f}x the floor, git's blobs {bd.get('blob', [0, 0])[1] / floor:.2f}x")
    no_idx_target = TARGET_SIZE * git_total - ours_idx
    say(f"      to meet the size target with this index ({_mb(ours_idx)}), the pack data must be at most "
        f"{_mb(no_idx_target)} ({raw / max(no_idx_target, 1):.2f}x of raw)")


# ---------------------------------------------------------------------------
# 3: reads and appends as packs accumulate


def _hold_pack_lock(root: str) -> FileLock:
    """Hold the store's pack lock, as a concurrent ``agentsession pack`` would: merges
    of small packs (on a writer's checkpoint and close) then leave the packs as they
    are."""
    os.makedirs(os.path.join(root, "locks"), exist_ok=True)
    lock = FileLock(os.path.join(root, "pack.lock"))
    lock.acquire(timeout=0)
    return lock


def build_many_packs(root: str, entries: list, sessions: int, per_session: int) -> list[str]:
    """A store of ``sessions`` sessions of ``per_session`` entries each, plus the
    target session (3 entries), written with sync 'never': each session's
    checkpoint writes one pack, none is merged (the pack lock is held). Returns the
    entry ids written."""
    Store.init(root, sync="never").close()
    lock = _hold_pack_lock(root)
    ids: list[str] = []
    try:
        bodies = [_body(e) for e in entries if e.type in ("item", "response", "config")]
        with Store(root, sync="never") as st:
            s = st.create(Header.new(TARGET_SESSION, created_at=CREATED))
            for j in range(3):
                ids.append(s.append(bodies[j]).id)
            s.close()
        k = 0
        for i in range(sessions):
            with Store(root, sync="never") as st:
                s = st.create(Header.new(f"many-{i:03d}", created_at=CREATED))
                for _ in range(per_session):
                    # Cycled bodies still make new entries: each hangs from a new parent.
                    ids.append(s.append(bodies[k % len(bodies)]).id)
                    k += 1
                s.close()
    finally:
        lock.release()
    return ids


def one_pack_copy(src: str, dst: str) -> None:
    """The same store with its packs' blocks, unchanged, in one pack (PackWriter.copy_pack)."""
    shutil.copytree(src, dst)
    pdir = os.path.join(dst, "objects", "pack")
    packs = [Pack(os.path.join(pdir, n)) for n in sorted(os.listdir(pdir)) if n.endswith(".idx")]
    packs.sort(key=lambda p: os.path.getmtime(p.path))
    w = PackWriter(pdir, os.path.join(dst, "tmp"))
    for p in packs:
        w.copy_pack(p)
    idx = w.finish()
    for p in packs:
        p.close()
        if p.idx_path != idx:
            os.unlink(p.idx_path)
            os.unlink(p.path)


_APPEND_N = [0]


def _open_append_close(path: str, _arg) -> None:
    _APPEND_N[0] += 1
    n = _APPEND_N[0]
    st = Store(path)
    s = st.session(TARGET_SESSION)
    s.append({"type": "info", "name": f"append {n} to see the latency"})  # ts: now
    s.close()
    st.close()


def _time_interleaved(fn, paths: list[str], args: list, warm: int = 5) -> list[list[float]]:
    """Per-path times of fn(path, arg) for each arg, the paths interleaved so drift hits all alike."""
    out: list[list[float]] = [[] for _ in paths]
    for p in paths:
        for a in args[:warm]:
            fn(p, a)
    gc.collect()
    pc = time.perf_counter
    for a in args:
        for i, p in enumerate(paths):
            t0 = pc()
            fn(p, a)
            out[i].append(pc() - t0)
    return out


def _med_p90(xs: list[float]) -> tuple[float, float]:
    return statistics.median(xs), sorted(xs)[int(len(xs) * 0.9)]


def bench_latency(tmp: str, entries: list, packs: int, per_session: int, reps: int, seed: int, res: Results) -> None:
    say(f"\n[3] open + append + close, and a random entry read: ~{packs} packs vs 1 (same blocks)")
    many, one, repacked = (os.path.join(tmp, n) for n in ("many-packs", "one-pack", "repacked"))
    t0 = time.perf_counter()
    ids = build_many_packs(many, entries, packs, per_session)
    build_s = time.perf_counter() - t0
    one_pack_copy(many, one)
    shutil.copytree(one, repacked)
    with Store(repacked) as st:
        st.pack()
    info = {p: _pack_files(os.path.join(p, "objects", "pack")) for p in (many, one, repacked)}
    say(f"    built: {packs} sessions of {per_session:,} entries + the target session (3 entries), sync 'never', "
        f"in {build_s:.1f} s; {len(ids):,} entries")
    for label, p in (("many", many), ("one", one), ("repacked", repacked)):
        f = info[p]
        lc, _ = _loose(p)
        say(f"    {label:9}: {f.get('#.idx', 0):3} pack(s), {_mb(f.get('.pack', 0))} + idx {_mb(f.get('.idx', 0))}, "
            f"{lc} loose objects")
    os.sync()
    time.sleep(1)

    locks = [_hold_pack_lock(p) for p in (many, one, repacked)]
    try:
        # open + one append + close (sync 'always', the default: the append and close fsync).
        t_many, t_one = _time_interleaved(_open_append_close, [many, one], list(range(reps)))
        (m_med, m_p90), (o_med, o_p90) = _med_p90(t_many), _med_p90(t_one)
        r1 = m_med / o_med
        say(f"    Store(path).session(id) + append + close: 1 pack median {o_med * 1e3:7.2f} ms (p90 {o_p90 * 1e3:.2f}), "
            f"{packs} packs median {m_med * 1e3:7.2f} ms (p90 {m_p90 * 1e3:.2f}); ratio {r1:.3f}  (target <= {TARGET_LATENCY})")
        res.add(f"open+append+close: {packs} packs / 1 pack", r1, f"<= {TARGET_LATENCY}", r1 <= TARGET_LATENCY)

        # A random entry, through a store kept open (its block cache of 16 blocks mostly misses).
        rng = Random(seed ^ 0xE17)
        picks = [rng.choice(ids) for _ in range(max(reps * 4, 400))]
        stores = {p: Store(p, readonly=True) for p in (many, one, repacked)}
        try:
            def entry(p, eid):
                stores[p].entry(eid)

            t_many, t_one, t_rep = _time_interleaved(entry, [many, one, repacked], picks)
            (m_med, m_p90), (o_med, o_p90), (r_med, r_p90) = _med_p90(t_many), _med_p90(t_one), _med_p90(t_rep)
            r2 = m_med / o_med
            say(f"    Store.entry(random id), store kept open: 1 pack median {o_med * 1e6:7.1f} us (p90 {o_p90 * 1e6:.1f}), "
                f"{packs} packs median {m_med * 1e6:7.1f} us (p90 {m_p90 * 1e6:.1f}); ratio {r2:.3f}  "
                f"(target <= {TARGET_LATENCY})")
            say(f"      (for scale, after Store.pack(): level {REPACK_LEVEL}, {REPACK_BLOCK // 1024} KiB blocks, median "
                f"{r_med * 1e6:.1f} us, p90 {r_p90 * 1e6:.1f}; the others have level 3, {BLOCK_TARGET // 1024} KiB blocks)")
            res.add(f"Store.entry(random): {packs} packs / 1 pack", r2, f"<= {TARGET_LATENCY}", r2 <= TARGET_LATENCY)

            # The index lookup alone: a present name and a missing one.
            missing = "sha256:" + "ab" * 32

            def locate(p, eid):
                stores[p].objects.packs.locate(eid)

            t_many, t_one = _time_interleaved(locate, [many, one], picks)
            tm_many, tm_one = _time_interleaved(locate, [many, one], [missing] * len(picks))
            say(f"      index lookup alone (PackSet.locate): present name median {statistics.median(t_one) * 1e6:.1f} us "
                f"with 1 pack, {statistics.median(t_many) * 1e6:.1f} us with {packs}; a missing name "
                f"{statistics.median(tm_one) * 1e6:.1f} us vs {statistics.median(tm_many) * 1e6:.1f} us")
        finally:
            for s in stores.values():
                s.close()
    finally:
        for lock in locks:
            lock.release()

    # Without the lock, the next writer's close merges the small packs (what keeps
    # packs from accumulating in the first place).
    before = _pack_files(os.path.join(many, "objects", "pack")).get("#.idx", 0)
    t0 = time.perf_counter()
    _open_append_close(many, None)
    dt = time.perf_counter() - t0
    after = _pack_files(os.path.join(many, "objects", "pack")).get("#.idx", 0)
    say(f"    without the pack lock held, one open + append + close of the {packs}-pack store took {dt * 1e3:.0f} ms "
        f"and left {after} pack(s) of {before} (Store.close merges small packs by size tier)")
    for p in (many, one, repacked):
        shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help=f"{QUICK_ENTRIES:,} entries; latency store of 50 x 200 entries, fewer repetitions")
    size.add_argument("--entries", type=int, default=None, help=f"entries of the session (default {DEFAULT_ENTRIES:,})")
    ap.add_argument("--forks", type=int, default=DEFAULT_FORKS, help=f"forks of the session (default {DEFAULT_FORKS})")
    ap.add_argument("--packs", type=int, default=DEFAULT_PACKS,
                    help=f"sessions, so packs, of the latency store (default {DEFAULT_PACKS})")
    ap.add_argument("--per-pack", type=int, default=None,
                    help=f"entries per session of the latency store (default {CHECKPOINT_ENTRIES}, 200 with --quick)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions of open+append+close (default 300, 100 with --quick)")
    ap.add_argument("--seed", type=int, default=20260917, help="generator seed")
    ap.add_argument("--only", default=",".join(BENCHES), help=f"comma-separated subset of {','.join(BENCHES)}")
    ap.add_argument("--analyze", action="store_true", help="print where the bytes go even when the size target is met")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    args = ap.parse_args(argv)
    q = args.quick
    count = QUICK_ENTRIES if q else (args.entries if args.entries is not None else DEFAULT_ENTRIES)
    per_pack = args.per_pack or (200 if q else CHECKPOINT_ENTRIES)
    reps = args.reps or (100 if q else 300)
    benches = tuple(b.strip() for b in args.only.split(",") if b.strip())
    bad = [b for b in benches if b not in BENCHES]
    if bad:
        ap.error(f"--only: unknown {', '.join(bad)}")
    if count < 10 or args.forks < 1 or args.packs < 2 or per_pack < 40 or reps < 10:
        ap.error("sizes: --entries >= 10, --forks >= 1, --packs >= 2, --per-pack >= 40, --reps >= 10")
    if reps > 1000:
        ap.error("--reps at most 1000 (each adds two loose objects; many more would set off an automatic pack)")
    if "size" in benches and shutil.which("git") is None:
        ap.error("git is not on PATH (needed for the size benchmark; use --only latency)")

    git_v = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip() if shutil.which("git") else "no git"
    say(f"bench_pack: agentsession-cas {agentsession_cas.__version__}, Python {platform.python_version()}, "
        f"zstandard {zstandard.__version__}, {git_v}, {platform.machine()}, {os.cpu_count()} CPUs "
        "(shared with other users: times vary from run to run)")
    base = ROOT / ".bench-tmp"
    base.mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-pack-", dir=base)
    same_fs = os.stat(tmp).st_dev == os.stat(ROOT).st_dev
    say(f"temp dir: {tmp} ({'same filesystem as the repository' if same_fs else 'WARNING: not the repository filesystem'})")
    t_start = time.perf_counter()
    ok = True
    res = Results()
    try:
        # The size benchmark needs the whole session; the latency store cycles through
        # the entries it has.
        need = count if "size" in benches else min(per_pack * args.packs + 3, count)
        t0 = time.perf_counter()
        data, entries, leaf = generate(need, args.seed)
        say(f"session: {need:,} entries generated in {time.perf_counter() - t0:.1f} s (seed {args.seed}), "
            f"{len(data) / 1e6:.1f} MB")
        try:
            if "size" in benches:
                bench_size(tmp, data, entries, leaf, args.forks, args.seed, res, args.analyze)
            if "latency" in benches:
                bench_latency(tmp, entries, args.packs, per_pack, reps, args.seed, res)
        except BenchError as exc:
            say(f"ERROR: {exc}")
            ok = False
        what = []
        if "size" in benches:
            what.append(f"session {count:,} entries + {args.forks} forks")
        if "latency" in benches:
            what.append(f"latency store {args.packs} x {per_pack:,} entries")
        say(f"\nSUMMARY ({time.perf_counter() - t_start:.0f} s; {'; '.join(what)}; {os.cpu_count()} shared cores)")
        for name, value, target, met in res.rows:
            say(f"  {'MET    ' if met else 'NOT MET'}  {name:<55} {value:8.3f}  (target {target})")
        say(f"  {sum(m for *_, m in res.rows)} of {len(res.rows)} targets met")
    finally:
        if args.keep:
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                base.rmdir()
            except OSError:
                pass
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
