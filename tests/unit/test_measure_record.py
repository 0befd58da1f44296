"""Power recording: the integrator, phase markers, the streamed CSV, stalls and disconnects."""

import json
import math
import os
import sys
import threading
import time

import numpy as np
import pytest

from insitu.errors import InsituError, UsageError
from insitu.measure.energy import integrate
from insitu.measure.meters import Meter, MeterError, Sample, open_meter
from insitu.measure.phases import PHASE_ENV, intervals, mark, phase, read_markers
from insitu.measure.record import (exit_code_of, load_csv, measure_call, run_command,
                                   summarize, summarize_files)

pytestmark = pytest.mark.unit


def sine_integral(a, b):
    """The exact integral of synthetic:sine, 1 + 0.5 sin(2 pi t), over [a, b]."""
    return (b - a) + 0.5 / (2 * math.pi) * (math.cos(2 * math.pi * a) - math.cos(2 * math.pi * b))


# ------------------------------------------------------------------------------- the integrator

def test_integrate_is_exact_on_piecewise_linear_traces_and_clips_with_interpolation():
    t = np.array([0.0, 1.0, 2.0, 4.0])
    w = np.array([1.0, 3.0, 3.0, 1.0])
    assert integrate(t, w) == pytest.approx(2 + 3 + 4)
    # [0.5, 3]: the power at 0.5 is 2, at 3 it is 2 (both interpolated)
    assert integrate(t, w, 0.5, 3.0) == pytest.approx((2 + 3) / 2 * 0.5 + 3 + (3 + 2) / 2)
    # an edge exactly on a sample, and an interval wider than the trace (clipped to it)
    assert integrate(t, w, 1.0, 2.0) == pytest.approx(3.0)
    assert integrate(t, w, -5, 50) == pytest.approx(integrate(t, w))
    # pieces add up to the whole
    assert integrate(t, w, 0, 1.7) + integrate(t, w, 1.7, 4) == pytest.approx(integrate(t, w))


def test_integrate_degenerate_inputs():
    assert integrate([], []) == 0.0
    assert integrate([1.0], [5.0]) == 0.0
    assert integrate([0.0, 1.0], [2.0, 2.0], 3, 4) == 0.0        # outside the trace
    assert integrate([0.0, 1.0], [2.0, 2.0], 0.6, 0.4) == 0.0    # empty interval
    with pytest.raises(ValueError, match="one length"):
        integrate([0.0, 1.0], [1.0])


@pytest.mark.parametrize("rate", [50.0, 1000.0])
def test_integrate_sine_over_whole_seconds_is_one_joule_per_second(rate):
    t = np.arange(0, int(3 * rate) + 1) / rate
    w = 1 + 0.5 * np.sin(2 * np.pi * t)
    assert abs(integrate(t, w) - 3.0) / 3.0 < 1e-3
    assert abs(integrate(t, w, 0.25, 1.6) - sine_integral(0.25, 1.6)) / sine_integral(0.25, 1.6) < 1e-2


# ------------------------------------------------------------------------------- phase markers

