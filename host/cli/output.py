"""Output helpers shared by the commands: JSON on stdout, tables and progress on the terminal."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from insitu.io import to_jsonable

#: Messages and progress go to stderr so that stdout stays clean for --json.
console = Console(stderr=True)
#: Human-readable reports (tables) go to stdout.
report = Console()


def emit_json(payload) -> None:
    """Print one JSON document on stdout."""
    click.echo(json.dumps(payload, indent=2, default=to_jsonable))


@contextmanager
def progress(description: str, total: int, enabled: bool = True):
    """A rich progress bar on stderr; yields ``advance(n=1)``. Silent when stderr is not a tty."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n=1: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)
