"""PYNQ power rails: the one sampler of a board's rails, as a streaming meter
(``--meter pynq-rails[:RAIL,...][@HZ]``) and as a recording of a training run on the board
(:class:`RailsRecording`).

The board's regulators as PYNQ reads them (``pynq.get_rails()``: PMBus through libsensors, e.g. on
an Ultra96-V2). The board's power is the input rail alone where there is one, else every rail's
power, V x I where a rail has no power sensor (:func:`select_power_sensors`);
``pynq-rails:VCCINT,VCC1V8`` sums the named rails instead. A thread reads the sensors every
``1/HZ`` s (default 20 Hz) the way ``pynq.DataRecorder`` does (each sensor's parents first, as
``pynq.pmbus.MultiSensor``), host-timed, without pandas.

Off-board ``get_rails()`` is empty (no PMBus regulators to read): the meter says so when opened,
and :meth:`RailsRecording.open` returns None (the run's energy is then estimated).
"""

from __future__ import annotations

import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from insitu.errors import UsageError
from insitu.measure import meters
from insitu.measure.meters import Meter, MeterError, Sample, SampleQueue
from insitu.measure.phases import read_markers
from insitu.measure.record import InProcessRecording, summarize

NO_RAILS = "no PYNQ power rails on this machine (a board's PYNQ image has them)"

#: Rail names under which a board reports its total input power (compared without case, "_"
#: and "-"). Where one is present, it alone is the board's power: summing it with the rails it
#: feeds would count them twice.
INPUT_RAIL_NAMES = ("12v", "vin")


def board_rails() -> dict | None:
    """``pynq.get_rails()``: the board's rails (empty off-board), or None without pynq."""
    try:
        with warnings.catch_warnings():
            # "Could not initialise libsensors library": the expected answer off-board.
            warnings.simplefilter("ignore")
            from pynq import get_rails
            return get_rails()
    except ImportError:
        return None


def select_power_sensors(rails: dict) -> list:
    """The sensors whose sum is the board's power: the input rail's power sensor when PYNQ
    exposes one (:data:`INPUT_RAIL_NAMES`), else every rail's power. A rail with voltage and
    current but no power sensor gets PYNQ's ``DerivedPowerSensor`` (V x I).

    The sum of the output rails leaves out regulator losses and unmonitored parts of the board, so
    it is lower than the draw at the wall plug.
    """
    def power_of(rail):
        if rail.power is not None:
            return rail.power
        if rail.voltage is not None and rail.current is not None:
            from pynq.pmbus import DerivedPowerSensor
            return DerivedPowerSensor(f"{rail.name}_power", rail.voltage, rail.current)
        return None

    def norm(name):
        return name.lower().replace("_", "").replace("-", "")

    for name, rail in rails.items():
        if norm(name) in INPUT_RAIL_NAMES and power_of(rail) is not None:
            return [power_of(rail)]
    return [s for s in map(power_of, rails.values()) if s is not None]


def _read_sensors(sensors) -> list[float]:
    """Values of ``sensors``, each parent read once (what ``pynq.pmbus.MultiSensor`` does)."""
    stored: dict = {}

    def value(sensor):
        key = id(sensor)
        if key not in stored:
            stored[key] = sensor.get_value([value(p) for p in getattr(sensor, "parents", ())])
        return stored[key]

    return [float(value(s)) for s in sensors]