def test_markers_are_a_noop_without_the_env_var(tmp_path, monkeypatch):
    monkeypatch.delenv(PHASE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with phase("train", samples=3) as p:
        p.samples = 4
    mark("eval", "start")
    assert list(tmp_path.iterdir()) == []


def test_phase_writes_start_and_stop_lines_also_when_the_block_raises(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv(PHASE_ENV, str(path))
    t0 = time.time()
    with phase("train", samples=10) as p:
        p.samples = 12
    with pytest.raises(RuntimeError):
        with phase("eval"):
            raise RuntimeError("boom")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(m["phase"], m["event"], m["samples"]) for m in lines] == [
        ("train", "start", 10), ("train", "stop", 12), ("eval", "start", None), ("eval", "stop", None)]
    assert all(t0 <= m["t"] <= time.time() for m in lines)
    with pytest.raises(ValueError, match="event"):
        mark("x", "pause")


def test_a_marker_that_cannot_be_written_is_a_warning_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(PHASE_ENV, str(tmp_path / "no" / "such" / "folder" / "m.jsonl"))
    with pytest.warns(RuntimeWarning, match="phase marker"):
        mark("train", "start")


def test_read_markers_skips_torn_and_foreign_lines_and_intervals_pair_them(tmp_path):
    path = tmp_path / "m.jsonl"
    good = [{"t": 1.0, "phase": "train", "event": "start", "samples": None},
            {"t": 1.5, "phase": "eval", "event": "start", "samples": None},     # overlapping
            {"t": 2.0, "phase": "train", "event": "stop", "samples": 50},
            {"t": 2.5, "phase": "eval", "event": "stop", "samples": 7},
            {"t": 3.0, "phase": "train", "event": "start", "samples": 20},      # repeated name
            {"t": 4.0, "phase": "train", "event": "stop", "samples": None},
            {"t": 4.5, "phase": "ghost", "event": "stop", "samples": 1},        # no start
            {"t": 5.0, "phase": "test", "event": "start", "samples": None}]     # never stopped
    junk = ["not json", json.dumps([1, 2]), json.dumps({"t": "x", "phase": "a", "event": "start"}),
            json.dumps({"t": 1, "phase": "a", "event": "pause"})]
    path.write_text("\n".join([json.dumps(m) for m in good[:4]] + junk + [json.dumps(m) for m in good[4:]])
                    + '\n{"t": 6.0, "pha')                                      # torn last line
    markers = read_markers(path)
    assert markers == good
    ivs = intervals(markers)
    assert [(iv.name, iv.start, iv.stop, iv.samples) for iv in ivs] == [
        ("train", 1.0, 2.0, 50), ("eval", 1.5, 2.5, 7), ("train", 3.0, 4.0, 20), ("test", 5.0, None, None)]
    assert read_markers(tmp_path / "missing.jsonl") == []


# ------------------------------------------------------------------------------- the summary

def test_summarize_per_phase_energy_and_energy_per_sample():
    t = np.arange(0, 101) / 10.0                  # 0..10 s at 10 Hz
    w = np.where(t < 5, 2.0, 4.0)                  # 2 W, then 4 W (the step between 4.9 and 5.0)
    started_at = 1000.0
    markers = [{"t": 1001.0, "phase": "train", "event": "start", "samples": None},
               {"t": 1004.0, "phase": "train", "event": "stop", "samples": 300},
               {"t": 1006.0, "phase": "train", "event": "start", "samples": None},
               {"t": 1008.0, "phase": "train", "event": "stop", "samples": 100},
               {"t": 1009.0, "phase": "eval", "event": "start", "samples": None},
               {"t": 1012.0, "phase": "eval", "event": "stop", "samples": None},   # past the trace
               {"t": 1009.5, "phase": "test", "event": "start", "samples": None}]  # cut short
    s = summarize(t, w, markers, started_at)
    assert s["samples"] == 101 and s["duration_s"] == pytest.approx(10.0)
    assert s["energy_j"] == pytest.approx(integrate(t, w))
    assert s["mean_w"] == pytest.approx(s["energy_j"] / 10.0)
    train1, train2, ev, test = s["phases"]
    assert (train1["start"], train1["stop"], train1["energy_j"]) == (1.0, 4.0, pytest.approx(6.0))
    assert train1["energy_per_sample_j"] == pytest.approx(6.0 / 300) and train1["mean_w"] == pytest.approx(2.0)
    assert train2["energy_j"] == pytest.approx(8.0) and train2["complete"]
    assert ev["covered_s"] == pytest.approx(1.0) and ev["energy_j"] == pytest.approx(4.0)
    assert ev["mean_w"] == pytest.approx(4.0) and ev["energy_per_sample_j"] is None
    assert not test["complete"] and test["stop"] == pytest.approx(10.0) and test["energy_j"] == pytest.approx(2.0)
    total = s["by_phase"]["train"]
    assert total["count"] == 2 and total["samples"] == 400 and total["energy_j"] == pytest.approx(14.0)
    assert total["energy_per_sample_j"] == pytest.approx(14.0 / 400)


def test_summarize_empty_trace():
    s = summarize([], [], [], None)
    assert s["samples"] == 0 and s["energy_j"] == 0.0 and s["mean_w"] is None and s["phases"] == []


def test_load_csv_drops_a_torn_last_line_and_refuses_what_is_not_a_trace(tmp_path):
    path = tmp_path / "run.csv"
    path.write_text("host_time,t,watts,volts,amps\n10.0,0.0,1.5,,\n10.5,0.5,2.5,5.0,0.5\n11.0,1.0,2")
    trace = load_csv(path)
    assert trace["t"].tolist() == [0.0, 0.5] and trace["watts"].tolist() == [1.5, 2.5]
    assert math.isnan(trace["volts"][0]) and trace["amps"][1] == 0.5
    path.write_text("time,watts\n0,1\n")
    with pytest.raises(InsituError, match="header"):
        load_csv(path)
    path.write_text("host_time,t,watts,volts,amps\n10.0,0.0,x,,\n10.5,0.5,2.5,,\n")
    with pytest.raises(InsituError, match="line 2"):
        load_csv(path)


# ------------------------------------------------------------------------------- recording

class ScriptedMeter(Meter):
    """A fake meter: sample i at i / rate seconds, delivered in real time, except that during the
    ``stalls`` (wall-clock windows, seconds since start) read() waits out its timeout and returns
    nothing; what is due arrives in one burst afterwards. ``fail_at``: MeterError from then on."""

    name = "scripted"

    def __init__(self, rate=200.0, stalls=(), fail_at=None, watts=lambda i: 1.0 + (i % 7) * 0.25):
        self.rate, self.stalls, self.fail_at, self.watts = rate, stalls, fail_at, watts
        self.reads = self.empty_reads = 0
        self.opened = self.closed = False

    def open(self):
        self.opened = True

    def start(self):
        self.started_at, self._t0, self._next = time.time(), time.monotonic(), 0

    def read(self, timeout_s=1.0):
        self.reads += 1
        now = time.monotonic() - self._t0
        if self.fail_at is not None and now >= self.fail_at:
            raise MeterError("scripted: the meter went away (USB unplugged)")
        if any(a <= now < b for a, b in self.stalls):
            time.sleep(timeout_s)
            self.empty_reads += 1
            return []
        due = int(now * self.rate)
        if due <= self._next:
            time.sleep(min(timeout_s, 1 / self.rate))
            due = int((time.monotonic() - self._t0) * self.rate)
        out = [Sample(i / self.rate, self.watts(i), 5.0, self.watts(i) / 5.0) for i in range(self._next, due)]
        self._next = max(self._next, due)
        return out

    def close(self):
        self.closed = True

    def describe(self):
        return {"meter": self.name, "kind": "scripted", "rate_hz": self.rate}


def _sleep_cmd(seconds, code=0):
    return [sys.executable, "-c", f"import time, sys; time.sleep({seconds}); sys.exit({code})"]


def test_synthetic_sine_record_integrates_within_one_percent(tmp_path):
    out = tmp_path / "run.csv"
    child = ("import time; from insitu.measure.phases import phase\n"
             "time.sleep(0.1)\n"
             "with phase('train', samples=64):\n"
             "    time.sleep(1.05)\n")
    rec = run_command(open_meter("synthetic:sine"), [sys.executable, "-c", child], out, handle_signals=False)
    assert rec["complete"] and rec["ended"] == "exit" and rec["exit_code"] == 0 and exit_code_of(rec) == 0
    trace = load_csv(out)
    t = trace["t"]
    assert rec["samples"] == t.size >= 1100
    # the whole trace against the exact integral of what was sampled
    exact = sine_integral(t[0], t[-1])
    assert abs(rec["energy_j"] - exact) / exact < 0.01
    # whole seconds integrate to 1 J/s
    assert abs(integrate(t, trace["watts"], 0, 1) - 1.0) < 0.01
    # the phase (host-time markers aligned onto the trace) against its exact integral
    (train,) = rec["phases"]
    exact = sine_integral(train["start"], train["stop"])
    assert train["samples"] == 64 and abs(train["energy_j"] - exact) / exact < 0.01
    assert train["energy_per_sample_j"] == pytest.approx(train["energy_j"] / 64)
    assert 0.05 < train["start"] < train["stop"] <= t[-1]
    # the record beside the CSV is the one returned
    assert json.loads((tmp_path / "run.json").read_text()) == json.loads(json.dumps(rec))
    assert summarize_files(out)["energy_j"] == pytest.approx(rec["energy_j"])
    # the trace covers the command to its end (the recorder drained the meter)
    assert t[-1] >= 1.15


def test_no_sample_is_lost_when_the_stream_stalls_and_resumes(tmp_path):
    # one stall mid-run and one over the command's end (the drain must wait it out)
    meter = ScriptedMeter(rate=200.0, stalls=((0.2, 0.5), (0.75, 1.05)))
    out = tmp_path / "run.csv"
    rec = run_command(meter, _sleep_cmd(0.8), out, poll_s=0.05, handle_signals=False)
    assert meter.empty_reads >= 4 and meter.closed
    trace = load_csv(out)
    index = np.rint(trace["t"] * 200.0).astype(int)
    assert index.tolist() == list(range(index.size))             # every sample, once, in order
    assert rec["samples"] == index.size and trace["t"][-1] >= rec["command_s"] - 0.1
    assert rec["max_gap_s"] == pytest.approx(1 / 200.0)
    assert trace["volts"][0] == 5.0 and trace["amps"][3] == pytest.approx(meter.watts(3) / 5.0)
    assert rec["energy_j"] == pytest.approx(integrate(trace["t"], trace["watts"]))
    assert rec["complete"]


def test_a_meter_that_disconnects_leaves_a_valid_partial_csv_and_the_command_finishes(tmp_path):
    meter = ScriptedMeter(rate=200.0, fail_at=0.3)
    out = tmp_path / "run.csv"
    told = []
    rec = run_command(meter, _sleep_cmd(0.6), out, poll_s=0.05, handle_signals=False, notify=told.append)
    assert rec["ended"] == "meter-error" and not rec["complete"] and "unplugged" in rec["message"]
    assert rec["exit_code"] == 0 and exit_code_of(rec) == 1 and rec["command_s"] >= 0.6
    assert told and "unplugged" in told[0]
    trace = load_csv(out)
    # Every sample the meter handed over before it failed at 0.3 s (60 at 200 Hz; how many of
    # them were read in time depends on how busy the machine is), none after.
    assert rec["samples"] == trace["t"].size == meter._next and 0 < trace["t"].size <= 60
    assert trace["t"][-1] < 0.3
    assert json.loads((tmp_path / "run.json").read_text())["ended"] == "meter-error"


def test_a_crashing_command_passes_its_exit_code_on(tmp_path):
    rec = run_command(open_meter("synthetic:3@500"), _sleep_cmd(0.2, code=3), tmp_path / "run.csv",
                      handle_signals=False)
    assert rec["exit_code"] == 3 and exit_code_of(rec) == 3 and not rec["complete"]
    assert "exit 3" in rec["message"]
    assert rec["mean_w"] == pytest.approx(3.0) and load_csv(tmp_path / "run.csv")["t"].size == rec["samples"]


def test_a_command_that_cannot_run_is_a_usage_error_and_the_meter_is_released(tmp_path):
    meter = ScriptedMeter()
    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    with pytest.raises(UsageError, match="cannot run"):
        run_command(meter, [str(script)], tmp_path / "run.csv", handle_signals=False)
    assert meter.closed


def test_an_unwritable_out_is_a_usage_error_before_the_meter_opens(tmp_path):
    meter = ScriptedMeter()
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="cannot write --trace"):
        run_command(meter, _sleep_cmd(0), tmp_path / "file" / "run.csv", handle_signals=False)
    assert not meter.opened


