"""Energy of FPGA runs: the per-operation table, the estimate, and the rail integration."""

import datetime as dt

import numpy as np
import pytest

from insitu.errors import InsituError
from insitu.fpga import power
from insitu.fpga.power import (DEFAULT, HOROWITZ_PJ, RailRecorder, estimate_energy, integrate_phases,
                               mult_pj, select_power_sensors, table_for)

pytestmark = pytest.mark.unit


def test_table_reproduces_the_savings_e2_train_quotes():
    # E²-Train: 8-bit fixed point saves 95 % (multiply), 97 % (add), 75 % (data) over 32-bit float.
    assert 1 - HOROWITZ_PJ["int8_mult"] / HOROWITZ_PJ["fp32_mult"] == pytest.approx(0.95, abs=0.005)
    assert 1 - HOROWITZ_PJ["int8_add"] / HOROWITZ_PJ["fp32_add"] == pytest.approx(0.97, abs=0.005)


def test_multiplier_interpolation_hits_both_published_points():
    assert mult_pj(8, 8) == pytest.approx(0.2)
    assert mult_pj(32, 32) == pytest.approx(3.1)
    assert mult_pj(16, 4) == pytest.approx(0.2)           # same array size as 8x8
    assert mult_pj(16, 16) == pytest.approx(0.2 + 192 * 2.9 / 960)
    assert DEFAULT.mac_16x4_pj == pytest.approx(0.3) and DEFAULT.mac_16x16_pj == pytest.approx(0.8800, abs=1e-3)
    assert DEFAULT.sram_word_pj == pytest.approx(2.5)
    assert DEFAULT.dram_byte_pj == pytest.approx(243.75)


def test_estimate_on_known_counters():
    counters = {"macs_16x4": 10**9, "macs_16x16": 10**8, "dram_bytes": 10**6, "sram_words": 10**7,
                "processor_seconds": 2.0}
    got = estimate_energy(counters, seconds=4.0)
    t = DEFAULT
    expect_dyn = (1e9 * t.mac_16x4_pj + 1e8 * t.mac_16x16_pj + 1e6 * t.dram_byte_pj
                  + 1e7 * t.sram_word_pj) * 1e-12 + 2.0 * t.cpu_active_w
    expect_static = 4.0 * (t.pl_static_w + t.ps_static_w)
    assert got["source"] == "estimate"
    assert got["dynamic_j"] == pytest.approx(expect_dyn)
    assert got["static_j"] == pytest.approx(expect_static)
    assert got["energy_j"] == pytest.approx(expect_dyn + expect_static)
    assert sum(got["by_kind"].values()) == pytest.approx(got["energy_j"])
    assert got["by_kind"]["macs_16x4"] == pytest.approx(0.3e-3)     # 1e9 x 0.3 pJ
    assert got["mean_w"] == pytest.approx(got["energy_j"] / 4.0)


def test_estimate_refuses_typos_and_negatives():
    with pytest.raises(ValueError, match="unknown energy counters"):
        estimate_energy({"mac_16x4": 1}, 1.0)
    with pytest.raises(ValueError, match="negative"):
        estimate_energy({"dram_bytes": -1}, 1.0)
    assert estimate_energy({}, 0.0)["energy_j"] == 0.0


def test_table_for_twins_and_unknown_boards():
    assert table_for("zedboard-sim") is power.ZEDBOARD and table_for("ultra96v2") is DEFAULT
    with pytest.raises(ValueError, match="no energy table"):
        table_for("stm32f746-disco")


def test_integration_of_a_known_curve_within_one_percent():
    t = np.arange(0, 10.0 + 1e-9, 0.05)
    w = 2 + np.sin(t)
    marks = [("forward", 1.0, 3.0), ("update", 4.02, 4.03), ("forward", 5.0, 6.0)]
    got = integrate_phases(t, w, marks)
    assert got["energy_j"] == pytest.approx(20 + 1 - np.cos(10), rel=0.01)
    assert got["duration_s"] == pytest.approx(10.0)
    fwd = (4 + np.cos(1) - np.cos(3)) + (2 + np.cos(5) - np.cos(6))
    assert got["phases"]["forward"]["energy_j"] == pytest.approx(fwd, rel=0.01)
    assert got["phases"]["forward"]["seconds"] == pytest.approx(3.0)
    # A phase between two samples: power interpolated, times its 10 ms.
    assert got["phases"]["update"]["energy_j"] == pytest.approx(0.01 * (2 + np.sin(4.025)), rel=0.01)


