"""Curves, run folders, config files, strict options and `insitu runs compare`, end to end (the
refusals of options run in this process: tests/in_process.py)."""

import json

import pytest

from in_process import insitu_in_process

pytestmark = pytest.mark.system

DIGITS = ("--dataset", "digits")


def test_the_result_has_a_curve_of_several_points(run_cli):
    run = run_cli("train", *DIGITS, "--samples", "3000", "--json")
    assert run.returncode == 0, run.stderr
    curve = json.loads(run.stdout)["curve"]
    assert len(curve) >= 5
    samples = [p["samples"] for p in curve]
    assert samples == sorted(samples) and samples[-1] == 3000
    for point in curve:
        assert point["loss"] > 0 and 0 <= point["train_accuracy"] <= 1 and 0 <= point["test_accuracy"] <= 1
    assert curve[-1]["loss"] < curve[0]["loss"]          # it learns: the curve shows it


def test_a_diverging_run_stops_with_a_clear_message(run_cli):
    run = run_cli("train", "--lr", "1e9", "--samples", "2000", "--json")
    assert run.returncode == 1 and "diverged" in run.stderr
    assert "RuntimeWarning" not in run.stderr and "Traceback" not in run.stderr
    assert run.stdout == ""


@pytest.mark.parametrize("args,message", [
    (["--algo", "tt", "--model", "tiny", "--samples", "256", "--out", "/proc/x.json"], "--out /proc/x.json"),
    (["--plot", "/proc/x.png"], "--plot /proc/x.png"),
    (["--seed", "-1"], "--seed must be an integer >= 0"),
    (["--mode", "rtl"], "--mode does not apply to --algo sgd"),
    (["--rank", "4"], "--rank does not apply to --algo sgd"),
    (["--scheme", "bias-6"], "--scheme does not apply to --algo sgd (it is an option of --algo sparse)"),
    (["--algo", "tt", "--board", "ultra96v2", "--mode", "rtl"], "--mode does not apply to --board ultra96v2"),
    (["--algo", "sparse", "--board", "stm32f746-disco", "--heap", "64K"], "--heap does not apply to --board"),
    (["lr"], "give options as --name VALUE or name=value"),
    (["colour=red"], "unknown option 'colour'"),
    (["lr=fast"], "--lr in 'lr=fast'"),
    (["--plot", "x.txt"], "--plot x.txt: a figure is written as .png, .pdf, .svg"),
    (["--plot", "plotnoext"], "(no suffix here); choose e.g. plotnoext.png"),
    (["--out", "a" * 300 + ".json"], "the name is too long for the file system"),
    (["--checkpoint", "c" * 300 + ".npz"], "the name is too long for the file system"),
    (["--plot", "p" * 300 + ".png"], "the name is too long for the file system"),
    (["--run-dir", "r" * 300], "the name is too long for the file system"),
    (["--config", "/nonexistent/run.toml"], "--config /nonexistent/run.toml does not exist"),
])
def test_bad_options_exit_2_before_any_work(tmp_path, args, message):
    run = insitu_in_process("train", *args, cwd=tmp_path)
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert message in run.stderr and "Traceback" not in run.stderr
    assert not any(tmp_path.iterdir())                  # nothing written where it ran


def test_the_command_line_overrides_key_value_with_a_note(run_cli):
    run = run_cli("train", *DIGITS, "--samples", "64", "--lr", "0.02", "lr=0.2", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["lr"] == 0.02
    assert "--lr on the command line overrides 'lr=0.2'" in run.stderr


@pytest.mark.parametrize("line,message", [
    ("samples = true", "--samples in --config"),
    ("samples = 500.7", "500.7 is not a whole number"),
    ("lr = false", "false is not a value of this option"),
    ("model = true", "--model in --config"),
])
def test_a_config_value_of_the_wrong_type_is_refused_not_coerced(tmp_path, line, message):
    config = tmp_path / "run.toml"
    config.write_text(line + "\n")
    run = insitu_in_process("train", "--config", config, cwd=tmp_path)
    assert run.returncode == 2 and message in run.stderr, run.stderr


def test_a_plot_that_cannot_be_drawn_loses_nothing_and_runs_compare_checks_it_first(run_cli, tmp_path):
    a = tmp_path / "a"
    run = run_cli("train", *DIGITS, "--samples", "64", "--run-dir", a, "--plot", tmp_path / "a.svg",
                  "--out", tmp_path / "a.json")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "a.svg").read_text().lstrip().startswith("<?xml")      # the suffix's format
    assert json.loads((tmp_path / "a.json").read_text())["plot"] == str(tmp_path / "a.svg")
    run = run_cli("runs", "compare", a, "--plot", tmp_path / "y.txt")
    assert run.returncode == 2 and "--plot" in run.stderr and "Traceback" not in run.stderr
    run = run_cli("runs", "compare", a, "--plot", tmp_path / "y.pdf")
    assert run.returncode == 0 and (tmp_path / "y.pdf").read_bytes().startswith(b"%PDF")


