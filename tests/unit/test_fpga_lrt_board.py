"""LRT adaptation on the LRT PE (insitu.fpga.lrt_board), through a port over the golden model."""

import math

import numpy as np
import pytest

from conftest import SHARED_CACHE
from insitu.checkpoint import load_checkpoint
from insitu.errors import InsituError
from insitu.boards import get_board
from insitu.fpga.boards import open_board
from insitu.fpga.lrt_board import LRTBoardTrainer, PEKroneckerSum, run_board_adapt
from insitu.lrt.adapt import pretrained_model
from insitu.lrt.online import OnlineData
from insitu.accel.stream import pad_words
from insitu.lrt.pe_ops import REGISTER_NAMES, LRTPEModel
from insitu.lrt.qnet import dense_net
from insitu.lrt.sks import KroneckerSum
from insitu.numerics import LRT_BASIS, LRT_WEIGHT, round_half_up
from insitu.accel.params import AcceleratorParams
from insitu.accel.regmap import Op

pytestmark = pytest.mark.unit

COMPUTE_OPS = ("LRT_PROJECT", "LRT_REPROJECT", "LRT_APPEND", "LRT_ROTATE", "LRT_UPDATE")


class GoldenPort:
    """The port over the bit-exact golden model: what the simulated board's functional mode does."""

    _ATTRIBUTE = {register: attribute for attribute, register in REGISTER_NAMES.items()}

    def __init__(self, params: AcceleratorParams | None = None):
        self.model = LRTPEModel(params) if params else LRTPEModel()

    def run(self, op, words=None, **registers):
        self.model.configure(**{self._ATTRIBUTE[name]: value for name, value in registers.items()})
        return self.model.execute(op, words)

    def read(self, name):
        m, p = self.model, self.model.params
        return {"LRT_NORM2_LO": m.norm2 & 0xFFFF_FFFF, "LRT_NORM2_HI": m.norm2 >> 32,
                "LRT_WRITES_MAX": m.writes_max, "LRT_WRITES_TOTAL": m.writes_total,
                "CAP_LRT_ROWS_MAX": p.lrt_rows_max, "CAP_LRT_COLS_MAX": p.lrt_cols_max,
                "CAP_LRT_CELLS_MAX": p.lrt_cells_max}[name]


# A small, quickly pre-trained network: the MLP (64 -> 128 -> 10) on scikit-learn's digits,
# 3000 offline samples x 20 epochs (a few seconds to pre-train, for each of three seeds).
SMALL = dict(dataset="digits", arch="mlp", offline_samples=3000, segment=500, test_samples=500)


@pytest.fixture(scope="module")
def cache():
    """The suite's shared cache of pre-trained networks (conftest.SHARED_CACHE): these tests look
    at the adaptation, not at what pre-training wrote; the refusals before pre-training below
    check that on empty caches of their own."""
    return SHARED_CACHE / "lrt"


def _net(cache, seed=0):
    return pretrained_model("mlp", "digits", seed=seed, offline_samples=3000, cache_dir=cache)[0]


# ------------------------------------------------------------------------------ the accumulator

