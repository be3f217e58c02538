"""The line rules of a streamed verify on a second core (issue 11: verify and import of a
large file near the cost of a bare parse).

A streamed verify (:func:`~agentsession_cas.format.reader.verify_file`) does two kinds of
work: what :func:`~agentsession_cas.format.rules.check_line` decides about each line on
its own (I-JSON, canonical form, ``ts``, reserved members, the two hashes), and the
rules that need the lines in order (tree, records, context). The first kind is handed
here to a helper process, fed the very bytes this process reads (copied into memory the
two share, so the two cannot read different files), while this process parses and runs
the sequential rules. For each line the helper answers one of two things:

* **clean**: it parsed as a JSON object proven in canonical form, ``check_line`` found
  nothing wrong, so its ``id`` is the hash of its members; the helper sends the content
  hash, where the ``item`` object's bytes lie in the line (the request hashes take
  them) and, for an import, the entry's two objects, which this process uses instead of
  hashing again; into a file store, the helper makes them into compressed pack blocks
  itself (:class:`_Packing`, the file backend's ``ready_blocks``) and answers the
  block's lines with them, so the compression runs on its core too (:data:`PACKED`);
* **anything else** (a problem, a form not proven canonical, an ``item`` whose bytes
  are not found once in the line): this process runs today's line rules on that line
  itself, so every problem is found, worded and ordered exactly as in one process.

A stored session's verify (``verify ID``) hands the helper the entries' objects instead
(content and envelope bytes as the packs hold them, :meth:`LineHelper.built`): the helper
makes each line of them (:func:`~agentsession_cas.format.hashing.lines_of_bytes`) and
answers it as above, sending the line with its answer, so this process reads the objects
and runs the sequential rules, and a line the helper does not make (an envelope not of
the common form, a member name a line cannot be cut at) is made here.

The helper is only ever an accelerator, and this process never waits for it: blocks
are read a few ahead and sent as they are read; when a block's turn comes and its
answers are not there (the helper still starting, or behind on a loaded machine), this
process takes the block and checks it itself, unless the helper has begun it (a byte a
block in memory both map says which: the helper skips a block taken, so it gets ahead
again rather than answering for nothing). When the helper cannot be started, dies, is
killed or answers out of turn, the lines it did not answer are checked here. Either
way the verdict is the one-process verdict by construction. Small files, a machine
with one core for this process, standard input (no file) and
``AGENTSESSION_VERIFY_PROCESSES=1`` stay in one process (:func:`wanted`).

The helper is a fresh interpreter (:func:`command`), never a fork of this process,
which may be a server with threads running. It ignores Ctrl-C (the process it serves
decides), and it exits when its input ends or a pipe breaks; this process kills and
reaps it when the pass ends, however it ends, so it never outlives the pass.
"""

from __future__ import annotations

import atexit
import json
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, TypeVar

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    fcntl = None  # type: ignore[assignment]

from .canonical import loads_canonical
from .entry import Entry
from .hashing import lines_of_bytes
from .rules import check_line, gc_paused

#: ``AGENTSESSION_VERIFY_PROCESSES``: ``1`` keeps a verify in one process; ``2`` uses the
#: helper whatever the size and the cores (tests, benchmarks); unset: :func:`wanted` decides.
ENV = "AGENTSESSION_VERIFY_PROCESSES"

#: The smallest file the helper is started for: its start-up (an interpreter and the
#: rules' modules, about 0.1 s of the other core) pays for itself past a few megabytes.
MIN_BYTES = 8 << 20

#: How many blocks this process reads ahead of the one it passes on, and the most the
#: helper is given at once: enough that the helper has the next ones while this process
#: works, few enough to bound the memory (a block is about 1 MB: the reader's).
AHEAD = 3

#: Whether a pass waits for the helper (to be ready, and for each answer) rather than
#: checking a block itself when the helper's answer is not there yet: tests set it, so
#: the answers are used from the first block whatever the machine's load. (Measured at
#: 100,000 entries on an idle machine, the import with every block waited for: 3.32-3.35 s
#: against 2.70-2.82 s. Nor does the reader gain by taking more: answering the blocks read
#: ahead while it waits for one the helper has begun made it 2.95 s against 2.73-2.83 s,
#: and reading the answers owed for taken blocks as soon as they come, to send the helper
#: more, 2.84-2.86 s: the reader's in-order pass is the longer path, and line work moved
#: onto it lengthens it.)
WAIT = False

#: How long a pass waits for the rest of an answer the helper began, or for any answer
#: under :data:`WAIT`, before it gives the helper up (stopped, or starved of CPU) and
#: checks the lines itself: a safety net, far beyond the milliseconds a block takes.
STALL = 60.0

