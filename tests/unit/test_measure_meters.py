"""Power meters of `insitu.measure`: SCPI over pyvisa-sim, the PowerShield against its pty twin,
and PYNQ rails with stand-in sensors."""

import importlib.util
import math
import time
from pathlib import Path

import pytest

from insitu.errors import UsageError
from insitu.measure import meters
from insitu.measure.meters import MeterError, open_meter
from insitu.measure.powershield_twin import PowerShieldTwin, decode_current, encode_current

pytestmark = pytest.mark.unit
needs_visa = pytest.mark.skipif(importlib.util.find_spec("pyvisa_sim") is None,
                                reason="pyvisa-sim is not installed (insitu[measure])")
needs_serial = pytest.mark.skipif(importlib.util.find_spec("serial") is None,
                                  reason="pyserial is not installed (insitu[measure])")

SIM = f"{Path(__file__).parent / 'data' / 'scpi_power.yaml'}@sim"
PA = "TCPIP0::sim-pa::inst0::INSTR"
DMM = "TCPIP0::sim-dmm::inst0::INSTR"
PA_WATTS = [1.0 + 0.1 * k for k in range(10)]          # what the simulated FETC? answers
DMM_AMPS = [0.10 + 0.05 * k for k in range(10)]


def collect(meter, seconds, step=0.1, at_least=0, patience=10.0):
    """What ``meter`` hands over in ``seconds``; then, while fewer than ``at_least`` samples came
    (a loaded machine ran the meter's thread late), on until they do or ``patience`` more seconds
    passed: a count the test asserts then depends on the meter, not on how busy the machine is."""
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end or (len(out) < at_least and time.monotonic() < end + patience):
        out += meter.read(step)
    return out


def test_kinds_register_on_load():
    meters._load_kinds()
    assert {"synthetic", "visa", "powershield", "pynq-rails"} <= set(meters.KINDS)


# -- SCPI over PyVISA (pyvisa-sim) -------------------------------------------------------------

