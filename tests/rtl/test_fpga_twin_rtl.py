"""The two twins agree: the same ops through `open_board(mode="fast")` (golden models) and
`open_board(mode="rtl")` (the accelerator's RTL in Amaranth's simulator, behind the same PYNQ
driver, AXI DMA model and registers) give the same output streams and the same LRT registers.

Small sizes: the RTL twin simulates about a thousand cycles a second. ``-s`` prints the RTL's
CYCLES next to the cycle models (`pe_stream.estimated_cycles`, `LRTPEModel.cycles`).
"""

import time

import numpy as np
import pytest

from insitu.boards import accelerator_params, get_board
from insitu.fpga.boards import open_board
from insitu.fpga.driver import AcceleratorError
from insitu.fpga.psg_op import run_psg
from insitu.fpga.twin import write_twin_overlay
from insitu.lrt.pe_ops import LRTPEModel, append_reciprocal
from insitu.accel.params import DEFAULT_PARAMS as P
from insitu.accel.regmap import ErrorCode, Op
from insitu.tt.hardware_report import network_ops
from insitu.tt import pe_stream
from insitu.tt.pe_stream import PEConfig

from twin_ops import codes, random_tt_shapes, tt_operands  # the test folder is on sys.path

pytestmark = pytest.mark.rtl

BOARD = get_board("ultra96v2-sim")
#: The design the twin runs: the board's accelerator parameters (two PE3 batch lanes).
BOARD_PARAMS = accelerator_params(BOARD.name)
LRT_REGS = ("LRT_SIDE", "LRT_ROWS_L", "LRT_ROWS_R", "LRT_COLS", "LRT_RECIP", "SHIFT")
LRT_STATE = ("LRT_NORM2_LO", "LRT_NORM2_HI", "LRT_WRITES_MAX", "LRT_WRITES_TOTAL")


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    bit = write_twin_overlay(BOARD.twin_of, tmp_path_factory.mktemp("overlay"))
    t0 = time.monotonic()
    rtl = open_board(BOARD, mode="rtl", bitstream=bit, timeout_s=120)
    print(f"\nRTL twin opened in {time.monotonic() - t0:.1f} s")
    return open_board(BOARD, mode="fast", bitstream=bit, timeout_s=5), rtl


def pad(rng, values):
    """Whole beats; the padding words are random (the PE must ignore them)."""
    v = np.asarray(values, np.int64).ravel()
    return np.concatenate([v, codes(rng, -v.size % 8)[::-1]])


class Lockstep:
    """Runs each op on both twins and compares; keeps a table of cycles."""

    def __init__(self, fast, rtl):
        self.fast, self.rtl = fast, rtl
        self.rows = []

    def run(self, label, op, words=None, model_cycles=None, **registers):
        out_f = self.fast.run(op, words, **registers)
        t0 = time.monotonic()
        sim0 = self.rtl.device.cycles
        out_r = self.rtl.run(op, words, **registers)
        wall = time.monotonic() - t0
        np.testing.assert_array_equal(out_r, out_f, err_msg=f"{label}: RTL twin vs fast twin")
        for name in ("STATUS", "ERROR_CODE", "BEATS_DONE_IN", "BEATS_DONE_OUT", *LRT_STATE):
            assert self.rtl.read(name) == self.fast.read(name), f"{label}: {name}"
        cycles_r, cycles_f = self.rtl.read("CYCLES"), self.fast.read("CYCLES")
        if model_cycles is not None:
            assert cycles_f == model_cycles
        self.rows.append((label, cycles_r, cycles_f, self.rtl.device.cycles - sim0, wall))
        return out_f

    def lrt_state(self):
        return {name: self.fast.read(name) for name in LRT_STATE}

    def print(self):
        print(f"\n{'op':<44} {'RTL CYCLES':>10} {'model':>7} {'ratio':>6} {'simulated':>9} {'wall s':>6}")
        for label, r, f, sim, wall in self.rows:
            print(f"{label:<44} {r:>10} {f:>7} {r / f:>6.3f} {sim:>9} {wall:>6.2f}")
        sim = sum(row[3] for row in self.rows)
        wall = sum(row[4] for row in self.rows)
        print(f"{'total':<44} {'':>10} {'':>7} {'':>6} {sim:>9} {wall:>6.2f}  "
              f"({sim / wall:.0f} simulated cycles/s)")