#: How a process of a large pass keeps its heap (glibc's tunables, for a process this
#: library starts: the helper, the index's sorting process; :func:`keep_heap` for this
#: one): the memory it frees kept for its next allocations rather than given back to the
#: system and taken again (the top of the heap trimmed only past 128 MiB, grown 64 MiB
#: at a time, and blocks under 4 MiB, a block of lines or of answers, taken from it
#: rather than mapped afresh): every page given back is a page fault when taken again,
#: and an import of 100,000 entries took about 135,000 of them where it takes 73,000 so
#: (0.17-0.29 s of system time less: tests/bench/README.md, session 33).
HEAP_TUNABLES = (("glibc.malloc.top_pad", 64 << 20), ("glibc.malloc.trim_threshold", 128 << 20),
                 ("glibc.malloc.mmap_threshold", 4 << 20))
#: mallopt's parameters for :data:`HEAP_TUNABLES`, in its order (glibc's malloc.h).
_MALLOPT = (-2, -1, -3)  # M_TOP_PAD, M_TRIM_THRESHOLD, M_MMAP_THRESHOLD


def _unnamed_tunables() -> list[tuple[int, str, int]]:
    """Those of :data:`HEAP_TUNABLES` that this process's ``GLIBC_TUNABLES`` does not name
    (a setting it names is the environment's word), each with its ``mallopt`` parameter."""
    said = os.environ.get("GLIBC_TUNABLES", "")
    named = {part.split("=", 1)[0] for part in said.split(":") if part}
    return [(param, name, value) for param, (name, value) in zip(_MALLOPT, HEAP_TUNABLES) if name not in named]


def heap_env() -> dict[str, str]:
    """The environment for a process a pass starts: this one's, with :data:`HEAP_TUNABLES`
    added to ``GLIBC_TUNABLES`` (each unless it names it already; ignored off glibc)."""
    env = dict(os.environ)
    more = [f"{name}={value}" for _, name, value in _unnamed_tunables()]
    if more:
        said = env.get("GLIBC_TUNABLES", "")
        env["GLIBC_TUNABLES"] = ":".join([*([said] if said else []), *more])
    return env


def keep_heap() -> None:
    """This process's heap kept as :data:`HEAP_TUNABLES` says (each unless
    ``GLIBC_TUNABLES`` names it), through glibc's ``mallopt`` (nothing off Linux): for a
    command about to make a large pass (``cli/main.py``), not for a library's caller,
    whose process it is."""
    unnamed = _unnamed_tunables()
    if not sys.platform.startswith("linux") or not unnamed:
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        for param, _, value in unnamed:
            mallopt(param, value)
    except (OSError, AttributeError, ImportError):  # no ctypes, no C library to speak to, or no mallopt in it
        return


#: fcntl's F_SETPIPE_SZ (Linux; the module names it from Python 3.10 on).
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # (fcntl None: AttributeError where used)

#: The claims both processes see, one byte a block sent (by its number, modulo the ring's
#: size: far more than the blocks in flight): ``FREE`` as sent, ``BEGUN`` when the helper
#: starts it, ``TAKEN`` when this process checks it itself, and the helper then skips it.
_RING = 4096
FREE, BEGUN, TAKEN = 0, 1, 2

#: After the claims, in the same shared memory, the blocks sent: block ``n`` is put in slot
#: ``n % _SLOTS`` and the pipe carries only its head, so the helper has a block whole the
#: moment it turns to it. Through the pipe alone (1 MB where unprivileged, a block a little
#: more) the helper waited for each block's last bytes until this process next wrote, a
#: block's work later, and had not begun the block when its turn came here: this process
#: took it. A slot is used again only once its block's answer is read: this process owes
#: answers for at most ``AHEAD + 1`` blocks (:meth:`LineHelper._send`). A block larger than
#: a slot (a very long line) goes through the pipe after its head.
_SLOTS = AHEAD + 1
_SLOT = 2 << 20

_FRAME = struct.Struct("<II")  # a frame's bytes after this head, and the lines it is of (the answers)
#: A block's head: its bytes, its lines, and where its bytes are in the shared memory (0:
#: they follow the head in the pipe).
_SENT = struct.Struct("<III")
_HASH_HEX = 64
_COUNT = struct.Struct("<i")  # the ready blocks an answer carries


def wanted(size: int, parallel: bool | None) -> bool:
    """Whether a verify of a file of ``size`` bytes takes the helper: ``parallel`` when the
    caller says (True or False), else the environment's word, else a file of at least
    :data:`MIN_BYTES` on a machine that gives this process two cores or more. Never off
    POSIX (the helper's pipes are polled), nor in an interpreter that cannot name itself
    (embedded: no ``sys.executable`` to start the helper with)."""
    if not hasattr(select, "poll") or not sys.executable:  # pragma: no cover - not POSIX, or embedded
        return False
    if parallel is not None:
        return parallel
    said = os.environ.get(ENV, "").strip()
    if said == "1":
        return False
    if said == "2":
        return True
    return size >= MIN_BYTES and _cores() >= 2


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


