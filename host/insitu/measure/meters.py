"""Power meters behind one interface, chosen by a spec string (``--meter SPEC``).

A :class:`Meter` streams :class:`Sample`\\ s: ``start()`` begins an acquisition, ``read(timeout_s)``
returns the samples that arrived since the last call (an empty list when none came in time: a
stalled stream is not an error until the caller says so), ``stop()`` ends it. Sample times are
seconds since the acquisition started, on the meter's clock where it has one; ``started_at`` is
the host's ``time.time()`` when the acquisition started, which maps them onto the host's clock
(where the training run's phase markers are).

Specs (``KIND`` or ``KIND:ARGUMENT``; each kind registers itself in :data:`KINDS`):

- ``synthetic:WATTS[@HZ]`` — a constant (or ``synthetic:sine``…) generated trace, for tests and
  dry runs; named as what it is, it measures nothing.
- further kinds (SCPI instruments over PyVISA, the PowerShield over pyserial, PYNQ rails) live in
  their own modules and are registered on import.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from insitu.errors import InsituError, UsageError


@dataclass(frozen=True)
class Sample:
    t: float                       # seconds since the acquisition started (the meter's clock)
    watts: float
    volts: float | None = None
    amps: float | None = None


class MeterError(InsituError):
    """A meter is unreachable, misconfigured, or answered something that is not a measurement;
    the message names the meter (its resource or port) and what to check."""


class Meter(ABC):
    """One power source. Use as a context manager: ``with open_meter(spec) as m: m.start() ...``."""

    #: What the meter is, in words (its resource, port or kind), for messages and records.
    name: str = "meter"
    #: host time.time() at start(); sample times are relative to it
    started_at: float | None = None

    def open(self) -> None:
        """Connect and configure (an unreachable instrument raises :class:`MeterError`)."""

    @abstractmethod
    def start(self) -> None:
        """Begin acquiring; sets :attr:`started_at`."""

    @abstractmethod
    def read(self, timeout_s: float = 1.0) -> list[Sample]:
        """The samples that arrived since the last call, waiting up to ``timeout_s`` for the first."""

    def stop(self) -> None:
        """End the acquisition (samples already read stay valid)."""

    def close(self) -> None:
        """Disconnect."""

    def describe(self) -> dict:
        """What a record says about the meter (kind, resource, settings)."""
        return {"meter": self.name}

    def __enter__(self) -> Meter:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self.close()


class SampleQueue:
    """Samples handed from a meter's reader thread to its ``read()``: the thread calls
    :meth:`put` (or :meth:`fail` when it stops on an error), ``read()`` calls :meth:`take`."""

    def __init__(self):
        self._cond = threading.Condition()
        self._items: deque[Sample] = deque()
        self._error: BaseException | None = None

    def put(self, samples) -> None:
        with self._cond:
            self._items.extend(samples)
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            self._items.clear()
            self._error = None

    def take(self, timeout_s: float, running: Callable[[], bool]) -> tuple[list[Sample], BaseException | None]:
        """What arrived, waiting up to ``timeout_s`` for the first sample while ``running()``;
        with nothing to give, the thread's error (once) as the second item."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._items and self._error is None and running():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            out, err = list(self._items), None
            self._items.clear()
            if not out and self._error is not None:
                err, self._error = self._error, None
        return out, err


class SyntheticMeter(Meter):
    """A generated trace (no instrument): ``watts(t)`` sampled at ``rate_hz`` in real time."""

    def __init__(self, watts: Callable[[float], float], rate_hz: float = 1000.0, label: str = "synthetic"):
        if not rate_hz > 0:
            raise UsageError(f"synthetic meter: the rate must be positive, got {rate_hz!r}")
        self.watts, self.rate_hz, self.name = watts, float(rate_hz), label
        self._next = 0

    def start(self) -> None:
        self.started_at, self._t0, self._next = time.time(), time.monotonic(), 0

    def read(self, timeout_s: float = 1.0) -> list[Sample]:
        if self.started_at is None:
            raise MeterError(f"{self.name}: read before start()")
        deadline = time.monotonic() + timeout_s
        while True:
            due = int((time.monotonic() - self._t0) * self.rate_hz)
            if due > self._next or time.monotonic() >= deadline:
                break
            time.sleep(min(0.01, 1.0 / self.rate_hz))
        out = [Sample(i / self.rate_hz, float(self.watts(i / self.rate_hz))) for i in range(self._next, due)]
        self._next = max(self._next, due)
        return out

    def describe(self) -> dict:
        return {"meter": self.name, "kind": "synthetic", "rate_hz": self.rate_hz}


def _synthetic(arg: str) -> Meter:
    text, _, rate = (arg or "1.0").partition("@")
    try:
        hz = float(rate) if rate else 1000.0
        if text == "sine":                        # 1 W +- 0.5 W at 1 Hz: a known integral
            return SyntheticMeter(lambda t: 1.0 + 0.5 * math.sin(2 * math.pi * t), hz, "synthetic:sine")
        w = float(text)
    except ValueError:
        raise UsageError(f"--meter synthetic:{arg}: give watts (synthetic:2.5), optionally a rate "
                         "(synthetic:2.5@1000), or synthetic:sine") from None
    return SyntheticMeter(lambda t: w, hz, f"synthetic:{w:g}")


#: kind -> factory(argument) ; other modules add theirs
KINDS: dict[str, Callable[[str], Meter]] = {"synthetic": _synthetic}


def open_meter(spec: str) -> Meter:
    """The meter a ``--meter`` spec names (not yet opened)."""
    kind, _, arg = str(spec).partition(":")
    _load_kinds()
    if kind not in KINDS:
        raise UsageError(f"unknown meter {spec!r}: the kinds are {', '.join(sorted(KINDS))} "
                         "(e.g. synthetic:2.5, visa:USB0::...::INSTR, powershield:/dev/ttyACM0)")
    return KINDS[kind](arg)


def _load_kinds() -> None:
    # Modules of the other kinds register themselves; a missing optional dependency leaves its
    # kind out (its factory explains what to install when it is asked for).
    import importlib

    for module in ("insitu.measure.visa_meter", "insitu.measure.powershield", "insitu.measure.rails"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if not exc.name or not exc.name.startswith("insitu.measure"):
                raise