@needs_visa
def test_visa_power_analyzer_streams_timed_blocks():
    m = open_meter(f"visa:{PA};backend={SIM};samples=10;interval=0.01")
    with m:
        assert m.idn.startswith("INSITU-SIM,PA-10")
        m.start()
        out = collect(m, 0.5, at_least=20)             # 50 in 0.5 s on the instrument's timer
    assert len(out) >= 20 and len(out) % 10 == 0
    assert [s.watts for s in out] == pytest.approx(PA_WATTS * (len(out) // 10))
    t = [s.t for s in out]
    assert all(b - a >= 0.01 - 1e-9 for a, b in zip(t, t[1:]))           # the instrument's timer
    assert all(b - a == pytest.approx(0.01) for a, b in zip(t[:10], t[1:10]))
    assert t[-1] <= time.time() - m.started_at + 0.005                     # none stamped in the future
    d = m.describe()
    assert d["kind"] == "visa" and d["interval_s"] == pytest.approx(0.01) and d["resyncs"] == 0


@needs_visa
def test_visa_dmm_current_times_volts():
    m = open_meter(f"visa:{DMM};backend={SIM};func=current;volts=5;interval=0.001")
    with m:
        m.start()
        out = m.read(2.0)
    assert len(out) >= 10
    assert [s.amps for s in out[:10]] == pytest.approx(DMM_AMPS)
    assert [s.watts for s in out[:10]] == pytest.approx([5 * a for a in DMM_AMPS])
    assert out[0].volts == 5


@needs_visa
def test_visa_host_timestamps_without_interval():
    m = open_meter(f"visa:{PA};backend={SIM}")
    with m:
        m.start()
        out = m.read(2.0)
        out += m.read(0.5)
    t = [s.t for s in out]
    assert len(out) >= 10 and all(b >= a for a, b in zip(t, t[1:])) and t[0] >= 0


@needs_visa
def test_visa_unknown_resource_names_it():
    with pytest.raises(MeterError, match="TCPIP0::nowhere::inst0::INSTR.*no instrument answered"):
        with open_meter(f"visa:TCPIP0::nowhere::inst0::INSTR;backend={SIM}"):
            pass
    with pytest.raises(MeterError, match="sim-silent"):
        with open_meter(f"visa:TCPIP0::sim-silent::inst0::INSTR;backend={SIM}"):
            pass


@needs_visa
def test_visa_bad_backend_and_options():
    with pytest.raises(MeterError, match=f"visa:{PA}: cannot load backend"):
        open_meter(f"visa:{PA};backend=/nonexistent/defs.yaml@sim").open()
    with pytest.raises(UsageError, match="unknown option"):
        open_meter(f"visa:{PA};speed=9")
    with pytest.raises(UsageError, match="volts"):
        open_meter(f"visa:{DMM};func=current")
    with pytest.raises(UsageError, match="power or current"):
        open_meter(f"visa:{DMM};func=voltage")


@needs_visa
def test_visa_refused_configuration_is_a_clear_error():
    # A DMM has no CONF:POW: its error queue says so, and the error names the command.
    with pytest.raises(MeterError, match=r"sim-dmm.*refused 'CONF:POW'.*-113"):
        with open_meter(f"visa:{DMM};backend={SIM};func=power"):
            pass


@needs_visa
def test_visa_garbage_answer_fails_clearly():
    m = open_meter(f"visa:TCPIP0::sim-garbage::inst0::INSTR;backend={SIM}")
    with m:
        m.start()
        with pytest.raises(MeterError, match=r"sim-garbage.*'OVLD,#%@!'.*FETC\?.*not comma-separated"):
            m.read(3.0)


@needs_visa
def test_visa_stale_answer_is_resynchronised():
    m = open_meter(f"visa:{PA};backend={SIM};interval=0.01")
    with m:
        m._inst.write("*IDN?")                 # an answer nobody reads: FETC? gets it first
        m.start()
        out = m.read(3.0)
    assert [s.watts for s in out[:10]] == pytest.approx(PA_WATTS)
    assert m.resyncs == 1


def test_visa_parse_readings():
    from insitu.measure.visa_meter import parse_readings

    assert parse_readings("+1.5E+00,2,-3e-3\n") == [1.5, 2.0, -0.003]
    for bad in ("", "1,,2", "abc", "1,9.91E37", "nan", "1;2"):
        assert parse_readings(bad) is None


# -- the PowerShield against its twin ----------------------------------------------------------

def trace(t):                                   # 1 mA + 2 mA/s ramp: a known integral
    return 1e-3 + 2e-3 * t


def check_samples(out, twin, freq=1000):
    assert [s.amps for s in out] == [twin.expected(i) for i in range(len(out))]
    assert [s.t for s in out] == pytest.approx([i / freq for i in range(len(out))], abs=1e-9)
    assert all(s.watts == pytest.approx(3.3 * s.amps) for s in out)


def test_current_encoding_round_trip():
    assert decode_current("6409-07") == pytest.approx(640.9e-6)
    for amps in (640.9e-6, 1e-3, 0.2, 9.9999e-4, 3.3e-9, 12.5):
        assert decode_current(encode_current(amps)) == pytest.approx(amps, rel=5e-4)
    assert encode_current(640.9e-6) == b"6409-07"


@needs_serial
def test_powershield_streams_the_trace():
    with PowerShieldTwin(trace) as twin:
        m = open_meter(f"powershield:{twin.port}")
        with m:
            m.start()
            out = collect(m, 1.2, at_least=1100)       # 1 kHz: 1200 in 1.2 s
        out += m.read(0)
        assert twin.commands[:8] == ["htc", "volt 3300m", "freq 1k", "acqtime 0", "output current",
                                     "format ascii_dec", "trigsrc sw", "start"]
        assert twin.commands[-2:] == ["stop", "hrc"]
        assert len(out) == twin.sent_samples >= 1100
    check_samples(out, twin)
    assert m.timestamps >= 1 and m.realigned == 0 and m.garbage_lines == 0
    # Energy of the ramp: integral of 3.3 V x (1 mA + 2 mA/s t) over the samples' span.
    from insitu.measure.energy import integrate

    T = out[-1].t
    got = integrate([s.t for s in out], [s.watts for s in out])
    assert got == pytest.approx(3.3 * (1e-3 * T + 1e-3 * T * T), rel=1e-3)


@needs_serial
def test_powershield_stall_loses_no_sample_and_garbage_is_skipped():
    with PowerShieldTwin(trace) as twin:
        m = open_meter(f"powershield:{twin.port};volts=3.3")
        with m:
            m.start()
            out = collect(m, 0.3)
            twin.inject_garbage()
            twin.inject_garbage(b"12#4-0")              # a mangled sample line
            twin.stall(1.0)
            time.sleep(0.1)
            out += m.read(0.0)                            # what was on its way before the stall
            assert m.read(0.3) == []                      # stalled: nothing, and no error
            out += collect(m, 0.8, at_least=1000 - len(out))   # resumes with the backlog (1.5 s in all)
        out += m.read(0)
        sent = twin.sent_samples
    assert len(out) == sent >= 1000
    check_samples(out, twin)
    assert m.garbage_lines == 2 and m.describe()["garbage_lines"] == 2


@needs_serial
def test_powershield_disconnect_is_a_clear_error():
    twin = PowerShieldTwin(trace)
    twin.start()
    try:
        m = open_meter(f"powershield:{twin.port}")
        with m:
            m.start()
            assert m.read(1.0)
            twin.stop()                                   # the cable is pulled
            with pytest.raises(MeterError, match=f"powershield:{twin.port}: the port failed"):
                for _ in range(50):
                    m.read(0.1)
    finally:
        twin.stop()


@needs_serial
def test_powershield_unopenable_port_names_it(tmp_path):
    port = tmp_path / "ttyACM9"
    with pytest.raises(MeterError, match=f"powershield:{port}: cannot open the port"):
        open_meter(f"powershield:{port}").open()


@needs_serial
def test_powershield_refusal_quotes_the_board(monkeypatch):
    with PowerShieldTwin() as twin:
        m = open_meter(f"powershield:{twin.port}")
        monkeypatch.setattr(m, "freq_text", "3k")        # not a PowerShield frequency
        with pytest.raises(MeterError, match=r"refused 'freq 3k': frequency not in"):
            m.open()
        assert m._ser is None                             # closed again


def test_powershield_spec_errors():
    with pytest.raises(UsageError, match="1.8..3.3"):
        open_meter("powershield:/dev/ttyACM0;volts=5")
    with pytest.raises(UsageError, match="freq must be one of"):
        open_meter("powershield:/dev/ttyACM0;freq=3k")
    with pytest.raises(UsageError, match="unknown option"):
        open_meter("powershield:/dev/ttyACM0;rate=1")


# -- PYNQ rails --------------------------------------------------------------------------------


class _Sensor:
    def __init__(self, name, value):
        self.name, self.value, self.parents = name, value, ()

    def get_value(self, parents=None):
        return self.value


class _Rail:
    def __init__(self, name, watts):
        self.name, self.power = name, _Sensor(f"{name}_power", watts)
        self.voltage = self.current = None


def test_rails_off_board_is_a_clear_error():
    # pynq.get_rails() is {} here (no PMBus regulators); without pynq the message is the same.
    no_rails = r"no PYNQ power rails on this machine \(a board's PYNQ image has them\)"
    with pytest.raises(MeterError, match=no_rails):
        open_meter("pynq-rails").open()


def test_rails_stream_the_selected_power():
    from insitu.measure.rails import RailsMeter

    rails = {"VCCINT": _Rail("VCCINT", 0.5), "12V": _Rail("12V", 4.0), "VCC1V8": _Rail("VCC1V8", 0.25)}
    m = RailsMeter(rate_hz=200, rails=rails)          # the input rail alone
    with m:
        m.start()
        out = collect(m, 0.15, at_least=10)            # 200 Hz: 30 in 0.15 s
    assert len(out) >= 10 and all(s.watts == 4.0 for s in out)
    assert m.describe()["sensors"] == ["12V_power"]
    t = [s.t for s in out]
    assert all(b > a for a, b in zip(t, t[1:]))

    m = RailsMeter(["vccint", "VCC1V8"], rate_hz=200, rails=rails)
    with m:
        m.start()
        out = m.read(1.0)
    assert out and all(s.watts == 0.75 for s in out)
    with pytest.raises(MeterError, match="no rail named VCCAUX"):
        RailsMeter(["VCCAUX"], rails=rails).open()
    assert math.isclose(open_meter("pynq-rails:12V,VCCINT@5").rate_hz, 5.0)