#: The helper's program: this module's :func:`main`, found where this process finds it
#: (its ``sys.path``, given as the first argument: the same copy of the package, and
#: nothing put before the standard library that this process does not put there).
_BOOT = "import json, sys; sys.path[:] = json.loads(sys.argv[1]); from agentsession_cas.format.parallel import main; sys.exit(main())"


def command(mode: str, claims: int | None) -> list[str]:
    """The helper's command line: this interpreter, in a process of its own (``claims``:
    the descriptor of the claims it shares with this process, see :class:`LineHelper`;
    ``mode``: what its answers carry beside the hashes, "" nothing, "objects" or "blocks",
    or "built": it is given entries' objects, and answers with the lines it made of them;
    :data:`_LATER`: told later)."""
    return [sys.executable, "-c", _BOOT, json.dumps(sys.path), "-" if claims is None else str(claims),
            *([mode] if mode else [])]


#: A helper's mode that :func:`start_early` gives (followed by the likely mode): what its
#: answers carry is told it later, by the first byte of its input, one of these (the modes
#: :func:`command` takes).
_LATER = "?"
_MODES = {"": b"-", "objects": b"o", "blocks": b"b", "built": b"l"}


#: What the helper answers of one line: None (check it yourself), or the content hash,
#: the ``item`` object's bytes' span in the line ((0, 0): no item object), and, when asked
#: for (an import writes them), the entry's two objects (content and envelope bytes), or
#: :data:`PACKED` when they are in the ready blocks that came with the answers.
Known = tuple[str, int, int, tuple[bytes, bytes] | None] | None

#: An entry's objects as a helper in "blocks" mode answers them: made into the ready pack
#: blocks of its answer (no entry's content is empty, so no entry's objects are these).
PACKED: tuple[bytes, bytes] = (b"", b"")

#: A ready pack block, as the file backend's :func:`~..backends.files.packs.ready_blocks`
#: makes them: its zstd frame, its stream's size, its objects' raw names and space bits.
Ready = tuple[bytes, int, bytes, bytes]

#: An entry's objects as :meth:`LineHelper.built` hands them on: its id, its content's
#: bytes and its envelope's members but ``content`` (``read_envelope``'s; None for an
#: envelope not of the common form, whose line is made here).
Objects = tuple[str, bytes, bytes | None]
#: A block of them as :meth:`LineHelper.built` takes it: the objects, and what makes the
#: lines of those at the places given, here (when the helper does not).
ObjectsBlock = tuple[Sequence[Objects], Callable[[list[int]], list[bytes]]]
_B = TypeVar("_B")  # a block as a pass passes it on (its lines, or its objects)