class RailsMeter(Meter):
    """The summed power of a PYNQ board's rails, sampled by a thread."""

    def __init__(self, names: list[str] | None = None, rate_hz: float = 20.0, rails: dict | None = None):
        if not rate_hz > 0:
            raise UsageError(f"--meter pynq-rails: the rate must be positive, got {rate_hz!r}")
        self.names = [n for n in (names or []) if n]
        self.rate_hz = float(rate_hz)
        self._rails = rails                  # None: pynq.get_rails() at open()
        self.name = "pynq-rails" + (":" + ",".join(self.names) if self.names else "")
        self.sensors: list = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._samples = SampleQueue()

    def open(self) -> None:
        rails = self._rails
        if rails is None:
            rails = board_rails()
            if rails is None:
                raise MeterError(f"{self.name}: {NO_RAILS}; pynq is not installed here either "
                                 "(pip install 'insitu[pynq]' on the board)")
        if not rails:
            raise MeterError(f"{self.name}: {NO_RAILS}")

        if self.names:
            by_name = {k.lower(): k for k in rails}
            unknown = [n for n in self.names if n.lower() not in by_name]
            if unknown:
                raise MeterError(f"{self.name}: no rail named {', '.join(unknown)}; this board has "
                                 f"{', '.join(sorted(rails))}")
            sensors = []
            for n in self.names:
                key = by_name[n.lower()]
                found = select_power_sensors({key: rails[key]})
                if not found:
                    raise MeterError(f"{self.name}: rail {key} has neither a power sensor nor "
                                     "voltage and current")
                sensors += found
        else:
            sensors = select_power_sensors(rails)
            if not sensors:
                raise MeterError(f"{self.name}: the rails ({', '.join(sorted(rails))}) have no "
                                 "power, voltage or current sensors")
        self.sensors = sensors

    def start(self) -> None:
        if not self.sensors:
            self.open()
        if self._thread is not None:
            raise MeterError(f"{self.name}: already started; stop() it first")
        self._stop.clear()
        self._samples.clear()
        self.started_at, self._t0 = time.time(), time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"meter {self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        period, i = 1.0 / self.rate_hz, 0
        try:
            while not self._stop.is_set():
                t = time.monotonic() - self._t0
                watts = sum(_read_sensors(self.sensors))
                self._samples.put([Sample(t, watts)])
                i += 1
                self._stop.wait(max(0.0, self._t0 + i * period - time.monotonic()))
        except BaseException as exc:
            self._samples.fail(exc)

    def read(self, timeout_s: float = 1.0) -> list[Sample]:
        if self.started_at is None:
            raise MeterError(f"{self.name}: read before start()")
        out, err = self._samples.take(timeout_s, lambda: self._thread is not None)
        if err is not None:
            raise MeterError(f"{self.name}: reading the sensors failed: {err}") from err
        return out

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(5.0)
        self._thread = None

    def close(self) -> None:
        self.stop()

    def describe(self) -> dict:
        return {"meter": self.name, "kind": "pynq-rails", "rate_hz": self.rate_hz,
                "sensors": [getattr(s, "name", str(s)) for s in self.sensors]}


def parse_spec(arg: str) -> RailsMeter:
    """``[RAIL,...][@HZ]`` -> a :class:`RailsMeter` (not yet opened)."""
    names, _, rate = (arg or "").partition("@")
    try:
        hz = float(rate) if rate else 20.0
    except ValueError:
        raise UsageError(f"--meter pynq-rails:{arg}: the rate after @ must be Hz, e.g. "
                         "pynq-rails:12V@20") from None
    return RailsMeter([n.strip() for n in names.split(",") if n.strip()], hz)


meters.KINDS["pynq-rails"] = parse_spec


class RailsRecording:
    """The board's rails recorded while a run works in the ``with`` block; the phases are the
    run's :func:`~insitu.measure.phases.phase` markers. ::

        recording = RailsRecording.open()       # None without rails (ZedBoard, twins, this machine)
        if recording:
            with recording:
                with phase("train"):
                    ...
            print(recording.summary())

    The trace goes through a temporary CSV (the recorder of ``insitu power record``), removed
    when the recording ends.
    """

    def __init__(self, meter: RailsMeter):
        self.meter = meter
        self._live: InProcessRecording | None = None
        self._folder: tempfile.TemporaryDirectory | None = None
        self._summary: dict | None = None

    @classmethod
    def open(cls, rate_hz: float = 20.0, rails: dict | None = None) -> RailsRecording | None:
        """A recording of the board's rails, not yet started; None where PYNQ finds none."""
        if rails is None:
            rails = board_rails()
            if rails is None:
                return None               # without pynq there are no rails to read either
        if not select_power_sensors(rails):
            return None
        return cls(RailsMeter(rate_hz=rate_hz, rails=rails))

    def __enter__(self) -> RailsRecording:
        self._folder = tempfile.TemporaryDirectory(prefix="insitu-rails-")
        self._live = InProcessRecording(self.meter, Path(self._folder.name) / "rails.csv")
        self._live.start()
        return self

    def __exit__(self, exc_type, *exc) -> bool:
        live, self._live = self._live, None
        assert live is not None and self._folder is not None      # set by __enter__
        try:
            live.stop()
            rec = live.recorder
            rec.drain(time.time(), max_s=2.0 / self.meter.rate_hz)
            rec.finish(ended="exit" if exc_type is None else "error", message="the run's rails",
                       command=[], exit_code=None)
            self._summary = {
                **summarize(np.frombuffer(rec.t, dtype=float), np.frombuffer(rec.w, dtype=float),
                            read_markers(rec.phase_path), rec.started_at),
                "rails": [getattr(s, "name", str(s)) for s in self.meter.sensors], "source": "rails"}
        finally:
            self._folder.cleanup()
        return False

    def summary(self) -> dict:
        """Energy, mean power and duration of the recording and of each phase (after the with)."""
        if self._summary is None:
            raise RuntimeError("RailsRecording.summary(): record first, and leave the with block")
        return self._summary