def test_random_ops_give_identical_results_on_both_twins(twins):
    fast, rtl = twins
    rng = np.random.default_rng(20240611)
    ls = Lockstep(fast, rtl)

    # ---- TT ops with random shifts: a few fixed shapes (several row / d groups, c chunks),
    # then random small ones
    fixed = [("PE1", 5, 3, 16, 4), ("PE2", 2, 4, 32, 5), ("PE3", 4, 3, 16, 2), ("PE1", 9, 2, 32, 3),
             ("PE2", 1, 9, 16, 11), ("PE3", 3, 10, 16, 3)]
    shapes = random_tt_shapes(rng, fixed, 14, d_max=10, b_max=9, a_max=12, pe3_blocks_max=4, beats_max=120)
    rng.shuffle(shapes)
    for kind, a, b, c, d in shapes:
        shift = int(rng.choice([P.shift_min, -2, 0, 3, 7, 12, 20, P.shift_max]))
        cfg = PEConfig(kind, a, b, c, d, shift)
        assert pe_stream.cfg_error(cfg) == ErrorCode.NONE
        lhs, rhs = tt_operands(rng, kind, a, b, c, d)
        out = ls.run(f"{kind} a={a} b={b} c={c} d={d} shift={shift}", Op(cfg.op),
                     pe_stream.stream_in(cfg, lhs, rhs), pe_stream.estimated_cycles(cfg, BOARD_PARAMS),
                     SIZE_A=a, SIZE_B=b, SIZE_C=c, SIZE_D=d, SHIFT=shift)
        np.testing.assert_array_equal(out, pe_stream.reference_stream_out(cfg, lhs, rhs))

    # ---- a short LRT sequence, checked against the golden model too
    model = LRTPEModel()
    m, n, q = 10, 7, P.lrt_cols_max
    model.configure(rows_l=m, rows_r=n, cols=0)

    def lrt(op, values=None, **regs):
        model.configure(**regs)
        words = None if values is None else pad(rng, values)
        want = model.execute(op, words)
        registers = dict(LRT_SIDE=model.side, LRT_ROWS_L=model.rows_l, LRT_ROWS_R=model.rows_r,
                         LRT_COLS=model.cols, LRT_RECIP=model.recip, SHIFT=model.shift)
        label = f"{Op(op).name} side={model.side} r={model.cols}"
        out = ls.run(label, op, words, model.cycles(op), **registers)
        np.testing.assert_array_equal(out, want, err_msg=label)
        state = ls.lrt_state()
        assert state["LRT_NORM2_LO"] | state["LRT_NORM2_HI"] << 32 == model.norm2, label
        assert (state["LRT_WRITES_MAX"], state["LRT_WRITES_TOTAL"]) == (model.writes_max,
                                                                        model.writes_total), label
        return out

    def append(side):
        norm2 = fast.read("LRT_NORM2_LO") | fast.read("LRT_NORM2_HI") << 32
        assert norm2 > 0
        recip, shift = append_reciprocal(norm2)
        lrt(Op.LRT_APPEND, side=side, recip=recip, shift=shift)

    def basis(rows):
        return np.round(rng.standard_normal((rows, q)) * 5000).astype(np.int64)

    lrt(Op.LRT_LOAD_WEIGHTS, codes(rng, m * n, bits=9))              # saturates to 8 bits
    lrt(Op.LRT_LOAD_BASIS, basis(m), side=0)
    lrt(Op.LRT_LOAD_BASIS, basis(n), side=1)
    lrt(Op.LRT_READ_BASIS, side=1)
    lrt(Op.LRT_PROJECT, codes(rng, m), side=0, cols=2)
    lrt(Op.LRT_REPROJECT, side=0)
    append(0)
    lrt(Op.LRT_ROTATE, np.round(rng.standard_normal((3, 3)) * 8000).astype(np.int64), side=0, cols=3)
    lrt(Op.LRT_PROJECT, codes(rng, n), side=1, cols=2)
    append(1)
    lrt(Op.LRT_ROTATE, np.round(rng.standard_normal((3, 3)) * 8000).astype(np.int64), side=1, cols=3)
    lrt(Op.LRT_PROJECT, np.full(m, 32767), side=0, cols=3)           # saturating residuals
    lrt(Op.LRT_UPDATE, np.round(rng.standard_normal(3) * 20000).astype(np.int64).clip(-32768, 32767),
        cols=3, shift=30)
    lrt(Op.LRT_UPDATE, np.array([32767, -32768, 12345]), cols=3, shift=29)
    weights = lrt(Op.LRT_READ_WEIGHTS)
    counts = lrt(Op.LRT_READ_COUNTS)
    lrt(Op.LRT_READ_BASIS, side=0)
    lrt(Op.LRT_READ_BASIS, side=1)
    ls.print()
    # the RTL's CYCLES (START to done, DMA programming after START included) are never below the
    # LRT PE's stall-free count
    lrt_rows = [row for row in ls.rows if row[0].startswith("LRT_")]
    assert all(r >= f for _, r, f, _, _ in lrt_rows), lrt_rows
    # the sequence exercised what it is for
    assert model.writes_total > 0 and counts[:m * n].max() >= 1
    assert len(set(weights[:m * n].tolist())) > 3