def test_integration_edges():
    # A step in power is exact for trapezoids of a piecewise-linear curve; outside the samples the
    # power is held.
    got = integrate_phases([0, 1, 2], [1, 1, 3], [("tail", 1.5, 3.0)])
    assert got["energy_j"] == pytest.approx(1 + 2)
    assert got["phases"]["tail"]["energy_j"] == pytest.approx(0.5 * 2.5 + 1 * 3)
    assert integrate_phases([5.0], [2.0])["energy_j"] == 0.0
    with pytest.raises(ValueError, match="decrease"):
        integrate_phases([0, 2, 1], [1, 1, 1])
    with pytest.raises(ValueError, match="ends"):
        integrate_phases([0, 1], [1, 1], [("x", 1, 0)])


def test_open_returns_none_without_rails():
    # This machine has no PMBus rails: pynq.get_rails() is {}.
    pytest.importorskip("pynq")
    assert RailRecorder.open() is None
    assert RailRecorder.open(rails={}) is None


class _Sensor:
    def __init__(self, name, value=1.0):
        self.name, self.value, self.parents = name, value, ()

    def get_value(self, parents=None):
        return self.value


class _Rail:
    def __init__(self, name, power=True, vi=False):
        self.name = name
        self.power = _Sensor(f"{name}_power") if power else None
        self.voltage = _Sensor(f"{name}_voltage", 12.0) if vi else None
        self.current = _Sensor(f"{name}_current", 0.5) if vi else None


def test_rail_selection_prefers_the_input_rail():
    rails = {"VCCINT": _Rail("VCCINT"), "12V": _Rail("12V"), "VCC1V8": _Rail("VCC1V8")}
    assert [s.name for s in select_power_sensors(rails)] == ["12V_power"]
    rails = {"VCCINT": _Rail("VCCINT"), "VCC1V8": _Rail("VCC1V8"), "temp": _Rail("temp", power=False)}
    assert [s.name for s in select_power_sensors(rails)] == ["VCCINT_power", "VCC1V8_power"]


def test_rail_selection_derives_power_from_voltage_and_current():
    pytest.importorskip("pynq")
    (sensor,) = select_power_sensors({"PSINT": _Rail("PSINT", power=False, vi=True)})
    assert sensor.name == "PSINT_power" and sensor.get_value() == pytest.approx(6.0)


def test_rails_without_pandas_is_a_clear_error(monkeypatch):
    pytest.importorskip("pynq")
    import builtins

    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ImportError("No module named 'pandas'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(InsituError, match="needs pandas"):
        RailRecorder.open(rails={"12V": _Rail("12V")})


class _FakeDataRecorder:
    def __init__(self):
        self.calls = []

    def record(self, interval):
        self.calls.append(("record", interval))

    def mark(self):
        self.calls.append(("mark",))

    def stop(self):
        self.calls.append(("stop",))


def test_phases_are_marked_and_summed(monkeypatch):
    origin = dt.datetime(2024, 1, 1)
    ticks = iter([1.0, 3.0, 5.0, 6.0])
    fake = _FakeDataRecorder()
    rec = RailRecorder(fake, [_Sensor("12V_power")],
                       clock=lambda: origin + dt.timedelta(seconds=next(ticks)), interval=0.1)
    with rec:
        with rec.phase("forward"):
            pass
        with pytest.raises(RuntimeError, match="stop recording"):
            rec.summary()
        with rec.phase("forward"):
            pass
    assert fake.calls == [("record", 0.1), ("mark",), ("mark",), ("mark",), ("mark",), ("stop",)]
    t = np.arange(0, 10.0 + 1e-9, 0.05)
    monkeypatch.setattr(rec, "_samples", lambda: (t, np.full_like(t, 4.0), origin))
    got = rec.summary()
    assert got["source"] == "rails" and got["rails"] == ["12V_power"]
    assert got["energy_j"] == pytest.approx(40.0) and got["mean_w"] == pytest.approx(4.0)
    assert got["phases"]["forward"] == pytest.approx({"energy_j": 12.0, "seconds": 3.0})
