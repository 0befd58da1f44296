"""Honest power runs: no trace, record or marker file is ever overwritten; the energy per training
sample is the train phase's alone; the measured command's output can be kept off stdout."""

import json
import sys
import time

import numpy as np
import pytest

from insitu.errors import UsageError
from insitu.measure.meters import Meter, MeterError, open_meter
from insitu.measure.record import (check_new, free_trace, measure_call, run_command, sidecar_paths,
                                   summarize)

pytestmark = pytest.mark.unit


class UnopenableMeter(Meter):
    """A meter whose port is gone (a PowerShield unplugged, a wrong /dev/ttyACM)."""

    name = "unopenable"

    def __init__(self):
        self.opened = False

    def open(self):
        self.opened = True
        raise MeterError("unopenable: cannot open the port")

    def start(self):
        raise AssertionError("never started")

    def read(self, timeout_s=1.0):
        raise AssertionError("never read")

    def close(self):
        pass

    def describe(self):
        return {"meter": self.name}


def _a_complete_run(tmp_path, name="run.csv"):
    out = tmp_path / name
    rec = run_command(open_meter("synthetic:2@500"), [sys.executable, "-c", "import time; time.sleep(0.2)"],
                      out, handle_signals=False)
    assert rec["complete"]
    return out, {p: p.read_bytes() for p in (out, *sidecar_paths(out))}


# ------------------------------------------------------------------------- never overwritten

def test_check_new_names_the_file_that_exists_and_says_what_to_do(tmp_path):
    out = tmp_path / "run.csv"
    assert check_new(out) == out
    for existing, named in (("run.phases.jsonl", "the phase markers of"), ("run.json", "the record of"),
                            ("run.csv", "exists already")):
        (tmp_path / existing).write_text("x")
        with pytest.raises(UsageError) as err:
            check_new(out, "--trace")
        message = str(err.value)
        assert message.startswith("--trace: ") and str(tmp_path / existing) in message and named in message
        assert "choose another path, or delete it" in message


def test_free_trace_is_the_first_name_free_with_its_sidecars(tmp_path):
    base = tmp_path / "power.csv"
    assert free_trace(base) == base
    base.write_text("")
    assert free_trace(base) == tmp_path / "power-1.csv"
    (tmp_path / "power-1.json").write_text("{}")                # a record alone takes the name too
    assert free_trace(base) == tmp_path / "power-2.csv"
    (tmp_path / "power-2.phases.jsonl").write_text("")
    (tmp_path / "power-3.csv").write_text("")
    assert free_trace(base) == tmp_path / "power-4.csv"


def test_the_issue_case_a_failing_meter_never_touches_an_earlier_complete_run(tmp_path):
    # The issue: a meter that failed to open cut a 90,654 B trace to its 29 B header and emptied
    # its phases file, while the old record still said complete: true.
    out, before = _a_complete_run(tmp_path)
    meter = UnopenableMeter()
    with pytest.raises(UsageError, match="run.csv exists already"):
        run_command(meter, [sys.executable, "-c", "pass"], out, handle_signals=False)
    assert not meter.opened                                     # refused before the meter opened
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("existing", ["json", "phases.jsonl"])
def test_an_existing_sidecar_alone_is_refused_and_kept(tmp_path, existing):
    other = tmp_path / f"run.{existing}"
    other.write_text("another run's file\n")
    meter = open_meter("synthetic:1@500")
    with pytest.raises(UsageError, match="exists already"):
        run_command(meter, [sys.executable, "-c", "pass"], tmp_path / "run.csv", handle_signals=False)
    assert not (tmp_path / "run.csv").exists() and other.read_text() == "another run's file\n"


def test_measure_call_refuses_an_existing_trace_before_calling(tmp_path):
    out, before = _a_complete_run(tmp_path, "power.csv")
    called = []
    with pytest.raises(UsageError, match="--power-out: .*power.csv exists already"):
        measure_call(open_meter("synthetic:1@500"), out, lambda: called.append(1))
    assert not called and {p: p.read_bytes() for p in before} == before


def test_a_meter_that_cannot_be_opened_leaves_no_file(tmp_path):
    with pytest.raises(MeterError, match="cannot open"):
        run_command(UnopenableMeter(), [sys.executable, "-c", "pass"], tmp_path / "run.csv",
                    handle_signals=False)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(MeterError, match="cannot open"):
        measure_call(UnopenableMeter(), tmp_path / "power.csv", lambda: None)
    assert list(tmp_path.iterdir()) == []


def test_the_record_is_written_atomically(tmp_path, monkeypatch):
    import insitu.measure.record as record_module

    written = []
    real = record_module.atomic_write_json
    monkeypatch.setattr(record_module, "atomic_write_json",
                        lambda path, payload: (written.append(path), real(path, payload))[1])
    out, _ = _a_complete_run(tmp_path)
    assert written == [sidecar_paths(out)[0]]


# ------------------------------------------------------------------- the command's output

def test_run_command_sends_the_commands_stdout_where_asked(tmp_path):
    log = tmp_path / "child.log"
    with open(log, "wb") as fh:
        rec = run_command(open_meter("synthetic:1@500"), [sys.executable, "-c", "print('hello from the child')"],
                          tmp_path / "run.csv", handle_signals=False, stdout=fh.fileno())
    assert rec["complete"] and log.read_text() == "hello from the child\n"


