"""`insitu writes report`: real (tiny) runs of `insitu lrt adapt` with SGD and LRT and of
`insitu train --algo lrt` on the twin, reported alone and side by side, and bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import cache_env

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
_SMALL = ("--env", "control", "--samples", "200", "--dense-batch", "20", "--dataset", "digits",
          "--arch", "mlp", "--offline-samples", "300", "--lr", "0.05")   # from a trained base, LRT
                                                                        # writes nothing in 200 samples at 0.01


def _insitu(*args, env):
    return subprocess.run([str(BIN / "insitu"), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, **env})


def _writes(*args):
    """`insitu writes ...` through insitu's own error handling (exit codes), registered or not."""
    from insitu.cli import _Group
    from insitu.cli.writes import command

    group = _Group("insitu")
    group.add_command(command)
    return CliRunner().invoke(group, ["writes", *map(str, args)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real runs of the adaptation experiment (SGD and LRT) and one of the board's LRT PE.
    Their pre-trained networks come from the suite's shared cache (the board's MLP is pre-trained
    on 20,000 samples x 20 epochs: over 20 s): these tests look at the runs' writes, not at what
    pre-training wrote."""
    d = tmp_path_factory.mktemp("writes")
    env = cache_env(d / "cache", share=("lrt",))
    for scheme in ("sgd", "lrt"):
        run = _insitu("lrt", "adapt", "--scheme", scheme, *_SMALL, "--out", d / f"{scheme}.json",
                      "--counts", d / f"{scheme}.npz", env=env)
        assert run.returncode == 0, run.stderr
    run = _insitu("train", "--algo", "lrt", "--env", "control", "--samples", "200", "--dataset",
                  "digits", "--model", "mlp", "--test-samples", "50", "--out", d / "board.json", env=env)
    assert run.returncode == 0, run.stderr
    return d


def test_sgd_vs_lrt_side_by_side(runs, tmp_path):
    sgd, lrt = (json.loads((runs / f"{s}.json").read_text()) for s in ("sgd", "lrt"))
    plot = tmp_path / "writes.png"
    res = _writes("report", runs / "sgd.json", "--counts", runs / "sgd.npz", "--compare",
                  runs / "lrt.json", "--compare-counts", runs / "lrt.npz", "--plot", plot, "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    a, b = payload["runs"]
    assert (a["label"], b["label"]) == ("sgd", "lrt") and a["exact_counts"] and b["exact_counts"]
    for report, run, scheme in ((a, sgd, "sgd"), (b, lrt, "lrt")):
        assert report["counts_file"] == str(runs / f"{scheme}.npz")
        assert report["samples"] == 200
        assert sorted(report["layers"]) == sorted(run["layers"])
        assert report["total"]["max_writes_per_cell"] == run["max_writes_per_cell"]
        assert report["total"]["total_writes"] == run["total_writes"]
        assert report["total"]["written_cells"] == run["nvm"]["written_cells"]
        assert report["total"]["write_energy_j"] == pytest.approx(run["nvm"]["write_energy_j"])
        assert report["total"]["lifetime_samples"] == pytest.approx(run["nvm"]["lifetime_samples"])
        for name, layer in run["layers"].items():
            mine = report["layers"][name]
            assert mine["max_writes_per_cell"] == layer["max_writes_per_cell"]
            assert mine["cells"] == sum(mine["write_histogram"]["counts"]) == layer["cells"]
        assert report["technology"]["endurance"] == run["nvm_parameters"]["endurance"]
    ratio = payload["comparison"]["total"]["max_writes_per_cell"]
    assert ratio == pytest.approx(sgd["max_writes_per_cell"] / lrt["max_writes_per_cell"])
    assert ratio > 1                                   # SGD's worst cell is written more often
    assert payload["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_text_report_of_one_run_and_of_a_bare_counts_file(runs, tmp_path):
    res = _writes("report", runs / "lrt.json", "--endurance", "1e5", "--rate", "10",
                  "--out", tmp_path / "r.json")
    assert res.exit_code == 0, res.output
    assert "max/cell" in res.stdout and "writes per cell (bins: cells)" in res.stdout
    assert "endurance 1e+05 writes/cell (option)" in res.stdout
    saved = json.loads((tmp_path / "r.json").read_text())
    total = saved["runs"][0]["total"]
    assert total["lifetime_seconds"] == pytest.approx(1e5 / total["max_writes_per_cell"] * 200 / 10)
    res = _writes("report", runs / "sgd.npz", "--samples", "200", "--json")
    assert res.exit_code == 0, res.output
    bare = json.loads(res.stdout)["runs"][0]
    assert bare["source"] == "counts .npz" and bare["samples"] == 200
    with np.load(runs / "sgd.npz") as counts:
        assert bare["total"]["total_writes"] == sum(int(counts[k].sum()) for k in counts.files)


def test_board_run_from_train_algo_lrt_against_sgd(runs):
    res = _writes("report", runs / "sgd.json", "--compare", runs / "board.json", "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    board = json.loads((runs / "board.json").read_text())
    b = payload["runs"][1]
    assert b["source"] == "insitu train" and list(b["layers"]) == [board["layer"]]
    assert b["total"]["max_writes_per_cell"] == board["max_writes_per_cell"]
    assert b["total"]["total_writes"] == board["writes_total"]
    assert payload["comparison"]["layers_in_one_run_only"] == {"sgd": ["fc1"]}


@pytest.mark.parametrize("case,message", [
    ("missing", "does not exist"),
    ("empty", "is empty"),
    ("truncated-json", "is not valid JSON"),
    ("no-counts", "holds no write counts"),
    ("corrupt-counts", "is not a readable .npz"),
    ("foreign-counts", "does not match run"),
    ("stray-option", "--compare-counts goes with --compare OTHER"),
    ("bad-endurance", "endurance must be a positive finite number"),
])
def test_bad_input_is_exit_2_naming_the_file(runs, tmp_path, case, message):
    good = runs / "sgd.json"
    bad = tmp_path / "bad.json"
    args = {
        "missing": [tmp_path / "nope.json"],
        "empty": [bad],
        "truncated-json": [bad],
        "no-counts": [bad],
        "corrupt-counts": [good, "--counts", tmp_path / "bad.npz"],
        "foreign-counts": [good, "--counts", runs / "lrt.npz"],
        "stray-option": [good, "--compare-counts", runs / "lrt.npz"],
        "bad-endurance": [good, "--endurance", "-1"],
    }[case]
    if case == "empty":
        bad.write_text("")
    elif case == "truncated-json":
        bad.write_text(good.read_text()[:200])
    elif case == "no-counts":
        bad.write_text(json.dumps({"board": "ultra96v2-sim", "algo": "sgd", "accuracy": 0.8}))
    elif case == "corrupt-counts":
        (tmp_path / "bad.npz").write_bytes((runs / "sgd.npz").read_bytes()[:40])
    res = _writes("report", *args)
    assert res.exit_code == 2, res.output
    assert message in res.stderr and "Traceback" not in res.output
    named = {"corrupt-counts": tmp_path / "bad.npz", "foreign-counts": runs / "lrt.npz",
             "missing": tmp_path / "nope.json"}.get(case, bad if case in ("empty", "truncated-json",
                                                                        "no-counts") else None)
    if named is not None:
        assert str(named) in res.stderr


def test_count_writes_script(runs):
    from insitu.cli import main

    if "writes" not in main.commands:
        pytest.skip("`insitu writes` is not registered in host/insitu/cli/__init__.py yet")
    run = subprocess.run([str(ROOT / "scripts" / "count_writes"), runs / "sgd.json", "--compare",
                          runs / "lrt.json", "--json"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "INSITU_VENV": str(BIN.parent)})
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["comparison"]["numerator"] == "sgd"
    run = subprocess.run([str(ROOT / "scripts" / "count_writes"), runs / "missing.json"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "INSITU_VENV": str(BIN.parent)})
    assert run.returncode == 2 and "does not exist" in run.stderr
