"""The ``agentsession`` command line. Parsing and printing only; the work is the library's.

Exit codes: 0 success; 1 a problem was found (and reported) or an error
stopped the command; 2 a usage error (click's own).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import importlib
import json
import os
import stat
import sys
from typing import Any, NoReturn

import click

from agentsession_cas import __version__
from agentsession_cas.errors import AgentSessionError, SessionFormatError

from . import terminal
from .common import (
    EXIT_INTERRUPTED,
    EXIT_PIPE,
    EXIT_TERMINATED,
    EXIT_USAGE,
    end_at_once_after,
    ended_at_once,
    fail,
    os_code,
    os_message,
    to_devnull,
    whole_stdout,
)

#: Each subcommand: the module of this package that defines it, imported only when
#: that subcommand runs, and the summary `--help` lists (its docstring's first
#: sentence; tests/test_cli_startup.py holds the two equal). `--version`, `--help`,
#: `head` and `append` do not pay for the file readers, exchange and maintenance.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "show": ("file_commands", "Print a session's entries in file order, then the context at its leaf."),
    "verify": ("file_commands", 'Check a session file or a stored session; exit 1 on any problem.'),
    "hash-object": ("file_commands", 'Print the computed id and content hash of each entry line in FILE (or stdin).'),
    "init": ("store_commands", 'Create the store (or find the one there) and say which, with its path.'),
    "list": ("list_command", "List the store's sessions, newest activity first: title, model, harness, times, entries, head, mark."),
    "log": ("store_commands", "Print a session's log records: line, op, seq, entry, head."),
    "export": ("store_commands", "Print a session's projection (RFC 0002) to stdout, or write it to FILE."),
    "import": ("store_commands", "Import a session file; print the new session's id."),
    "create": ("store_commands", 'Create a session (a record) and print its id.'),
    "append": ("store_commands", 'Append one entry, given as a JSON object on stdin, and print its id.'),
    "head": ("store_commands", "Print a session's head (nothing when it has none), or move it with NEW --expect OLD."),
    "cat-object": ("store_commands", "Print an object's bytes, verified against its name (sha256:<64 hex>, or a unique prefix of 4+ hex digits)."),
    "delete": ("store_commands", 'Delete a session (its objects stay; other sessions may share them).'),
    "rev-parse": ("store_commands", "Print the session id a name resolves to (and an entry's full id)."),
    "pack": ("maintenance_commands", 'Move every loose object and every pack into one new pack, recompressed.'),
    "sweep": ("maintenance_commands", 'Remove objects nothing retained names (RFC 0002 "Deletion and retention").'),
    "fsck": ("fsck_command", 'Check the whole store, as `git fsck --full` does; exit 1 if anything is damaged.'),
    "migrate": ("migrate_command", "Convert a store of the earlier journal layout, or of the reference library's, to this release's layout, in place."),
    "repair": ("repair_command", "Rewrite a damaged session's log from the records that read."),
    "ref": ("ref_commands", 'Named refs: store-wide names (chat/slack/C123) for sessions.'),
    "push": ("exchange_commands", "Push session ID, of which this store is the record, to REMOTE (a store's path or URL, or an http(s) server)."),
    "fetch": ("exchange_commands", 'Fetch session ID from REMOTE, which may be its record or a mirror.'),
    "handover": ("exchange_commands", 'Hand session ID over to REMOTE: push it, make the remote the record, then make this store a mirror.'),
    "declare-record": ("exchange_commands", 'Make a store the record of session ID, which it holds as a mirror.'),
    "take-back": ("exchange_commands", 'Take the record of session ID back from REMOTE: fetch, declare it here, release it there.'),
    "diff": ("view_commands", "Compare two sessions, or two entries' paths: the common prefix, then what only each holds."),
    "grep": ("view_commands", "Search entries' text for a regular expression; exit 1 when nothing matches."),
    "stats": ("view_commands", "Print the store's objects, logical versus stored bytes, and how much sessions share."),
    "serve": ("serve_command", "Serve the store over HTTP (RFC 0003) until interrupted."),
}


#: The group's options that take a value and may also be written after the subcommand.
_GLOBAL_WITH_VALUE = ("--store", "-C", "--color")
#: ... and those that take none, or are written ``--name=value``.
_GLOBAL_FLAGS = ("--no-pager",)
_GLOBAL_JOINED = ("--store=", "--color=")


def hoist_global_options(args: list[str]) -> list[str]:
    """Move ``--store X``, ``--store=X``, ``-C X``, ``--color[=]X`` and ``--no-pager``
    written after the subcommand to before it, so either place works, as users of git
    expect. Nothing after ``--`` is touched."""
    cmd = 0  # the subcommand's index: the first word that is no option nor an option's value
    while cmd < len(args) and (args[cmd].startswith("-") or (cmd and args[cmd - 1] in _GLOBAL_WITH_VALUE)):
        if args[cmd] == "--":
            return args
        cmd += 1
    head, tail = args[: cmd + 1], args[cmd + 1 :]
    moved: list[str] = []
    kept: list[str] = []
    i = 0
    while i < len(tail):
        a = tail[i]
        if a == "--":
            kept.extend(tail[i:])
            break
        if a in _GLOBAL_WITH_VALUE and i + 1 < len(tail):
            moved.extend(tail[i : i + 2])
            i += 2
            continue
        (moved if a.startswith(_GLOBAL_JOINED) or a in _GLOBAL_FLAGS else kept).append(a)
        i += 1
    if not moved:
        return args
    return head[:-1] + moved + head[-1:] + kept


class App(click.Group):
    """Turns the library's errors and OS errors into one line and exit 1, never a traceback;
    loads each subcommand's module on first use (:data:`LAZY_COMMANDS`)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        whole_stdout()  # nothing printed is lost to a short write (a non-blocking pipe)
        end_at_once_after(False)
        return super().main(*args, **kwargs)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None or cmd_name not in LAZY_COMMANDS:
            return found
        module = importlib.import_module(f".{LAZY_COMMANDS[cmd_name][0]}", __package__)
        for command in module.COMMANDS:
            if command.name == cmd_name:
                if ctx.resilient_parsing:  # completing: session ids and ref names where they go
                    from .completion import attach

                    attach(command)
                return command
        raise RuntimeError(f"{module.__name__} does not define the command {cmd_name!r}")

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """A mistyped command is a usage error naming the commands it is close to (as git's
        "did you mean"): click looks only among the commands loaded, which here are none."""
        name = args[0] if args else ""
        if (name and not name.startswith("-") and not ctx.resilient_parsing and name not in LAZY_COMMANDS
                and super().get_command(ctx, name) is None):
            from difflib import get_close_matches  # a mistyped command's path only

            close = [repr(c) for c in get_close_matches(name, self.list_commands(ctx))]
            hint = "" if not close else f" Did you mean {close[0]}?" if len(close) == 1 else f" Did you mean one of {', '.join(close)}?"
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from the table, so help imports no subcommand's module."""
        rows = [(name, LAZY_COMMANDS[name][1]) for name in sorted(LAZY_COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # Under --json an error is one JSON object on stderr carrying its code: note it
        # while every argument is still in sight (the subcommand's included).
        ctx.meta["agentsession.json"] = "--json" in args
        terminal.configure(as_json="--json" in args)  # a run starts afresh (the tests run many)
        try:
            return super().parse_args(ctx, hoist_global_options(args))
        except click.UsageError as exc:  # the group's own options: what invoke does for the rest
            if not ctx.meta["agentsession.json"]:
                raise
            usage_json(exc)

    def invoke(self, ctx: click.Context) -> Any:
        previous = _stop_on_sigterm()
        try:
            return self._invoke(ctx)
        finally:
            if previous is not None:
                _signal.signal(_signal.SIGTERM, previous)

    def _invoke(self, ctx: click.Context) -> Any:
        as_json = bool(ctx.meta.get("agentsession.json"))
        try:
            try:
                return super().invoke(ctx)
            finally:
                terminal.stop_pager()  # what went to the pager is read before the command ends
        except SessionFormatError as exc:
            fail(str(exc), code=exc.code, as_json=as_json, problems=[p.as_dict() for p in exc.problems])
        except AgentSessionError as exc:
            fail(str(exc), code=exc.code, as_json=as_json, extra=exc.as_dict()["error"])
        except BrokenPipeError:
            # The reader went away (`| head`): stop quietly with 128+SIGPIPE, as git does.
            try:
                to_devnull(sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            sys.exit(EXIT_PIPE)
        except KeyboardInterrupt:
            # Ctrl-C: no traceback, no "Aborted!", 128+SIGINT as a shell reports it.
            sys.stderr.write("\n")
            sys.exit(EXIT_INTERRUPTED)
        except Terminated:
            # SIGTERM: what was being written was let go as Ctrl-C lets it go (an import's
            # stage and partial packs removed), then 128+SIGTERM as a shell reports it.
            sys.exit(EXIT_TERMINATED)
        except OSError as exc:
            fail(os_message(exc), code=os_code(exc), as_json=as_json)
        except click.UsageError as exc:
            if not as_json:
                raise
            usage_json(exc)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except ValueError as exc:
            if "null byte" not in str(exc):  # os and open() refuse a path holding NUL so
                fail(f"internal error ({type(exc).__name__}: {exc}); please report it", code="internal", as_json=as_json)
            fail("a file name cannot hold a NUL character", code="bad_name", as_json=as_json)
        except Exception as exc:  # a bug of ours: still one line, never a traceback
            fail(f"internal error ({type(exc).__name__}: {exc}); please report it", code="internal", as_json=as_json)


class Terminated(BaseException):
    """SIGTERM, raised where the command is, as Ctrl-C raises KeyboardInterrupt: not an
    ``Exception``, so only the cleanups (``finally``, ``except BaseException``) see it
    on its way out, and the temporary files of a write are removed as for Ctrl-C."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def _stop_on_sigterm() -> Any:
    """SIGTERM ends the command through :class:`Terminated` (default: the process dies
    where it is, leaving an import's partial packs in tmp/); the handler it replaces, to
    put back when the command returns (a program calling :func:`main` goes on), or None
    off the main thread, where no handler can be set. (``_signal``: the built-in module,
    loaded already; ``signal`` would cost a command's start-up its import.)"""
    try:
        return _signal.signal(_signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread
        return None


def usage_json(exc: click.UsageError) -> NoReturn:
    """Under --json the usage error too is one JSON object on stderr, exit 2 as click's."""
    click.echo(json.dumps({"error": {"code": "usage", "message": exc.format_message()}}, ensure_ascii=True), err=True)
    sys.exit(EXIT_USAGE)


@click.group(cls=App, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentsession")
@click.option(
    "--store",
    "store_path",
    metavar="PATH",
    help="The store (a directory or URL). Default: the one found walking up from the working "
    "directory, else $AGENTSESSION_STORE, else ~/.agent/cas.",
)
@click.option(
    "-C",
    "directory",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Run as if started in DIR (as git -C): paths and the store search start there.",
)
@click.option("--no-pager", is_flag=True, help="Do not send long output through a pager ($AGENTSESSION_PAGER, $PAGER, less).")
@click.option("--color", "color", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="Colour human output: auto colours it on a terminal only, unless NO_COLOR is set.")
@click.pass_context
def main(ctx: click.Context, store_path: str | None, directory: str | None, no_pager: bool, color: str) -> None:
    """A git-like content-addressed store for agent session records.

    It reads, shows and verifies Agent Session Format files, and holds
    sessions in a store, which it checks, packs, sweeps and exchanges with
    other stores. `agentsession COMMAND --help` says more of each.
    """
    if store_path == "":  # `--store "$UNSET"`: not the store the search would find, which `delete` would change
        raise click.BadParameter("an empty value names no store; leave --store out for the default", param_hint="--store")
    if directory:  # an empty -C changes nothing, as git's
        try:
            os.chdir(directory)
        except OSError as exc:
            fail(f"cannot change to {directory}: {exc.strerror}", code=os_code(exc))
    s = terminal.settings()
    s.pager, s.color = not no_pager, color
    ctx.obj = {"store": store_path}


def start_helper_early(args: list[str]) -> None:
    """``import FILE`` or ``verify FILE`` of a file big enough for a helper process
    (format/parallel.py): the helper started now, before this process loads the store's
    and the rules' modules (about 0.15 s, which the helper's own start then overlaps),
    for the command's pass to take (``parallel.start_early``), and this process's heap
    kept for the pass as the helper's is (``parallel.keep_heap``). Anything else: nothing.
    Only a guess from the words: a helper started for nothing is killed at exit, and one
    not started is started by the pass as ever."""
    args = hoist_global_options(args)
    i, where = 0, ""
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        if args[i] == "-C" and i + 1 < len(args):
            where = args[i + 1]
        i += 2 if args[i] in _GLOBAL_WITH_VALUE else 1
    if args[i : i + 1] not in (["import"], ["verify"]):
        return
    files = [a for a in args[i + 1 :] if not a.startswith("-")]  # (their options take no value)
    if len(files) != 1 or files[0] == "-":
        return
    try:
        st = os.stat(os.path.join(where, files[0]))
    except (OSError, ValueError):
        return
    from agentsession_cas.format import parallel

    if stat.S_ISREG(st.st_mode) and parallel.wanted(st.st_size, None):
        parallel.start_early(blocks=args[i] == "import")
        parallel.keep_heap()  # (this process's pass: its freed memory kept for it, as its helper's is)


def run() -> None:
    """The installed ``agentsession`` script: :func:`main`, and a command that said its
    work is durable and its store closed (:func:`~.common.end_at_once_after`: an import)
    ends the process at once once it exits 0, its output flushed, rather than after the
    interpreter has freed its modules and objects one by one. Only here: a program that
    calls :func:`main` itself (a test's runner, an embedding) goes on after it."""
    start_helper_early(sys.argv[1:])
    try:
        main()
    except SystemExit as exc:
        ended_at_once(exc.code)
        raise


if __name__ == "__main__":  # pragma: no cover
    run()
