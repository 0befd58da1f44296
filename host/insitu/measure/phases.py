"""Phase markers: how a run tells the power recorder what it is doing, and when.

The protocol is one environment variable and one file per recorder. The recorder (``insitu power
record``, ``insitu train --meter``, or a board's rails recording) adds the path of its file to
:data:`PHASE_ENV` (``os.pathsep``-separated, so that recordings may nest); the measured run appends
one JSON object per line to each::

    {"t": 1732370000.123456, "phase": "train", "event": "start", "samples": null}
    {"t": 1732370042.654321, "phase": "train", "event": "stop", "samples": 6000}

``t`` is the host's ``time.time()`` (the clock :attr:`insitu.measure.meters.Meter.started_at` is
on, so the recorder aligns markers and power samples); ``event`` is ``start`` or ``stop``;
``samples`` counts the training samples the phase processed (the ``stop`` marker's count wins over
the ``start`` marker's; either may be null). Further keys are allowed and ignored.

A run marks its phases with :func:`phase` (a context manager) or :func:`mark`; both do nothing when
the variable is unset, so training code calls them unconditionally::

    from insitu.measure.phases import phase

    with phase("train") as p:
        ...                      # the work
        p.samples = done         # counted as it went

Each marker is written with a single ``write`` on a file opened with ``O_APPEND``: complete lines,
in order, even from several processes. A marker that cannot be written is a warning, never an
error: measuring must not stop the training it measures.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: The environment variable naming the marker file (unset: markers are no-ops).
PHASE_ENV = "INSITU_PHASE_FILE"

EVENTS = ("start", "stop")


def mark(name: str, event: str, samples: int | None = None, t: float | None = None) -> None:
    """Append one marker (``event`` is ``start`` or ``stop``) to each file :data:`PHASE_ENV` names."""
    paths = [p for p in os.environ.get(PHASE_ENV, "").split(os.pathsep) if p]
    if not paths:
        return
    if event not in EVENTS:
        raise ValueError(f"phase marker event must be one of {EVENTS}, got {event!r}")
    line = json.dumps({"t": time.time() if t is None else float(t), "phase": str(name),
                       "event": event, "samples": None if samples is None else int(samples)})
    for path in paths:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:
            warnings.warn(f"cannot write the phase marker to {path} ({PHASE_ENV}): {exc.strerror}",
                          RuntimeWarning, stacklevel=2)


@contextmanager
def listening(path: str | Path):
    """Add ``path`` to :data:`PHASE_ENV` for the ``with`` block (markers go to it as well as to
    any recorder already listening); the variable is restored after."""
    previous = os.environ.get(PHASE_ENV)
    os.environ[PHASE_ENV] = os.pathsep.join(p for p in (previous, str(path)) if p)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(PHASE_ENV, None)
        else:
            os.environ[PHASE_ENV] = previous


class PhaseHandle:
    """What :func:`phase` yields: set :attr:`samples` before the phase ends to count them."""

    def __init__(self, name: str, samples: int | None):
        self.name, self.samples = name, samples


@contextmanager
def phase(name: str, samples: int | None = None):
    """Mark ``name`` as running for the duration of the ``with`` block (also when it raises)."""
    handle = PhaseHandle(name, samples)
    mark(name, "start", samples)
    try:
        yield handle
    finally:
        mark(name, "stop", handle.samples)


def enabled() -> bool:
    """Whether a recorder listens (:data:`PHASE_ENV` is set)."""
    return bool(os.environ.get(PHASE_ENV))


# ----------------------------------------------------------------------------- the reader's side

@dataclass
class Interval:
    """One phase, from its start marker to its stop marker (host times, ``time.time()``)."""

    name: str
    start: float
    stop: float | None             # None: never stopped (the run was cut short)
    samples: int | None = None


def read_markers(path: str | Path) -> list[dict]:
    """The well-formed markers of a marker file, in file order. A missing file has none; a line
    that is not a marker (a torn last line of a killed run, stray output) is skipped."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return []
    markers = []
    for line in text.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if not isinstance(m, dict) or m.get("event") not in EVENTS or "phase" not in m:
            continue
        t, samples = m.get("t"), m.get("samples")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            continue
        if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int)):
            samples = None
        markers.append({"t": float(t), "phase": str(m["phase"]), "event": m["event"], "samples": samples})
    return markers


def intervals(markers: list[dict]) -> list[Interval]:
    """Pair start and stop markers by phase name (a name may run many times, and phases may nest
    or overlap); sorted by start. A start never stopped is open (``stop`` None); a stop without a
    start is dropped."""
    open_: dict[str, list[Interval]] = {}
    done: list[Interval] = []
    for m in sorted(markers, key=lambda m: m["t"]):
        name = m["phase"]
        if m["event"] == "start":
            open_.setdefault(name, []).append(Interval(name, m["t"], None, m["samples"]))
        elif open_.get(name):
            iv = open_[name].pop()
            iv.stop = m["t"]
            if m["samples"] is not None:
                iv.samples = m["samples"]
            done.append(iv)
    done.extend(iv for ivs in open_.values() for iv in ivs)
    return sorted(done, key=lambda iv: iv.start)
