"""`insitu train --algo tt|lrt` on the FPGA twins, end to end through the console script.

The record the issue asks for (board, algo, samples, accuracy, pl_cycles, seconds_at_board_clock,
energy_j; max_writes_per_cell for lrt), the RTL twin against the fast twin (same weights after the
same step), checkpoint/resume giving the uninterrupted run, bad input refused with exit 2 and
nothing written, and the sgd baseline unchanged. Timings are printed (run with -s).
"""

import json
import re
import time

import numpy as np
import pytest

from conftest import ROOT, cache_env
from insitu.io import tomllib
from insitu.checkpoint import load_checkpoint

pytestmark = pytest.mark.system

TT_TINY = ("--algo", "tt", "--model", "tiny")
REQUIRED = ("board", "algo", "samples", "accuracy", "pl_cycles", "seconds_at_board_clock", "energy_j")


def _board_toml(name: str) -> dict:
    return tomllib.loads((ROOT / "boards" / f"{name}.toml").read_text())


# LRT on the MLP over digits: its base pre-trains in about 30 s (cached for the session's later
# runs); the default CNN on FashionMNIST takes about 10 minutes, which the figure-2 runs exercise.
LRT_SMALL = ("--algo", "lrt", "--model", "mlp", "--dataset", "digits")


def _pl_clock_hz(board: str) -> int:
    """The PL clock of ``board`` (a twin's: its real board's) as boards/*.toml gives it."""
    real = _board_toml(board).get("twin_of", board)
    return _board_toml(real)["fpga"]["pl_clock_hz"]


def _train(run_cli, *args, timeout=300, label=None):
    """Run `insitu train ARGS --json`; returns (result, seconds). Fails on a non-zero exit."""
    started = time.perf_counter()
    run = run_cli("train", *args, "--json", timeout=timeout)
    seconds = time.perf_counter() - started
    print(f"\n  [{seconds:5.1f} s] insitu train {' '.join(map(str, args))}"
          + (f"  ({label})" if label else ""))
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    assert "Traceback" not in run.stderr
    return json.loads(run.stdout), seconds


def _assert_same_arrays(a: dict, b: dict, what: str) -> None:
    assert sorted(a) == sorted(b), f"{what}: different arrays {sorted(a)} vs {sorted(b)}"
    differ = [k for k in a if not (a[k].shape == b[k].shape and np.array_equal(a[k], b[k]))]
    assert not differ, f"{what}: arrays that differ: {differ}"


# ------------------------------------------------------------------------------ 1. the record

