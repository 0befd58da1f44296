"""`insitu lrt`: the adaptation experiment end to end on a small dataset, and bad input (run in
this process: tests/in_process.py)."""

import json

import numpy as np
import pytest

from conftest import cache_env
from in_process import insitu_in_process

pytestmark = pytest.mark.system

_SMALL = ("--dataset", "digits", "--arch", "mlp", "--offline-samples", "300", "--segment", "60")


def test_adapt_reports_accuracy_and_writes_and_saves_figure_json_counts(run_cli, tmp_path, insitu_cache):
    out, plot, counts = tmp_path / "run.json", tmp_path / "run.png", tmp_path / "counts.npz"
    run = run_cli("lrt", "adapt", "--env", "shift", "--scheme", "lrt-maxnorm", "--samples", "240",
                  "--dense-batch", "20", *_SMALL, "--out", out, "--plot", plot, "--counts", counts,
                  "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["samples"] == 240 and result["scheme"] == "lrt-maxnorm" and result["env"] == "shift"
    assert 0 <= result["online_accuracy"] <= 1
    assert result["max_writes_per_cell"] >= 1 and result["total_writes"] >= result["max_writes_per_cell"]
    assert [s["start"] for s in result["segments"]] == [0, 60, 120, 180]
    # A curve point every 12 samples (1/20 of the run): the loss and the online accuracy of its
    # samples, and the test accuracy of the weights there.
    assert [p["samples"] for p in result["curve"]] == list(range(12, 241, 12))
    for point in result["curve"]:
        assert point["loss"] > 0 and 0 <= point["train_accuracy"] <= 1 and 0 <= point["test_accuracy"] <= 1
    assert json.loads(out.read_text()) == result
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with np.load(counts) as saved:
        assert sorted(saved.files) == sorted(result["layers"])
        assert sum(int(saved[k].sum()) for k in saved.files) == result["total_writes"]
    assert list((insitu_cache / "lrt").glob("pretrained-mlp-*.npz"))


@pytest.fixture
def shared_lrt(tmp_path, monkeypatch):
    """A cache of the test's own whose pre-trained networks (lrt/) are the suite's shared ones: for
    the tests that do not look at what pre-training wrote (the test above does)."""
    for name, value in cache_env(tmp_path / "cache", share=("lrt",)).items():
        monkeypatch.setenv(name, value)


def test_adapt_all_schemes_compares_sgd_and_lrt_writes(run_cli, shared_lrt):
    run = run_cli("lrt", "adapt", "--env", "digital", "--scheme", "all", "--samples", "200",
                  "--dense-batch", "20", *_SMALL, "--json")
    assert run.returncode == 0, run.stderr
    summary = {row["scheme"]: row for row in json.loads(run.stdout)["summary"]}
    assert list(summary) == ["inference", "bias", "sgd", "lrt", "lrt-maxnorm"]
    assert summary["inference"]["total_writes"] == summary["bias"]["total_writes"] == 0
    assert summary["sgd"]["max_writes_per_cell"] > summary["lrt"]["max_writes_per_cell"] > 0


@pytest.mark.parametrize("args,message", [
    (("--rank", "0"), "--rank must be an integer >= 1"),
    (("--rank", "12"), "--rank 12 is too large for layer fc2"),
    (("--samples", "0"), "--samples must be an integer >= 1"),
    (("--conv-batch", "0"), "--conv-batch must be an integer >= 1"),
    (("--bias-lr", "0"), "--bias-lr must be a positive number"),
    (("--rho-min", "2"), "--rho-min must be in [0, 1]"),
    (("--plot", "/proc/x.png"), "cannot write --plot /proc/x.png"),
    (("--env", "mars"), "Invalid value for '--env'"),
    (("--kappa-th", "-1"), "--kappa-th must be >= 0"),
])
def test_adapt_bad_input_is_a_clear_error(insitu_cache, args, message):
    base = {"--env": "control", "--samples": "10"}
    for key, value in zip(args[::2], args[1::2]):
        base[key] = value
    flat = [item for kv in base.items() for item in kv]
    run = insitu_in_process("lrt", "adapt", *flat, *_SMALL)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert message in run.stderr and "Traceback" not in run.stderr
    assert not any(insitu_cache.rglob("*.npz"))           # refused before pre-training


def test_transfer_table_on_a_small_dataset(run_cli, tmp_path):
    out = tmp_path / "transfer.json"
    run = run_cli("lrt", "transfer", "--samples", "400", "--seeds", "3,5", "--ranks", "1,2",
                  "--lrs", "0.01,0.1", "--dataset", "digits", "--pretrain-samples", "800",
                  "--out", out)
    assert run.returncode == 0, run.stderr
    assert "UORO" in run.stdout and "LRT" in run.stdout and "Max writes per weight cell" in run.stdout
    result = json.loads(out.read_text())
    rows = {(r["algorithm"], r["rank"], r["lr"]) for r in result["table"]}
    assert ("LRT", 2, 0.1) in rows and ("SGD", None, 0.01) in rows and len(rows) == 12
    assert result["seeds"] == [3, 5]                 # --seeds is a list of seeds
    assert result["inference_accuracy"] < result["pretrained_accuracy"]


def test_bench_reports_speedup_and_memory(run_cli):
    run = run_cli("lrt", "bench", "--sizes", "32,64", "--json")
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)["rows"]
    assert [r["n"] for r in rows] == [32, 64]
    for r in rows:
        assert r["speedup"] == pytest.approx(r["dense_us"] / r["lrt_us"])
        assert r["aux_memory_bits"] == 4 * (2 * r["n"]) * 16


