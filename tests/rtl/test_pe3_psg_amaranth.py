"""PE3_PSG (E2-Train's predictive sign gradient on PE3) against the golden model, in Amaranth's
simulator: output words (rescaled g_msb, eq.-2 signs) and the PSG_PREDICTED / PSG_MAX ports,
with random shapes, codes with their extremes, X words over all 16 bits (the PE takes the low
byte), random thresholds (1, tiny, around beta * max, exactly max, huge), gaps and stalls; PE3
generated with one or two batch entries a MAC step (``pe3_batch_lanes``)."""

import numpy as np
import pytest

from insitu.rtl.pe3 import PE3
from insitu.accel.regmap import ErrorCode, Op
from insitu.tt import pe_stream as ps
from insitu.tt.pe_stream import PEConfig, psg_config

from test_pe3_amaranth import LANES, _codes, _error, _pe3, simulate  # the test folder is on sys.path

pytestmark = pytest.mark.rtl

U32_MAX = (1 << 32) - 1


def _x_words(rng, shape):
    """X words: mostly 8-bit codes with their extremes, some with junk in the upper byte."""
    x = rng.integers(-128, 128, size=shape)
    pick = rng.random(shape)
    x = np.where(pick < 0.1, -128, x)
    x = np.where((pick >= 0.1) & (pick < 0.2), 127, x)
    x = np.where((pick >= 0.2) & (pick < 0.25), 0, x)
    return np.where(pick >= 0.85, _codes(rng, shape), x)


def _tau(rng, peak: int) -> int:
    """A threshold: 1, tiny, beta * peak, the peak itself (|g| == tau decides), above it, huge."""
    kind = rng.integers(0, 6)
    if kind == 0:
        return 1
    if kind == 1:
        return int(rng.integers(2, 9))
    if kind == 2:
        return max(1, int(np.ceil(float(rng.uniform(0.01, 0.5)) * peak)))
    if kind == 3:
        return max(1, peak)
    if kind == 4:
        return peak + 1
    return U32_MAX


