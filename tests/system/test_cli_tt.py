"""`insitu tt`: the PE schedule, a short training run through the CLI, and bad input."""

import json

import pytest

from insitu.data.datasets import FASHION_MNIST_DIR

pytestmark = pytest.mark.system

needs_fashion = pytest.mark.skipif(
    not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason=f"FashionMNIST not installed in {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)")


def test_tt_help_lists_the_subcommands(run_cli):
    run = run_cli("tt", "--help")
    assert run.returncode == 0, run.stderr
    commands = run.stdout.split("Commands:")[1].split()
    for name in ("train", "schedule", "bench"):
        assert name in commands


def test_schedule_json_lists_ops_and_macs(run_cli):
    run = run_cli("tt", "schedule", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    ops = result["ops"]
    assert ops
    for op in ops:
        assert op["kind"] in ("PE1", "PE2", "PE3")
        for key in ("a", "b", "c", "d", "macs"):
            assert isinstance(op[key], int) and op[key] >= 1, (key, op)
    by_kind = result["macs_by_kind"]
    assert set(by_kind) <= {"PE1", "PE2", "PE3"} and {op["kind"] for op in ops} == set(by_kind)
    for kind, macs in by_kind.items():
        assert macs == sum(op["macs"] for op in ops if op["kind"] == kind)
    assert result["macs"] == sum(by_kind.values())
    # The default is a first layer: no input gradient; --not-first-layer adds it.
    assert "input-grad" not in {op["phase"] for op in ops}
    run = run_cli("tt", "schedule", "--json", "--not-first-layer")
    assert run.returncode == 0, run.stderr
    later = json.loads(run.stdout)
    assert "input-grad" in {op["phase"] for op in later["ops"]} and later["macs"] > result["macs"]


def test_schedule_text_prints_ops_and_totals(run_cli):
    run = run_cli("tt", "schedule", "--in-modes", "4,16", "--out-modes", "2,4", "--ranks", "3")
    assert run.returncode == 0, run.stderr
    assert "PE1" in run.stdout
    assert "MACs:" in run.stdout + run.stderr and "total" in run.stdout + run.stderr


@pytest.mark.parametrize("args,message", [
    (("--ranks", "0"), "ranks"),
    (("--ranks", "a,b"), "--ranks takes comma-separated integers"),
    (("--in-modes", "7,4", "--out-modes", "4,4,2"), "--in-modes [7, 4] and --out-modes"),
    (("--batch-size", "0"), "--batch-size must be an integer >= 1"),
])
def test_schedule_bad_input_is_a_usage_error(run_cli, args, message):
    run = run_cli("tt", "schedule", *args)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert message in run.stderr
    assert "Traceback" not in run.stderr


def test_train_curve_points_have_the_loss_and_both_accuracies(run_cli):
    # 2 epochs of 64 samples, 16 a step: a point a step; the epochs' ends have the evaluation of
    # the whole test set, the others the probe of its first samples (250 of digits' 359: the
    # golden-model PEs' inference passes are most of the run).
    run = run_cli("tt", "train", "--variant", "fixed", "--dataset", "digits", "--epochs", "2",
                  "--train-size", "64", "--batch-size", "16", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    curve = result["curve"]
    assert [p["samples"] for p in curve] == list(range(16, 129, 16))
    for point in curve:
        assert point["loss"] > 0 and 0 <= point["train_accuracy"] <= 1 and 0 <= point["test_accuracy"] <= 1
    assert [curve[3]["test_accuracy"], curve[7]["test_accuracy"]] == [
        h["test_accuracy"] for h in result["history"]]


@needs_fashion
def test_train_float_prints_json_and_writes_out_and_plot(run_cli, tmp_path):
    # 128 training samples, one epoch, on FashionMNIST's network; --data-dir holds its first 1,000
    # training and 500 test samples (the evaluation of all 10,000 would be most of the run).
    from insitu.data import load_dataset
    from insitu.data.idx import write_idx

    full, data_dir = load_dataset("fashion-mnist"), tmp_path / "fashion"
    data_dir.mkdir()
    for prefix, images, labels in (("train", full.x_train[:1000], full.y_train[:1000]),
                                   ("t10k", full.x_test[:500], full.y_test[:500])):
        write_idx(data_dir / f"{prefix}-images-idx3-ubyte", images)
        write_idx(data_dir / f"{prefix}-labels-idx1-ubyte", labels.astype("uint8"))
    out, plot = tmp_path / "res" / "tt.json", tmp_path / "tt.png"
    run = run_cli("tt", "train", "--variant", "float", "--epochs", "1", "--train-size", "128",
                  "--data-dir", data_dir, "--out", out, "--plot", plot, "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    for key in ("variant", "config", "test_accuracy", "train_accuracy", "best_test_accuracy",
                "best_epoch", "parameters", "memory_bits", "memory_reduction", "dense_memory_bits",
                "ranks", "epochs", "train_samples", "seconds", "history"):
        assert key in result, key
    assert result["variant"] == "float" and result["epochs"] == 1 and result["train_samples"] == 128
    assert result["parameters"] == 14800 and result["ranks"] == [[1, 16, 16, 16, 1], [1, 16, 1]]
    assert 0 <= result["test_accuracy"] <= 1 and len(result["history"]) == 1
    assert json.loads(out.read_text()) == result
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # `tt report` tabulates result files of separate runs and draws them in one figure.
    both = tmp_path / "both.png"
    run = run_cli("tt", "report", out, out, "--plot", both)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("\nfloat ") == 2 and "memory bits" in run.stdout
    assert both.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_refuses_a_file_that_is_not_a_result(run_cli, tmp_path):
    bogus = tmp_path / "bogus.json"
    bogus.write_text(json.dumps({"hello": 1}))
    run = run_cli("tt", "report", bogus)
    assert run.returncode == 2
    assert "is not a result of `insitu tt train --out`" in run.stderr


@pytest.mark.parametrize("args,field", [
    (("--epochs", "0"), "--epochs must be an integer >= 1"),
    (("--batch-size", "0"), "--batch-size must be an integer >= 1"),
    (("--train-size", "0"), "--train-size must be an integer >= 1"),
    (("--lr", "0"), "--lr must be a positive number"),
    (("--prune-threshold", "1"), "--prune-threshold must be in [0, 1)"),
    (("--rank", "64", "--batch-size", "256"), "--rank 64 with --batch-size 256 does not fit"),
    (("--variant", "sparse"), "--variant"),
])
def test_train_bad_input_is_a_usage_error(run_cli, args, field):
    run = run_cli("tt", "train", *args)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert field in run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""


def test_train_unwritable_out_fails_before_training(run_cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    run = run_cli("tt", "train", "--variant", "float", "--epochs", "1", "--train-size", "64",
                  "--out", blocker / "tt.json", "--json", timeout=60)
    assert run.returncode != 0, (run.stdout, run.stderr)
    assert "--out" in run.stderr and "Traceback" not in run.stderr
    assert run.stdout == ""                                   # no result: nothing was trained
    assert blocker.read_text() == "not a folder"


def test_train_unwritable_plot_fails_before_training(run_cli):
    # /proc lets root pass a permission check but refuses new files: found before any training.
    run = run_cli("tt", "train", "--variant", "float", "--epochs", "1", "--train-size", "64",
                  "--plot", "/proc/x.png", timeout=60)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "--plot" in run.stderr and "/proc/x.png" in run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""


@pytest.mark.parametrize("command,new,old,args", [
    (("tt", "train"), "--train-size", "--train-samples", ("--train-samples", "0")),
    (("tt", "schedule"), "--batch-size", "--batch", ("--batch", "4", "--json")),
    (("tt", "bench"), "--batch-size", "--batch", ("--batch", "0")),
])
def test_older_spellings_still_work_and_help_shows_the_new_one(run_cli, command, new, old, args):
    help_text = run_cli(*command, "--help").stdout
    assert new in help_text and f"{old} " not in help_text and f"{old}\n" not in help_text
    run = run_cli(*command, *args, timeout=60)
    if "--json" in args:
        assert run.returncode == 0, run.stderr
        new_run = run_cli(*command, new, *args[1:], timeout=60)
        assert run.stdout == new_run.stdout
    else:                                   # a bad value: the error names the current spelling
        assert run.returncode == 2 and f"{new} must be an integer >= 1" in run.stderr, run.stderr
