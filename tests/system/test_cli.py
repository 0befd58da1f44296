"""The `insitu` console script end to end: boards, doctor, train on a twin, bad input."""

import json

import numpy as np
import pytest

from conftest import VENV_BIN
from insitu.checkpoint import load_checkpoint

pytestmark = pytest.mark.system


def test_help_explains_the_commands(run_cli):
    run = run_cli("--help")
    assert run.returncode == 0
    for cmd in ("boards", "data", "doctor", "train"):
        assert cmd in run.stdout


def test_boards_json_lists_boards_and_twins_with_resources(run_cli):
    run = run_cli("boards", "--json")
    assert run.returncode == 0, run.stderr
    boards = {b["name"]: b for b in json.loads(run.stdout)}
    for name in ("ultra96v2", "zedboard", "stm32f746-disco"):
        assert boards[name]["twin_of"] is None and boards[f"{name}-sim"]["twin_of"] == name
    for b in boards.values():
        assert b["kind"] in ("fpga-soc", "mcu")
        fields = ("part", "lut", "ff", "dsp", "bram18") if b["kind"] == "fpga-soc" else \
                 ("part", "sram_bytes", "flash_bytes", "cpu_hz")
        assert all(isinstance(b[f], (int, str)) for f in fields)
    assert run_cli("boards").returncode == 0          # the table view


def test_doctor_finds_the_whole_toolchain(run_cli):
    run = run_cli("doctor", "--json")
    report = json.loads(run.stdout)
    missing = [c for c in report["checks"] if not c["ok"]]
    assert run.returncode == 0 and report["ok"], f"missing after setup: {missing}"


def test_doctor_says_what_is_missing_and_how_to_get_it(run_cli):
    # Only the venv on PATH: Icarus (a Debian package) cannot be found.
    run = run_cli("doctor", "--json", env={"PATH": str(VENV_BIN)})
    assert run.returncode == 1
    checks = {c["name"]: c for c in json.loads(run.stdout)["checks"]}
    assert not checks["icarus verilog"]["ok"]
    assert checks["icarus verilog"]["fix"] == "sudo apt-get install iverilog"


def test_train_on_a_twin_learns(run_cli, tmp_path):
    out = tmp_path / "run.json"
    run = run_cli("train", "--board", "zedboard-sim", "--dataset", "digits", "--samples", "3000",
                  "--lr", "0.1", "--json", "--out", out)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result == json.loads(out.read_text())
    assert (result["board"], result["algo"], result["samples"]) == ("zedboard-sim", "sgd", 3000)
    assert result["accuracy"] > 0.85, result            # chance is 0.10


def test_training_resumes_from_its_checkpoint_without_repeating_samples(run_cli, tmp_path):
    common = ["train", "--dataset", "digits", "--model", "cnn", "--batch-size", "16", "--json",
              "--checkpoint-every", "320"]
    straight = tmp_path / "straight.npz"
    resumed = tmp_path / "resumed.npz"
    assert run_cli(*common, "--samples", "1000", "--checkpoint", straight).returncode == 0
    first = run_cli(*common, "--samples", "512", "--checkpoint", resumed)
    assert first.returncode == 0, first.stderr
    second = run_cli(*common, "--samples", "1000", "--checkpoint", resumed)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["resumed_from"] == 512
    a, meta_a = load_checkpoint(straight)
    b, meta_b = load_checkpoint(resumed)
    assert meta_a["run"]["samples_done"] == meta_b["run"]["samples_done"] == 1000
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_a_checkpoint_from_another_run_is_refused(run_cli, tmp_path):
    ckpt = tmp_path / "c.npz"
    assert run_cli("train", "--dataset", "digits", "--samples", "64", "--checkpoint", ckpt).returncode == 0
    run = run_cli("train", "--dataset", "digits", "--samples", "64", "--lr", "0.2", "--checkpoint", ckpt)
    assert run.returncode == 1 and "belongs to another run (lr 0.05 there, 0.2 here)" in run.stderr
    ckpt.write_bytes(b"PK\x03\x04garbage")
    run = run_cli("train", "--dataset", "digits", "--samples", "64", "--checkpoint", ckpt)
    assert run.returncode == 1 and "corrupt" in run.stderr


def test_unwritable_output_fails_before_training(run_cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = run_cli("train", "--dataset", "digits", "--samples", "64", "--out", blocker / "run.json")
    assert run.returncode == 2 and "--out" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("args,message", [
    (["--board", "nope"], "known boards: "),
    (["--board", "ultra96v2"], "use --board ultra96v2-sim"),
    (["--algo", "magic"], "known algorithms: sgd"),
    (["--samples", "0"], "--samples must be an integer >= 1"),
    (["--lr", "-1"], "--lr must be a positive finite number"),
    (["--dataset", "cifar"], "cifar"),
])
def test_bad_train_arguments_exit_2_with_a_clear_message(run_cli, args, message):
    run = run_cli("train", "--dataset", "digits", *args, timeout=60)
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert message in run.stderr