class LineHelper:
    """The helper process of one pass, and the lines of the file with its answers.

    :meth:`lines` passes the blocks of lines on (each block as the reader split it),
    sending each to the helper as it comes and taking its answers when its turn comes
    (checked here when they are not there), and puts one :data:`Known` for each line
    passed on in :attr:`known`, in order;
    a reader takes one from there for each line it takes. :meth:`close` ends the helper
    (a ``with`` block calls it), whatever happened."""

    def __init__(self, *, objects: bool = False, on_ready: Callable[[list[Ready]], None] | None = None,
                 built: bool = False) -> None:
        #: Whether the answers carry each clean entry's two objects.
        self.objects = objects or on_ready is not None
        #: Whether the helper is given objects and makes the lines (:meth:`built`).
        self.built_mode = built
        self._lines: list[bytes | None] = []  # those of the answers read last, in that mode
        #: Given the ready pack blocks of each block whose answers are taken (then the
        #: helper makes an entry's objects into them, :data:`PACKED`, where it can).
        self.on_ready = on_ready
        self._blocks: list[Ready] = []  # those of the answers read last
        self.known: deque[Known] = deque()
        self.proc: subprocess.Popen[bytes] | None = None
        #: What is sent but not yet written: the pipe is written without blocking, a piece
        #: at a time as it has room (no thread: under load, a thread's turns at the
        #: interpreter lock would hold this process up).
        self._unwritten: deque[memoryview] = deque()
        self._ready = False
        #: The number and line count of each block sent whose answers are not read, oldest first.
        self._owed: deque[tuple[int, int]] = deque()
        self._sent = 0
        self._claims: mmap.mmap | None = None
        #: How many of those were checked here meanwhile: their answers are dropped.
        self._dropping = 0
        #: Lines checked here, the helper running (not ready, or behind): a test reads it.
        self.checked_here = 0
        #: Why the helper was given up (None while it answers): a test reads it.
        self.failed: str | None = None

    def __enter__(self) -> LineHelper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the helper (or take the one :func:`start_early` started, telling it what its
        answers carry); if it cannot be, every line is checked here."""
        global _early
        mode = "built" if self.built_mode else "blocks" if self.on_ready else "objects" if self.objects else ""
        early, _early = _early, None
        if early is not None:
            self.proc, self._claims = early
            self._unwritten.append(memoryview(_MODES[mode]))
            self._write()
            return
        try:
            self.proc, self._claims = _launch(mode)
        except OSError as exc:
            self.failed = f"the helper could not start: {exc}"

    def _write(self) -> None:
        """Write what the pipe has room for of what is sent, at once (see :attr:`_unwritten`)."""
        proc, unwritten = self.proc, self._unwritten
        if proc is None or not unwritten:
            return
        assert proc.stdin is not None
        fd = proc.stdin.fileno()
        try:
            while unwritten:
                view = unwritten[0]
                n = os.write(fd, view)
                if n < len(view):
                    unwritten[0] = view[n:]
                    return
                unwritten.popleft()
        except BlockingIOError:
            return
        except OSError as exc:  # the helper went: what it did not answer is checked here
            self._give_up(f"the helper's input broke: {exc}")

    def close(self) -> None:
        """End the helper (at once: its answers are no longer needed) and reap it."""
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        self._unwritten.clear()
        _end(proc, self._claims)
        self._claims = None

    def _give_up(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
        self.close()

    def lines(self, blocks: Iterable[tuple[bytes, list[bytes]]]) -> Iterator[bytes]:
        """Each block's lines (``(the lines joined by LF, the lines)``), with their answers
        put in :attr:`known` before the block's first line comes. Blocks are read
        :data:`AHEAD` ahead and sent to the helper as they are read; when a block's turn
        comes and its answer is not there yet, its lines are checked here (None each),
        unless the helper has begun it: this process does not wait for a helper behind."""
        return self._windowed(((joined, len(parts), parts) for joined, parts in blocks), self._passed)

    def built(self, blocks: Iterable[ObjectsBlock]) -> Iterator[bytes]:
        """:meth:`lines` of a session given as its entries' objects, a block at a time: each
        line made by the helper with its answer, or here, by the block's own maker (checked
        here, None in :attr:`known`) when the helper does not answer the block or does not
        make that line. Each line ends with its LF, as the maker makes it."""
        return self._windowed(((encode_objects(b[0]), len(b[0]), b) for b in blocks), self._built_passed)

    def _windowed(self, blocks: Iterable[tuple[bytes, int, _B]],
                  passed: Callable[[_B, list[Known] | None], list[bytes]]) -> Iterator[bytes]:
        """The lines ``passed`` gives of each block (``(what the helper is sent, its line
        count, the block)``) and its answers, or None when it is checked here: the blocks
        sent as they are read, each passed on :data:`AHEAD` blocks later."""
        window: deque[tuple[_B, int, bool]] = deque()  # (block, lines, whether the helper has it), oldest first
        for payload, count, block in blocks:
            window.append((block, count, self._send(payload, count)))
            if len(window) > AHEAD:
                yield from self._turn(*window.popleft(), passed)
        while window:
            yield from self._turn(*window.popleft(), passed)

    def _turn(self, block: _B, count: int, sent: bool, passed: Callable[[_B, list[Known] | None], list[bytes]]) -> list[bytes]:
        """A block's turn: its answers (or None for each) put in :attr:`known`, its lines."""
        self._write()
        answers = self._answers() if sent else None
        if answers is None:
            self.known.extend([None] * count)
            self.checked_here += count
            if sent:
                self._dropping += 1  # its answer, when it comes, is read and dropped
        else:
            self.known.extend(answers)
        return passed(block, answers)

    def _passed(self, parts: list[bytes], answers: list[Known] | None) -> list[bytes]:
        if answers is not None and self._blocks:
            assert self.on_ready is not None
            blocks, self._blocks = self._blocks, []
            self.on_ready(blocks)
        return parts

    def _built_passed(self, block: ObjectsBlock, answers: list[Known] | None) -> list[bytes]:
        objects, make = block
        if answers is None:
            return make(list(range(len(objects))))
        lines, self._lines = self._lines, []
        here = [i for i, line in enumerate(lines) if line is None]
        for i, line in zip(here, make(here) if here else ()):
            lines[i] = line
        return lines  # type: ignore[return-value]  # (every None made here)

    def _send(self, joined: bytes, count: int) -> bool:
        """Give the helper a block, when it is ready (and owes answers for no more than the
        :data:`AHEAD` blocks read before this one)."""
        if self.proc is None or len(self._owed) > AHEAD or not self._readied():
            return False
        number = self._sent
        self._sent += 1
        shared = self._claims
        at = 0
        if shared is not None:
            shared[number % _RING] = FREE
            slot = (len(shared) - _RING) // _SLOTS  # (_SLOT when the helper was started)
            if len(joined) <= slot:
                at = _RING + number % _SLOTS * slot
                shared[at : at + len(joined)] = joined
        self._unwritten.append(memoryview(_SENT.pack(len(joined), count, at)))
        if not at:
            self._unwritten.append(memoryview(joined))
        self._owed.append((number, count))
        self._write()
        return True

    def _readied(self) -> bool:
        """Whether the helper said it is ready, not waiting for it (unless :data:`WAIT`):
        until it is (its interpreter and modules load), blocks are checked here."""
        if self._ready:
            return True
        assert self.proc is not None and self.proc.stdout is not None
        if self._waiting(STALL if WAIT else 0.0):
            if self.proc.stdout.read(1) == b"R":
                self._ready = True
            else:
                self._give_up("the helper did not start")
        return self._ready

    def _waiting(self, seconds: float) -> bool:
        """Whether the helper has written something (or closed its end) not read yet, within
        ``seconds`` (read unbuffered: nothing waits in a buffer); what is sent is written
        meanwhile as the pipe has room, since the helper may need it to answer."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        out, into = proc.stdout.fileno(), proc.stdin.fileno()
        poll = select.poll()
        poll.register(out, select.POLLIN)
        deadline = time.monotonic() + seconds
        while True:
            poll.register(into, select.POLLOUT if self._unwritten else 0)  # (0: a closed end still shows)
            events = poll.poll(max(0.0, deadline - time.monotonic()) * 1000)
            if not events:
                return False
            if any(fd == out for fd, _ in events):
                return True
            if any(flags & (select.POLLERR | select.POLLHUP) for _, flags in events):
                self._give_up("the helper closed its input")
                return False
            self._write()
            if self.proc is None:  # (its input broke: given up)
                return False

    def _answers(self) -> list[Known] | None:
        """The answers for the oldest block the helper has (those it owes for blocks checked
        here meanwhile read and dropped first), when they are there or it has begun the
        block (then they are waited for). None when this process takes the block (the
        helper has not begun it: it will skip it), or the helper cannot answer (it died,
        answered out of turn, said nothing for :data:`STALL`: it is given up)."""
        while self.proc is not None:
            if not self._waiting(STALL if WAIT else 0.0):
                if not WAIT and self._take(self._owed[self._dropping][0]):
                    return None
                if WAIT or not self._waiting(STALL):  # (the helper began it: waited for)
                    self._give_up(f"no answer in {STALL:g} s")
                    return None
            frame = self._frame()
            if frame is None or not self._dropping:
                return frame
            self._dropping -= 1
            self._blocks, self._lines = [], []
        return None

    def _take(self, number: int) -> bool:
        """Take block ``number`` to check here, unless the helper has begun it. (Both may
        check it when they look at once: its answer is then dropped, as any taken block's.)"""
        claims = self._claims
        if claims is None:
            return True
        if claims[number % _RING] == BEGUN:
            return False
        claims[number % _RING] = TAKEN
        return True

    def _frame(self) -> list[Known] | None:
        """Read the answers the helper owes first (None when it failed)."""
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        _, count = self._owed.popleft()
        try:
            size, lines = _FRAME.unpack(_read_exactly(proc.stdout, _FRAME.size))
            if lines != count:
                raise ValueError(f"the helper answered {lines} lines for a block of {count}")
            data = _read_exactly(proc.stdout, size)
            if self.built_mode:
                answers, self._lines = decode_built(data, count)
                return answers
            answers, self._blocks = decode_answers(data, count, self.objects)
            if self._blocks and self.on_ready is None:
                raise ValueError("the helper answered with pack blocks, not asked for")
            return answers
        except (OSError, ValueError, EOFError, struct.error) as exc:
            self._give_up(f"the helper failed: {exc}")
            return None


def _launch(mode: str) -> tuple[subprocess.Popen[bytes], mmap.mmap | None]:
    """A helper started (:func:`command`), its input written without blocking, and the
    memory it shares with this process, the claims and the slots of the blocks sent (None
    where there can be none); OSError when it cannot be started."""
    fd = _shared(_RING + _SLOTS * _SLOT)
    claims = None
    try:
        if fd is not None:
            claims = mmap.mmap(fd, _RING + _SLOTS * _SLOT)
        proc = subprocess.Popen(
            command(mode, fd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            close_fds=True, pass_fds=() if fd is None else (fd,), bufsize=0, env=heap_env(),
        )
    except OSError:
        if claims is not None:
            claims.close()
        raise
    finally:
        if fd is not None:
            os.close(fd)  # (the map, and the helper, hold it)
    for pipe in (proc.stdin, proc.stdout):  # an answer (or a block larger than a slot) whole in a pipe, where allowed
        try:
            fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, 1 << 20)  # type: ignore[union-attr]
        except (OSError, AttributeError):
            pass
    assert proc.stdin is not None
    os.set_blocking(proc.stdin.fileno(), False)
    return proc, claims


#: The helper :func:`start_early` started, until a pass takes it.
_early: tuple[subprocess.Popen[bytes], mmap.mmap | None] | None = None


def start_early(blocks: bool = False) -> None:
    """Start the helper of a pass this process is about to make, before it loads what the
    pass needs: the ``import`` command calls it first thing (``cli/main.py``), so the
    helper's own start (an interpreter and the rules' modules, 0.1-0.2 s) overlaps this
    process's, and the pass's first blocks are answered rather than checked here. The
    pass's :class:`LineHelper` takes it, telling it by the first byte of its input what
    its answers carry (:data:`_MODES`); one never taken is killed when this process exits
    (and ends by itself when its input does). Nothing when it cannot start: the pass then
    starts its own. ``blocks``: the pass is likely an import into a file store, whose
    pack module the helper then loads while it waits."""
    global _early
    if _early is not None:
        return
    try:
        _early = _launch(_LATER + ("blocks" if blocks else ""))
    except OSError:
        return
    atexit.register(_end_early)


def _end_early() -> None:
    global _early
    early, _early = _early, None
    if early is not None:
        _end(*early)


def _end(proc: subprocess.Popen[bytes], claims: mmap.mmap | None) -> None:
    """Kill a helper (unless it has ended), reap it, and close what this process held of it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:  # (unwritten bytes to a pipe the helper no longer reads)
                pass
    if claims is not None:
        claims.close()


def _shared(size: int) -> int | None:
    """A descriptor of ``size`` zero bytes of memory this process and a helper it starts can
    both map (None where none can be had: the helper then never skips a block, and is sent
    each block through its pipe). Only the pages written take memory."""
    try:
        fd = os.memfd_create("agentsession-claims") if hasattr(os, "memfd_create") else _unlinked()
    except OSError:
        return None
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        return None
    return fd


def _unlinked() -> int:  # pragma: no cover - Linux has memfd_create
    import tempfile

    with tempfile.TemporaryFile() as f:
        return os.dup(f.fileno())


def _read_exactly(f: IO[bytes], n: int) -> bytes:
    """``n`` bytes from the unbuffered pipe ``f`` (a read may give fewer; the rest is
    waited for :data:`STALL` at most)."""
    data = f.read(n)
    if data is not None and len(data) == n:
        return data
    pieces = [data or b""]
    got = len(pieces[0])
    poll = select.poll()
    poll.register(f.fileno(), select.POLLIN)
    while got < n:
        if not poll.poll(STALL * 1000):
            raise OSError(f"no answer in {STALL:g} s")
        more = f.read(n - got)
        if not more:
            raise EOFError("the helper's answers ended")
        pieces.append(more)
        got += len(more)
    return b"".join(pieces)


# ---------------------------------------------------------------------------
# the answers, as bytes: per line a flag byte (0 none, 1 clean, 2 clean and its objects
# in the ready blocks); then four int32 (the item's span, the lengths of the two objects,
# 0 when not sent); the content hash's 64 hex digits of each clean line; the objects of
# each, one after the other; then the ready blocks: their count, three int32 each (the
# frame's length, the stream's, the objects'), their names, space bits and frames


def encode_answers(answers: list[Known], ready: Sequence[Ready] = ()) -> bytes:
    flags = bytes(0 if a is None else 2 if a[3] is PACKED else 1 for a in answers)
    ints = array("i")
    hexes: list[str] = []
    blobs: list[bytes] = []
    for a in answers:
        if a is None:
            ints.extend((0, 0, 0, 0))
            continue
        chash, start, end, objects = a
        hexes.append(chash[7:])
        if objects is None or objects is PACKED:
            ints.extend((start, end, 0, 0))
        else:
            ints.extend((start, end, len(objects[0]), len(objects[1])))
            blobs.extend(objects)
    heads = array("i")
    for frame, raw, _, spaces in ready:
        heads.extend((len(frame), raw, len(spaces)))
    return b"".join((flags, ints.tobytes(), "".join(hexes).encode("ascii"), *blobs, _COUNT.pack(len(ready)), heads.tobytes(),
                     *(b for _, _, raws, spaces in ready for b in (raws, spaces)), *(r[0] for r in ready)))


def decode_answers(data: bytes, count: int, objects: bool) -> tuple[list[Known], list[Ready]]:
    """:func:`encode_answers`' answers of ``count`` lines and its ready blocks; ValueError
    when they are not."""
    flags = data[:count]
    ints = array("i")
    ints.frombytes(data[count : count * 17])
    clean = count - flags.count(0)
    at = count * 17
    hexes = data[at : at + clean * _HASH_HEX].decode("ascii")
    at += clean * _HASH_HEX
    if len(hexes) != clean * _HASH_HEX:
        raise ValueError("the helper's answer is malformed")
    out: list[Known] = []
    h = 0
    for i, flag in enumerate(flags):
        if not flag:
            out.append(None)
            continue
        start, end, nc, ne = ints[4 * i : 4 * i + 4]
        pair = None
        if flag == 2:
            pair = PACKED
        elif objects:
            pair = (data[at : at + nc], data[at + nc : at + nc + ne])
            at += nc + ne
        out.append(("sha256:" + hexes[h : h + _HASH_HEX], start, end, pair))
        h += _HASH_HEX
    (many,) = _COUNT.unpack_from(data, at)  # (struct.error when cut short)
    heads = array("i")
    heads.frombytes(data[at + 4 : at + 4 + 12 * many])
    at += 4 + 12 * many
    if len(heads) != 3 * many:
        raise ValueError("the helper's answer is malformed")
    ready: list[Ready] = []
    frame_at = at + 33 * sum(heads[2::3])
    for i in range(0, len(heads), 3):
        size, raw, n = heads[i : i + 3]
        ready.append((data[frame_at : frame_at + size], raw, data[at : at + 32 * n], data[at + 32 * n : at + 33 * n]))
        at += 33 * n
        frame_at += size
    if frame_at != len(data) or (flags.count(2) and not ready):
        raise ValueError("the helper's answer is malformed")
    return out, ready


# built mode: a block is its entries' objects (per entry two int32, the content's length
# and the members' or -1 for none; the ids' 32 raw bytes each; then each entry's content
# and members); the answers are encode_answers' (its length first, an int32), then per
# entry the length of its line (an int32, -1 for none made) and the lines


def encode_objects(entries: Sequence[Objects]) -> bytes:
    lengths = array("i")
    for _, content, members in entries:
        lengths.extend((len(content), -1 if members is None else len(members)))
    raws = bytes.fromhex("".join(entry_id[7:] for entry_id, _, _ in entries))
    return b"".join((lengths.tobytes(), raws, *(b for _, c, m in entries for b in (c, m or b""))))


def decode_objects(data: bytes, count: int) -> list[Objects]:
    """:func:`encode_objects`' entries; ValueError when they are not."""
    lengths = array("i")
    lengths.frombytes(data[: 8 * count])
    at = 8 * count + 32 * count
    raws = data[8 * count : at].hex()
    if len(lengths) != 2 * count or len(raws) != 64 * count:
        raise ValueError("a block of objects is malformed")
    out: list[Objects] = []
    for i in range(count):
        nc, nm = lengths[2 * i], lengths[2 * i + 1]
        content = data[at : at + nc]
        at += nc
        members = None if nm < 0 else data[at : at + nm]
        at += max(nm, 0)
        out.append(("sha256:" + raws[64 * i : 64 * i + 64], content, members))
    if at != len(data):
        raise ValueError("a block of objects is malformed")
    return out


def encode_built(answers: list[Known], lines: Sequence[bytes | None]) -> bytes:
    head = encode_answers(answers)
    sizes = array("i", (-1 if line is None else len(line) for line in lines))
    return b"".join((_COUNT.pack(len(head)), head, sizes.tobytes(), *(line for line in lines if line is not None)))


def decode_built(data: bytes, count: int) -> tuple[list[Known], list[bytes | None]]:
    """:func:`encode_built`' answers and lines of ``count`` entries; ValueError when they are not."""
    (n,) = _COUNT.unpack_from(data)
    answers, _ = decode_answers(data[4 : 4 + n], count, False)
    at = 4 + n
    sizes = array("i")
    sizes.frombytes(data[at : at + 4 * count])
    at += 4 * count
    lines: list[bytes | None] = []
    for size in sizes:
        if size < 0:
            lines.append(None)
            continue
        lines.append(data[at : at + size])
        at += size
    if len(sizes) != count or at != len(data) or any(a is not None and b is None for a, b in zip(answers, lines)):
        raise ValueError("the helper's answer is malformed")
    return answers, lines


def answer_built(entries: Sequence[Objects]) -> bytes:
    """The helper's answer to a block of objects: the line of each it can make of the bytes
    alone, each answered as a line of a file is (:func:`answer`)."""
    common = [(i, (entry_id, content, members)) for i, (entry_id, content, members) in enumerate(entries)
              if members is not None]
    lines: list[bytes | None] = [None] * len(entries)
    for (i, _), (line, _) in zip(common, lines_of_bytes([objects for _, objects in common])):
        lines[i] = line
    return encode_built([None if line is None else answer(line[:-1]) for line in lines], lines)


# ---------------------------------------------------------------------------
# the helper's side


class _Packing:
    """In "blocks" mode, the helper's objects of one block's clean entries, made into ready
    pack blocks as the file backend makes them (its module is loaded here only then: the
    store this helper serves is a file store). An entry whose objects are packed is
    answered :data:`PACKED`; a label (which an import may keep out of its session: a
    projection's marker) and an object too big for a pack are answered with their bytes."""

    def __init__(self) -> None:
        from ..backends.files import packs

        self._ready = packs.ready_blocks
        self._cctx = packs.compressor()
        self._max = packs.MAX_PACKED
        self._spaces = bytes((packs.SPACE_BITS["contents"], packs.SPACE_BITS["entries"]))
        self._names: list[str] = []
        self._datas: list[bytes] = []

    def take(self, entry: Entry) -> bool:
        """Take the entry's objects into the block's (whether they were taken)."""
        pair = entry.objects
        if pair is None or entry.type == "label" or len(pair[0]) > self._max or len(pair[1]) > self._max:
            return False
        self._names += (entry.content_hash, entry.id)
        self._datas += pair
        return True

    def blocks(self) -> list[Ready]:
        """The objects taken since the last call, as ready blocks."""
        names, datas, self._names, self._datas = self._names, self._datas, [], []
        raws = bytes.fromhex("".join(names).replace("sha256:", ""))
        return self._ready(raws, self._spaces * (len(datas) // 2), datas, self._cctx)


def answer(raw: bytes, objects: bool = False, packing: _Packing | None = None) -> Known:
    """What the helper says of one entry line: :data:`Known` (see the module's doc)."""
    try:
        obj, _, canonical = loads_canonical(raw)
        if not canonical:
            return None  # (proven canonical: a dict, and nothing needing the careful serialiser)
        entry, found = check_line(obj, careful=False, keep_objects=True, raw=raw)
    except Exception:  # whatever it is, the reader meets it again and words it
        return None
    if found or entry is None:
        return None
    item = entry.item_bytes
    if item is None:
        start = end = 0
    else:
        # Where the reader cuts the item's bytes from its copy of the line: any place they
        # stand is as good (the same bytes); most often just after the first "item" key.
        start = raw.find(b'"item":{') + 7
        if start < 7 or not raw.startswith(item, start):
            start = raw.find(item)
            if start < 0:  # (cannot be: they were cut from it, or it is their canonical form)
                return None
        end = start + len(item)
    pair = entry.objects if objects or packing else None
    if packing is not None and packing.take(entry):
        pair = PACKED
    return entry.content_hash, start, end, pair


def main() -> int:
    """The helper: blocks in, answers out, until its input ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reader's to handle
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    if mode.startswith(_LATER):  # started early (start_early): told when a pass takes it
        if mode == _LATER + "blocks":
            from ..backends.files import packs  # noqa: F401 (what the likely mode loads: loaded meanwhile)
        told = inp.read(1)
        mode = next((m for m, b in _MODES.items() if b == told), _LATER)
        if mode.startswith(_LATER):
            return 0  # (its input ended: no pass took it)
    objects = mode in ("objects", "blocks")
    built = mode == "built"
    packing = _Packing() if mode == "blocks" else None
    claims = mmap.mmap(int(sys.argv[2]), 0) if sys.argv[2] != "-" else None  # (the claims, then the slots)
    number = 0
    out.write(b"R")
    out.flush()
    with gc_paused():
        while True:
            head = inp.read(_SENT.size)
            if len(head) != _SENT.size:
                return 0
            size, lines, at = _SENT.unpack(head)
            block = b"" if at else inp.read(size)  # (else in its slot of the shared memory)
            if len(block) != (0 if at else size) or (at and claims is None):
                return 0
            slot, number = number % _RING, number + 1
            if claims is not None and claims[slot] == TAKEN:  # the reader checks this block itself
                payload = encode_built([None] * lines, [None] * lines) if built else encode_answers([None] * lines)
            else:
                if claims is not None:
                    claims[slot] = BEGUN
                    if at:
                        block = claims[at : at + size]
                if built:
                    try:
                        entries = decode_objects(block, lines)
                    except ValueError:
                        return 1
                    payload = answer_built(entries)
                else:
                    parts = block.split(b"\n")
                    if len(parts) != lines:
                        return 1
                    answers = [answer(raw, objects, packing) for raw in parts]
                    payload = encode_answers(answers, packing.blocks() if packing is not None else [])
            try:
                out.write(_FRAME.pack(len(payload), lines) + payload)
                out.flush()
            except BrokenPipeError:
                return 0


if __name__ == "__main__":
    sys.exit(main())
