"""Output helpers shared by the commands: JSON on stdout, tables and progress on the terminal."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from insitu.errors import InsituError, UsageError
from insitu.io import atomic_write_json, to_jsonable

#: Messages and progress go to stderr so that stdout stays clean for --json. When a stream is not a
#: terminal (a pipe, a log file), its lines are never wrapped at 80 columns (``soft_wrap``).
console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())
#: Human-readable reports (tables) go to stdout.
report = Console(soft_wrap=not sys.stdout.isatty())

#: Without a terminal, a progress line is printed at most this often (seconds)...
PLAIN_EVERY_S = 30.0
#: ...and at least this much of the work apart (fraction), but not closer than PLAIN_MIN_S.
PLAIN_STEP = 0.1
PLAIN_MIN_S = 2.0


def emit_json(payload) -> None:
    """Print one JSON document on stdout."""
    click.echo(json.dumps(payload, indent=2, default=to_jsonable))


def print_table(table) -> None:
    """Print a rich table on stdout, never cutting a cell: columns wrap (fold) on a terminal, and
    when stdout is not one (a pipe, a file) the table takes the width its cells need."""
    for column in table.columns:
        column.overflow, column.no_wrap = "fold", False
    if report.is_terminal:
        report.print(table)
    else:
        Console(file=sys.stdout, width=100_000, soft_wrap=True).print(table)


def _figures(figures: dict) -> str:
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in figures.items() if v is not None)


class Ticker:
    """What :func:`progress` yields: ``ticker(n)`` advances by n; ``ticker.note(**figures)`` shows
    live figures (``loss=...``) and ``ticker.note(stage="test")`` says what is being done."""

    def __init__(self, description: str, total: int, bar=None, task=None):
        self.description, self.total, self.bar, self.task = description, total, bar, task
        self.done, self.figures, self.stage = 0, {}, None
        self.started = self.last_line = time.monotonic()
        self.last_step = 0        # the multiple of PLAIN_STEP of the work at the last line
        self.counting = False     # the clock restarts at the first advance: slow setup before it
                                  # (a pre-training, a build) is not the run's time

    def __call__(self, n: int = 1) -> None:
        if not self.counting:
            self.counting = True
            self.started = self.last_line = time.monotonic()
        self.done += n
        if self.bar is not None:
            self.bar.advance(self.task, n)
        else:
            self._plain_line()

    def note(self, stage: str | None = None, **figures) -> None:
        self.figures.update(figures)
        if stage is not None:
            self.stage = stage if stage != "train" else None
        status = _figures(self.figures)
        if self.stage:
            status = f"{self.stage}..." + (f" ({status})" if status else "")
        if self.bar is not None:
            self.bar.update(self.task, status=status)
        elif stage is not None and self.stage:
            self._plain_line()         # a stage shows on the next line that is due, never between

    def _step_reached(self) -> int:
        """How many whole PLAIN_STEPs of the work are done (counted exactly, in integers)."""
        steps = round(1 / PLAIN_STEP)
        return self.done * steps // self.total if self.total else steps

    def _plain_line(self) -> None:
        now = time.monotonic()
        fraction = self.done / self.total if self.total else 1.0
        step = self._step_reached()
        due = now - self.last_line >= PLAIN_EVERY_S or (
            step > self.last_step and now - self.last_line >= PLAIN_MIN_S)
        if not due:
            return
        self.last_line, self.last_step = now, step
        figures = _figures(self.figures)
        doing = f", {self.stage}" if self.stage else ""
        print(f"{self.description}: {self.done}/{self.total} ({100 * fraction:.0f} %), "
              f"{now - self.started:.0f} s{doing}{', ' + figures if figures else ''}",
              file=sys.stderr, flush=True)


@contextmanager
def progress(description: str, total: int, enabled: bool = True):
    """Progress on stderr; yields a :class:`Ticker`. A rich bar on a terminal, plain lines now and
    then when stderr is not one (a log stays readable); nothing when not ``enabled``."""
    if not enabled:
        yield Ticker(description, total, bar=_Silent(), task=None)
        return
    if not sys.stderr.isatty():
        yield Ticker(description, total)
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), TextColumn("{task.fields[status]}"), console=console,
                  transient=True) as bar:
        task = bar.add_task(description, total=total, status="")
        yield Ticker(description, total, bar, task)


class _Silent:
    """A bar that shows nothing (progress turned off)."""

    def advance(self, task, n) -> None:
        pass

    def update(self, task, **fields) -> None:
        pass


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