def test_refused_configurations_agree(twins):
    """ERROR_CODE at START for configurations each check refuses, and BAD_OP (cheap on the RTL:
    a refused op never streams)."""
    fast, rtl = twins
    configs = [
        dict(OP=1, SIZE_A=0, SIZE_B=1, SIZE_C=16, SIZE_D=1, SHIFT=0),
        dict(OP=1, SIZE_A=5, SIZE_B=3, SIZE_C=8, SIZE_D=4, SHIFT=99),
        dict(OP=1, SIZE_A=1, SIZE_B=17, SIZE_C=16, SIZE_D=300, SHIFT=0),
        dict(OP=1, SIZE_A=1, SIZE_B=1, SIZE_C=16, SIZE_D=257, SHIFT=0),
        dict(OP=1, SIZE_A=1, SIZE_B=1, SIZE_C=16, SIZE_D=1, SHIFT=-17),
        dict(OP=2, SIZE_A=1, SIZE_B=600, SIZE_C=16, SIZE_D=48, SHIFT=0),
        dict(OP=2, SIZE_A=1, SIZE_B=100, SIZE_C=16, SIZE_D=48, SHIFT=0),
        dict(OP=2, SIZE_A=4096, SIZE_B=1, SIZE_C=2048, SIZE_D=1, SHIFT=0),
        dict(OP=2, SIZE_A=1, SIZE_B=1, SIZE_C=24, SIZE_D=1, SHIFT=64),
        dict(OP=3, SIZE_A=5, SIZE_B=300, SIZE_C=16, SIZE_D=2, SHIFT=99),
        dict(OP=3, SIZE_A=4, SIZE_B=257, SIZE_C=16, SIZE_D=2, SHIFT=0),
        dict(OP=3, SIZE_A=4, SIZE_B=1, SIZE_C=32, SIZE_D=2, SHIFT=0),
        dict(OP=int(Op.PE3_PSG), SIZE_A=4, SIZE_B=1, SIZE_C=16, SIZE_D=2, SHIFT=0, PSG_TAU=0),
        dict(OP=0), dict(OP=5), dict(OP=26),
        dict(OP=int(Op.LRT_LOAD_BASIS), LRT_SIDE=1, LRT_ROWS_L=3, LRT_ROWS_R=0),
        dict(OP=int(Op.LRT_PROJECT), LRT_SIDE=0, LRT_ROWS_L=P.lrt_rows_max + 1, LRT_COLS=0),
        dict(OP=int(Op.LRT_ROTATE), LRT_SIDE=0, LRT_ROWS_L=3, LRT_COLS=P.lrt_cols_max),
        dict(OP=int(Op.LRT_UPDATE), LRT_ROWS_L=200, LRT_ROWS_R=200, LRT_COLS=1, SHIFT=0),
        dict(OP=int(Op.LRT_APPEND), LRT_SIDE=0, LRT_ROWS_L=3, LRT_COLS=1, SHIFT=64),
    ]
    seen = set()
    for registers in configs:
        codes_ = []
        for acc in (fast, rtl):
            acc.regs.configure(**registers)
            acc.regs.command("START")
            codes_.append((acc.read("STATUS"), ErrorCode(acc.read("ERROR_CODE"))))
        assert codes_[0] == codes_[1], (registers, codes_)
        assert codes_[0][0] == 0b100, registers
        seen.add(codes_[0][1])
    config_codes = set(ErrorCode) - {ErrorCode.NONE, ErrorCode.STREAM_SHORT, ErrorCode.STREAM_LONG,
                                     ErrorCode.ABORTED}
    assert seen == config_codes
    for acc in twins:
        acc._reset_dma()                                          # the driver's state as after an error