@pytest.mark.parametrize("m, n, r", [(10, 64, 4), (10, 128, 7), (64, 144, 4), (256, 64, 7)])
def test_fixed_point_sum_tracks_the_float_kronecker_sum(m, n, r):
    """The PE's estimate (bases read back, de-quantized) against KroneckerSum on the same pairs.

    Biased (deterministic) estimator, 100 random pairs: relative Frobenius error <= 1e-2. The Q1.14
    bases are rounded at every ROTATE (2**-15 per entry, 100 times); measured over 20 seeds and
    these shapes the worst was 3.1e-3 (5.4e-3 for the unbiased one on a rank-2 stream, below).
    The unbiased estimator is random: a different SVD sign picks another, equally valid, mixture,
    so it is compared where it must be exact, on a stream of rank 2 < r.
    """
    rng = np.random.default_rng(m + n + r)
    P = 100
    dz = rng.standard_normal((P, m)) * 0.1
    a = np.abs(rng.standard_normal((P, n)))
    pe = PEKroneckerSum(GoldenPort(), m, n, r, unbiased=False, seed=5)
    ref = KroneckerSum(m, n, r, unbiased=False, seed=5)
    # Same seed, same start: the PE holds KroneckerSum's initial bases as Q1.14 codes.
    np.testing.assert_array_equal(pe.read_basis(0), LRT_BASIS.quantize_code(ref.QL))
    np.testing.assert_array_equal(pe.read_basis(1), LRT_BASIS.quantize_code(ref.QR))
    for i in range(P):
        pe.add(dz[i], a[i])
        ref.add(dz[i], a[i])
    want = ref.estimate()
    assert np.linalg.norm(pe.estimate() - want) <= 1e-2 * np.linalg.norm(want)
    assert pe.counts["added"] == P and pe.pe.ops["LRT_PROJECT"] == 2 * P

    U, V = rng.standard_normal((m, 2)), rng.standard_normal((n, 2))
    dz, a = rng.standard_normal((P, 2)) @ U.T, rng.standard_normal((P, 2)) @ V.T
    exact = dz.T @ a
    pe = PEKroneckerSum(GoldenPort(), m, n, r, unbiased=True, seed=6)
    for i in range(P):
        pe.add(dz[i], a[i])
    assert np.linalg.norm(pe.estimate() - exact) <= 1e-2 * np.linalg.norm(exact)


def test_update_writes_minus_scale_times_the_estimate():
    """LRT_UPDATE moves each weight code by round(scale * estimate * 2**7), within one code (s has
    16 significant bits, the bases 14 fractional ones); the reset keeps orthonormal bases."""
    rng = np.random.default_rng(1)
    m, n, r = 10, 64, 4
    port = GoldenPort()
    pe = PEKroneckerSum(port, m, n, r, seed=2)
    W = rng.integers(-100, 100, size=(m, n))
    port.run(Op.LRT_LOAD_WEIGHTS, pad_words(W), LRT_ROWS_L=m, LRT_ROWS_R=n)
    for _ in range(20):
        pe.add(rng.standard_normal(m) * 0.1, np.abs(rng.standard_normal(n)))
    scale = 0.03
    want = LRT_WEIGHT.saturate(W - round_half_up(scale * pe.estimate() * 2.0**LRT_WEIGHT.frac))
    pe.apply_update(scale)
    got = port.model.weights()
    assert np.abs(got - want).max() <= 1 and (got != W).mean() > 0.25
    pe.reset()
    assert not pe.cx.any()
    for side in (0, 1):
        Q = LRT_BASIS.to_float(pe.read_basis(side)[:, :r])
        # Q is an orthonormal float QR factor rounded to LRT_BASIS: each entry off by at most
        # half an LSB, e = 2**-(frac+1). Then |(Q.T Q - I)_ij| <= |q_i . e_j| + |e_i . q_j| +
        # |e_i . e_j| <= 2 sqrt(rows) e + rows e**2 (Cauchy-Schwarz on unit columns). Which codes
        # round which way depends on the last bits of LAPACK's QR, i.e. on the BLAS build, so
        # the bound is the worst case (4.9e-4 for 64 rows), not what one machine happened to give.
        rows, e = Q.shape[0], 2.0 ** -(LRT_BASIS.frac + 1)
        assert np.abs(Q.T @ Q - np.eye(r)).max() <= 2 * np.sqrt(rows) * e + rows * e * e


# ------------------------------------------------------------------------------ the trainer