def test_measure_call_records_an_in_process_run_and_its_phases(tmp_path):
    out = tmp_path / "power.csv"

    def train():
        time.sleep(0.15)
        with phase("train") as p:
            time.sleep(0.3)
            p.samples = 30
        return {"samples": 30}

    value, rec = measure_call(open_meter("synthetic:2@500"), out, train, command=["insitu", "train"])
    assert value == {"samples": 30} and rec["complete"] and rec["command"] == ["insitu", "train"]
    (p,) = rec["phases"]
    assert p["name"] == "train" and p["samples"] == 30
    # The phase lasts its sleep (0.3 s; longer on a busy machine), within the call and after the
    # 0.15 s before it; 2 W over the whole of it, whatever it lasted.
    assert 0.3 <= p["duration_s"] <= rec["command_s"] - 0.15 and p["covered_s"] == pytest.approx(p["duration_s"])
    assert p["energy_j"] == pytest.approx(2.0 * p["duration_s"], rel=0.01)
    assert p["energy_per_sample_j"] == pytest.approx(p["energy_j"] / 30)
    assert PHASE_ENV not in os.environ
    assert not any(th.name == "insitu-power-recorder" for th in threading.enumerate())


def test_measure_call_makes_the_whole_call_one_phase_when_it_marks_none(tmp_path):
    value, rec = measure_call(open_meter("synthetic:1@500"), tmp_path / "p.csv",
                              lambda: (time.sleep(0.25), {"samples": 5})[1])
    (p,) = rec["phases"]
    # named `run`, not `train`: the whole call is not the training alone
    assert p["name"] == "run" and p["samples"] == 5 and p["complete"]
    # the phase is the call (its 0.25 s sleep, longer on a busy machine), at 1 W
    assert p["duration_s"] == pytest.approx(rec["command_s"], abs=1e-6) and p["duration_s"] >= 0.25
    assert p["energy_j"] == pytest.approx(1.0 * p["duration_s"], rel=0.01)
    assert rec["energy_per_training_sample_j"] is None and rec["training_samples"] is None