# ------------------------------------------------------------------- energy per training sample

def _step_trace():
    t = np.arange(0, 101) / 10.0                  # 0..10 s at 10 Hz
    return t, np.where(t < 5, 2.0, 4.0)            # 2 W, then 4 W


def _markers(*spans):
    out = []
    for name, start, stop, samples in spans:
        out.append({"t": 1000.0 + start, "phase": name, "event": "start", "samples": None})
        if stop is not None:
            out.append({"t": 1000.0 + stop, "phase": name, "event": "stop", "samples": samples})
    return out


def test_energy_per_training_sample_is_the_train_phase_alone():
    t, w = _step_trace()
    # load 0-1 s, train 1-3 s (100 samples) and 6-7 s (50), test 3-4 s and 7-9 s
    s = summarize(t, w, _markers(("load", 0, 1, None), ("train", 1, 3, 100), ("test", 3, 4, None),
                                 ("train", 6, 7, 50), ("test", 7, 9, None)), 1000.0)
    assert s["training_energy_j"] == pytest.approx(2 * 2.0 + 1 * 4.0)
    assert s["training_samples"] == 150
    assert s["energy_per_training_sample_j"] == pytest.approx(8.0 / 150)
    assert s["energy_per_training_sample_j"] != pytest.approx(s["energy_j"] / 150)   # not the whole run


def test_no_train_phase_no_energy_per_training_sample():
    t, w = _step_trace()
    s = summarize(t, w, _markers(("run", 0, 10, 150)), 1000.0)
    assert s["energy_per_training_sample_j"] is None and s["training_energy_j"] is None
    assert s["by_phase"]["run"]["energy_per_sample_j"] == pytest.approx(s["energy_j"] / 150)
    s = summarize(t, w, _markers(("train", 1, 3, None)), 1000.0)                  # no samples counted
    assert s["energy_per_training_sample_j"] is None and s["training_energy_j"] == pytest.approx(4.0)


def test_a_train_phase_the_trace_does_not_cover_gives_no_energy_per_training_sample():
    t, w = _step_trace()
    # the meter failed at 10 s, the training ran on to 14 s: its energy is short
    s = summarize(t, w, _markers(("train", 8, 14, 100)), 1000.0)
    assert s["energy_per_training_sample_j"] is None and s["training_samples"] == 100
    # a train phase that was cut (never stopped)
    s = summarize(t, w, _markers(("train", 8, None, None)), 1000.0)
    assert s["energy_per_training_sample_j"] is None


# ------------------------------------------------------------------- measured (train --meter)

def _work(samples=40):
    from insitu.measure.phases import phase

    def fn():
        with phase("train") as p:
            time.sleep(0.1)
            p.samples = samples
        with phase("test"):
            time.sleep(0.05)
        return {"samples": samples}
    return fn


def test_measured_default_trace_is_the_first_free_power_csv(tmp_path, monkeypatch, capsys):
    from insitu.cli.power import measured

    monkeypatch.chdir(tmp_path)
    first = measured("synthetic:1@500", None, _work())
    assert first["power"]["csv"] == "power.csv" and first["power"]["complete"]
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    capsys.readouterr()
    second = measured("synthetic:1@500", None, _work())
    assert second["power"]["csv"] == "power-1.csv"
    err = capsys.readouterr().err
    assert "into power-1.csv" in err and "energy per training sample" in err
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert second["power"]["energy_per_training_sample_j"] == pytest.approx(
        second["power"]["by_phase"]["train"]["energy_j"] / 40)


def test_measured_with_run_dir_writes_there_and_a_second_run_takes_the_next_trace(tmp_path):
    from insitu.cli.power import measured

    run_dir = tmp_path / "runs" / "a"
    value = measured("synthetic:1@500", None, _work(), run_dir=run_dir)
    assert value["power"]["csv"] == str(run_dir / "power.csv")
    assert sorted(p.name for p in run_dir.iterdir()) == ["power.csv", "power.json", "power.phases.jsonl"]
    assert json.loads((run_dir / "power.json").read_text())["training_samples"] == 40
    first = (run_dir / "power.csv").read_bytes()
    # The folder's run again (resumed, or a sweep's point rerun): its trace is kept.
    value = measured("synthetic:1@500", None, _work(), run_dir=run_dir)
    assert value["power"]["csv"] == str(run_dir / "power-1.csv")
    assert (run_dir / "power.csv").read_bytes() == first
    # --power-out wins over the run folder
    value = measured("synthetic:1@500", str(tmp_path / "mine.csv"), _work(), run_dir=run_dir)
    assert value["power"]["csv"] == str(tmp_path / "mine.csv")


def test_measured_refuses_an_explicit_power_out_that_exists(tmp_path):
    from insitu.cli.power import measured

    (tmp_path / "p.json").write_text("{}")
    called = []
    with pytest.raises(UsageError, match="p.json .the record of .*p.csv. exists already"):
        measured("synthetic:1@500", str(tmp_path / "p.csv"), lambda: called.append(1))
    assert not called and (tmp_path / "p.json").read_text() == "{}"
