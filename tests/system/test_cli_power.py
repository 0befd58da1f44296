"""`insitu power record`: a command measured end to end, its phases, partial traces, bad input."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from insitu.measure.record import load_csv

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _registered() -> bool:
    from insitu.cli import main

    return "power" in main.commands


def power_argv(*args) -> list[str]:
    """`insitu power ARGS` (the command object itself until it is registered on `insitu`)."""
    if _registered() and (VENV_BIN / "insitu").exists():
        return [str(VENV_BIN / "insitu"), "power", *map(str, args)]
    return [sys.executable, "-c", "from insitu.cli.power import command; command()", *map(str, args)]


def power(*args, timeout=60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(power_argv(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          **kwargs)


def sine_integral(a, b):
    return (b - a) + 0.5 / (2 * math.pi) * (math.cos(2 * math.pi * a) - math.cos(2 * math.pi * b))


_CHILD = """
import sys, time
from insitu.measure.phases import phase
with phase("load"):
    time.sleep(0.2)
for epoch in range(2):
    with phase("train") as p:
        time.sleep(0.4)
        p.samples = 100
print("trained", flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""
#: The same phases a tenth as long: for the tests that read no phase's energy or duration.
_QUICK_CHILD = _CHILD.replace("time.sleep(0.2)", "time.sleep(0.02)").replace("time.sleep(0.4)", "time.sleep(0.04)")


def _assert_valid_csv(path, samples):
    lines = path.read_text().splitlines()
    assert lines[0] == "host_time,t,watts,volts,amps" and len(lines) == samples + 1
    trace = load_csv(path)
    assert trace["t"].size == samples
    if samples > 1:
        assert (trace["t"][1:] > trace["t"][:-1]).all()
    return trace


def test_record_measures_a_command_with_its_phases_and_draws_them(tmp_path):
    out, plot, child = tmp_path / "run.csv", tmp_path / "run.png", tmp_path / "child.py"
    child.write_text(_CHILD)
    run = power("record", "--meter", "synthetic:sine", "--trace", out, "--plot", plot, "--json",
                "--", sys.executable, child)
    assert run.returncode == 0, run.stderr
    rec = json.loads(run.stdout)                           # stdout is the record alone
    assert "trained" in run.stderr and "trained" not in run.stdout   # the command's output: stderr
    for key in ("energy_j", "mean_w", "duration_s", "samples", "phases", "meter", "command",
                "exit_code", "csv", "complete"):
        assert key in rec, key
    assert rec["complete"] and rec["exit_code"] == 0 and rec["meter"]["meter"] == "synthetic:sine"
    assert rec["command"] == [sys.executable, str(child)] and rec["csv"] == str(out)
    trace = _assert_valid_csv(out, rec["samples"])
    assert abs(rec["energy_j"] - sine_integral(trace["t"][0], trace["t"][-1])) / rec["energy_j"] < 0.01
    assert [p["name"] for p in rec["phases"]] == ["load", "train", "train"]
    for p in rec["phases"]:
        exact = sine_integral(p["start"], p["stop"])
        assert abs(p["energy_j"] - exact) / exact < 0.01
        assert p["mean_w"] == pytest.approx(p["energy_j"] / (p["stop"] - p["start"]))
    train = rec["by_phase"]["train"]
    assert train["count"] == 2 and train["samples"] == 200
    assert train["energy_per_sample_j"] == pytest.approx(train["energy_j"] / 200)
    assert json.loads((tmp_path / "run.json").read_text()) == {k: v for k, v in rec.items() if k != "plot"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_record_reports_in_words_without_json(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(_QUICK_CHILD)
    run = power("record", "--meter", "synthetic:2", "--trace", tmp_path / "run.csv", "--", sys.executable, child)
    assert run.returncode == 0, run.stderr
    assert "synthetic:2" in run.stdout and " J " in run.stdout and "train" in run.stdout
    assert "J/sample" in run.stdout and "trained" in run.stdout     # without --json it passes through
    assert "energy per training sample" in run.stdout and "train phase alone" in run.stdout


def test_a_crashing_command_leaves_a_valid_partial_csv_and_its_exit_code(tmp_path):
    out, child = tmp_path / "run.csv", tmp_path / "child.py"
    child.write_text(_QUICK_CHILD.replace('print("trained", flush=True)', 'raise SystemExit(7)'))
    run = power("record", "--meter", "synthetic:1.5@500", "--trace", out, "--json", "--", sys.executable, child)
    assert run.returncode == 7, run.stderr
    rec = json.loads(run.stdout)
    assert rec["exit_code"] == 7 and not rec["complete"] and rec["ended"] == "exit" and "exit 7" in rec["message"]
    _assert_valid_csv(out, rec["samples"])
    assert rec["mean_w"] == pytest.approx(1.5)


def test_a_crashing_command_in_a_run_folder_is_recorded_as_failed(tmp_path):
    child, folder = tmp_path / "child.py", tmp_path / "run"
    child.write_text(_QUICK_CHILD.replace('print("trained", flush=True)', 'raise SystemExit(7)'))
    run = power("record", "--meter", "synthetic:1.5@500", "--run-dir", folder, "--", sys.executable, child)
    assert run.returncode == 7, run.stderr
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "failed" and "exit 7" in record["message"] and record["rows"]


def test_sigint_to_the_recorder_stops_the_command_and_keeps_a_valid_partial_csv(tmp_path):
    out = tmp_path / "run.csv"
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    proc = subprocess.Popen(power_argv("record", "--meter", "synthetic:4@500", "--trace", out, "--json",
                                       "--", sys.executable, "-c", child),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:           # samples on disk while the command runs
            if pid_file.exists() and out.exists() and len(out.read_text().splitlines()) > 50:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the recorder wrote no samples")
        rows_before = len(out.read_text().splitlines())
        proc.send_signal(signal.SIGINT)                # to the recorder only, not its command
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    rec = json.loads(stdout)
    assert rec["ended"] == "interrupted" and not rec["complete"] and "SIGINT" in rec["message"]
    trace = _assert_valid_csv(out, rec["samples"])
    assert trace["t"].size >= rows_before - 1 and rec["mean_w"] == pytest.approx(4.0)
    child_pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):        # the command was stopped, not orphaned
        os.kill(child_pid, 0)


@pytest.mark.parametrize("args,message", [
    (("--meter", "bogus:1", "--trace", "{tmp}/run.csv", "--", "true"), "unknown meter 'bogus:1'"),
    (("--meter", "synthetic:x", "--trace", "{tmp}/run.csv", "--", "true"), "--meter synthetic:x"),
    (("--meter", "synthetic:1", "--trace", "{tmp}/run.csv"), "give the command to measure after --"),
    (("--meter", "synthetic:1", "--trace", "{tmp}/run.csv", "--"), "give the command to measure after --"),
    (("--meter", "synthetic:1", "--trace", "{tmp}/afile/run.csv", "--", "true"), "afile is a file, not a folder"),
    (("--meter", "synthetic:1", "--trace", "{tmp}", "--", "true"), "is a directory"),
    (("--meter", "synthetic:1", "--trace", "{tmp}/run.json", "--", "true"), "is the trace (CSV)"),
    (("--meter", "synthetic:1", "--trace", "{tmp}/run.csv", "--plot", "{tmp}/afile/p.png", "--", "true"),
     "cannot write --plot"),
    (("--meter", "synthetic:1", "--trace", "{tmp}/run.csv", "--", "no-such-program-xyz"), "command not found"),
    (("--trace", "{tmp}/run.csv", "--", "true"), "Missing option '--meter'"),
    (("--meter", "synthetic:1", "--trace", "{tmp}/run.csv", "--run-dir", "{tmp}/r", "--", "true"), "not both"),
    (("--meter", "synthetic:1", "--run-dir", "{tmp}/afile", "--", "true"), "is a file"),
    (("--meter", "synthetic:1", "--out", "{tmp}/afile/run.csv", "--", "true"),     # the old spelling,
     "cannot write --trace"),                                                      # named as now
])
def test_bad_input_is_a_clear_error_with_exit_2(tmp_path, args, message):
    from click.testing import CliRunner

    from insitu.cli.power import command

    (tmp_path / "afile").write_text("")
    result = CliRunner().invoke(command, ["record", *[a.replace("{tmp}", str(tmp_path)) for a in args]])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert isinstance(result.exception, SystemExit)           # a message, not a traceback
    assert message in result.stderr
    assert not (tmp_path / "run.json").exists()


def test_bad_input_through_the_real_entry_point(tmp_path):
    run = power("record", "--meter", "nope", "--trace", tmp_path / "run.csv", "--", "true")
    assert run.returncode == 2 and "unknown meter 'nope'" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.skipif(not _registered(), reason="`insitu power` is not registered on `insitu` yet")
def test_measure_power_script_is_the_record_command(tmp_path):
    out = tmp_path / "run.csv"
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = subprocess.run([str(ROOT / "scripts" / "measure_power"), "--meter", "synthetic:2@200",
                          "--out", out, "--json", "--", "sleep", "0.2"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    rec = json.loads(run.stdout)
    # >= 40: the trace runs from before the command starts until after it ends (the recorder
    # drains the meter to then), so it spans at least the 0.2 s sleep at 200 Hz however busy the
    # machine is (a slow start only makes it longer)
    assert rec["complete"] and rec["mean_w"] == pytest.approx(2.0) and rec["samples"] >= 40


def test_a_simulated_powershield_is_measured_through_its_serial_port(tmp_path):
    # `insitu power emulate` serves the LPM01A protocol on a pty; `record` reads it as a board.
    twin = subprocess.Popen(power_argv("emulate", "--current", 20, "--json"), stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        port = json.loads(twin.stdout.readline())["port"]
        run = power("record", "--meter", f"powershield:{port}", "--trace", tmp_path / "ps.csv", "--json", "--",
                    sys.executable, "-c", "import time; time.sleep(1.5)")
        assert run.returncode == 0, run.stderr
        r = json.loads(run.stdout)
        # the trace spans the command (the recorder drains the meter until its end): at least its
        # 1.5 s at 1 kHz, whatever the load (the twin sends the samples due by its clock)
        assert r["complete"] and r["samples"] > 1000
        assert r["mean_w"] == pytest.approx(0.020 * 3.3, rel=0.01)          # 20 mA at 3.3 V
        assert r["energy_j"] == pytest.approx(r["mean_w"] * r["duration_s"], rel=0.02)
        assert len(load_csv(tmp_path / "ps.csv")["watts"]) == r["samples"]
    finally:
        twin.send_signal(signal.SIGINT)
        assert twin.wait(timeout=10) == 0


# ------------------------------------------------------------------ traces are never overwritten

_TOUCH = "import sys; open(sys.argv[1], 'w').write('ran')"


def _first_run(tmp_path):
    """A complete recording in run.csv (+ run.json, run.phases.jsonl); its files' bytes."""
    child = tmp_path / "child.py"
    child.write_text(_QUICK_CHILD)
    run = power("record", "--meter", "synthetic:sine", "--trace", tmp_path / "run.csv", "--json",
                "--", sys.executable, child)
    assert run.returncode == 0, run.stderr
    files = {name: (tmp_path / name).read_bytes() for name in ("run.csv", "run.json", "run.phases.jsonl")}
    assert json.loads(files["run.json"])["complete"] and len(files["run.csv"]) > 1000
    assert files["run.phases.jsonl"].count(b"\n") == 6
    return files


def test_the_issue_case_a_failed_meter_run_leaves_the_earlier_trace_and_record_whole(tmp_path):
    # Before: the second run (a meter that cannot be opened) truncated run.csv to its 29 B header
    # and emptied run.phases.jsonl, and run.json still said complete: true.
    before = _first_run(tmp_path)
    for meter in ("powershield:/dev/no-such-port", "synthetic:1"):
        run = power("record", "--meter", meter, "--trace", tmp_path / "run.csv", "--json",
                    "--", sys.executable, "-c", _TOUCH, tmp_path / "ran")
        assert run.returncode == 2, run.stderr
        assert "run.csv exists already" in run.stderr and "choose another path, or delete it" in run.stderr
        assert "Traceback" not in run.stderr and run.stdout == ""
        assert not (tmp_path / "ran").exists()                     # the command never started
        assert {name: (tmp_path / name).read_bytes() for name in before} == before


@pytest.mark.parametrize("existing", ["run.json", "run.phases.jsonl"])
def test_an_existing_sidecar_is_refused_before_the_meter_or_the_command_starts(tmp_path, existing):
    (tmp_path / existing).write_text("another run's\n")
    run = power("record", "--meter", "synthetic:1", "--trace", tmp_path / "run.csv",
                "--", sys.executable, "-c", _TOUCH, tmp_path / "ran")
    assert run.returncode == 2, run.stderr
    assert f"{tmp_path / existing} (the " in run.stderr and "exists already" in run.stderr
    assert "choose another path, or delete it" in run.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "run.csv").exists()
    assert (tmp_path / existing).read_text() == "another run's\n"


def test_a_meter_that_cannot_be_opened_leaves_no_files_and_the_path_stays_free(tmp_path):
    run = power("record", "--meter", "powershield:/dev/no-such-port", "--trace", tmp_path / "run.csv",
                "--", sys.executable, "-c", _TOUCH, tmp_path / "ran")
    assert run.returncode != 0 and "no-such-port" in run.stderr and "Traceback" not in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    _first_run(tmp_path)                                    # the same path works afterwards


def test_run_dir_holds_the_trace_record_and_phases_and_is_never_overwritten(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(_QUICK_CHILD)
    run_dir = tmp_path / "runs" / "a"
    run = power("record", "--meter", "synthetic:2@500", "--run-dir", run_dir, "--json",
                "--", sys.executable, child)
    assert run.returncode == 0, run.stderr
    rec = json.loads(run.stdout)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.toml", "curve.csv", "power.csv", "power.json",
                                                         "power.phases.jsonl", "result.json", "run.json"]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    assert rec["csv"] == str(run_dir / "power.csv") and rec["record"] == str(run_dir / "power.json")
    assert json.loads((run_dir / "power.json").read_text()) == rec
    _assert_valid_csv(run_dir / "power.csv", rec["samples"])
    before = (run_dir / "power.csv").read_bytes()
    # The same recording again is already complete: its record is shown, nothing is measured.
    again = power("record", "--meter", "synthetic:2@500", "--run-dir", run_dir, "--json", "--",
                  sys.executable, child)
    assert again.returncode == 0 and "already holds this run, complete" in again.stderr
    assert json.loads(again.stdout) == rec
    other = power("record", "--meter", "synthetic:2@500", "--run-dir", run_dir, "--", "true")
    assert other.returncode == 2 and "holds another run (command" in other.stderr
    assert (run_dir / "power.csv").read_bytes() == before


def test_the_old_out_spelling_still_records_but_help_shows_trace(tmp_path):
    run = power("record", "--meter", "synthetic:2@200", "--out", tmp_path / "old.csv", "--json", "--", "true")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["csv"] == str(tmp_path / "old.csv")
    shown = power("record", "--help")
    assert "--trace" in shown.stdout and "--run-dir" in shown.stdout and "--out" not in shown.stdout


# ------------------------------------------------------- `insitu train` under the recorder, --json

#: The training runs measured below: digits (fashion-mnist, the default, loads 70,000 images and
#: tests on 10,000 for figures these tests do not read).
DIGITS = ("--dataset", "digits")


def _insitu_on_path() -> dict:
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.skipif(not (VENV_BIN / "insitu").exists(), reason="the insitu console script is not installed")
def test_json_record_of_insitu_train_is_alone_on_stdout_with_train_and_test_phases(tmp_path):
    run = power("record", "--meter", "synthetic:sine", "--trace", tmp_path / "x.csv", "--json",
                "--", "insitu", "train", "--dataset", "digits", "--samples", "600", timeout=300,
                env=_insitu_on_path())
    assert run.returncode == 0, run.stderr
    rec = json.loads(run.stdout)                   # only JSON: the child's result line went to stderr
    assert "sgd: 600 samples" in run.stderr
    assert rec["complete"] and rec["command"] == ["insitu", "train", "--dataset", "digits", "--samples", "600"]
    # sgd (the default algorithm) marks its phases through the harness
    names = [p["name"] for p in rec["phases"]]
    assert set(names) == {"train", "test"} and names[0] == "train" and names[-1] == "test"
    train = rec["by_phase"]["train"]
    assert train["samples"] == 600 and train["energy_j"] > 0
    assert sum(p["samples"] for p in rec["phases"] if p["name"] == "train") == 600
    # energy per training sample: the train phase alone, never the whole run
    assert rec["training_samples"] == 600 and rec["training_energy_j"] == pytest.approx(train["energy_j"])
    assert rec["energy_per_training_sample_j"] == pytest.approx(train["energy_j"] / 600, rel=1e-6)
    assert rec["energy_per_training_sample_j"] < rec["energy_j"] / 600
    assert rec["by_phase"]["test"]["count"] >= 1 and rec["by_phase"]["test"]["energy_j"] > 0


@pytest.mark.skipif(not (VENV_BIN / "insitu").exists(), reason="the insitu console script is not installed")
def test_train_meter_never_overwrites_a_power_trace(tmp_path, run_cli):
    insitu_cli = run_cli
    first = insitu_cli("train", *DIGITS, "--samples", "600", "--meter", "synthetic:2@200", "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["power"]["csv"] == "power.csv"
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"power.csv", "power.json", "power.phases.jsonl"}
    # the default goes to the first free name, and says so
    second = insitu_cli("train", *DIGITS, "--samples", "600", "--meter", "synthetic:2@200", "--json", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    rec = json.loads(second.stdout)["power"]
    assert rec["csv"] == "power-1.csv" and "into power-1.csv" in second.stderr
    assert rec["by_phase"]["train"]["samples"] == 600 and rec["energy_per_training_sample_j"] > 0
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    # an explicit --power-out that exists is refused before training
    third = insitu_cli("train", *DIGITS, "--samples", "600", "--meter", "synthetic:2@200", "--power-out",
                       "power.csv", cwd=tmp_path)
    assert third.returncode == 2 and "--power-out: power.csv exists already" in third.stderr
    assert "training on" not in third.stderr
    assert {name: (tmp_path / name).read_bytes() for name in before} == before


def test_the_record_of_a_training_run_is_json_on_stdout_and_never_overwrites_a_trace(run_cli, tmp_path):
    """The issue's case: no --trace, --json, a training run as the command."""
    for expected in ("power.csv", "power-1.csv"):
        run = run_cli("power", "record", "--meter", "synthetic:sine", "--json", "--",
                      VENV_BIN / "insitu", "train", *DIGITS, "--samples", "600", cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        record = json.loads(run.stdout)
        assert Path(record["csv"]).name == expected and (tmp_path / expected).stat().st_size > 0
        assert {p["name"] for p in record["phases"]} >= {"train", "test"}


def test_a_power_run_folder_is_compared_with_the_training_runs(run_cli, tmp_path):
    run = run_cli("power", "record", "--meter", "synthetic:2", "--run-dir", tmp_path / "p", "--", "sleep", "1")
    assert run.returncode == 0, run.stderr
    run = run_cli("train", "--dataset", "digits", "--samples", "320", "--meter", "synthetic:2",
                  "--run-dir", tmp_path / "t")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "t" / "power.csv").is_file()
    run = run_cli("runs", "compare", tmp_path / "p", tmp_path / "t", "--json")
    rows = {r["run"]: r for r in json.loads(run.stdout)["runs"]}
    assert rows["p"]["command"] == "insitu power record" and rows["p"]["energy_j"] > 1.5
    assert rows["t"]["energy_j"] > 0 and rows["t"]["accuracy"] > 0.2
