"""Printing helpers shared by the file commands and the store commands."""

from __future__ import annotations

import functools
import gc
import io
import json
import os
import select
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar

import click
import orjson

from agentsession_cas.errors import NO_SPACE_ERRNOS, READ_ONLY_ERRNOS, NoSpaceError, ReadOnlyError, quoted

from . import terminal
from .terminal import color_on, cut, fit_table, paint, visible, width, wrap

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


def printable(text: str) -> str:
    """Values read from a file may hold lone surrogates, which no stream can
    write; show them as backslash escapes instead of failing. A text without one
    (ASCII, or one that encodes) is itself: not encoded and decoded again (show
    prints a long listing a batch of lines at a time)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


#: Exit statuses, one table (docs/cli.md "Exit status").
EXIT_OK = 0
EXIT_FAILED = 1  # a check failed, or an error
EXIT_USAGE = 2  # click's: a bad option or argument
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM: stopped (kill, a service manager, a timeout)
EXIT_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (`| head`)


# ---------------------------------------------------------------------------
# options: one habit for a value, one flag a letter, one --json (docs/cli.md "Options")


class Parsed(click.ParamType):
    """An option's value read by a parser of ours (a time, a duration, a pattern, an
    address): a value it refuses (``ValueError``, or a library error) is a usage error, as
    a value click's own types refuse (``IntRange``, ``Choice``) is: exit 2, under
    ``--json`` code ``usage``, the option named. ``parse`` is given the text and returns
    the value; ``keep_text`` hands the command the text as given, the parser only its
    judge (what the command prints back, as ``sweep``'s grace)."""

    def __init__(self, name: str, parse: Callable[[str], Any], *, keep_text: bool = False) -> None:
        self.name, self._parse, self._keep = name, parse, keep_text

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # a default already made
        from agentsession_cas.errors import AgentSessionError

        try:
            parsed = self._parse(value)
        except (ValueError, AgentSessionError) as exc:
            message = one_line(str(exc))
            for name in param.opts if param is not None else ():
                message = message.removeprefix(name + " ")  # (click names the option: once is enough)
            self.fail(message, param, ctx)
        return value if self._keep else parsed


def _when(text: str) -> str:
    from agentsession_cas.store.summary import parse_when  # (the one rule, with the summaries it reads)

    return parse_when(text)


def _duration(text: str) -> float:
    from agentsession_cas.maintenance.sweep import parse_duration

    return parse_duration(text)


def _pattern(text: str) -> str:
    from agentsession_cas.format.redact import RedactOptions  # what export --secret takes, said by the one place

    RedactOptions(secrets=(text,)).rewriter()
    return text


#: A time an option is given (``list --after``): a date, a time, or an age (``3d``).
WHEN = Parsed("when", _when)
#: A duration (``sweep --grace 14d``): the text, which the parser accepts.
DURATION = Parsed("duration", _duration, keep_text=True)
#: A regular expression a redaction replaces (``export --secret``).
SECRET = Parsed("regex", _pattern)

#: The help of every ``--json`` (one wording; what each document holds: docs/cli.md).
JSON_HELP = "Print one JSON document instead of text."

_F = TypeVar("_F", bound=Callable[..., Any])


def json_option(help: str | None = None) -> Callable[[_F], _F]:
    """The ``--json`` flag, as every command has it: :data:`JSON_HELP`, with ``help`` added
    when the command's document goes elsewhere than stdout or is a stream."""
    return click.option("--json", "as_json", is_flag=True, help=JSON_HELP if help is None else f"{JSON_HELP} {help}")


# ---------------------------------------------------------------------------
# numbers, sizes and times: the one format of human output (docs/cli.md "Human output")


def number(n: int) -> str:
    """``1,234,567``: every count a person reads, with thousands separators."""
    return f"{n:,}"


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``1 entry``, ``2 entries``, ``1,024 objects``: a count in words, never ``1 entries``."""
    return f"{number(n)} {noun if n == 1 else (many or noun + 's')}"


_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def size(n: int) -> str:
    """``12,345 bytes (12.1 KiB)``: a size exact, then in the largest binary unit it
    reaches (``512 bytes`` alone below 1 KiB)."""
    exact = plural(n, "byte")
    for unit, scale in _UNITS:
        if n >= scale:
            return f"{exact} ({n / scale:,.1f} {unit})"
    return exact


def when(ts: str | None) -> str:
    """A time as a person reads it: to the second, UTC (``2026-01-02T03:04:05Z``); ``-`` for none."""
    from agentsession_cas.store.summary import seconds  # the one rule, with list's

    return seconds(ts) or "-"


# ---------------------------------------------------------------------------
# printing


def echo(text: str = "", err: bool = False, *, fit: str | None = "wrap") -> None:
    """A line of human output. On standard output it is fitted to the width
    (:func:`terminal.width`): ``wrap`` breaks a long line at spaces (nothing is lost),
    ``cut`` shortens it with ``…`` (a table's row), None leaves it (an id or a hash a
    script reads). Standard error is left whole: an error is one line to grep."""
    text = printable(text)
    # colour was decided here (terminal.color_on); when it is off click strips escapes
    if err or fit is None:
        click.echo(text, err=err, color=color_on(err))
        return
    lines = []
    for line in text.split("\n"):
        lines.extend(wrap(line) if fit == "wrap" else [cut(line)])
    click.echo("\n".join(lines), color=color_on())


def echo_lines(texts: Iterable[str], *, fit: str = "wrap") -> None:
    """:func:`echo` of many lines on standard output, written :data:`ECHO_BATCH` at a
    time: what a long listing prints (one write a batch instead of one a line; a batch,
    not all of them: a list of every line of a long context held 25 MB more at show's
    peak). Each batch is made printable at once and only a line wider than the width is
    fitted (a narrower one is its own fit, cut or wrapped)."""
    color = color_on()
    columns = width()
    fitted = wrap if fit == "wrap" else lambda line: [cut(line, columns)]
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) < ECHO_BATCH:
            continue
        _echo_batch(batch, columns, fitted, color)
        batch.clear()
    if batch:
        _echo_batch(batch, columns, fitted, color)


#: Texts :func:`echo_lines` writes at once.
ECHO_BATCH = 1024


def _echo_batch(texts: list[str], columns: int, fitted: Callable[[str], list[str]], color: bool) -> None:
    out: list[str] = []
    for line in printable("\n".join(texts)).split("\n"):  # a text may hold line breaks: each line is fitted
        if len(line) > columns:  # no more visible columns than characters: only such a line may not fit
            out.extend(fitted(line))
        else:
            out.append(line)
    click.echo("\n".join(out), color=color)


def one_line(message: str) -> str:
    return " ".join(str(message).splitlines())


def note(message: str) -> None:
    """A remark on stderr that does not change the exit status."""
    echo(f"agentsession: note: {one_line(message)}", err=True)


def read_stdin() -> bytes:
    """Standard input, whole. At a terminal a note first says it is read and how to end
    it: a bare `hash-object` (FILE defaults to it) or `append ID` would wait unexplained."""
    if terminal.isatty(sys.stdin):
        note("reading standard input (end it with Ctrl-D)")
    return sys.stdin.buffer.read()


def fail(
    message: str,
    *,
    code: str,
    as_json: bool | None = None,
    problems: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> NoReturn:
    """Print one line to stderr and exit 1; under ``--json``, one JSON object on stderr
    (``{"error": {"code": ..., "message": ...}}``) carrying the error's machine code,
    which every refusal names (the error class's ``code``; there is no default).
    ``as_json`` defaults to whether the command line holds ``--json``."""
    if as_json is None:
        ctx = click.get_current_context(silent=True)
        as_json = bool(ctx is not None and ctx.find_root().meta.get("agentsession.json"))
    if as_json:
        error: dict[str, Any] = dict(extra or {})
        error.update(code=code, message=one_line(message))
        if problems is not None:
            error["problems"] = problems
        click.echo(json.dumps({"error": error}, ensure_ascii=True), err=True)
    else:
        echo(f"{paint('agentsession: error:', 'bad', err=True)} {one_line(message)}", err=True)
    sys.exit(1)


def emit_json(obj: Any) -> None:
    text = json.dumps(obj, ensure_ascii=False, indent=2)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate read from the file: escape everything
        text = json.dumps(obj, ensure_ascii=True, indent=2)
    click.echo(text)


def _spool_file() -> IO[str]:
    """A temporary file for a long JSON document. (tempfile is imported here: with the
    random module it brings, it is start-up that only ``--json`` of a long listing needs.)"""
    import tempfile

    return tempfile.TemporaryFile("w+", encoding="utf-8")


class Made:
    """An element of a lazy sequence given to :class:`JsonStream` with its JSON text made
    ahead (``json.dumps(value, ensure_ascii=False, indent=2)``'s, as :func:`indented`
    made it, at no indent): the stream indents and writes that text, and asks ``value()``
    for the value only when it escapes every non-ASCII character (a lone surrogate met)."""

    __slots__ = ("text", "value")

    def __init__(self, text: str, value: Callable[[], Any]) -> None:
        self.text, self.value = text, value


class JsonStream:
    """:func:`emit_json`'s document (one object, or a list), written as its members are known: the
    same bytes (its key order, two-space indentation, the line after), a member at a time,
    and a list member an element at a time (:meth:`open_list`, :meth:`item`): what ``show
    --json`` writes as it reads the session, never holding the document. A member whose
    value holds a sequence that is not a list (a context's items read one at a time from
    their entries) has that sequence written element by element too, ``tidy()`` called
    after each (a caller re-parking what reading it woke).

    Written to standard output a batch at a time, or with ``spool`` to a temporary file
    copied out by :meth:`end` (a document that may still fail before its end leaves
    nothing on standard output). :func:`emit_json` escapes the whole document when any
    text holds a lone surrogate; here what is written after one is escaped, which is the
    same bytes unless a non-ASCII character was written before it (the same JSON value)."""

    BATCH = 1 << 20  # characters written at once
    TEXTS = 1024  # elements of a list of texts made at once

    def __init__(self, *, spool: bool = False, tidy: Callable[[], None] | None = None, array: bool = False) -> None:
        #: With ``array``, the document is a list (``log --json``'s): :meth:`item` writes its elements.
        self._brackets, self._indent = ("[]", "  ") if array else ("{}", "    ")
        self._parts: list[str] = [self._brackets[0]]
        self._size = 1
        self._first = True  # no member written yet (then: no element of the open list)
        self._ascii = False  # escape every non-ASCII character from now on (a lone surrogate was met)
        self._spool = _spool_file() if spool else None
        #: Called after each element of a lazy sequence is written (settable as the writing goes).
        self.tidy = tidy
        self._str = json.encoder.encode_basestring

    # -- members ---------------------------------------------------------------

    def member(self, key: str, value: Any) -> None:
        """``"key": value``, the next member."""
        self._put(("\n  " if self._first else ",\n  ") + self._dumps(key) + ": ")
        self._first = False
        self._value(value, "  ")

    def open_list(self, key: str) -> None:
        """A list member whose elements follow (:meth:`item`), closed by :meth:`close_list`."""
        self._put(("\n  " if self._first else ",\n  ") + self._dumps(key) + ": [")
        self._first = True

    def item(self, value: Any) -> None:
        self._put(("\n" if self._first else ",\n") + self._indent)
        self._value(value, self._indent, 0)
        self._first = False

    def close_list(self) -> None:
        self._put("]" if self._first else "\n  ]")
        self._first = False

    def end(self) -> None:
        """Close the document and write what is left (with ``spool``: all of it)."""
        self._put(self._brackets[1] if self._first else "\n" + self._brackets[1])
        self._put("\n")
        self._flush()
        if self._spool is not None:
            self._spool.seek(0)
            while chunk := self._spool.read(self.BATCH):
                click.echo(chunk, nl=False)
            self._spool.close()

    # -- values ----------------------------------------------------------------

    def _value(self, value: Any, indent: str, depth: int = 2) -> None:
        """``value`` at ``indent``: an object or a list ``depth`` levels down written a
        member or an element at a time (a long list's text is never made whole: json's
        indenting encoder holds each of its pieces), a lazy sequence at any depth."""
        inner = indent + "  "
        if value.__class__ is list and depth > 0 and value and not self._ascii and all(
                v.__class__ is str and v.isascii() for v in value):
            # a list of ASCII texts (a path's ids): a slice of them made at a time, not a
            # call or three an element (nor the list's text at once: a copy of each element)
            sep, enc, step = ",\n" + inner, self._str, self.TEXTS
            for at in range(0, len(value), step):
                self._put(("[\n" if at == 0 else ",\n") + inner + sep.join(map(enc, value[at : at + step])))
            self._put("\n" + indent + "]")
            return
        if isinstance(value, dict) and value and depth > 0:
            self._put("{")
            for i, (k, v) in enumerate(value.items()):
                self._put(("\n" if i == 0 else ",\n") + inner + self._dumps(k) + ": ")
                self._value(v, inner, depth - 1)
            self._put("\n" + indent + "}")
        elif (isinstance(value, list) and depth > 0) or _lazy(value):
            empty = True
            for element in value:
                self._put("[\n" if empty else ",\n")
                self._put(inner)
                self._value(element, inner, depth - 1)
                empty = False
                if self.tidy is not None and not isinstance(value, list):
                    self.tidy()
            self._put("[]" if empty else "\n" + indent + "]")
        else:
            self._put(self._text(value, indent))

    def _text(self, value: Any, indent: str) -> str:
        """``value`` as :func:`emit_json` writes it at ``indent``: a flat object (every
        member a string, number, bool or null: an entry's row) made here, the rest by
        ``json.dumps``; a :class:`Made` element's text as made."""
        if value.__class__ is Made:
            if not self._ascii:
                return value.text.replace("\n", "\n" + indent)
            value = value.value()
        if value.__class__ is str and not self._ascii:
            return self._checked(self._str(value), value, indent)
        if value.__class__ is dict and value and not self._ascii:
            enc, inner, rows = self._str, indent + "  ", []
            for k, v in value.items():
                if v.__class__ is str:
                    text = enc(v)
                elif v is None:
                    text = "null"
                elif v is True or v is False:
                    text = "true" if v else "false"
                elif v.__class__ is int:
                    text = int.__repr__(v)
                else:
                    break
                rows.append(f"{inner}{enc(k)}: {text}")
            else:
                return self._checked("{\n" + ",\n".join(rows) + "\n" + indent + "}", value, indent)
        made = None if self._ascii else indented(value)
        return (made if made is not None else self._dumps(value)).replace("\n", "\n" + indent)

    def _dumps(self, value: Any) -> str:
        return self._checked(json.dumps(value, ensure_ascii=self._ascii, indent=2), value, None)

    def _checked(self, text: str, value: Any, indent: str | None) -> str:
        if self._ascii or text.isascii():
            return text
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:  # a lone surrogate read from the file: escape from now on
            self._ascii = True
            text = json.dumps(value, ensure_ascii=True, indent=2)
            return text if indent is None else text.replace("\n", "\n" + indent)

    # -- output ----------------------------------------------------------------

    def _put(self, text: str) -> None:
        self._parts.append(text)
        self._size += len(text)
        if self._size >= self.BATCH:
            self._flush()

    def _flush(self) -> None:
        text = "".join(self._parts)
        self._parts.clear()
        self._size = 0
        if self._spool is not None:
            self._spool.write(text)
        elif text:
            click.echo(text, nl=False)


def indented(value: Any) -> str | None:
    """``json.dumps(value, ensure_ascii=False, indent=2)``, made by orjson (json's indenting
    encoder is Python's own, a context's items are most of a ``show --json``): only when
    orjson writes every token as json does, which their compact forms being equal proves
    (a float orjson writes otherwise, an integer past 64 bits, a lone surrogate: None)."""
    try:
        compact = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return None
    if compact.decode("utf-8") != json.dumps(value, ensure_ascii=False, separators=(",", ":")):
        return None
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode("utf-8")


def _lazy(value: Any) -> bool:
    """A sequence read as it is written (not a list, a tuple nor a text)."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, list, tuple))


class WholeWrites(io.RawIOBase):
    """Standard output's descriptor, each write carried to its last byte.

    write(2) may take only part of what it is given: on a pipe a parent set O_NONBLOCK
    (then EAGAIN once it is full), or when the reader leaves mid-write. Python's text
    layer over an unbuffered stream (PYTHONUNBUFFERED, ``python -u``) drops the rest
    without a word, and its buffered layer raises BlockingIOError: a document cut short
    and exit 0, or a stray error. Here a short write goes on, a full pipe is waited for
    (as git's xwrite polls), and a reader that left is BrokenPipeError (exit 141)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            try:
                done += os.write(self._fd, view[done:])
            except BlockingIOError:
                select.select([], [self._fd], [])
            except OSError as exc:  # a full device, a reader gone: the error names standard output ...
                if exc.filename is None:
                    exc.filename = "standard output"
                to_devnull(self._fd)  # ... and what is buffered behind it is not retried (and failed) at exit
                raise
        return done


def to_devnull(fd: int) -> None:
    """Point ``fd`` at /dev/null: output the reader cannot take any more is dropped quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError):
        pass


def whole_stdout() -> None:
    """Put the process's standard output behind :class:`WholeWrites`, with its encoding
    and buffering as they were (a stream a test put there is left as it is)."""
    out = sys.stdout
    if out is None or out is not sys.__stdout__ or not isinstance(out, io.TextIOWrapper):
        return
    try:
        fd = out.fileno()
        out.flush()
    except (OSError, ValueError):
        return
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(WholeWrites(fd)), encoding=out.encoding, errors=out.errors,
                                  line_buffering=out.line_buffering, write_through=out.write_through)


def write_bytes(data: bytes) -> None:
    """Raw bytes to stdout (projections and objects are printed exactly)."""
    sys.stdout.flush()
    out = sys.stdout.buffer
    out.write(data)
    out.flush()


def write_stream(chunks: Iterable[bytes]) -> None:
    """Raw pieces to stdout as they come, gathered into large writes (a projection's lines)."""
    from agentsession_cas.fsutil import batched

    sys.stdout.flush()
    out = sys.stdout.buffer
    for chunk in batched(chunks):
        out.write(chunk)
    out.flush()


def table(rows: list[list[str]], shrink: int | None = None) -> list[str]:
    """Rows as aligned lines that fit the width: column ``shrink`` (default: the last) is
    cut to what the others leave. Print them with ``echo(line, fit="cut")``."""
    rows, widths = fit_table(rows, shrink)
    return [table_line(r, widths[:-1]) for r in rows]


def table_line(row: list[str], widths: list[int]) -> str:
    """One row of :func:`table`, for a caller that knows the column widths before the rows
    (a listing printed as it is read): every cell but the last padded, two spaces apart."""
    cells = [c + " " * (w - len(visible(c))) for c, w in zip(row, widths)] + [row[-1]]
    return "  ".join(cells).rstrip()


def os_code(exc: OSError) -> str:
    """The machine code of an OSError a command reports: ``no_space`` for a full device,
    ``read_only`` for one mounted read-only."""
    if exc.errno in NO_SPACE_ERRNOS:
        return NoSpaceError.code
    return ReadOnlyError.code if exc.errno in READ_ONLY_ERRNOS else "os_error"


def os_message(exc: OSError) -> str:
    if exc.errno in NO_SPACE_ERRNOS:
        return (f"no space left on the device holding {exc.filename or 'the store'} ({exc.strerror}): "
                "free space and run it again (what the store holds reads as before; `agentsession fsck` checks it)")
    if exc.errno in READ_ONLY_ERRNOS:
        return (f"the device holding {exc.filename or 'the store'} is read-only ({exc.strerror}): make it writable "
                "and run it again (what the store holds reads as before; `agentsession fsck` checks it)")
    name = exc.filename if exc.filename is not None else ""
    if exc.filename in ("", b""):  # an empty name given (`show "$UNSET"`): said so, quoted
        name = "''"
    if isinstance(name, (str, bytes)) and len(name) > 200:  # a hostile path: still one short line
        name = quoted(name, 120)
    # (a directory where a session file was named says so itself: format/reader.py's
    # IsADirectoryError; one met elsewhere, a lock file, a header, is the system's words)
    reason = {
        FileNotFoundError: "no such file",
        PermissionError: "permission denied",
    }.get(type(exc), exc.strerror or str(exc))
    return f"{name}: {reason}" if name else reason




#: Whether the command run asked to end its process at once (:func:`end_at_once_after`).
_AT_ONCE = False


def end_at_once_after(asked: bool = True) -> None:
    """Say that this command's work is durable and its store closed: once its output is
    written and it exits 0, the installed command's process ends at once
    (:func:`~agentsession_cli.main.run`, the script's), not after the interpreter has freed
    the modules and what the command built one object at a time (about 20 ms after an
    import of 100,000 entries). Nothing is left to do then: no file is open for writing,
    every write was made durable before the command returned. (``asked`` False: not
    asked, as each run starts.)"""
    global _AT_ONCE
    _AT_ONCE = asked


def ended_at_once(code: Any) -> None:
    """End the process now, with ``code`` (0 or None), when the command asked to
    (:func:`end_at_once_after`) and its output is all written; else return."""
    global _AT_ONCE
    asked, _AT_ONCE = _AT_ONCE, False
    if not asked or code not in (0, None):
        return
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return  # (what could not be written is the normal exit's to report)
    os._exit(0)


def whole_pass(fn: _F) -> _F:
    """A command (or the part of one) that passes once over a whole session runs with the
    cyclic collector off, turned back on once it returns, when what the pass held is
    gone. The library pauses the collector for its passes too, but turned back on while
    the pass's result is still held (a verify's report, an import's session) its first
    collection scans every object of it: a tenth to a fifth of a verify's CPU time, for
    cycles such a pass does not make."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return run  # type: ignore[return-value]