def _psg_job(rng, a, b, d, shift=None, tau=None):
    dy, x = _codes(rng, (a, b)), _x_words(rng, (a // d, b, 16))
    if shift is None:
        shift = int(rng.integers(-4, 12))
    probe = ps.psg_run(psg_config(a, b, d), dy, x)
    cfg = psg_config(a, b, d, shift, _tau(rng, probe.peak) if tau is None else tau)
    return cfg, dy, x


def _check(dut, jobs, rng, **kwargs):
    """Runs the jobs (PE3 and PE3_PSG mixed); PSG status must hold the last PSG job's values."""
    status = []
    results = simulate(dut, jobs, rng, status=status, **kwargs)
    last = (0, 0)
    for (cfg, dy, x), (out, _), got in zip(jobs, results, status):
        np.testing.assert_array_equal(out, ps.reference_stream_out(cfg, dy, x), err_msg=str(cfg))
        if cfg.kind == "PE3_PSG":
            run = ps.psg_run(cfg, dy, x)
            last = (run.predicted_count, run.peak)
        assert got == last, f"{cfg}: (PSG_PREDICTED, PSG_MAX) = {got}, expected {last}"
    return results


@LANES
def test_random_psg_ops_with_gaps_and_backpressure(lanes):
    rng = np.random.default_rng(4321)
    shapes = [(4, 1, 1), (6, 5, 3), (3, 8, 3), (4, 13, 2), (2, 17, 1), (4, 2, 4), (2, 20, 2)]
    for _ in range(5):
        d = int(rng.integers(1, 5))
        shapes.append((d * int(rng.integers(1, 4)), int(rng.integers(1, 21)), d))
    jobs = [_psg_job(rng, *shape) for shape in shapes]
    # PE3 ops in between: the PE switches modes, and the PSG registers survive a PE3 op.
    for at in (3, 8):
        cfg = PEConfig("PE3", 4, int(rng.integers(1, 21)), 16, 2, int(rng.integers(0, 30)))
        jobs.insert(at, (cfg, _codes(rng, (4, cfg.b)), _codes(rng, (2, cfg.b, 16))))
    taus = {cfg.tau for cfg, _, _ in jobs if cfg.kind == "PE3_PSG"}
    assert 1 in taus and U32_MAX in taus
    _check(PE3(_pe3(lanes, pe3_b_max=20)), jobs, rng, gap=0.3, stall=0.3)


@LANES
def test_psg_tiny_fifos_and_short_rows(lanes):
    """The smallest FIFOs under heavy stalls, and b = 1..3 rows back to back without stalls (a
    PSG row takes 4 output beats: rows start every 4 cycles at most)."""
    rng = np.random.default_rng(77)
    dut = PE3(_pe3(lanes, pe3_b_max=16), dy_fifo_beats=2, out_fifo_beats=4)
    jobs = [_psg_job(rng, 12, 3, 6), _psg_job(rng, 8, 16, 4), _psg_job(rng, 5, 1, 5),
            _psg_job(rng, 6, 9, 1)]
    _check(dut, jobs, rng, gap=0.5, stall=0.6)
    jobs = [_psg_job(rng, 32, 1, 16), _psg_job(rng, 16, 2, 8), _psg_job(rng, 16, 3, 16),
            _psg_job(rng, 16, 5, 16)]
    results = _check(PE3(_pe3(lanes, pe3_b_max=16)), jobs, rng)
    for (cfg, _, _), (_, cycles) in zip(jobs, results):
        # bound by max(b, 4) cycles a row, plus the X blocks and the pipeline
        assert cycles <= cfg.a * max(cfg.b, 4) + cfg.in_beats() // 2 + 20, (cfg, cycles)


@LANES
def test_psg_full_scale_sums(lanes):
    """Sums at the narrow accumulators' extremes at the generated b_max: every predictor product
    (-512) * (-8) (max) or (-512) * 7 (min), full-precision extremes alongside, SHIFT over its
    range, tau at and around the peak."""
    rng = np.random.default_rng(8)
    bmax = 256
    jobs = []
    for x_code, shift, tau in ((-128, 0, 1), (127, 7, bmax * 3584), (-128, 63, bmax * 4096),
                               (127, -16, bmax * 3584 + 1)):
        cfg = psg_config(2, bmax, 1, shift, tau)
        dy, x = np.full((2, bmax), -(1 << 15)), np.full((2, bmax, 16), x_code)
        dy[1, ::3] = (1 << 15) - 1                     # a second row of mixed signs
        x[1, :, ::2] = _x_words(rng, (bmax, 8))
        jobs.append((cfg, dy, x))
    _check(PE3(_pe3(lanes)), jobs, rng, gap=0.1, stall=0.1)


@LANES
def test_psg_throughput_on_the_network_shape(lanes):
    """(a, 64, 16, 16) with always-valid / always-ready streams: one MAC step a clock, as PE3."""
    rng = np.random.default_rng(3)
    job = _psg_job(rng, 64, 64, 16, shift=8)
    [(_, cycles)] = _check(PE3(_pe3(lanes)), [job], rng)
    assert job[0].macs() / (16 * lanes * cycles) >= 0.9, cycles


@LANES
def test_psg_configuration_errors_and_beat_counts(lanes):
    dut = PE3(_pe3(lanes))
    psg = int(Op.PE3_PSG)
    cases = [
        ((16, 64, 16, 16, 0, psg, 0), ErrorCode.PSG_TAU),
        ((16, 64, 16, 16, 0, 3, 0), ErrorCode.NONE),                 # PE3 ignores PSG_TAU
        ((0, 64, 16, 16, 0, psg, 0), ErrorCode.ZERO_SIZE),           # the PE3 checks come first
        ((16, 64, 32, 16, 0, psg, 0), ErrorCode.C_LANES),
        ((17, 64, 16, 16, 0, psg, 0), ErrorCode.BLOCK),
        ((16, 257, 16, 16, 0, psg, 0), ErrorCode.TILE),
        ((16, 64, 16, 16, 64, psg, 0), ErrorCode.SHIFT),
        ((16, 64, 16, 16, -17, psg, 5), ErrorCode.SHIFT),
    ]
    for args, code in cases:
        assert _error(dut, *args[:5], op=args[5], tau=args[6])["error"] == code, args
    for a, b, d, shift, tau in [(28672, 64, 16, 0, 1), (65535, 256, 1, 63, U32_MAX), (30, 5, 3, -3, 9)]:
        cfg = psg_config(a, b, d, shift, tau)
        assert ps.cfg_error(cfg) == ErrorCode.NONE
        got = _error(dut, a, b, 16, d, shift, op=psg, tau=tau)
        assert got == {"error": 0, "in": cfg.in_beats(), "out": cfg.out_beats()}, cfg
        assert cfg.out_beats() == 4 * a
    # the golden model's checks agree
    assert ps.cfg_error(psg_config(16, 64, 16, tau=0)) == ErrorCode.PSG_TAU
    assert ps.cfg_error(psg_config(16, 64, 16, shift=64, tau=0)) == ErrorCode.SHIFT
    assert ps.cfg_error(psg_config(17, 300, 16, tau=0)) == ErrorCode.BLOCK
