"""PYNQ power rails as a streaming meter: ``pynq-rails[:RAIL,...][@HZ]``.

The board's regulators as PYNQ reads them (``pynq.get_rails()``: PMBus through libsensors, e.g. on
an Ultra96-V2). Which sensors make up the board's power is decided as
:class:`insitu.fpga.power.RailRecorder` decides it (:func:`~insitu.fpga.power.select_power_sensors`:
the input rail alone where there is one, else every rail's power, V x I where a rail has no power
sensor); ``pynq-rails:VCCINT,VCC1V8`` sums the named rails instead. Where the recorder keeps
``pynq.DataRecorder``'s pandas frame and integrates after the run, this meter streams: a thread
reads the sensors every ``1/HZ`` s (default 20 Hz, the recorder's 0.05 s) the way
``DataRecorder`` does (each sensor's parents first, as ``pynq.pmbus.MultiSensor``), host-timed,
without pandas.

Off-board ``get_rails()`` is empty (no PMBus regulators to read): opening says so.
"""

from __future__ import annotations

import threading
import time

from insitu.errors import UsageError
from insitu.measure import meters
from insitu.measure.meters import Meter, MeterError, Sample, SampleQueue

NO_RAILS = "no PYNQ power rails on this machine (a board's PYNQ image has them)"


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
        from insitu.fpga.power import board_rails, select_power_sensors

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