@pytest.mark.parametrize("args,message", [
    (("transfer", "--ranks", "0"), "ranks must be integers >= 1"),
    (("transfer", "--lrs", "fast"), "comma-separated numbers"),
    (("transfer", "--seeds", "three"), "--seeds takes comma-separated integers"),
    (("transfer", "--seeds", "0,-1"), "--seeds must be an integer >= 0"),
    (("transfer", "--seeds", "1,1"), "--seeds lists a seed twice"),
    (("transfer", "--out", "/proc/t.json"), "cannot write --out /proc/t.json"),
    (("bench", "--sizes", "1,x"), "comma-separated integers"),
])
def test_transfer_and_bench_bad_input(args, message):
    run = insitu_in_process("lrt", *args)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert message in run.stderr


@pytest.mark.parametrize("scheme", ["lrt-maxnorm", "sgd"])
def test_adapt_resumes_from_its_checkpoint_exactly(run_cli, tmp_path, shared_lrt, scheme):
    common = ("lrt", "adapt", "--env", "analog", "--scheme", scheme, "--dense-batch", "20",
              *_SMALL, "--json")
    whole = run_cli(*common, "--samples", "160")
    assert whole.returncode == 0, whole.stderr
    ckpt = tmp_path / "run.ckpt.npz"
    first = run_cli(*common, "--samples", "80", "--checkpoint", ckpt, "--checkpoint-every", "40")
    assert first.returncode == 0, first.stderr and ckpt.exists()
    resumed = run_cli(*common, "--samples", "160", "--checkpoint", ckpt, "--checkpoint-every", "40")
    assert resumed.returncode == 0, resumed.stderr
    a, b = json.loads(whole.stdout), json.loads(resumed.stdout)
    for key in ("online_accuracy", "online_accuracy_mean", "max_writes_per_cell", "total_writes",
                "max_update_ops_per_cell", "layers"):
        assert a[key] == b[key], key
    # a checkpoint of another run is refused, with what to do
    other = run_cli(*common[:3], "digital", *common[4:], "--samples", "200", "--checkpoint", ckpt)
    assert other.returncode == 1 and "belongs to another run" in other.stderr


def test_transfer_seeds_one_integer_is_that_seed_and_help_says_so():
    help_text = " ".join(insitu_in_process("lrt", "transfer", "--help").stdout.split())
    assert "--seeds TEXT Comma-separated seeds" in help_text and "--seeds 3 is now --seeds 0,1,2" in help_text
    assert "default: 0,1,2" in help_text
    from insitu.cli.lrt import _seed_list

    assert _seed_list("3") == (3,) and _seed_list("0,1,2") == (0, 1, 2)