def test_measure_call_writes_the_record_when_the_run_fails(tmp_path):
    def boom():
        time.sleep(0.1)
        raise RuntimeError("diverged")

    with pytest.raises(RuntimeError, match="diverged"):
        measure_call(open_meter("synthetic:1@500"), tmp_path / "p.csv", boom)
    rec = json.loads((tmp_path / "p.json").read_text())
    assert rec["ended"] == "error" and not rec["complete"] and "diverged" in rec["message"]
    assert rec["samples"] == load_csv(tmp_path / "p.csv")["t"].size > 0
    assert rec["phases"][0]["complete"] is False


def test_the_figure_legend_gives_each_phase_its_summed_energy(tmp_path, monkeypatch):
    """Nineteen train spans are one legend entry with their total (the record's
    training_energy_j), not the first span's energy."""
    from insitu.measure import record as rec

    phases = [{"name": "train", "start": float(i), "stop": i + 0.5, "energy_j": 0.002}
              for i in range(19)]
    phases.append({"name": "test", "start": 19.5, "stop": 20.0, "energy_j": 0.001})
    legends = []
    real_save = rec.save_figure

    def capture(fig, path, dpi=110):
        legends.extend(t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts())
        return real_save(fig, path, dpi=dpi)

    monkeypatch.setattr(rec, "save_figure", capture)
    t = np.linspace(0, 20, 200)
    rec.plot_record({"phases": phases, "energy_j": 0.04, "duration_s": 20.0, "complete": True,
                     "meter": {"meter": "synthetic:1"}}, t, np.ones_like(t), tmp_path / "p.png")
    assert legends == ["power", "train: 0.038 J (19 spans)", "test: 0.001 J"]
    assert (tmp_path / "p.png").stat().st_size > 0