@pytest.mark.parametrize("board,args", [
    ("ultra96v2-sim", TT_TINY + ("--samples", "64", "--batch-size", "16", "--test-samples", "500")),
    ("zedboard-sim", TT_TINY + ("--samples", "64", "--batch-size", "16", "--test-samples", "500")),
    ("ultra96v2-sim", LRT_SMALL + ("--samples", "300", "--test-samples", "200",
                                   "--lr", "0.1", "--batch-size", "50")),
    ("zedboard-sim", LRT_SMALL + ("--samples", "300", "--test-samples", "200")),
], ids=["tt-ultra96v2-sim", "tt-zedboard-sim", "lrt-ultra96v2-sim", "lrt-zedboard-sim"])
def test_train_reports_the_fields_the_issue_asks_for(run_cli, tmp_path, board, args):
    out = tmp_path / "run.json"
    result, _ = _train(run_cli, "--board", board, *args, "--out", out)
    assert json.loads(out.read_text()) == result            # --out holds what --json printed
    algo = args[args.index("--algo") + 1]
    samples = int(args[args.index("--samples") + 1])
    test_samples = int(args[args.index("--test-samples") + 1])
    missing = [f for f in REQUIRED + (("max_writes_per_cell",) if algo == "lrt" else ()) if f not in result]
    assert not missing, f"fields missing from the record: {missing}"
    assert (result["board"], result["algo"], result["samples"]) == (board, algo, samples)
    assert result["test_samples"] == test_samples
    assert result["executor"] == "twin-fast"
    assert 0.0 <= result["accuracy"] <= 1.0
    # The accelerator's cycles, and their time at the board's PL clock (boards/<board>.toml).
    assert isinstance(result["pl_cycles"], int) and result["pl_cycles"] > 0
    assert result["pl_cycles"] == sum(result["cycles_by_op"].values())
    clock = _pl_clock_hz(board)
    assert result["pl_clock_hz"] == clock
    assert result["seconds_at_board_clock"] == result["pl_cycles"] / clock
    # A twin has no power rails: the energy is the estimate from the counted operations.
    assert result["energy"]["source"] == "estimate"
    assert result["energy_j"] > 0 and result["energy_j"] == result["energy"]["energy_j"]
    assert result["energy"]["seconds"] == pytest.approx(result["seconds_at_board_clock"], rel=1e-12)
    # The curve: a point every 1/20 of the budget (tt: every step of these 4), each with the loss,
    # the training accuracy and the test accuracy.
    assert len(result["curve"]) == (20 if algo == "lrt" else 4)
    for point in result["curve"]:
        assert point["loss"] > 0 and 0 <= point["train_accuracy"] <= 1 and 0 <= point["test_accuracy"] <= 1
    if algo == "lrt":
        counts = np.asarray(result["write_counts"])
        assert isinstance(result["max_writes_per_cell"], int) and result["max_writes_per_cell"] >= 0
        assert result["max_writes_per_cell"] == counts.max()
        assert result["writes_total"] == counts.sum()
        assert all(op.startswith("LRT_") for op in result["ops"])
    else:
        assert set(result["ops"]) <= {"PE1", "PE2", "PE3"} and result["ops"]
        assert result["final_loss"] is not None and np.isfinite(result["final_loss"])


# ------------------------------------------------------------------------------ 2. RTL == fast

@pytest.mark.rtl
def test_the_rtl_twin_and_the_fast_twin_give_identical_weights(run_cli, tmp_path):
    """Two training steps of the tiny TT network (batch 4) on the compiled RTL (Verilator) and on
    the functional model: every array of the checkpoints equal (the second step starts from the
    first's update), the same loss, accuracy and ops, cycles within 10 %."""
    step = TT_TINY + ("--samples", "8", "--batch-size", "4", "--test-samples", "8")
    fast, fast_s = _train(run_cli, *step, "--mode", "fast", "--checkpoint", tmp_path / "fast.npz")
    rtl, rtl_s = _train(run_cli, *step, "--mode", "rtl", "--checkpoint", tmp_path / "rtl.npz",
                        timeout=400)
    print(f"  pl_cycles: rtl {rtl['pl_cycles']}, fast {fast['pl_cycles']} "
          f"({(rtl['pl_cycles'] - fast['pl_cycles']) / fast['pl_cycles']:+.1%}); "
          f"wall: rtl {rtl_s:.1f} s, fast {fast_s:.1f} s")
    assert (rtl["executor"], fast["executor"]) == ("twin-rtl", "twin-fast")
    assert rtl["samples"] == fast["samples"] == 8
    a, meta_a = load_checkpoint(tmp_path / "rtl.npz")
    b, meta_b = load_checkpoint(tmp_path / "fast.npz")
    assert meta_a["run"]["samples_done"] == meta_b["run"]["samples_done"] == 8
    assert len(meta_a["run"]["losses"]) == 2 and meta_a["run"]["losses"] == meta_b["run"]["losses"]
    assert any(k.startswith("param.") for k in a)
    _assert_same_arrays(a, b, "rtl vs fast checkpoint")
    # the PE output scales too; the cycle counts are each model's own (compared below)
    learner_a, learner_b = meta_a["learner"], meta_b["learner"]
    for m in (learner_a, learner_b):
        m["counters"].pop("cycles_by_op")
    assert learner_a == learner_b
    assert rtl["final_loss"] == fast["final_loss"]
    assert rtl["accuracy"] == fast["accuracy"]
    assert rtl["ops"] == fast["ops"]
    assert rtl["pl_cycles"] > 0
    assert abs(rtl["pl_cycles"] - fast["pl_cycles"]) <= 0.10 * fast["pl_cycles"]