def test_a_complete_run_run_again_is_already_complete_and_keeps_its_figures(run_cli, tmp_path):
    folder = tmp_path / "r"
    args = ("train", *DIGITS, "--samples", "320", "--run-dir", folder, "--meter", "synthetic:1", "--json")
    run = run_cli(*args)
    assert run.returncode == 0, run.stderr
    first, result = json.loads(run.stdout), (folder / "result.json").read_bytes()
    run = run_cli(*args)
    assert run.returncode == 0 and "already holds this run, complete" in run.stderr
    assert json.loads(run.stdout) == first and (folder / "result.json").read_bytes() == result
    assert first["train_accuracy"] is not None and first["samples_per_second"] is not None
    assert not (folder / "power-1.csv").exists()         # nothing measured again
    # The default and the same value asked explicitly are one run: it goes on.
    run = run_cli("train", *DIGITS, "--samples", "640", "--run-dir", folder, "--lr", "0.05",
                  "--batch-size", "32", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["resumed_from"] == 320


def test_config_files_are_checked_and_the_command_line_wins(run_cli, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('dataset = "digits"\nsamples = 320\nbatch-size = 16\nlr = 0.5\n')
    run = run_cli("train", "--config", config, "--lr", "0.1", "seed=3", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert (result["samples"], result["batch_size"], result["lr"], result["seed"]) == (320, 16, 0.1, 3)
    config.write_text('dataset = "digits"\nenv = "control"\n')        # an lrt option, not sgd's
    run = run_cli("train", "--config", config)
    assert run.returncode == 2 and "--env does not apply to --algo sgd" in run.stderr
    config.write_text("[train]\nlr = 1\n")
    run = run_cli("train", "--config", config)
    assert run.returncode == 2 and "[train] is a table" in run.stderr


def test_run_folders_keep_the_run_and_are_compared(run_cli, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run = run_cli("train", *DIGITS, "--samples", "640", "--run-dir", a, "lr=0.1")
    assert run.returncode == 0, run.stderr
    for name in ("config.toml", "run.json", "result.json", "curve.csv", "checkpoint.npz", "plot.png"):
        assert (a / name).is_file(), name
    assert json.loads((a / "run.json").read_text())["status"] == "complete"
    # The saved config runs again with one change.
    run = run_cli("train", "--config", a / "config.toml", "seed=1", "--run-dir", b)
    assert run.returncode == 0, run.stderr
    assert json.loads((b / "result.json").read_text())["seed"] == 1

    run = run_cli("runs", "compare", a, b, "--json", "--plot", tmp_path / "curves.png")
    assert run.returncode == 0, run.stderr
    table = json.loads(run.stdout)
    assert [r["run"] for r in table["runs"]] == ["a", "b"] and table["differing"] == ["seed"]
    assert all(r["samples"] == 640 and r["curve"] and r["accuracy"] > 0.3 for r in table["runs"])
    assert (tmp_path / "curves.png").stat().st_size > 0
    run = run_cli("runs", "compare", a, b)
    assert run.returncode == 0 and "insitu train" in run.stdout

    # Another run's folder is refused, naming what differs; nothing in it changes.
    before = (a / "result.json").read_bytes()
    run = run_cli("train", *DIGITS, "--samples", "640", "--run-dir", a, "lr=0.2")
    assert run.returncode == 2 and "lr 0.1 there, 0.2 here" in run.stderr
    assert (a / "result.json").read_bytes() == before
    # The same run continues in its folder.
    run = run_cli("train", *DIGITS, "--samples", "960", "--run-dir", a, "lr=0.1", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["resumed_from"] == 640 and "resumed from" in run.stderr


def test_runs_compare_refuses_a_folder_that_is_not_a_run(tmp_path):
    run = insitu_in_process("runs", "compare", tmp_path)
    assert run.returncode == 2 and "not a run folder" in run.stderr


def test_runs_of_every_training_command_are_compared_in_one_table(run_cli, tmp_path):
    runs = {       # on digits: the TT run evaluates its whole test split every epoch (10,000 in
                   # fashion-mnist, the commands' default; 359 in digits)
        "sgd": ("train", *DIGITS, "--samples", "320"),
        "tt": ("tt", "train", *DIGITS, "--variant", "fixed", "--epochs", "2", "train-size=256", "rank=4"),
        "e2": ("e2train", "run", *DIGITS, "--techniques", "smd", "--epochs", "1", "train-size=256",
               "test-samples=100"),
    }
    for name, args in runs.items():
        run = run_cli(*args, "--run-dir", tmp_path / name, timeout=300)
        assert run.returncode == 0, (name, run.stderr)
    run = run_cli("runs", "compare", *(tmp_path / name for name in runs), "--json")
    assert run.returncode == 0, run.stderr
    compared = json.loads(run.stdout)
    table = compared["runs"]
    # Every command writes its resolved options: sgd's default lr is there, the dataset (digits
    # in all three) does not differ, and an option only some commands have does.
    assert "dataset" not in compared["differing"] and {"lr", "board", "variant"} <= set(compared["differing"])
    assert "meter" not in compared["differing"]        # unset in train's config, absent in the others
    assert table[0]["config"]["lr"] == 0.05 and table[0]["config"]["batch-size"] == 32
    assert [r["run"] for r in table] == ["sgd", "tt/fixed", "e2/sgd32", "e2/smd"]
    assert [r["command"] for r in table] == ["insitu train", "insitu tt train", *["insitu e2train run"] * 2]
    for r in table:
        assert r["samples"] > 0 and r["accuracy"] is not None and r["curve"], r["run"]
    # Each command's complete folder, asked again, shows its result and runs nothing.
    for name in ("tt", "e2"):
        before = (tmp_path / name / "result.json").read_bytes()
        plot = ("--plot", tmp_path / "tt-again.png") if name == "tt" else ()
        run = run_cli(*runs[name], "--run-dir", tmp_path / name, *plot, "--json", timeout=300)
        assert run.returncode == 0 and "already holds this run, complete" in run.stderr, run.stderr
        assert json.loads(run.stdout) == json.loads(before)
        assert (tmp_path / name / "result.json").read_bytes() == before
    assert (tmp_path / "tt-again.png").stat().st_size > 0
    # A rerun of the TT folder with another rank is refused, not overwritten.
    run = run_cli(*runs["tt"][:-1], "rank=2", "--run-dir", tmp_path / "tt")
    assert run.returncode == 2 and "rank 4 there, 2 here" in run.stderr


def test_a_meter_from_the_config_records_and_a_run_folder_goes_on_with_it(run_cli, tmp_path):
    """`meter = ...` in --config (or as KEY=VALUE) records power like --meter; the same run asked
    for more samples in its folder keeps the first trace and writes the next free one."""
    config = tmp_path / "run.toml"
    config.write_text('dataset = "digits"\nmeter = "synthetic:2"\n')
    folder = tmp_path / "a"
    for samples, trace in ((320, "power.csv"), (640, "power-1.csv")):
        run = run_cli("train", "--config", config, "--samples", samples, "--run-dir", folder, "--json")
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["power"]["meter"]["meter"] == "synthetic:2"
        assert (folder / trace).is_file(), sorted(p.name for p in folder.iterdir())
    assert json.loads((folder / "run.json").read_text())["status"] == "complete"


def test_lrt_adapt_from_scratch_in_a_run_folder_is_complete_when_asked_again(run_cli, tmp_path):
    """--offline-samples 0 (the fig6 sweep's setting) trains from scratch, without pre-training;
    the complete folder asked again shows its result and trains nothing."""
    args = ("lrt", "adapt", "--env", "control", "--model", "mlp", *DIGITS, "--samples", "200",
            "--offline-samples", "0", "--run-dir", tmp_path / "a", "--json")
    run = run_cli(*args, timeout=300)
    assert run.returncode == 0, run.stderr
    first = json.loads(run.stdout)
    assert "pre-training" not in run.stderr and first["samples"] == 200
    run = run_cli(*args, "--plot", tmp_path / "again.png", timeout=300)
    assert run.returncode == 0 and "already holds this run, complete" in run.stderr
    assert json.loads(run.stdout) == first
    assert (tmp_path / "again.png").stat().st_size > 0       # a figure asked now is drawn


def test_a_complete_checkpoint_run_again_keeps_the_runs_figures(run_cli, tmp_path):
    """Only --checkpoint: the rerun trains nothing and reports the run's training accuracy and
    rate; a run resumed half-way reports the same training accuracy as one run straight through."""
    args = ("train", *DIGITS, "--samples", "640", "--json")
    straight = json.loads(run_cli(*args, "--checkpoint", tmp_path / "a.npz").stdout)
    run = run_cli(*args, "--checkpoint", tmp_path / "a.npz")
    assert run.returncode == 0 and "is already complete at 640 samples" in run.stderr
    again = json.loads(run.stdout)
    assert again["train_accuracy"] == straight["train_accuracy"] is not None
    assert again["samples_per_second"] is not None and again["curve"] == straight["curve"]
    run_cli("train", *DIGITS, "--samples", "320", "--checkpoint", tmp_path / "b.npz")
    resumed = json.loads(run_cli(*args, "--checkpoint", tmp_path / "b.npz").stdout)
    assert resumed["resumed_from"] == 320 and resumed["train_accuracy"] == straight["train_accuracy"]
