"""`insitu sweep`: a tiny LRT grid end to end (local process pool and Ray), resuming, bad configs."""

import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, VENV_BIN, insitu_cli

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
    run = sweep_cli(tiny, "--out", tmp_path / "out")
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


@needs_ray
def test_ray_and_local_sweeps_give_identical_tables(tiny, tmp_path, monkeypatch):
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
    assert b["backend"] == "ray" and b["ran"] == 8
    assert a["table"] == b["table"]