# ------------------------------------------------------------------------------ 3. resume

TT_RESUME = TT_TINY + ("--batch-size", "16", "--test-samples", "500")


@pytest.fixture(scope="module")
def tt_runs(tmp_path_factory):
    """128 samples of the tiny TT network straight (a checkpoint at the end only), and interrupted
    after 64 then resumed, saving every 32 (every 2 steps): checkpoint frequency is not part of
    the run, so the two end alike."""
    from conftest import insitu_cli

    folder = tmp_path_factory.mktemp("tt-resume")
    straight, _ = _train(insitu_cli, *TT_RESUME, "--samples", "128", "--checkpoint", folder / "s.npz",
                         label="straight")
    often = ("--checkpoint-every", "32", "--checkpoint", folder / "r.npz")
    first, _ = _train(insitu_cli, *TT_RESUME, "--samples", "64", *often,
                      label="interrupted at 64, checkpoint every 32")
    resumed, _ = _train(insitu_cli, *TT_RESUME, "--samples", "128", *often,
                        label="resumed, checkpoint every 32")
    return {"folder": folder, "straight": straight, "first": first, "resumed": resumed}


def test_tt_resumed_from_a_checkpoint_equals_the_uninterrupted_run(tt_runs):
    folder, straight, resumed = tt_runs["folder"], tt_runs["straight"], tt_runs["resumed"]
    assert (tt_runs["first"]["samples"], tt_runs["first"]["resumed_from"]) == (64, None)
    assert (resumed["samples"], resumed["resumed_from"]) == (128, 64)
    s, meta_s = load_checkpoint(folder / "s.npz")
    r, meta_r = load_checkpoint(folder / "r.npz")
    assert meta_s["run"]["samples_done"] == meta_r["run"]["samples_done"] == 128
    _assert_same_arrays(s, r, "straight (checkpoint every 10000) vs resumed (every 32)")
    for meta in (meta_s, meta_r):
        meta["run"].pop("seconds")                  # the one field that is each run's own
    assert meta_s == meta_r
    assert resumed["accuracy"] == straight["accuracy"]
    assert resumed["ranks"] == straight["ranks"]


def test_tt_resumed_run_reports_the_uninterrupted_final_loss(tt_runs):
    assert tt_runs["resumed"]["final_loss"] == tt_runs["straight"]["final_loss"]


LRT_RESUME = LRT_SMALL + ("--test-samples", "200", "--lr", "0.1", "--batch-size", "50")


def test_lrt_resumed_mid_batch_equals_the_uninterrupted_run(run_cli, tmp_path):
    """200 samples straight (one 1000-sample chunk) vs 125 (mid-batch: batch 50) then 200, saving
    every 100 samples: same checkpoint arrays, accuracy and write counts (summed over the restart
    of the PE's counters: two updates before it, two after)."""
    straight, _ = _train(run_cli, *LRT_RESUME, "--samples", "200", "--checkpoint", tmp_path / "s.npz",
                         label="straight")
    first, _ = _train(run_cli, *LRT_RESUME, "--samples", "125", "--checkpoint-every", "100",
                      "--checkpoint", tmp_path / "r.npz", label="interrupted at 125")
    resumed, _ = _train(run_cli, *LRT_RESUME, "--samples", "200", "--checkpoint-every", "100",
                        "--checkpoint", tmp_path / "r.npz", label="resumed")
    assert (first["samples"], resumed["samples"], resumed["resumed_from"]) == (125, 200, 125)
    s, meta_s = load_checkpoint(tmp_path / "s.npz")
    r, meta_r = load_checkpoint(tmp_path / "r.npz")
    _assert_same_arrays(s, r, "straight vs resumed")
    # The PE ops differ (a resume loads the PE again); everything else of the trainer is the same.
    trainer_s = {k: v for k, v in meta_s["learner"]["trainer"].items() if k != "pe_ops"}
    trainer_r = {k: v for k, v in meta_r["learner"]["trainer"].items() if k != "pe_ops"}
    assert trainer_s == trainer_r and trainer_s["samples"] == 200
    assert straight["max_writes_per_cell"] > 1, "too few writes for the summed counts to matter"
    for key in ("accuracy", "online_accuracy", "max_writes_per_cell", "writes_total", "write_counts",
                "updates", "pairs"):
        assert resumed[key] == straight[key], key


