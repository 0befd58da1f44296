"""Output helpers shared by the commands: JSON on stdout, tables and progress on the terminal."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from insitu.errors import InsituError, UsageError
from insitu.io import atomic_write_json, to_jsonable

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


def usage_errors(fn, *args, **kwargs):
    """Run a library call; its ValueErrors are the user's bad input (exit 2)."""
    import numpy as np

    try:
        return fn(*args, **kwargs)
    except np.linalg.LinAlgError:
        raise                              # a numerical failure is not the user's input
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def write_json(path, payload, what) -> None:
    """Write a result file atomically; an OS error names the option and the reason."""
    try:
        atomic_write_json(path, payload)
    except OSError as exc:
        raise InsituError(f"cannot write {what} {path}: {exc.strerror}") from None


def per_run_path(path: str | None, name: str, several: bool) -> str | None:
    """With several runs in one command, each gets its own file: run.npz -> run-NAME.npz."""
    if not path or not several:
        return path
    stem = path[:-4] if path.endswith(".npz") else path
    return f"{stem}-{name}.npz"
