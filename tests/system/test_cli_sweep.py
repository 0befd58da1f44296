"""`insitu sweep`: a tiny LRT grid end to end (local process pool and Ray), resuming, bad configs
(refused in this process: tests/in_process.py)."""

import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, SHARED_CACHE, VENV_BIN, insitu_cli
from in_process import insitu_in_process

pytestmark = pytest.mark.system

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'insitu[ray]')")

# A 2 x 2 grid (learning rate x dense batch), no-norm vs max-norm: 8 points of well under 2 s.
TINY = """\
[sweep]
name = "tiny"
run = "lrt.adapt"
seeds = [0]
metrics = ["online_accuracy", "max_writes_per_cell"]

[fixed]
env = "control"
samples = 120
dataset = "digits"
arch = "mlp"
offline_samples = 300
cache_dir = "cache"

[grid]
lr = [0.01, 0.1]
dense_batch = [10, 20]
scheme = ["lrt", "lrt-maxnorm"]
"""


def sweep_cli(*args, env=None, timeout=300):
    """`insitu sweep ...`; until the command is registered on the main group, the same group with
    it added (the fallback goes once host/insitu/cli/__init__.py registers insitu.cli.sweep)."""
    from insitu.cli import main

    if "sweep" in main.commands:
        return insitu_cli("sweep", *args, env=env, timeout=timeout)
    code = ("import sys; from insitu.cli import main; from insitu.cli.sweep import command; "
            "main.add_command(command); sys.argv[0] = 'insitu'; main()")
    full_env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    return subprocess.run([sys.executable, "-c", code, "sweep", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=ROOT)


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_tiny_lrt_grid_tabulates_writes_csv_and_heat_maps_and_resumes(tiny, tmp_path):
    out = tmp_path / "out"
    run = sweep_cli(tiny, "--out", out, "--json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["points"] == summary["ran"] == 8 and summary["backend"] == "local"
    rows = summary["table"]
    assert [(r["lr"], r["dense_batch"], r["scheme"]) for r in rows][:3] == [
        (0.01, 10, "lrt"), (0.01, 10, "lrt-maxnorm"), (0.01, 20, "lrt")]
    for r in rows:
        assert 0 <= r["online_accuracy"] <= 1 and r["max_writes_per_cell"] >= 0 and r["seeds"] == [0]
    assert len(list((out / "points").glob("*.json"))) == 8
    with open(out / "points.csv", newline="") as fh:
        points = list(csv.DictReader(fh))
    assert len(points) == 8 and {p["scheme"] for p in points} == {"lrt", "lrt-maxnorm"}
    maps = sorted(p.name for p in out.glob("heatmap-*.png"))
    assert maps == ["heatmap-max-writes-per-cell-scheme=lrt-maxnorm.png",
                    "heatmap-max-writes-per-cell-scheme=lrt.png",
                    "heatmap-online-accuracy-scheme=lrt-maxnorm.png",
                    "heatmap-online-accuracy-scheme=lrt.png"]
    assert list((tmp_path / "cache").glob("pretrained-mlp-*.npz"))   # cache_dir, from the config's folder

    # the rerun finds every point done, and prints the same table for people
    again = sweep_cli(tiny, "--out", out)
    assert again.returncode == 0, again.stderr
    assert "8 points: 0 run, 8 already done" in again.stdout
    assert "online_accuracy" in again.stdout and "lrt-maxnorm" in again.stdout
    assert json.loads((out / "sweep.json").read_text())["table"] == rows


@pytest.mark.parametrize("edit,message", [
    (("[grid]", "[grid]\nlrr = [0.1]"), "unknown key 'lrr' in [grid] (lrt.adapt parameters); allowed: env, scheme"),
    (("[fixed]", "[fixed]\nbatch = 3"), "unknown key 'batch' in [fixed]"),
    (("[sweep]", "[sweep]\nworkers = 3"), "unknown key 'workers' in [sweep]; allowed: name, run, seeds"),
    (("[grid]", "[extra]\n[grid]"), "unknown key 'extra' in the top level; allowed: sweep, fixed, grid"),
    (("lr = [0.01, 0.1]", "lr = [0.01, -1.0]"), "point lr=-1.0, dense_batch=10, scheme=lrt: lr must be a positive number"),
])
def test_bad_configs_are_clear_errors_with_exit_2(tiny, tmp_path, edit, message):
    tiny.write_text(TINY.replace(*edit))
    run = insitu_in_process("sweep", tiny, "--out", tmp_path / "out")
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert message in run.stderr
    assert not list(tmp_path.glob("out/points/*.json"))


def test_ray_address_without_ray_names_the_extra(tiny, tmp_path):
    hide = tmp_path / "hide"
    (hide / "ray").mkdir(parents=True)
    (hide / "ray" / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    run = sweep_cli(tiny, "--out", tmp_path / "out", "--ray-address", "127.0.0.1:1",
                    env={"PYTHONPATH": str(hide)})
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "--ray-address needs Ray, which is not installed: pip install 'insitu[ray]'" in run.stderr


#: TINY on one scheme and one batch: two points, one for each of Ray's two CPUs (what the test
#: checks, that Ray's table is the process pool's, needs no more); the pre-trained network from
#: the suite's shared cache (the test above sees cache_dir at work).
TWO = TINY.replace("dense_batch = [10, 20]", "dense_batch = [20]").replace(
    'scheme = ["lrt", "lrt-maxnorm"]', 'scheme = ["lrt-maxnorm"]').replace(
    'cache_dir = "cache"', f"cache_dir = {json.dumps(str(SHARED_CACHE / 'lrt'))}")


@needs_ray
def test_ray_and_local_sweeps_give_identical_tables(tiny, tmp_path, monkeypatch):
    tiny.write_text(TWO)
    # Keep the cluster on the loopback address (Ray otherwise uses the machine's own address);
    # Ray reads the variable when it is imported, hence also the constant itself.
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    local = sweep_cli(tiny, "--out", tmp_path / "local", "--json", env=env)
    assert local.returncode == 0, local.stderr
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        assert address.startswith("127.0.0.1:")
        on_ray = sweep_cli(tiny, "--out", tmp_path / "ray", "--ray-address", address, "--json", env=env)
    finally:
        ray.shutdown()
    assert on_ray.returncode == 0, on_ray.stderr
    a, b = json.loads(local.stdout), json.loads(on_ray.stdout)
    assert a["backend"] == "local" and b["backend"] == "ray" and a["ran"] == b["ran"] == 2
    assert [(r["lr"], r["dense_batch"], r["scheme"]) for r in b["table"]] == [
        (0.01, 20, "lrt-maxnorm"), (0.1, 20, "lrt-maxnorm")]
    assert a["table"] == b["table"]


# ------------------------------------------------------------------ a sweep of an insitu command

TRAIN = """\
[sweep]
name = "train-lr"
command = "train"
seeds = [0]
metrics = ["accuracy", "final_loss"]

[fixed]
samples = 200
batch_size = 32
dataset = "digits"

[grid]
lr = [0.01, 0.1]
"""


@pytest.fixture
def train_lr(tmp_path):
    path = tmp_path / "train_lr.toml"
    path.write_text(TRAIN)
    return path


def test_a_train_grid_runs_one_run_folder_per_point_compares_and_resumes(train_lr, tmp_path):
    out = tmp_path / "out"
    run = sweep_cli(train_lr, "--out-dir", out, "--json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["run"] == "insitu train" and summary["command"] == "train"
    assert summary["points"] == summary["ran"] == 2 and summary["failed"] == []
    assert [r["lr"] for r in summary["table"]] == [0.01, 0.1]
    for row in summary["table"]:
        assert 0 <= row["accuracy"] <= 1 and row["final_loss"] > 0
    folders = sorted((out / "points").iterdir())
    assert [f.name.split("_")[0] for f in folders] == ["lr=0.01", "lr=0.1"]
    for folder, lr in zip(folders, (0.01, 0.1)):
        assert {"config.toml", "result.json", "run.json", "curve.csv", "stderr.log",
                "point.json"} <= {f.name for f in folder.iterdir()}
        config = (folder / "config.toml").read_text()
        assert f"lr = {lr}\n" in config and "seed = 0\n" in config and "batch-size = 32\n" in config
        result = json.loads((folder / "result.json").read_text())
        assert result["samples"] == 200 and result["curve"]
        assert json.loads((folder / "point.json").read_text())["result"] == result
        assert (folder / "stderr.log").is_file()

    # every point's run folder is a run `insitu runs compare` tabulates
    compare = insitu_cli("runs", "compare", *folders, "--json")
    assert compare.returncode == 0, compare.stderr
    table = json.loads(compare.stdout)
    assert table["differing"] == ["lr"]
    assert [r["config"]["lr"] for r in table["runs"]] == [0.01, 0.1]
    assert all(r["status"] == "complete" and r["command"] == "insitu train" for r in table["runs"])

    # a rerun skips the finished points: nothing runs, the folders are untouched
    stamps = [(f / "result.json").stat().st_mtime_ns for f in folders]
    again = sweep_cli(train_lr, "--out-dir", out)
    assert again.returncode == 0, again.stderr
    assert "2 points: 0 run, 2 already done" in again.stdout
    assert [(f / "result.json").stat().st_mtime_ns for f in folders] == stamps


@pytest.mark.parametrize("edit,message", [
    (("lr = [", "lrr = ["), "unknown key 'lrr' in [grid]: `insitu train` has no option --lrr; its options: "),
    (("samples = 200", "samples = 200\ncheckpoint = 'x.npz'"), "'checkpoint' in [fixed]: the sweep runs each point"),
    (("samples = 200", "samples = 'many'"), "[fixed] samples = 'many': 'many' is not a valid integer"),
    (("samples = 200", "samples = 200\nseed = 3"), "'seed' in [fixed]: list the seeds in [sweep] seeds"),
    (('command = "train"', 'command = "train --fast"'), "[sweep] command must be one of the insitu training commands"),
    (('command = "train"', 'command = "train"\nrun = "lrt.adapt"'), "[sweep] has both run and command"),
])
def test_a_bad_command_sweep_is_refused_with_exit_2_before_any_point_runs(train_lr, tmp_path, edit, message):
    train_lr.write_text(TRAIN.replace(*edit))
    run = insitu_in_process("sweep", train_lr, "--out-dir", tmp_path / "out")
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert message in run.stderr
    assert not (tmp_path / "out").exists()


def test_a_failed_point_is_reported_with_its_exit_code_and_stderr_and_the_others_finish(train_lr, tmp_path):
    train_lr.write_text(TRAIN.replace("lr = [0.01, 0.1]", "lr = [-1.0, 0.1]"))
    out = tmp_path / "out"
    run = sweep_cli(train_lr, "--out-dir", out)
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "1 of 2 sweep points failed" in run.stderr
    assert "point lr=-1.0_seed=0_" in run.stderr and "`insitu train` exited with 2" in run.stderr
    assert "--lr must be a positive finite number, got -1.0" in run.stderr
    failed = next((out / "points").glob("lr=-1.0_*"))
    assert "--lr must be a positive finite number" in (failed / "stderr.log").read_text()
    assert not (failed / "point.json").exists()
    good = next((out / "points").glob("lr=0.1_*"))
    assert (good / "point.json").is_file()
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["ran"] == 1 and summary["failed"] == [failed.name]
    assert [r["seeds"] for r in summary["table"]] == [[], [0]]
    # the rerun runs the failed point again (its folder has only the log), not the finished one
    again = sweep_cli(train_lr, "--out-dir", out)
    assert again.returncode == 1 and "1 of 2 sweep points failed" in again.stderr
    assert json.loads((out / "sweep.json").read_text())["skipped"] == 1


def test_sweep_help_names_out_dir_and_hides_the_old_out():
    run = sweep_cli("--help")
    assert run.returncode == 0
    assert "--out-dir" in run.stdout and "--out " not in run.stdout and "command =" in run.stdout
