"""Energy of a training run on an FPGA board: measured from PYNQ's power rails, or estimated.

Two sources, both reported as ``{"energy_j": ..., ..., "source": "rails" | "estimate"}``:

* :class:`RailRecorder` samples the board's power rails with PYNQ's own ``pynq.DataRecorder``
  over ``pynq.get_rails()`` while training runs, and integrates power over time (per training
  phase too). It needs a board whose regulators PYNQ can read (PMBus through libsensors, e.g. the
  Ultra96-V2); on a ZedBoard or on this machine ``get_rails()`` is empty and
  :meth:`RailRecorder.open` returns ``None``.
* :func:`estimate_energy` turns the operation counters of a run (simulated twins count MACs,
  buffer accesses and DMA bytes) into energy with a per-operation table, :class:`EnergyTable`.

Where the per-operation figures come from
-----------------------------------------
M. Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014, 45 nm,
0.9 V: integer add 8 b 0.03 pJ, 32 b 0.1 pJ; integer multiply 8 b 0.2 pJ, 32 b 3.1 pJ; float add
16 b 0.4 pJ, 32 b 0.9 pJ; float multiply 16 b 1.1 pJ, 32 b 3.7 pJ; 64-bit read of an 8 KB SRAM
10 pJ; 64-bit DRAM read 1.3-2.6 nJ. E²-Train (``shared/papers/e2-train-energy-efficient-training.md``,
ref. [59]) cites this table only through the savings of 8-bit fixed point over 32-bit float -- 95 %
for a multiply, 97 % for an add, 75 % for data movement -- which these figures reproduce
(1 - 0.2/3.7 = 94.6 %, 1 - 0.03/0.9 = 96.7 %, 8/32 bits moved); the unit tests check that.

How they are carried over (rules, not measurements):

* A multiplier's energy grows with its partial-product array, i.e. with the product of the operand
  widths ``a*b``: the energy is interpolated linearly in ``a*b`` between the 8x8 (64, 0.2 pJ) and
  32x32 (1024, 3.1 pJ) points. A MAC adds one accumulator add, taken at 32 bits (0.1 pJ), an upper
  bound for the PEs' narrower accumulators. So 16x4: 0.2 + 0.1 = 0.30 pJ, 16x16: 0.78 + 0.1 = 0.88 pJ.
* An on-chip buffer access moves a 16-bit word: a quarter of the 64-bit SRAM read, 2.5 pJ.
* A DRAM byte moved by DMA: the middle of the 1.3-2.6 nJ range per 64 bits, 1.95 nJ / 8 = 244 pJ.
* 45 nm ASIC figures are used as they are for 16 nm (ZU3EG) and 28 nm (Z-7020) FPGAs. A smaller
  node lowers the energy, FPGA fabric (routing, a whole DSP slice per narrow MAC) raises it; the
  two do not cancel exactly, so the dynamic estimate compares algorithms with each other and is
  not an absolute figure for the board.
* Static power is an ASSUMPTION of the order of Vivado ``report_power`` / Xilinx Power Estimator
  figures for these parts, not a measurement: ZU3EG PL 0.3 W and PS 0.75 W (with a small PL design
  this totals ~1.2 W, the on-chip power the TT-on-FPGA paper reports for its Ultra96-V2 design);
  Z-7020 PL 0.14 W and PS 1.2 W. A busy CPU core adds ``cpu_active_w`` on top (0.3 W assumed for
  both). Board-level parts (DRAM chips, regulators, USB, Wi-Fi) are not in the estimate; the rails
  see some of them.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from insitu.errors import InsituError

# Horowitz, ISSCC 2014 (45 nm), in pJ. Kept as published so the derived fields can be checked.
HOROWITZ_PJ = {
    "int8_add": 0.03, "int32_add": 0.1, "int8_mult": 0.2, "int32_mult": 3.1,
    "fp16_add": 0.4, "fp16_mult": 1.1, "fp32_add": 0.9, "fp32_mult": 3.7,
    "sram_8kb_read_64b": 10.0, "dram_read_64b_low": 1300.0, "dram_read_64b_high": 2600.0,
}


def mult_pj(a_bits: int, b_bits: int) -> float:
    """Energy of an ``a_bits`` x ``b_bits`` integer multiply: linear in ``a*b`` through Horowitz's
    8x8 and 32x32 points (a multiplier's array, hence its switched capacitance, grows as ``a*b``)."""
    (p0, e0), (p1, e1) = (64, HOROWITZ_PJ["int8_mult"]), (1024, HOROWITZ_PJ["int32_mult"])
    return e0 + (a_bits * b_bits - p0) * (e1 - e0) / (p1 - p0)


@dataclass(frozen=True)
class EnergyTable:
    """Energy per operation (pJ) and static power (W) of one board; see the module docstring."""

    name: str
    mac_16x4_pj: float          # one 16-bit x 4-bit MAC (TT factors)
    mac_16x16_pj: float         # one 16-bit x 16-bit MAC
    sram_word_pj: float         # one 16-bit on-chip buffer read or write
    dram_byte_pj: float         # one byte moved between DRAM and the PL by DMA
    pl_static_w: float          # ASSUMED static power of the programmable logic
    ps_static_w: float          # ASSUMED power of the processing system while the run lasts
    cpu_active_w: float         # ASSUMED extra power of one busy CPU core


_ACC_ADD_PJ = HOROWITZ_PJ["int32_add"]
_SRAM_WORD_PJ = HOROWITZ_PJ["sram_8kb_read_64b"] * 16 / 64
_DRAM_BYTE_PJ = (HOROWITZ_PJ["dram_read_64b_low"] + HOROWITZ_PJ["dram_read_64b_high"]) / 2 / 8

ULTRA96V2 = EnergyTable(
    name="ultra96v2 (ZU3EG; Horowitz 45 nm ops, assumed static power)",
    mac_16x4_pj=mult_pj(16, 4) + _ACC_ADD_PJ, mac_16x16_pj=mult_pj(16, 16) + _ACC_ADD_PJ,
    sram_word_pj=_SRAM_WORD_PJ, dram_byte_pj=_DRAM_BYTE_PJ,
    pl_static_w=0.3, ps_static_w=0.75, cpu_active_w=0.3)
ZEDBOARD = EnergyTable(
    name="zedboard (Z-7020; Horowitz 45 nm ops, assumed static power)",
    mac_16x4_pj=ULTRA96V2.mac_16x4_pj, mac_16x16_pj=ULTRA96V2.mac_16x16_pj,
    sram_word_pj=_SRAM_WORD_PJ, dram_byte_pj=_DRAM_BYTE_PJ,
    pl_static_w=0.14, ps_static_w=1.2, cpu_active_w=0.3)
DEFAULT = ULTRA96V2
TABLES = {"ultra96v2": ULTRA96V2, "zedboard": ZEDBOARD}

#: The counters :func:`estimate_energy` understands, and the table field that prices each.
COUNTERS = {"macs_16x4": "mac_16x4_pj", "macs_16x16": "mac_16x16_pj", "sram_words": "sram_word_pj",
            "dram_bytes": "dram_byte_pj", "processor_seconds": None}


def table_for(board: str) -> EnergyTable:
    """The table of a board or of its twin (``ultra96v2-sim`` -> ``ultra96v2``)."""
    key = board.removesuffix("-sim")
    if key not in TABLES:
        raise ValueError(f"no energy table for board {board!r}; known: {', '.join(TABLES)}")
    return TABLES[key]


def estimate_energy(counters: dict, seconds: float, table: EnergyTable = DEFAULT) -> dict:
    """Energy of a run from its operation counters (see :data:`COUNTERS`) and its wall time.

    Dynamic energy: each counter times its per-operation energy, plus ``processor_seconds`` times
    the busy-core power. Static energy: PL and PS static power times ``seconds``. Missing counters
    count as zero; an unknown name is an error (it is usually a typo that would drop a term).
    """
    unknown = set(counters) - set(COUNTERS)
    if unknown:
        raise ValueError(f"unknown energy counters {sorted(unknown)}; known: {', '.join(COUNTERS)}")
    if seconds < 0 or any(v < 0 for v in counters.values()):
        raise ValueError("energy counters and seconds must not be negative")
    by_kind = {}
    for counter, field in COUNTERS.items():
        if field is not None:
            by_kind[counter] = counters.get(counter, 0) * getattr(table, field) * 1e-12
    by_kind["processor"] = counters.get("processor_seconds", 0) * table.cpu_active_w
    dynamic = sum(by_kind.values())
    by_kind["pl_static"] = table.pl_static_w * seconds
    by_kind["ps_static"] = table.ps_static_w * seconds
    static = by_kind["pl_static"] + by_kind["ps_static"]
    total = dynamic + static
    return {"energy_j": total, "dynamic_j": dynamic, "static_j": static, "by_kind": by_kind,
            "seconds": seconds, "mean_w": total / seconds if seconds > 0 else None,
            "table": table.name, "source": "estimate"}


# ---------------------------------------------------------------------------------------------
# Measured: PYNQ power rails


def _integral(t: np.ndarray, w: np.ndarray, start: float, end: float) -> float:
    """Exact integral over [start, end] of the piecewise-linear curve through (t, w), held
    constant before the first and after the last sample."""
    inside = t[(t > start) & (t < end)]
    points = np.concatenate(([start], inside, [end]))
    values = np.interp(points, t, w)
    return float(np.sum((values[1:] + values[:-1]) * np.diff(points)) / 2)


def integrate_phases(times, watts, marks=()) -> dict:
    """Energy of sampled power: trapezoids over the whole recording and over each phase.

    ``times`` are seconds (increasing), ``watts`` the power at those times, ``marks`` a sequence of
    ``(name, start_s, end_s)``. A phase may be shorter than the sampling interval: its energy is
    the integral of the line between the samples around it. Phases of the same name add up.
    """
    t = np.asarray(times, dtype=float)
    w = np.asarray(watts, dtype=float)
    if t.ndim != 1 or t.shape != w.shape or t.size == 0:
        raise ValueError("times and watts must be 1-D arrays of the same non-zero length")
    if np.any(np.diff(t) < 0):
        raise ValueError("times must not decrease")
    duration = float(t[-1] - t[0])
    energy = _integral(t, w, t[0], t[-1]) if t.size > 1 else 0.0
    phases: dict = {}
    for name, start, end in marks:
        if end < start:
            raise ValueError(f"phase {name!r} ends ({end}) before it starts ({start})")
        entry = phases.setdefault(name, {"energy_j": 0.0, "seconds": 0.0})
        entry["energy_j"] += _integral(t, w, start, end)
        entry["seconds"] += end - start
    return {"energy_j": energy, "duration_s": duration,
            "mean_w": energy / duration if duration > 0 else float(w[0]), "phases": phases}


#: Rail names under which a board reports its total input power (compared without case, "_"
#: and "-"). Where one is present, it alone is the board's power: summing it with the rails it
#: feeds would count them twice.
INPUT_RAIL_NAMES = ("12v", "vin")


def board_rails() -> dict | None:
    """``pynq.get_rails()``: the board's rails (empty off-board), or None without pynq."""
    import warnings

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


class RailRecorder:
    """Records the board's power while training runs; ``summary()`` integrates it.

    ::

        recorder = RailRecorder.open()          # None without rails (ZedBoard, this machine)
        if recorder:
            with recorder:
                with recorder.phase("forward"):
                    ...
            print(recorder.summary())
    """

    def __init__(self, recorder, sensors, clock, interval: float = 0.05):
        self._recorder = recorder         # pynq.DataRecorder (or a stand-in in tests)
        self.sensors = list(sensors)
        self._clock = clock               # the same clock DataRecorder stamps its rows with
        self.interval = interval
        self._marks: list[tuple[str, object, object]] = []
        self._lock = threading.Lock()
        self._recording = False

    @classmethod
    def open(cls, interval: float = 0.05, rails: dict | None = None) -> RailRecorder | None:
        """A recorder over the board's rails, not yet started; ``None`` where PYNQ finds none."""
        if rails is None:
            rails = board_rails()
            if rails is None:
                return None               # without pynq there are no rails to read either
        sensors = select_power_sensors(rails)
        if not sensors:
            return None
        try:
            import pandas as pd
        except ImportError:
            raise InsituError("this board has power rails, but recording them needs pandas "
                              "(pynq.DataRecorder keeps its samples in a pandas DataFrame): "
                              "pip install pandas, or run without rail recording") from None
        from pynq import DataRecorder

        return cls(DataRecorder(*sensors), sensors, pd.Timestamp.now, interval)

    def __enter__(self):
        self._recorder.record(self.interval)
        self._recording = True
        return self

    def __exit__(self, *exc):
        self._recorder.stop()
        self._recording = False
        return False

    @contextmanager
    def phase(self, name: str):
        """Marks a training phase; its energy is reported under ``name`` (repeats add up)."""
        self._recorder.mark()             # also in pynq's own frame, for whoever reads it
        start = self._clock()
        try:
            yield
        finally:
            end = self._clock()
            self._recorder.mark()
            with self._lock:
                self._marks.append((name, start, end))

    def _samples(self):
        """(times in seconds from the first sample, total watts, origin) from pynq's frame."""
        frame = self._recorder.frame
        if len(frame) == 0:
            raise InsituError("no power samples were recorded (the run was shorter than one "
                              "sampling interval?); use a shorter interval")
        origin = frame.index[0]
        times = np.asarray((frame.index - origin).total_seconds(), dtype=float)
        columns = [c for c in frame.columns if c != "Mark"]
        watts = frame[columns].to_numpy(dtype=float).sum(axis=1)
        return times, watts, origin

    def summary(self) -> dict:
        """Energy, mean power and duration of the recording and of each phase (after the with)."""
        if self._recording:
            raise RuntimeError("RailRecorder.summary(): stop recording first (leave the with block)")
        times, watts, origin = self._samples()

        def seconds(stamp):
            return (stamp - origin).total_seconds()

        marks = [(name, seconds(a), seconds(b)) for name, a, b in self._marks]
        out = integrate_phases(times, watts, marks)
        return {**out, "samples": int(times.size), "rails": [s.name for s in self.sensors],
                "source": "rails"}
