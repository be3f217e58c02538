"""The terminal the command writes to: whether there is one, its width, colour, the
pager and progress lines. One place decides each, for every command.

Every decision asks :func:`isatty`, so a test forces the terminal path by replacing
that one function (and :data:`clock` with :data:`PROGRESS_DELAY` for a "slow"
operation) instead of needing a real terminal or a sleep.
"""

from __future__ import annotations

import io
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import field
from typing import IO, Any

from agentsession_cas.lean import dataclass

#: The width of human output when standard output is not a terminal.
FALLBACK_WIDTH = 100
#: The narrowest width a terminal is taken to have (a line is never fitted to less).
MIN_WIDTH = 40
#: A progress line appears only once an operation has run this long (seconds).
PROGRESS_DELAY = 1.0
#: ... and is redrawn at most this often (seconds).
PROGRESS_EVERY = 0.1
#: The pager when neither AGENTSESSION_PAGER nor PAGER names one, and its options (git's).
DEFAULT_PAGER = "less"
DEFAULT_LESS = "FRX"

#: The clock progress measures with (a test replaces it).
clock: Callable[[], float] = time.monotonic


def isatty(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (False for a closed or fileless stream)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


# ---------------------------------------------------------------------------
# the settings of one run of the command


@dataclass
class Settings:
    """What this run of the command decided about its output (set by ``main``)."""

    color: str = "auto"  # auto, always or never (--color)
    pager: bool = True  # False under --no-pager
    json: bool = False  # the command line holds --json: no pager, colour or progress
    quiet: bool = False  # a command's -q: no progress either
    stdout_tty: bool | None = None  # standard output was a terminal before a pager took it
    plain_env: bool | None = None  # NO_COLOR set, or TERM dumb (read once a run)
    width: int | None = None
    paging: Any = None  # the pager's process while it runs
    saved_stdout: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


_settings = Settings()


def configure(*, color: str = "auto", pager: bool = True, as_json: bool = False) -> Settings:
    """Start a run: forget what an earlier run in this process decided."""
    global _settings
    _settings = Settings(color=color, pager=pager, json=as_json)
    return _settings


def settings() -> Settings:
    return _settings


def stdout_is_tty() -> bool:
    if _settings.stdout_tty is None:
        _settings.stdout_tty = isatty(sys.stdout)
    return _settings.stdout_tty


def width() -> int:
    """The columns human output may take: the terminal's, or 100 when standard output is
    not a terminal (``COLUMNS`` overrides both, as for other tools)."""
    if _settings.width is None:
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit() and int(columns) > 0:
            _settings.width = max(MIN_WIDTH, int(columns))
        elif stdout_is_tty():
            _settings.width = _terminal_columns()
        else:
            _settings.width = FALLBACK_WIDTH
    return _settings.width


# ---------------------------------------------------------------------------
# colour


_STYLES = {
    "id": "33",  # yellow, as git shows a commit
    "bad": "31",  # red: an error, a problem, what only A holds
    "good": "32",  # green: a sound result, what only B holds
    "warn": "33",
    "head": "1;36",  # bold cyan: the head, a ref
    "match": "1;31",  # a grep match
    "dim": "2",
    "title": "1",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def color_on(err: bool = False) -> bool:
    """Colour for standard output (or error): ``--color=always`` or ``never`` as given;
    else only on a terminal, never under --json, and not when NO_COLOR is set and not
    empty (no-color.org) or TERM is dumb."""
    if _settings.color == "always":
        return True
    if _settings.color == "never" or _settings.json:
        return False
    if _settings.plain_env is None:  # (once a run: a grep asks for each line it prints)
        _settings.plain_env = bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"
    if _settings.plain_env:
        return False
    return isatty(sys.stderr) if err else stdout_is_tty()


def paint(text: str, role: str, err: bool = False) -> str:
    """``text`` in the colour of ``role`` when colour is on, else as it is."""
    if not text or not color_on(err):
        return text
    return f"\x1b[{_STYLES[role]}m{text}\x1b[0m"


def visible(text: str) -> str:
    """``text`` without colour codes: what takes columns."""
    return _ANSI.sub("", text) if "\x1b" in text else text


# ---------------------------------------------------------------------------
# widths


def cut(line: str, columns: int | None = None) -> str:
    """``line`` shortened to ``columns`` (default: :func:`width`) with ``…`` at the end,
    colour codes kept and not counted."""
    columns = columns or width()
    if len(visible(line)) <= columns:
        return line
    out: list[str] = []
    left = columns - 1
    pos = 0
    for m in _ANSI.finditer(line):
        take = line[pos:m.start()][:max(left, 0)]
        out.append(take)
        left -= len(take)
        out.append(m.group())
        pos = m.end()
    out.append(line[pos:][:max(left, 0)])
    return "".join(out) + "…" + ("\x1b[0m" if "\x1b" in line else "")


def wrap(line: str, columns: int | None = None, indent: str = "  ") -> list[str]:
    """``line`` broken at spaces into lines of at most ``columns`` (default: :func:`width`),
    each after the first indented two more; a word longer than a line is broken where it
    must be. Nothing is left out."""
    columns = columns or width()
    if "\x1b" not in line:
        return [line] if len(line) <= columns else _wrap_plain(line, columns, indent)
    return [line] if len(visible(line)) <= columns else _wrap_words(line, columns, indent)


def _wrap_words(line: str, columns: int, indent: str) -> list[str]:
    """:func:`wrap` a word at a time, each measured without its colour codes."""
    lead = " " * (len(line) - len(line.lstrip(" ")))
    more = lead + indent
    out: list[str] = []
    current = lead
    for word in line.lstrip(" ").split(" "):
        candidate = current + word if not current.strip() else f"{current} {word}"
        if len(visible(candidate)) <= columns:
            current = candidate
            continue
        if current.strip():
            out.append(current)
            current = more
        while word and len(visible(current + word)) > columns:  # a word longer than a line (a lead wider than the line too)
            room = max(1, columns - len(visible(current)))
            out.append(current + word[:room])
            word = word[room:]
            current = more
        current += word
    if current.strip():
        out.append(current)
    return out or [""]  # a line of white space wider than the width: one empty line


def _wrap_plain(line: str, columns: int, indent: str) -> list[str]:
    """:func:`wrap` of a line without colour codes (every character a column), a line at
    a time instead of a word at a time: the word-by-word fill stops at the last space
    that fits (``rfind``), the space it stops at is dropped, and so are the spaces that
    follow it (an empty word never starts a line); a word wider than a line is broken
    where it must be. The same lines as the fill (tests/test_cli_terminal.py holds the
    two to it): show wraps the context's tens of thousands of lines."""
    rest = line.lstrip(" ")
    current = line[: len(line) - len(rest)]
    more = current + indent
    out: list[str] = []
    while True:
        room = columns - len(current)
        if len(rest) <= room or not rest:  # (a lead wider than the line leaves no room)
            current += rest
            break
        cut_at = rest.rfind(" ", 0, room + 1) if room >= 0 else -1
        if cut_at > 0:  # rest never starts with a space: a word fits before it
            out.append(current + rest[:cut_at])
            current, rest = more, rest[cut_at + 1 :].lstrip(" ")
            continue
        end = rest.find(" ")
        end = len(rest) if end < 0 else end
        word = rest[:end]  # wider than what is left: broken where it must be
        while word and len(current) + len(word) > columns:
            take = max(1, columns - len(current))
            out.append(current + word[:take])
            word, current = word[take:], more
        rest = word + rest[end:] if word else rest[end:].lstrip(" ")
    if current.strip():
        out.append(current)
    return out or [""]


def fit_table(rows: list[list[str]], shrink: int | None = None) -> tuple[list[list[str]], list[int]]:
    """Rows whose lines fit the width, and each column's width in them: column ``shrink``
    (default: the last) is cut to what the others leave (never under 8 columns)."""
    if not rows:
        return rows, []
    columns = width()
    n = len(rows[0])
    col = n - 1 if shrink is None else shrink
    widths = [max(map(len, map(visible, cells))) for cells in zip(*rows)]
    fixed = sum(widths) - widths[col] + 2 * (n - 1)
    room = max(8, columns - fixed)
    if widths[col] <= room:
        return rows, widths
    rows = [[cut(c, room) if i == col else c for i, c in enumerate(r)] for r in rows]
    widths[col] = max(len(visible(r[col])) for r in rows)
    return rows, widths


# ---------------------------------------------------------------------------
# the pager


def pager_command() -> str | None:
    """The pager this run would use: $AGENTSESSION_PAGER, else $PAGER, else less when it is
    installed; None when paging is off (empty, or ``cat``)."""
    for name in ("AGENTSESSION_PAGER", "PAGER"):
        if name in os.environ:
            command = os.environ[name].strip()
            return None if command in ("", "cat") else command
    import shutil

    return DEFAULT_PAGER if shutil.which(DEFAULT_PAGER) else None


def start_pager() -> bool:
    """Send standard output through the pager, as git does, when it goes to a terminal and
    paging is not off (--no-pager, --json, no pager). Returns whether it did. The pager
    gets LESS=FRX unless LESS is set: it leaves at once when the output fits the screen,
    shows colour, and leaves the text on the screen."""
    s = _settings
    if s.paging is not None or not s.pager or s.json or not stdout_is_tty():
        return False
    command = pager_command()
    if command is None:
        return False
    import shlex
    import shutil
    import subprocess

    width()  # fitted to the terminal, measured before the pager takes standard output
    color_on()
    env = dict(os.environ)
    env.setdefault("LESS", DEFAULT_LESS)
    env.setdefault("LV", "-c")
    words = shlex.split(command) if not set(command) & set("|&;<>()$`\\\"'*?[#~=%") else None
    try:
        if words is not None:
            if shutil.which(words[0]) is None:
                return False
            proc = subprocess.Popen(words, stdin=subprocess.PIPE, env=env)
        else:
            proc = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env)
    except OSError:
        return False
    assert proc.stdin is not None
    sys.stdout.flush()
    s.saved_stdout = sys.stdout
    s.paging = proc
    sys.stdout = io.TextIOWrapper(proc.stdin, encoding="utf-8", errors="backslashreplace", write_through=False)
    return True


def stop_pager() -> None:
    """Close the pager's input and wait for the reader to quit it."""
    s = _settings
    proc, s.paging = s.paging, None
    if proc is None:
        return
    out: IO[str] = sys.stdout
    sys.stdout = s.saved_stdout
    try:
        out.close()
    except (BrokenPipeError, OSError, ValueError):
        pass
    try:
        proc.wait()
    except KeyboardInterrupt:  # the reader's Ctrl-C in the pager: wait for it to leave
        proc.wait()


# ---------------------------------------------------------------------------
# progress


class Progress:
    """One progress line on standard error, redrawn in place: ``LABEL: 42% (1,234/2,900
    UNIT)``, or ``LABEL: PHASE`` for a step with no count. Drawn only once the operation
    has run :data:`PROGRESS_DELAY` seconds, then at most every :data:`PROGRESS_EVERY`; the
    line is cleared when the operation ends, so the output that follows starts clean."""

    def __init__(self, label: str, unit: str = ""):
        self.label = label
        self.unit = unit
        self.started = clock()
        self.last = float("-inf")
        self.open = False

    def _draw(self, text: str, final: bool = False) -> None:
        now = clock()
        if now - self.started < PROGRESS_DELAY:
            return
        if not final and now - self.last < PROGRESS_EVERY:
            return
        self.last = now
        line = cut(f"{self.label}: {text}", _stderr_width())
        sys.stderr.write(f"\r\x1b[K{line}")
        sys.stderr.flush()
        self.open = True

    def __call__(self, done: int, total: int) -> None:
        from .common import number

        pct = 100 * done // total if total else 100
        unit = f" {self.unit}" if self.unit else ""
        self._draw(f"{pct:3d}% ({number(done)}/{number(total)}{unit})", final=done >= total)

    def phase(self, text: str) -> None:
        """A step of the operation that has no count (reading logs, say)."""
        self._draw(" ".join(text.split()))

    def end(self) -> None:
        """Clear the line (an error or the result is printed next)."""
        if self.open:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.open = False


def _stderr_width() -> int:
    return _terminal_columns() - 1


def _terminal_columns() -> int:
    """The terminal's width. (shutil is imported here, and where a pager is looked for: it
    brings the bz2 and lzma modules, start-up that output to a pipe or a file never needs.)"""
    import shutil

    return max(MIN_WIDTH, shutil.get_terminal_size((FALLBACK_WIDTH, 24)).columns)


def progress(label: str, unit: str = "") -> Progress | None:
    """A progress line for an operation that may take long, or None: only when standard
    error is a terminal, the command line holds no --json nor a -q, and no pager runs."""
    if _settings.json or _settings.quiet or _settings.paging is not None or not isatty(sys.stderr):
        return None  # under a pager the line would tear the page: none there
    return Progress(label, unit)


class progressing:
    """``with progressing(label, unit) as p:`` ... a :class:`Progress` (or None off a
    terminal), its line cleared however the block ends."""

    def __init__(self, label: str, unit: str = ""):
        self.reporter = progress(label, unit)

    def __enter__(self) -> Progress | None:
        return self.reporter

    def __exit__(self, *exc: object) -> None:
        if self.reporter is not None:
            self.reporter.end()
