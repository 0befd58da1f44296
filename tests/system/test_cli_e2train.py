"""`insitu e2train run`: a tiny real experiment end to end (baseline and all three techniques),
resuming from --out-dir, measured with a synthetic meter, and bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from in_process import insitu_in_process
from insitu.checkpoint import load_checkpoint

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY = ("--epochs", "1", "--train-size", "256", "--test-samples", "128", "--width", "4",
        "--blocks-per-stage", "1", "--batch-size", "32")


def _insitu(*args):
    return subprocess.run([str(BIN / "insitu"), "e2train", "run", *map(str, args)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env={**os.environ, "COLUMNS": "80"})


def _refused(*args):
    """`insitu e2train run ARGS` in this process (tests/in_process.py): the refusals."""
    return insitu_in_process("e2train", "run", *args, env={"COLUMNS": "80"}, cwd=ROOT)


@pytest.fixture(scope="module")
def all_three(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2") / "run"
    proc = _insitu("--techniques", "smd,slu,psg", *TINY, "--out-dir", out, "--plot", out / "fig.png", "--json")
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


def test_prints_the_headline_figures(all_three):
    _, result = all_three
    for key in ("accuracy", "baseline_accuracy", "computational_saving", "energy_saving"):
        assert isinstance(result[key], float), key
    assert result["row"] == "smd+slu+psg"
    rows = {r["row"]: r for r in result["rows"]}
    assert set(rows) == {"sgd32", "smd+slu+psg"}
    e2 = rows["smd+slu+psg"]
    assert 0 < e2["dropped_batches"] < e2["batches"]          # SMD dropped some, not all
    assert e2["epochs"] == round(1 * (2 / 3) / 0.5) == 1 and rows["sgd32"]["epochs"] == 1
    assert 0 < e2["psg_predicted_fraction"] <= 1
    assert 0 <= e2["slu_skip_ratio"] <= 1
    # Fewer steps and cheaper arithmetic: both savings are positive, energy more than MACs.
    assert 0 < result["computational_saving"] < result["energy_saving"] < 1
    assert rows["sgd32"]["computational_saving"] == 0
    # A curve point a step, each with the test accuracy; the loss and the training accuracy
    # wherever a mini-batch was trained since the point before (SMD drops some).
    for row in rows.values():
        assert len(row["curve"]) == 8 and all(0 <= p["test_accuracy"] <= 1 for p in row["curve"])
        trained = [p for p in row["curve"] if p["loss"] is not None]
        assert all(p["loss"] > 0 and 0 <= p["train_accuracy"] <= 1 for p in trained)
    assert all(p["loss"] is not None for p in rows["sgd32"]["curve"])


def test_writes_rows_plot_and_resumes(all_three):
    out, result = all_three
    for row in ("sgd32", "smd+slu+psg"):
        (path,) = (out / "rows").glob(f"{row}-*.json")
        weights, meta = load_checkpoint(path.with_suffix(".npz"))
        assert meta["row"] == row and "fc.weight" in weights
    assert (out / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "e2train.json").read_text())
    assert saved["baseline_accuracy"] == result["baseline_accuracy"]
    # A rerun reuses both finished rows (same key) and reports the same figures.
    proc = _insitu("--techniques", "smd,slu,psg", *TINY, "--out-dir", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("reusing") == 2
    assert "smd+slu+psg" in proc.stdout and "sgd32" in proc.stdout
    # Piped (and COLUMNS=80), the table cuts no header and no cell.
    for header in ("comp. sav. %", "energy sav. %", "meas. sav. %", "PSG pred.", "dropped"):
        assert header in proc.stdout, header
    assert "…" not in proc.stdout
    # Another PSG threshold: the baseline is shared, the E2-Train row is new.
    proc = _insitu("--techniques", "smd,slu,psg", *TINY, "--out-dir", out, "--beta", "0.1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("reusing") == 1 and "sgd32: reusing" in " ".join(proc.stderr.split())
    assert len(list((out / "rows").glob("*.json"))) == 3


def test_measured_energy_per_row(tmp_path):
    power = tmp_path / "power.csv"
    proc = _insitu("--techniques", "psg", *TINY, "--meter", "synthetic:2.5", "--power-out", power, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    # Each row is a phase, and within it the harness's training steps and evaluations.
    assert set(result["power"]["by_phase"]) == {"sgd32", "psg", "train", "test"}
    rows = {r["row"]: r for r in result["rows"]}
    assert rows["psg"]["measured_energy_j"] > 0 and rows["sgd32"]["measured_energy_j"] > 0
    assert result["measured_energy_saving"] == rows["psg"]["measured_energy_saving"]
    assert power.exists()


@pytest.mark.parametrize("args, message", [
    (("--smd-p", "1.5"), "--smd-p (SMD's drop probability) must be in [0, 1]"),
    (("--smd-p", "-0.1"), "--smd-p (SMD's drop probability) must be in [0, 1]"),
    (("--smd-energy-ratio", "0"), "--smd-energy-ratio must be in (0, 1]"),
    (("--beta", "0"), "--beta must be in (0, 1)"),
    (("--beta", "1"), "--beta must be in (0, 1)"),
    (("--batch-size", "0"), "--batch-size must be >= 1, got 0"),
    (("--train-size", "0"), "--train-size must be >= 1, got 0"),
    (("--test-samples", "0"), "--test-samples must be >= 1, got 0"),
    (("--psg-lr", "0"), "--psg-lr must be > 0"),
    (("--slu-alpha", "-1"), "--slu-alpha must be >= 0"),
    (("--train-size", "100000"), "asked for --train-size 100000 and --test-samples 128"),
    (("--plot", "/proc/x.png"), "cannot write --plot /proc/x.png"),
    (("--out-dir", "/proc/e2"), "--out-dir /proc/e2"),
    (("--techniques", "smd,dropout"), "unknown E2-Train technique(s) dropout"),
    (("--techniques", "slu", "--blocks-per-stage", "0"), "has none"),
])
def test_bad_input_exits_2_with_a_clear_message(args, message):
    proc = _refused(*TINY, *args)
    assert proc.returncode == 2, proc.stderr
    assert message in " ".join(proc.stderr.split())


@pytest.mark.parametrize("new, old, args, message", [
    ("--train-size", "--train-samples", ("--train-samples", "0"), "--train-size must be >= 1"),
    ("--out-dir", "--out", ("--out", "/proc/e2"), "--out-dir /proc/e2"),
])
def test_older_spellings_still_work_and_help_shows_the_new_one(new, old, args, message):
    help_text = _refused("--help").stdout
    assert new in help_text and f"{old} " not in help_text
    proc = _refused(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_a_sweep_of_e2train_points_shares_the_baseline(tmp_path):
    (tmp_path / "grid.toml").write_text(f"""
[sweep]
name = "e2-tiny"
run = "insitu.e2train.experiment:sweep_point"
seeds = [0]
metrics = ["accuracy", "energy_saving", "slu_skip_ratio"]
heatmap = ["slu_target", "beta"]
[fixed]
techniques = "smd,slu,psg"
epochs = 1
train_samples = 256
test_samples = 128
width = 4
blocks_per_stage = 1
batch_size = 32
out = "{tmp_path / 'rows'}"
[grid]
slu_target = [0.2, 0.6]
beta = [0.05]
""")
    proc = subprocess.run([str(BIN / "insitu"), "sweep", str(tmp_path / "grid.toml"), "--out",
                           str(tmp_path / "sweep"), "--workers", "1", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    table = json.loads(proc.stdout)["table"]
    assert len(table) == 2 and all(0 < row["energy_saving"] < 1 for row in table)
    rows = sorted(p.name.split("-")[0] for p in (tmp_path / "rows" / "rows").glob("*.json"))
    assert rows == ["sgd32", "smd+slu+psg", "smd+slu+psg"]