def test_psg_ops_agree(twins):
    """PE3_PSG ops (g_msb, signs, PSG_PREDICTED, PSG_MAX) on both twins and the golden model."""
    fast, rtl = twins
    rng = np.random.default_rng(77)
    for a, b, d, shift in ((4, 3, 2, 0), (3, 9, 3, 4), (2, 1, 1, 1)):
        dy, x = codes(rng, (a, b)), codes(rng, (a // d, b, 16))
        peak = pe_stream.psg_run(pe_stream.psg_config(a, b, d), dy, x).peak
        cfg = pe_stream.psg_config(a, b, d, shift, tau=max(1, peak // 4))
        want = pe_stream.psg_run(cfg, dy, x)
        for acc in (fast, rtl):
            got = run_psg(acc, cfg, dy, x)
            np.testing.assert_array_equal(got.g_msb, want.out[:, 0], err_msg=str(cfg))
            np.testing.assert_array_equal(got.sign, want.sign, err_msg=str(cfg))
            assert (got.predicted, got.peak) == (want.predicted_count, want.peak), cfg
            assert acc.read("STATUS") == 0b010


def test_beats_of_the_network_ops_agree(twins):
    """IN_BEATS / OUT_BEATS (the DMA transfer sizes) of every op of the network, read from both."""
    fast, rtl = twins
    for _, op, cfg in network_ops():
        registers = dict(OP=cfg.op, SIZE_A=cfg.a, SIZE_B=cfg.b, SIZE_C=cfg.c, SIZE_D=cfg.d, SHIFT=0)
        got = []
        for acc in (fast, rtl):
            acc.regs.configure(**registers)
            got.append((acc.read("IN_BEATS"), acc.read("OUT_BEATS")))
        assert got[0] == got[1] == (cfg.in_beats(), cfg.out_beats()), (op, cfg)
    for acc in twins:
        acc.written.clear()


def test_rtl_twin_refuses_an_op_with_its_stream_with_the_error_code(twins):
    """The RTL twin reports IN_BEATS for a configuration it refuses, so the driver starts it and
    raises AcceleratorError with the code (the fast twin does not: see test_fpga_driver)."""
    _, rtl = twins
    cfg = PEConfig("PE1", 5, 3, 8, 4, 2)
    rng = np.random.default_rng(4)
    words = pe_stream.stream_in(cfg, codes(rng, (5, 3, 8)), codes(rng, (3, 4, 8), bits=4))
    with pytest.raises(AcceleratorError, match="C_LANES"):
        rtl.run(Op.PE1, words, SIZE_A=5, SIZE_B=3, SIZE_C=8, SIZE_D=4, SHIFT=2)
