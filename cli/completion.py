"""Shell completion (bash, zsh, fish, through click): subcommands, session ids and
``ref:`` names where a session is taken, ref names where a ref is, files beside sessions
where either is (``show FILE|ID``). Enable it as ``docs/cli.md`` says."""

from __future__ import annotations

import os
from typing import Any

import click
from click.shell_completion import CompletionItem

#: Argument metavars that name a session; those with FILE also complete files.
_SESSION_METAVARS = {"ID", "SESSION", "FILE|ID", "[FILE|ID]"}


def _store(ctx: click.Context) -> Any:
    """The store the command line names (``--store``, ``-C``, else found as a command
    would), read-only; None when there is none to read (completion never fails loudly)."""
    from agentsession_cas.backends.files.layout import find_store
    from agentsession_cas.errors import AgentSessionError
    from agentsession_cas.store import default_store_path
    from agentsession_cas.store.url import open_store

    root = ctx.find_root().params
    base = root.get("directory") or os.getcwd()
    given = root.get("store_path") or find_store(os.path.abspath(base)) or default_store_path()
    try:
        return open_store(given, readonly=True)
    except (AgentSessionError, OSError):
        return None


def _refs(store: Any, incomplete: str) -> list[str]:
    from agentsession_cas.store.refs import Refs

    return Refs(store).names(incomplete)


def complete_session(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Session ids, then ``ref:NAME`` for each ref, that start with what was typed."""
    out: list[CompletionItem] = []
    store = _store(ctx)
    if store is not None:
        try:
            if incomplete.startswith("ref:"):
                out = [CompletionItem("ref:" + n) for n in _refs(store, incomplete[4:])]
            else:
                out = [CompletionItem(s) for s in store.list() if s.startswith(incomplete)]
                out += [CompletionItem("ref:" + n) for n in _refs(store, "") if ("ref:" + n).startswith(incomplete)]
        except Exception:  # a damaged store: offer what was found, never a traceback in a shell
            pass
        finally:
            store.close()
    if "FILE" in (param.metavar or ""):
        out.append(CompletionItem(incomplete, type="file"))
    return out


def complete_ref(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Ref names that start with what was typed."""
    store = _store(ctx)
    if store is None:
        return []
    try:
        return [CompletionItem(n) for n in _refs(store, incomplete)]
    except Exception:
        return []
    finally:
        store.close()


def attach(command: click.Command) -> click.Command:
    """Give a command's session and ref arguments their completion (and its
    subcommands', for a group such as ``ref``), where none is set."""
    for param in command.params:
        if not isinstance(param, click.Argument) or getattr(param, "_custom_shell_complete", None) is not None:
            continue
        if param.metavar in _SESSION_METAVARS:
            param._custom_shell_complete = complete_session
        elif command.name in ("show", "update", "delete") and param.name == "name" and param.metavar is None:
            param._custom_shell_complete = complete_ref  # ref show|update|delete NAME
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            attach(sub)
    return command