def test_pe_write_counts_equal_the_weight_changes(cache):
    net = _net(cache)
    port = GoldenPort()
    trainer = LRTBoardTrainer(port, net, rank=4, batch=10, lr=0.03)
    before = LRT_WEIGHT.quantize_code(trainer.layer.weight)
    np.testing.assert_array_equal(port.model.weights(), before)       # LRT_LOAD_WEIGHTS
    x, y = OnlineData("digits", seed=0).online("control", 200)
    expected = np.zeros_like(before)
    previous = before
    for i in range(len(y)):
        trainer.step(x[i:i + 1], int(y[i]))
        if trainer.in_batch == 0:                      # an update has just been written
            now = port.model.weights()
            expected += now != previous
            previous = now
            # The forward pass reads what the PE holds.
            np.testing.assert_array_equal(LRT_WEIGHT.quantize_code(trainer.layer.weight), now)
    report = trainer.summary()
    assert trainer.updates == report["pe_ops"]["LRT_UPDATE"] == 20
    assert expected.sum() > 0
    np.testing.assert_array_equal(report["write_counts"], expected)
    assert report["writes_total"] == expected.sum()
    assert report["max_writes_per_cell"] == expected.max() == port.model.writes_max


def test_short_adaptation_improves_a_partly_trained_base(cache):
    """1000 control samples, rank 4, batch 50, lr 0.03, from a base pre-trained for 2 epochs on
    1000 offline samples (validation about 0.6: the fully pre-trained base is converged, and its
    last layer has nothing left to learn from 1000 samples of the same distribution; shifted
    samples do not teach the clean test split). Measured over seeds 0-5: test accuracy +4.2, +1.4,
    +5.0, +3.2, +1.8, +1.4 points (500 test samples); seed 0's +4.2 (21 samples) is asserted as
    better than before."""
    result = run_board_adapt(GoldenPort(), env="control", samples=1000, batch=50, lr=0.03, seed=0,
                             cache_dir=cache, **{**SMALL, "offline_samples": 1000}, pretrain_epochs=2)
    assert result["accuracy"] > result["accuracy_before"]
    assert result["samples"] == 1000 and result["updates"] == 20
    assert result["pe_ops"]["LRT_UPDATE"] == 20
    assert result["pe_ops"]["LRT_PROJECT"] == 2 * result["pairs"]["added"] + 2 * result["pairs"]["skipped"]
    counts = result["write_counts"]
    assert counts.shape == tuple(result["layer_shape"]) == (10, 128)
    assert result["max_writes_per_cell"] == counts.max() > 0
    assert result["writes_total"] == counts.sum()
    assert result["env"] == "control" and result["rank"] == 4 and result["lr"] == 0.03
    # The figure is the run's time over its samples (its speed is the benchmarks' to print).
    print(f"\nLRT adaptation on the golden PE: {result['seconds_per_sample'] * 1e3:.3f} ms a sample")
    assert result["seconds_per_sample"] > 0 and math.isfinite(result["seconds_per_sample"])
    assert result["seconds_per_sample"] == pytest.approx(result["seconds"] / 1000, abs=1e-6)


def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(cache, tmp_path):
    options = dict(env="shift", batch=50, lr=0.03, seed=1, cache_dir=cache, **SMALL)
    whole = run_board_adapt(GoldenPort(), samples=300, **options)

    # Stop in the middle of a batch (130 = 2 batches + 30 samples), on another PE.
    path = tmp_path / "run.ckpt.npz"
    run_board_adapt(GoldenPort(), samples=130, chunk=65, checkpoint=path, checkpoint_every=65, **options)
    assert load_checkpoint(path)[1]["run"]["samples_done"] == 130
    port = GoldenPort()
    resumed = run_board_adapt(port, samples=300, checkpoint=path, **options)

    assert resumed["resumed_from"] == 130
    np.testing.assert_array_equal(resumed["write_counts"], whole["write_counts"])
    # The fresh PE counted only what it wrote after the resume; the processor kept the rest.
    assert port.model.counts.sum() < resumed["write_counts"].sum()
    for key in ("accuracy", "online_accuracy", "online_accuracy_mean", "writes_total",
                "max_writes_per_cell", "updates", "samples", "pairs"):
        assert resumed[key] == whole[key], key
    for op in COMPUTE_OPS:
        assert resumed["pe_ops"][op] == whole["pe_ops"][op], op
    # A state resumes only a run made the same way.
    other = LRTBoardTrainer(GoldenPort(), _net(cache, seed=1), batch=50, lr=0.01, seed=1)
    arrays, meta = load_checkpoint(path)
    with pytest.raises(ValueError, match="another run"):
        other.load_state(arrays, meta["learner"]["trainer"])