# ------------------------------------------------------------------------------ 4. bad input

def _bits(folder, kind: str):
    """The --bitstream file of a bad-input case, made in ``folder``."""
    from insitu.fpga.twin import write_twin_overlay

    if kind == "empty-pair":                  # a .bit and its .hwh, both empty
        (folder / "X.hwh").write_text("")
        (folder / "X.bit").write_text("")
        return folder / "X.bit"
    if kind == "bit-only":
        (folder / "Y.bit").write_text("")
        return folder / "Y.bit"
    if kind == "text-pair":                   # text files under both names
        (folder / "T.bit").write_text("hello\n")
        (folder / "T.hwh").write_text("hello\n")
        return folder / "T.bit"
    if kind == "text-bit-real-hwh":           # a valid .hwh beside a .bit that is no twin overlay
        bit = write_twin_overlay("ultra96v2", folder / "ov")
        bit.write_text("hello\n")
        return bit
    if kind == "zedboard-overlay":            # the ZedBoard twin's overlay
        return write_twin_overlay("zedboard", folder / "zed")
    raise AssertionError(kind)


BAD = [
    pytest.param(["--board", "ultra96v2", "--algo", "tt"], None,
                 [r"--board ultra96v2 needs --bitstream"], id="real-board-without-bitstream"),
    pytest.param(["--board", "ultra96v2", "--algo", "tt"], "empty-pair",
                 [r"no PYNQ board", r"insitu deploy", r"--board BOARD-sim"], id="real-board-no-pynq-tt"),
    pytest.param(["--board", "ultra96v2", "--algo", "lrt"], "empty-pair",
                 [r"no PYNQ board", r"insitu deploy", r"--board BOARD-sim"], id="real-board-no-pynq-lrt"),
    pytest.param(["--board", "zedboard", "--algo", "tt"], "bit-only",
                 [r"Y\.hwh is missing"], id="bit-without-hwh"),
    pytest.param(["--board", "stm32f746-disco-sim", "--algo", "tt"], None,
                 [r"'tt' does not run on stm32f746-disco-sim", r"ultra96v2-sim"], id="mcu-tt"),
    pytest.param(["--board", "stm32f746-disco-sim", "--algo", "lrt"], None,
                 [r"'lrt' does not run on stm32f746-disco-sim"], id="mcu-lrt"),
    pytest.param([*TT_TINY, "--rank", "64", "--batch-size", "256"], None,
                 [r"PE[123] op '[\w.]+'", r"lower"], id="tt-does-not-fit-the-pes"),
    pytest.param(["--algo", "lrt", "--env", "analog"], None,
                 [r"Invalid value for '--env'", r"analog"], id="lrt-env-analog"),
    pytest.param(["--algo", "tt", "--rank", "0"], None, [r"--rank must be an integer >= 1, got 0"], id="tt-rank-0"),
    pytest.param(["--algo", "lrt", "--rank", "0"], None, [r"--rank must be an integer >= 1, got 0"], id="lrt-rank-0"),
    pytest.param(["--algo", "lrt", "--rank", "8"], None, [r"rank must be an integer in \[1, 7\]"],
                 id="lrt-rank-8"),
    pytest.param(["--algo", "lrt", "--model", "tiny"], None,
                 [r"unknown --model 'tiny' for --algo lrt"], id="lrt-model-tiny"),
    pytest.param([*TT_TINY, "--mode", "gates"], None, [r"Invalid value for '--mode'"], id="bad-mode"),
    pytest.param([*TT_TINY, "--test-samples", "0"], None, [r"--test-samples must be an integer >= 1"],
                 id="test-samples-0"),
    pytest.param([*TT_TINY], "text-bit-real-hwh", [r"is not a twin overlay"],
                 id="sim-board-text-bit-with-real-hwh"),
    pytest.param([*TT_TINY], "text-pair", [r"not a twin overlay"], id="sim-board-text-bit-and-hwh"),
    pytest.param([*TT_TINY], "empty-pair", [r"not a twin overlay"], id="sim-board-empty-bit-and-hwh"),
    pytest.param([*TT_TINY], "zedboard-overlay", [r"zedboard"], id="sim-board-other-boards-overlay"),
    pytest.param([*TT_TINY, "--batch-size", "0"], None, [r"--batch-size must be an integer >= 1"],
                 id="tt-batch-size-0"),
    pytest.param(["--algo", "lrt", "--lr", "0"], None, [r"--lr must be a positive finite number"],
                 id="lrt-lr-0"),
    pytest.param(["--algo", "sgd", "--model", "paper"], None,
                 [r"unknown --model 'paper' for --algo sgd"], id="sgd-model-paper"),
]


