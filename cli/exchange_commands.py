"""push, fetch, handover, declare-record, take-back: exchange between stores."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
