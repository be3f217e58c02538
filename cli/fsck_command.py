"""fsck: walk the whole store and report every problem."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