@pytest.mark.parametrize("args,bitstream,messages", BAD)
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(run_cli, tmp_path, args,
                                                                   bitstream, messages):
    bit = ["--bitstream", _bits(tmp_path, bitstream)] if bitstream else []
    out, ckpt = tmp_path / "res" / "run.json", tmp_path / "res" / "run.npz"
    # The no-board answer comes before any slow work: run with an empty cache of its own, which a
    # pre-training (LRT's base) or a built twin would write to.
    no_board = "ultra96v2" in args and bitstream
    cache = tmp_path / "insitu-cache"
    started = time.perf_counter()
    # Small sizes: where a case is wrongly accepted it trains for seconds, not minutes.
    small = ["--samples", "8"] + ([] if "--test-samples" in args else ["--test-samples", "8"])
    run = run_cli("train", *args, *bit, *small, "--out", out, "--checkpoint", ckpt, "--json",
                  timeout=120, env=cache_env(cache, own_verilog=True) if no_board else None)
    seconds = time.perf_counter() - started
    print(f"\n  [{seconds:5.1f} s] exit {run.returncode}: {run.stderr.strip().splitlines()[-1:]}")
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert "Traceback" not in run.stderr
    for message in messages:
        assert re.search(message, run.stderr), (message, run.stderr)
    assert run.stdout.strip() == ""                            # no half a JSON record
    assert not out.exists() and not ckpt.exists()
    if no_board:                                              # nothing pre-trained, built or cached
        assert "pre-train" not in run.stderr, run.stderr
        assert not cache.exists() or list(cache.iterdir()) == []


# ------------------------------------------------------------------------------ 5. sgd

def test_sgd_keeps_its_defaults(run_cli):
    for args in (("--algo", "sgd"), ()):                      # sgd is also the default algorithm
        result, _ = _train(run_cli, *args, "--samples", "64")
        assert (result["algo"], result["model"], result["batch_size"]) == ("sgd", "mlp", 32)
        assert (result["board"], result["executor"], result["samples"]) == ("ultra96v2-sim", "host-numpy", 64)
        assert "pl_cycles" not in result                      # no accelerator in this algorithm
        assert 0.0 <= result["accuracy"] <= 1.0
