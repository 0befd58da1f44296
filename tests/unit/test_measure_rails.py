"""PYNQ rails: which sensors make up the board's power, and a run's rails recording with its phases."""

import os
import time

import pytest

from insitu.measure.phases import PHASE_ENV, phase
from insitu.measure.rails import RailsRecording, select_power_sensors

pytestmark = pytest.mark.unit


class _Sensor:
    def __init__(self, name, value=1.0):
        self.name, self.value, self.parents = name, value, ()

    def get_value(self, parents=None):
        return self.value


class _Rail:
    def __init__(self, name, power=True, vi=False, watts=1.0):
        self.name = name
        self.power = _Sensor(f"{name}_power", watts) if power else None
        self.voltage = _Sensor(f"{name}_voltage", 12.0) if vi else None
        self.current = _Sensor(f"{name}_current", 0.5) if vi else None


def test_open_returns_none_without_rails():
    # This machine has no PMBus rails: pynq.get_rails() is {} (and without pynq there are none).
    assert RailsRecording.open() is None
    assert RailsRecording.open(rails={}) is None
    assert RailsRecording.open(rails={"temp": _Rail("temp", power=False)}) is None


def test_rail_selection_prefers_the_input_rail():
    rails = {"VCCINT": _Rail("VCCINT"), "12V": _Rail("12V"), "VCC1V8": _Rail("VCC1V8")}
    assert [s.name for s in select_power_sensors(rails)] == ["12V_power"]
    rails = {"VCCINT": _Rail("VCCINT"), "VCC1V8": _Rail("VCC1V8"), "temp": _Rail("temp", power=False)}
    assert [s.name for s in select_power_sensors(rails)] == ["VCCINT_power", "VCC1V8_power"]


def test_rail_selection_derives_power_from_voltage_and_current():
    pytest.importorskip("pynq")
    (sensor,) = select_power_sensors({"PSINT": _Rail("PSINT", power=False, vi=True)})
    assert sensor.name == "PSINT_power" and sensor.get_value() == pytest.approx(6.0)


def test_a_recording_sums_each_phase_and_passes_markers_to_an_outer_recorder(tmp_path, monkeypatch):
    outer = tmp_path / "outer.jsonl"
    monkeypatch.setenv(PHASE_ENV, str(outer))            # e.g. `insitu train --meter` around it
    recording = RailsRecording.open(rate_hz=200, rails={"12V": _Rail("12V", watts=4.0)})
    with recording:
        with pytest.raises(RuntimeError, match="leave the with block"):
            recording.summary()
        for _ in range(2):
            with phase("forward"):
                time.sleep(0.1)
        time.sleep(0.05)
    got = recording.summary()
    assert got["source"] == "rails" and got["rails"] == ["12V_power"]
    assert got["mean_w"] == pytest.approx(4.0) and got["energy_j"] == pytest.approx(4.0 * got["duration_s"])
    forward = got["by_phase"]["forward"]
    assert forward["count"] == 2 and forward["energy_j"] == pytest.approx(4.0 * forward["covered_s"])
    assert forward["covered_s"] == pytest.approx(0.2, abs=0.05)
    assert outer.read_text().count('"forward"') == 4      # both start and stop, twice
    assert os.environ[PHASE_ENV] == str(outer)           # restored
