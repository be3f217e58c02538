"""``show --graph``: the ``show`` command, with the entry tree drawn as ``git log --graph``.

The command is file_commands' ``show`` with one more option: its own options and
behaviour are taken from there as they stand, and ``--graph`` prints the drawing
(:func:`agentsession_cas.store.views.graph_rows`) instead of the listing.
"""

from __future__ import annotations

from typing import Any

import click

from agentsession_cas.format.entry import Entry, short_id
from agentsession_cas.store.views import graph_rows

from . import file_commands, store_commands
from .common import echo, emit_json
from .describe import describe

_base = file_commands.show

#: show's options that choose what the listing or the context holds: the graph draws
#: every entry and no context, so they do not go with it.
_NOT_WITH_GRAPH = {"leaf_name": "--leaf", "show_runs": "--runs", "first": "-n", "last": "--tail",
                   "follow": "-f", "remote": "--remote"}


def _marks(e: Entry, head: str | None, base: str | None, labels: dict[str, list[str]]) -> list[str]:
    marks = []
    if e.id == head:
        marks.append("(head)")
    if base is not None and e.id == base:
        marks.append("(base)")
    marks.extend(f"[{text}]" for text in labels.get(e.id, ()))
    return marks


def draw(file: str, as_json: bool, verbose: bool) -> None:
    """Print the graph of a session file or a stored session."""
    target = store_commands.locate(file, files=True)
    sf = store_commands.read_file_arg(file) if target.kind == "file" else store_commands.projection_file(target)
    head, base = sf.leaf, sf.header.base
    labels: dict[str, list[str]] = {}
    for e in sf.entries:
        if e.type == "label" and isinstance(e.get("target"), str) and isinstance(e.label, str):
            labels.setdefault(e.get("target"), []).append(e.label)
    rows = graph_rows(sf.entries)
    if as_json:
        emit_json({
            "session": sf.header.id,
            "head": head,
            "base": base,
            "entries": [{"id": r.entry.id, "parent": r.entry.parent, "type": r.entry.type,
                         "summary": describe(r.entry, verbose), "graph": r.lanes,
                         **({"branch": r.branch} if r.branch is not None else {}),
                         **({"collapse": r.collapse} if r.collapse is not None else {}),
                         "marks": _marks(r.entry, head, base, labels)} for r in rows],
        })
        return
    width = max((len(r.lanes) for r in rows), default=0)
    for r in rows:
        if r.branch is not None:
            echo(r.branch)
        marks = _marks(r.entry, head, base, labels)
        line = f"{r.lanes.ljust(width)}  {short_id(r.entry.id)}  {r.entry.type:<10} {describe(r.entry, verbose)}"
        echo((line + "  " + " ".join(marks)) if marks else line)
        if r.collapse is not None:
            echo(r.collapse)


def _show(graph: bool, **kwargs: Any) -> None:
    if not graph:
        _base.callback(**kwargs)  # type: ignore[misc]
        return
    given = [opt for name, opt in _NOT_WITH_GRAPH.items() if kwargs.get(name) not in (None, False)]
    if given:
        raise click.UsageError(f"--graph draws every entry and no context: it does not go with {', '.join(given)}")
    draw(kwargs["file"], kwargs["as_json"], kwargs["verbose"])


show = click.Command(
    "show",
    callback=_show,
    params=[*_base.params, click.Option(["--graph"], is_flag=True, help=(
        "Draw the entry tree as `git log --graph` does, oldest first: one line per entry (type and "
        "summary), branches in lanes, labels, the fork's base and the head marked."))],
    help=(_base.help or "") + "\n\nWith --graph, the entries are drawn as a tree instead (docs/cli.md).",
    short_help=_base.short_help,
)

COMMANDS: list[click.Command] = [show]