def test_the_loop_runs_step_for_step_the_same_on_the_golden_model_and_the_twin(cache):
    """One adaptation loop, two executors: the golden model of the PE on the host, and the
    simulated board's accelerator through the driver; every sample's prediction (the EMA curve
    at every sample) and every write are the same."""
    options = dict(env="shift", samples=120, batch=20, lr=0.03, seed=2, cache_dir=cache,
                   curve_points=120, **SMALL)
    host = run_board_adapt(GoldenPort(), **options)
    twin = run_board_adapt(open_board(get_board("ultra96v2-sim"), "fast"), **options)
    assert len(host["online_curve"]["sample"]) == 120 and host["online_curve"] == twin["online_curve"]
    assert host["curve"] == twin["curve"]
    for key in ("accuracy", "online_accuracy_mean", "writes_total", "updates", "pairs"):
        assert host[key] == twin[key], key
    np.testing.assert_array_equal(host["write_counts"], twin["write_counts"])


def test_every_point_of_the_curve_has_the_loss_and_both_accuracies(cache):
    """About 20 points, however short the run (a step is at most 1/20 of it): each with the mean
    loss of its samples, their online accuracy and the test accuracy, the last the final one's."""
    result = run_board_adapt(GoldenPort(), env="shift", samples=200, batch=20, lr=0.03, seed=0,
                             cache_dir=cache, **SMALL)
    curve = result["curve"]
    assert [p["samples"] for p in curve] == list(range(10, 201, 10))
    for point in curve:
        assert point["loss"] > 0 and 0 <= point["train_accuracy"] <= 1 and 0 <= point["test_accuracy"] <= 1
    assert curve[-1]["test_accuracy"] == result["accuracy"]
    assert np.mean([p["train_accuracy"] for p in curve]) == pytest.approx(result["online_accuracy_mean"])


def test_configurations_the_pe_cannot_take_are_refused(cache, tmp_path):
    net = _net(cache)
    for rank in (0, 8, 10):
        with pytest.raises(ValueError, match="rank"):
            LRTBoardTrainer(GoldenPort(), net, rank=rank)
    with pytest.raises(ValueError, match="rank"):           # q = 5 basis columns on a 4-column PE
        LRTBoardTrainer(GoldenPort(AcceleratorParams(lrt_cols_max=4)), net, rank=4)
    with pytest.raises(ValueError, match="batch"):
        LRTBoardTrainer(GoldenPort(), net, batch=0)
    wide = dense_net(sample_shape=(8, 8), hidden=(300,), classes=10)   # last layer 300 -> 10
    with pytest.raises(ValueError, match="does not fit the LRT PE"):
        LRTBoardTrainer(GoldenPort(), wide)
    with pytest.raises(ValueError, match="env"):
        run_board_adapt(GoldenPort(), env="analog", samples=10, cache_dir=cache, **SMALL)
    # Refused before any pre-training: nothing lands in an empty cache.
    with pytest.raises(ValueError, match="rank"):
        run_board_adapt(GoldenPort(), samples=10, rank=8, cache_dir=tmp_path, **SMALL)
    assert not any(tmp_path.iterdir())
    LRTBoardTrainer(GoldenPort(), net, rank=7)               # the largest that fits
    assert math.isfinite(LRTBoardTrainer(GoldenPort(), net).lr)


def test_a_checkpoint_of_another_run_is_refused_before_pre_training(cache, tmp_path):
    path = tmp_path / "run.npz"
    run_board_adapt(GoldenPort(), samples=20, batch=10, checkpoint=path, cache_dir=cache, **SMALL)
    empty = tmp_path / "cache"
    empty.mkdir()
    with pytest.raises(InsituError, match=r"belongs to another run \(lr 0.01 there, 0.03 here\)"):
        run_board_adapt(GoldenPort(), samples=20, batch=10, lr=0.03, checkpoint=path,
                        cache_dir=empty, **SMALL)
    assert not any(empty.iterdir())                      # nothing was pre-trained
