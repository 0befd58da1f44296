"""The fast twin's model of the PL (`insitu.fpga.twin_models.FunctionalModel`) and what it is built from.

* the golden stream helpers it reads streams with (`pe_stream.operands_from_stream` inverts
  `stream_in`), its configuration checks (`pe_stream.cfg_error`, `LRTPEModel.cfg_error`: every
  ErrorCode from a crafted configuration, the RTL's priority order, NONE for the network's ops)
  and its cycle model (`pe_stream.estimated_cycles` within 2 % of the CYCLES measured in Icarus,
  `docs/results/rtl/report.json`; ``-s`` prints the ratios);
* the fast twin driven through the PYNQ driver (`open_board(mode="fast")`): random PE1/PE2/PE3
  ops and random LRT op sequences equal the golden models word for word (and an independent
  NumPy reference for the TT results), with the LRT registers;
* register encoding (`insitu.fpga.regs`): the signed SHIFT, range errors;
* the AXI DMA model: decode and internal errors, and what the driver makes of a DMA error.
"""

import gc
import json
import re
from pathlib import Path

import numpy as np
import pytest
from pynq.buffer import PynqBuffer

from insitu.boards import get_board
from insitu.fpga import regs as regs_mod
from insitu.fpga.boards import open_board
from insitu.fpga.driver import AcceleratorError, AcceleratorTimeout
from insitu.fpga.psg_op import run_psg
from insitu.fpga.twin import AxiDmaModel, DeviceMemory, write_twin_overlay
from insitu.lrt.pe_ops import LRTPEModel, append_reciprocal
from insitu.accel import stream
from insitu.accel.params import DEFAULT_PARAMS as P
from insitu.accel.params import BEAT_BYTES, AcceleratorParams, mac_units
from insitu.boards import accelerator_params
from insitu.accel.regmap import ID_VALUE, VERSION, ErrorCode, Op, register
from insitu.tt.hardware_report import network_ops
from insitu.tt import pe_stream
from insitu.tt.pe_stream import PEConfig

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "results" / "rtl" / "report.json"
BOARD = get_board("ultra96v2-sim")
#: The design the twin runs: its board's parameters (the Ultra96-V2's PE3 takes 2 batch lanes).
BOARD_PARAMS = accelerator_params(BOARD)
I16 = (-(1 << 15), (1 << 15) - 1)


@pytest.fixture(scope="module")
def overlay(tmp_path_factory):
    """A twin overlay of this insitu version in a temporary folder (not the user's cache)."""
    return write_twin_overlay(BOARD.twin_of, tmp_path_factory.mktemp("overlay"))


@pytest.fixture
def acc(overlay):
    return open_board(BOARD, mode="fast", bitstream=overlay, timeout_s=2.0)


# ------------------------------------------------------------------------------------ helpers

def codes(rng, shape, bits=16, extremes=True):
    """Random signed codes of ``bits`` bits, with the extremes seeded in."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    x = rng.integers(lo, hi + 1, size=shape, dtype=np.int64)
    if extremes and x.size >= 4:
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, size=2, replace=False)] = [lo, hi]
    return x


def random_config(rng, kind, shift=None) -> PEConfig:
    """A small configuration the PE accepts."""
    if kind == "PE1":
        chunks = int(rng.integers(1, 5))
        b = int(rng.integers(1, P.pe1_row_entries // chunks + 1))
        d = int(rng.integers(1, min(P.factor_words // P.c_lanes // (b * chunks), 20) + 1))
        a = int(rng.integers(1, 30))
        c = 16 * chunks
    elif kind == "PE2":
        a, b, c, d = int(rng.integers(1, 6)), int(rng.integers(1, 40)), 16 * int(rng.integers(1, 4)), \
            int(rng.integers(1, 20))
    else:
        d = int(rng.integers(1, 5))
        a, b, c = d * int(rng.integers(1, 5)), int(rng.integers(1, 40)), 16
    if shift is None:
        shift = int(rng.choice([P.shift_min, -3, 0, 1, 5, 9, 14, 20, 31, P.shift_max])) \
            if rng.random() < 0.3 else int(rng.integers(-2, 16))
    cfg = PEConfig(kind, a, b, c, d, shift)
    assert pe_stream.cfg_error(cfg) == ErrorCode.NONE, cfg
    return cfg


def random_operands(rng, cfg):
    a, b, c, d = cfg.a, cfg.b, cfg.c, cfg.d
    if cfg.kind == "PE1":
        return codes(rng, (a, b, c)), codes(rng, (b, d, c), bits=4)
    if cfg.kind == "PE2":
        return codes(rng, (a, b, c)), codes(rng, (b, d), bits=4)
    return codes(rng, (a, b)), codes(rng, (a // d, b, 16))


def independent_result(cfg, lhs, rhs):
    """The op's natural-layout result by plain loops over Python ints (no insitu code): exact sums,
    round half up by SHIFT (a left shift when negative), saturation to 16 bits."""
    def rescale(v):
        v = int(v)
        s = cfg.shift
        v = (v + (1 << (s - 1))) >> s if s > 0 else v << -s
        return min(max(v, I16[0]), I16[1])

    lhs, rhs = lhs.astype(object), rhs.astype(object)
    if cfg.kind == "PE1":
        acc = [[(lhs[i] * rhs[:, j, :]).sum() for j in range(cfg.d)] for i in range(cfg.a)]
    elif cfg.kind == "PE2":
        acc = [[[(lhs[i, :, k] * rhs[:, j]).sum() for k in range(cfg.c)] for j in range(cfg.d)]
               for i in range(cfg.a)]
    else:
        acc = [[(lhs[i] * rhs[i // cfg.d][:, k]).sum() for k in range(16)] for i in range(cfg.a)]
    return np.vectorize(rescale, otypes=[np.int64])(np.array(acc, dtype=object))


def tt_registers(cfg):
    regs = dict(SIZE_A=cfg.a, SIZE_B=cfg.b, SIZE_C=cfg.c, SIZE_D=cfg.d, SHIFT=cfg.shift)
    if cfg.kind == "PE3_PSG":
        regs["PSG_TAU"] = cfg.tau
    return regs


# ------------------------------------------------------------------------------------ streams

@pytest.mark.parametrize("kind", ["PE1", "PE2", "PE3"])
def test_operands_from_stream_inverts_stream_in(kind):
    rng = np.random.default_rng({"PE1": 11, "PE2": 12, "PE3": 13}[kind])
    for _ in range(60):
        cfg = random_config(rng, kind)
        lhs, rhs = random_operands(rng, cfg)
        words = pe_stream.stream_in(cfg, lhs, rhs)
        assert words.size == cfg.in_words() and words.size % 8 == 0
        for view in (words, stream.to_words(words)):      # signed codes or the bus's u16 view
            got_lhs, got_rhs = pe_stream.operands_from_stream(cfg, view)
            np.testing.assert_array_equal(got_lhs, lhs, err_msg=str(cfg))
            np.testing.assert_array_equal(got_rhs, rhs, err_msg=str(cfg))
        # the stream is not a mere concatenation: each operand word lands somewhere new
        if lhs.size > 1:
            moved = words.copy()
            moved[-1], moved[0] = words[0], words[-1]
            if words[0] != words[-1]:
                got = pe_stream.operands_from_stream(cfg, moved)
                assert not (np.array_equal(got[0], lhs) and np.array_equal(got[1], rhs))


@pytest.mark.parametrize("kind", ["PE1", "PE2", "PE3"])
def test_operands_from_stream_refuses_a_stream_of_another_length(kind):
    cfg = random_config(np.random.default_rng(5), kind)
    lhs, rhs = random_operands(np.random.default_rng(6), cfg)
    words = pe_stream.stream_in(cfg, lhs, rhs)
    with pytest.raises(ValueError, match="input stream"):
        pe_stream.operands_from_stream(cfg, words[:-8])
    with pytest.raises(ValueError, match="input stream"):
        pe_stream.operands_from_stream(cfg, np.concatenate([words, np.zeros(8, np.int64)]))


def test_operands_from_stream_drops_padding():
    """PE1 rows beyond a, PE2 columns beyond d and PE3 dY words beyond b are padding."""
    rng = np.random.default_rng(7)
    for cfg in (PEConfig("PE1", 3, 2, 16, 2), PEConfig("PE2", 2, 3, 16, 3), PEConfig("PE3", 4, 5, 16, 2)):
        lhs, rhs = random_operands(rng, cfg)
        words = pe_stream.stream_in(cfg, lhs, rhs)
        pad = np.ones(words.size, bool)
        if cfg.kind == "PE1":
            pad[:cfg.b * cfg.d * cfg.c + cfg.a * cfg.b * cfg.c] = False
        elif cfg.kind == "PE2":
            pad[:] = False
            pad[:cfg.b * 8] = np.tile(np.arange(8) >= cfg.d, cfg.b)
        else:
            pad[:] = False
            block = cfg.b * 16 + cfg.d * 8
            for t in range(cfg.a // cfg.d):
                for r in range(cfg.d):
                    start = t * block + cfg.b * 16 + r * 8
                    pad[start + cfg.b:start + 8] = True
        assert pad.any() and (words[pad] == 0).all()
        noisy = words.copy()
        noisy[pad] = codes(rng, int(pad.sum()))
        got = pe_stream.operands_from_stream(cfg, noisy)
        np.testing.assert_array_equal(got[0], lhs)
        np.testing.assert_array_equal(got[1], rhs)


# ------------------------------------------------------------------------------------ cfg_error

#: Configurations the PEs refuse, with the code the RTL reports (its checks' priority order:
#: ZERO_SIZE, C_LANES, then PE1 TILE/FACTOR_WORDS, PE2 TILE/TILE(a*c)/FACTOR_WORDS,
#: PE3 BLOCK/TILE, then SHIFT).
REFUSED = [
    (PEConfig("PE1", 0, 1, 16, 1), ErrorCode.ZERO_SIZE),
    (PEConfig("PE2", 1, 0, 16, 1), ErrorCode.ZERO_SIZE),
    (PEConfig("PE2", 1, 1, 0, 1), ErrorCode.ZERO_SIZE),
    (PEConfig("PE3", 4, 1, 16, 0), ErrorCode.ZERO_SIZE),
    (PEConfig("PE1", 0, 1, 8, 1, 99), ErrorCode.ZERO_SIZE),          # before C_LANES and SHIFT
    (PEConfig("PE1", 5, 3, 8, 4), ErrorCode.C_LANES),
    (PEConfig("PE2", 1, 1, 24, 1), ErrorCode.C_LANES),
    (PEConfig("PE3", 4, 1, 32, 2), ErrorCode.C_LANES),
    (PEConfig("PE3", 5, 1, 32, 2), ErrorCode.C_LANES),                # before BLOCK
    (PEConfig("PE1", 5, 1, 8, 1, 99), ErrorCode.C_LANES),             # before SHIFT
    (PEConfig("PE1", 1, 1, 16, 257), ErrorCode.FACTOR_WORDS),         # b*d*c/16 = 257 > 256
    (PEConfig("PE1", 1, 4, 64, 17), ErrorCode.FACTOR_WORDS),          # 4*17*4 = 272
    (PEConfig("PE2", 1, 100, 16, 48), ErrorCode.FACTOR_WORDS),        # 100 * 6 > 512
    (PEConfig("PE1", 1, 17, 16, 1), ErrorCode.TILE),                  # b*c/16 = 17 > 16
    (PEConfig("PE1", 1, 1, 272, 1), ErrorCode.TILE),
    (PEConfig("PE1", 1, 17, 16, 300), ErrorCode.TILE),                # before FACTOR_WORDS
    (PEConfig("PE2", 1, 513, 16, 1), ErrorCode.TILE),
    (PEConfig("PE2", 1, 600, 16, 48), ErrorCode.TILE),                # before FACTOR_WORDS
    (PEConfig("PE2", 4096, 1, 2048, 1), ErrorCode.TILE),              # a*c = 2**23
    (PEConfig("PE3", 4, 257, 16, 2), ErrorCode.TILE),
    (PEConfig("PE1", 1, 1, 16, 1, P.shift_min - 1), ErrorCode.SHIFT),
    (PEConfig("PE2", 1, 1, 16, 1, P.shift_max + 1), ErrorCode.SHIFT),
    (PEConfig("PE3", 2, 1, 16, 2, -128), ErrorCode.SHIFT),
    (PEConfig("PE3", 5, 1, 16, 2), ErrorCode.BLOCK),
    (PEConfig("PE3", 5, 300, 16, 2, 99), ErrorCode.BLOCK),            # before TILE and SHIFT
    (pe_stream.psg_config(4, 3, 2, 0, tau=0), ErrorCode.PSG_TAU),
    (pe_stream.psg_config(4, 3, 2, 99, tau=0), ErrorCode.SHIFT),      # PSG_TAU is checked last
    (pe_stream.psg_config(5, 3, 2, 0, tau=0), ErrorCode.BLOCK),
    (pe_stream.psg_config(4, 257, 2, 0, tau=5), ErrorCode.TILE),
]

#: The limits themselves are accepted.
ACCEPTED = [
    PEConfig("PE1", 1, 16, 16, 16), PEConfig("PE1", 1, 1, 256, 16), PEConfig("PE1", 1, 1, 16, 256),
    PEConfig("PE2", 1, 512, 16, 8), PEConfig("PE2", 4096, 1, 2032, 1), PEConfig("PE2", 1, 64, 16, 64),
    PEConfig("PE3", 6, 256, 16, 3), PEConfig("PE1", 1, 1, 16, 1, P.shift_min),
    PEConfig("PE2", 1, 1, 16, 1, P.shift_max), PEConfig("PE3", 1, 1, 16, 1, 0),
    pe_stream.psg_config(6, 256, 3, P.shift_max, tau=1), pe_stream.psg_config(1, 1, 1, tau=(1 << 32) - 1),
]

#: LRT configurations (registers, op) the LRT PE refuses.
LRT_REFUSED = [
    (dict(side=0, rows_l=0, rows_r=4), Op.LRT_LOAD_BASIS, ErrorCode.ZERO_SIZE),
    (dict(side=1, rows_l=4, rows_r=0), Op.LRT_PROJECT, ErrorCode.ZERO_SIZE),
    (dict(rows_l=4, rows_r=0), Op.LRT_UPDATE, ErrorCode.ZERO_SIZE),
    (dict(rows_l=0, rows_r=4), Op.LRT_LOAD_WEIGHTS, ErrorCode.ZERO_SIZE),
    (dict(side=0, rows_l=P.lrt_rows_max + 1, rows_r=1), Op.LRT_READ_BASIS, ErrorCode.LRT_SIZE),
    (dict(side=0, rows_l=4, rows_r=1, cols=P.lrt_cols_max), Op.LRT_PROJECT, ErrorCode.LRT_SIZE),
    (dict(rows_l=200, rows_r=200), Op.LRT_READ_WEIGHTS, ErrorCode.LRT_SIZE),   # 40000 cells
    (dict(side=0, rows_l=4, rows_r=1, shift=P.shift_max + 1), Op.LRT_APPEND, ErrorCode.SHIFT),
    (dict(rows_l=4, rows_r=4, shift=P.shift_min - 1), Op.LRT_UPDATE, ErrorCode.SHIFT),
    (dict(rows_l=0, rows_r=4, shift=99), Op.LRT_UPDATE, ErrorCode.ZERO_SIZE),   # before SHIFT
]

LRT_ACCEPTED = [
    (dict(side=1, rows_l=0, rows_r=P.lrt_rows_max), Op.LRT_LOAD_BASIS),          # only Q_R's rows
    (dict(side=0, rows_l=4, rows_r=1, cols=P.lrt_cols_max - 1), Op.LRT_ROTATE),
    (dict(side=0, rows_l=4, rows_r=1, cols=P.lrt_cols_max, shift=99), Op.LRT_READ_BASIS),
    (dict(side=0, rows_l=4, rows_r=1, shift=99), Op.LRT_PROJECT),                # no SHIFT used
    (dict(rows_l=128, rows_r=128), Op.LRT_READ_COUNTS),                         # 16384 cells
]


@pytest.mark.parametrize("cfg,code", REFUSED,
                         ids=[f"{c.kind}-{e.name}-{i}" for i, (c, e) in enumerate(REFUSED)])
def test_cfg_error_crafted(cfg, code):
    assert pe_stream.cfg_error(cfg) == code


@pytest.mark.parametrize("cfg", ACCEPTED, ids=str)
def test_cfg_error_accepts_the_limits(cfg):
    assert pe_stream.cfg_error(cfg) == ErrorCode.NONE


@pytest.mark.parametrize("regs,op,code", LRT_REFUSED, ids=[f"{o.name}-{e.name}" for _, o, e in LRT_REFUSED])
def test_lrt_cfg_error_crafted(regs, op, code):
    model = LRTPEModel()
    for k, v in regs.items():
        setattr(model, k, v)
    assert model.cfg_error(op) == code


@pytest.mark.parametrize("regs,op", LRT_ACCEPTED, ids=[o.name for _, o in LRT_ACCEPTED])
def test_lrt_cfg_error_accepts(regs, op):
    model = LRTPEModel()
    for k, v in regs.items():
        setattr(model, k, v)
    assert model.cfg_error(op) == ErrorCode.NONE


def test_every_configuration_error_code_is_crafted():
    """Each code a configuration can cause has a configuration above that causes it (the stream
    codes and ABORTED come from test_stream_errors_and_abort)."""
    runtime = {ErrorCode.NONE, ErrorCode.STREAM_SHORT, ErrorCode.STREAM_LONG, ErrorCode.ABORTED}
    crafted = {c for _, c in REFUSED} | {c for _, _, c in LRT_REFUSED} | {ErrorCode.BAD_OP}
    assert crafted == set(ErrorCode) - runtime


def test_cfg_error_none_for_the_network_ops():
    ops = network_ops()
    assert len(ops) == 21
    for _, op, cfg in ops:
        assert pe_stream.cfg_error(cfg) == ErrorCode.NONE, (op, cfg)


def test_twin_refuses_crafted_configs_with_the_same_code(acc):
    """The fast twin reports cfg_error's code at START, through the registers, and stays idle."""
    regs = acc.regs
    for cfg, code in REFUSED:
        regs.configure(OP=cfg.op, **tt_registers(cfg))
        regs.command("START")
        assert regs.read("STATUS") == 0b100, cfg
        assert ErrorCode(regs.read("ERROR_CODE")) == code, cfg
    for op in (0, 5, 15, 26, 255):
        regs.write("OP", op)
        regs.command("START")
        assert regs.read("STATUS") == 0b100
        assert regs.read("ERROR_CODE") == ErrorCode.BAD_OP, op
    for values, op, code in LRT_REFUSED:
        names = {"side": "LRT_SIDE", "rows_l": "LRT_ROWS_L", "rows_r": "LRT_ROWS_R",
                 "cols": "LRT_COLS", "shift": "SHIFT"}
        regs.configure(OP=int(op), **{"LRT_SIDE": 0, "LRT_COLS": 0, "SHIFT": 0,
                                      **{names[k]: v for k, v in values.items()}})
        regs.command("START")
        assert regs.read("STATUS") == 0b100
        assert ErrorCode(regs.read("ERROR_CODE")) == code, (op, values)


def test_twin_beats_of_the_network_ops(acc):
    """IN_BEATS/OUT_BEATS that the driver sizes its DMA transfers by, for the network's ops."""
    for _, _, cfg in network_ops():
        acc.regs.configure(OP=cfg.op, **tt_registers(cfg))
        assert acc.read("IN_BEATS") == cfg.in_beats() == cfg.in_words() // 8
        assert acc.read("OUT_BEATS") == cfg.out_beats() == cfg.out_words() // 8


# ------------------------------------------------------------------------------------ cycles

def _report_designs() -> list[tuple[str, AcceleratorParams, list[dict]]]:
    """(board, its design's parameters, its measured ops) of docs/results/rtl/report.json: one per
    board; a report of the earlier layout (one design, the defaults) as one entry."""
    rep = json.loads(REPORT.read_text())
    if "boards" not in rep:
        return [("default design", AcceleratorParams(), rep["ops"])]
    return [(name, AcceleratorParams(**b["params"]), b["ops"]) for name, b in rep["boards"].items()]


def test_report_is_of_the_network():
    """The measured report covers the network's ops, in order (not a stale report)."""
    want = [(c.kind, c.a, c.b, c.c, c.d) for _, _, c in network_ops()]
    for _, _, ops in _report_designs():
        assert [(o["kind"], o["a"], o["b"], o["c"], o["d"]) for o in ops] == want


@pytest.mark.parametrize("design", range(2))
def test_estimated_cycles_within_2_percent_of_the_rtl(design):
    designs = _report_designs()
    if design >= len(designs):
        pytest.skip("the report has one design (written before the per-board layout)")
    board, params, ops = designs[design]
    rows, worst = [], 0.0
    for o in ops:
        cfg = PEConfig(o["kind"], o["a"], o["b"], o["c"], o["d"])
        est = pe_stream.estimated_cycles(cfg, params)
        ratio = est / o["cycles"]
        worst = max(worst, abs(ratio - 1))
        rows.append((o["op"], cfg, o["cycles"], est, ratio))
    print(f"\nestimated_cycles / CYCLES measured in simulation, {board} "
          "(docs/results/rtl/report.json):")
    for name, cfg, measured, est, ratio in rows:
        print(f"  {cfg.kind} a={cfg.a:<5} b={cfg.b:<3} c={cfg.c:<5} d={cfg.d:<3} "
              f"measured {measured:>8} estimated {est:>8} ratio {ratio:.4f}  ({name})")
    print(f"  worst |ratio - 1| = {worst:.4f}")
    bad = [(n, m, e) for n, _, m, e, r in rows if abs(r - 1) > 0.02]
    assert not bad, f"estimated_cycles off by more than 2 %: {bad}"
    # and in total (what the training figures add up)
    total_m = sum(r[2] for r in rows)
    total_e = sum(r[3] for r in rows)
    assert abs(total_e / total_m - 1) < 0.002


def test_estimated_cycles_is_at_least_the_stream_and_mac_bounds():
    rng = np.random.default_rng(3)
    for params in (AcceleratorParams(), BOARD_PARAMS):
        for kind in ("PE1", "PE2", "PE3"):
            for _ in range(30):
                cfg = random_config(rng, kind)
                est = pe_stream.estimated_cycles(cfg, params)
                assert est >= max(cfg.in_beats(), cfg.out_beats(), cfg.macs() / mac_units(kind, params))


# ------------------------------------------------------------------------------------ fast twin: TT ops

def test_fast_twin_tt_ops_match_the_golden_model(acc):
    rng = np.random.default_rng(2024)
    kinds = ["PE1", "PE2", "PE3"] * 14
    rng.shuffle(kinds)
    saturated = nonzero = 0
    bytes_moved, counts = 0, {}
    for kind in kinds:
        cfg = random_config(rng, kind)
        lhs, rhs = random_operands(rng, cfg)
        out = acc.run(Op(cfg.op), pe_stream.stream_in(cfg, lhs, rhs), **tt_registers(cfg))
        want = pe_stream.reference_stream_out(cfg, lhs, rhs)
        assert out.dtype == np.int64 and out.shape == want.shape, cfg
        np.testing.assert_array_equal(out, want, err_msg=str(cfg))
        np.testing.assert_array_equal(pe_stream.unpack_out(cfg, out), independent_result(cfg, lhs, rhs),
                                      err_msg=str(cfg))
        assert acc.read("STATUS") == 0b010
        assert acc.read("ERROR_CODE") == ErrorCode.NONE
        assert acc.read("CYCLES") == pe_stream.estimated_cycles(cfg, BOARD_PARAMS)
        assert (acc.read("BEATS_DONE_IN"), acc.read("BEATS_DONE_OUT")) == (cfg.in_beats(), cfg.out_beats())
        assert acc.read("SHIFT") == cfg.shift                     # signed read-back
        saturated += int(np.isin(out, I16).sum())
        nonzero += int((out != 0).sum())
        bytes_moved += (cfg.in_words() + cfg.out_words()) * 2
        counts[kind] = counts.get(kind, 0) + 1
    assert saturated and nonzero > saturated                     # the ops are not degenerate
    fig = acc.figures()
    assert fig["ops"] == counts
    assert fig["dma_bytes"] == bytes_moved
    assert fig["pl_cycles"] == sum(fig["cycles_by_op"].values()) > 0


def test_fast_twin_large_op_grows_the_dma_buffers(acc):
    """Ops bigger than the first 4096-word buffers, then small ones again."""
    rng = np.random.default_rng(8)
    for cfg in (PEConfig("PE2", 8, 16, 64, 3, 4), PEConfig("PE1", 3, 2, 16, 2, 1),
                PEConfig("PE2", 2, 512, 16, 8, 12), PEConfig("PE3", 2, 3, 16, 1, 0)):
        assert pe_stream.cfg_error(cfg) == ErrorCode.NONE
        lhs, rhs = random_operands(rng, cfg)
        out = acc.run(Op(cfg.op), pe_stream.stream_in(cfg, lhs, rhs), **tt_registers(cfg))
        np.testing.assert_array_equal(out, pe_stream.reference_stream_out(cfg, lhs, rhs))
    assert acc.buffers["in"].size >= 8 * 16 * 64


def test_fast_twin_psg_ops_match_the_golden_model(acc):
    """PE3_PSG through the driver (run_psg): the rescaled g_msb, the signs and the PSG registers
    equal the golden model (built on numerics.psg_*); a PE3 op leaves the registers, an aborted
    one clears them (PE3 is reset), as in the RTL."""
    rng = np.random.default_rng(31)
    last = None
    for k in range(8):
        d = int(rng.integers(1, 4))
        a, b = d * int(rng.integers(1, 4)), int(rng.integers(1, 30))
        dy, x = codes(rng, (a, b)), codes(rng, (a // d, b, 16), bits=8 if k % 2 else 16)
        probe = pe_stream.psg_run(pe_stream.psg_config(a, b, d), dy, x)
        tau = [1, probe.peak, probe.peak + 1, max(1, probe.peak // 10)][k % 4]
        cfg = pe_stream.psg_config(a, b, d, int(rng.integers(0, 8)), tau)
        got = run_psg(acc, cfg, dy, x)
        want = pe_stream.psg_run(cfg, dy, x)
        np.testing.assert_array_equal(got.g_msb, want.out[:, 0], err_msg=str(cfg))
        np.testing.assert_array_equal(got.sign, want.sign, err_msg=str(cfg))
        assert (got.predicted, got.peak) == (want.predicted_count, want.peak), cfg
        assert acc.read("CYCLES") == pe_stream.estimated_cycles(cfg, BOARD_PARAMS)
        last = (got.predicted, got.peak)
    assert acc.figures()["ops"] == {"PE3_PSG": 8}
    cfg = random_config(rng, "PE3")
    lhs, rhs = random_operands(rng, cfg)
    acc.run(Op.PE3, pe_stream.stream_in(cfg, lhs, rhs), **tt_registers(cfg))
    assert (acc.read("PSG_PREDICTED"), acc.read("PSG_MAX")) == last
    acc.regs.configure(OP=int(Op.PE3), **tt_registers(cfg))
    acc.regs.command("START")
    acc.regs.command("ABORT")
    assert ErrorCode(acc.read("ERROR_CODE")) == ErrorCode.ABORTED
    assert (acc.read("PSG_PREDICTED"), acc.read("PSG_MAX")) == (0, 0)


# ------------------------------------------------------------------------------------ fast twin: LRT ops

_LRT_REGS = {"side": "LRT_SIDE", "rows_l": "LRT_ROWS_L", "rows_r": "LRT_ROWS_R", "cols": "LRT_COLS",
             "recip": "LRT_RECIP", "shift": "SHIFT"}


class LRTPair:
    """One LRT op on the twin (through the driver) and on the golden model, compared."""

    def __init__(self, acc, rng):
        self.acc, self.rng = acc, rng
        self.model = LRTPEModel()
        self.ran: list[str] = []

    def stream(self, values):
        """``values`` padded to whole beats with random words (padding the PE must ignore)."""
        v = np.asarray(values, np.int64).ravel()
        return np.concatenate([v, codes(self.rng, -v.size % 8, extremes=False)])

    def run(self, op, values=None, **regs):
        for k, v in regs.items():
            setattr(self.model, k, int(v))
        words = None if values is None else self.stream(values)
        want = self.model.execute(op, words)
        out = self.acc.run(op, words, **{_LRT_REGS[k]: getattr(self.model, k) for k in _LRT_REGS})
        np.testing.assert_array_equal(out, want, err_msg=f"{Op(op).name} after {self.ran}")
        acc, m = self.acc, self.model
        assert acc.read("LRT_NORM2_LO") | acc.read("LRT_NORM2_HI") << 32 == m.norm2, Op(op).name
        assert acc.read("LRT_WRITES_MAX") == m.writes_max, Op(op).name
        assert acc.read("LRT_WRITES_TOTAL") == m.writes_total, Op(op).name
        assert acc.read("CYCLES") == m.cycles(op), Op(op).name
        assert acc.read("STATUS") == 0b010
        self.ran.append(Op(op).name)
        return out


def lrt_sequence(pair, rng, n_ops):
    """A random SKS-like op sequence: weights, both bases, then projections, appends, rotations,
    updates and reads in random order."""
    q = P.lrt_cols_max
    m, n = int(rng.integers(1, 24)), int(rng.integers(1, 24))
    pair.run(Op.LRT_LOAD_WEIGHTS, codes(rng, m * n, bits=9), rows_l=m, rows_r=n, cols=0)
    for side in (0, 1):
        rows = (m, n)[side]
        pair.run(Op.LRT_LOAD_BASIS, np.round(rng.standard_normal((rows, q)) * 4000).astype(np.int64),
                 side=side)
        pair.run(Op.LRT_READ_BASIS)
    pair.run(Op.LRT_UPDATE, codes(rng, 0), cols=0, shift=0)          # r = 0: no-op update
    writes = 0
    for _ in range(n_ops):
        kind = rng.choice(["project", "reproject", "append", "rotate", "update", "read", "cols"])
        side = int(rng.integers(0, 2))
        rows = (m, n)[side]
        r = pair.model.cols
        if kind == "project":
            scale = float(rng.choice([100.0, 8000.0, 40000.0]))          # the last one saturates
            x = np.clip(np.round(rng.standard_normal(rows) * scale), *I16).astype(np.int64)
            pair.run(Op.LRT_PROJECT, x, side=side)
        elif kind == "reproject":
            pair.run(Op.LRT_REPROJECT, side=side)
        elif kind == "append" and r < q - 1:
            pair.run(Op.LRT_PROJECT, codes(rng, rows), side=side)
            norm2 = pair.acc.read("LRT_NORM2_LO") | pair.acc.read("LRT_NORM2_HI") << 32
            recip, shift = append_reciprocal(norm2)
            pair.run(Op.LRT_APPEND, side=side, recip=recip, shift=shift)
            pair.model.cols += 1                                        # the processor's r += 1
        elif kind == "rotate":
            M = np.round(rng.standard_normal((r + 1, r)) * 6000).astype(np.int64)
            pair.run(Op.LRT_ROTATE, M, side=side)
        elif kind == "update":
            s = np.round(rng.standard_normal(r) * 20000).clip(*I16).astype(np.int64)
            pair.run(Op.LRT_UPDATE, s, shift=int(rng.integers(28, 40)))
            writes = pair.model.writes_total
        elif kind == "read":
            op = rng.choice([Op.LRT_READ_WEIGHTS, Op.LRT_READ_COUNTS, Op.LRT_READ_BASIS])
            pair.run(op, side=side)
        elif kind == "cols":
            pair.model.cols = int(rng.integers(0, q))
    pair.run(Op.LRT_READ_WEIGHTS)
    counts = pair.run(Op.LRT_READ_COUNTS)
    return writes, counts


def test_fast_twin_lrt_sequences_match_the_golden_model(overlay):
    rng = np.random.default_rng(77)
    total_writes = appended = 0
    for _ in range(6):
        # a fresh twin for a fresh golden model (NORM2 and the bases outlive LOAD_WEIGHTS)
        pair = LRTPair(open_board(BOARD, mode="fast", bitstream=overlay, timeout_s=2.0), rng)
        writes, counts = lrt_sequence(pair, rng, 40)
        total_writes += writes
        appended += pair.ran.count("LRT_APPEND")
        assert (counts >= 0).all()
    # the sequences did what they are for: updates that write cells, appended basis vectors
    assert total_writes > 0 and appended > 0


def test_fast_twin_lrt_state_survives_tt_ops_and_errors(acc):
    """The LRT PE's memories are its own: a TT op, a refused op in between change nothing."""
    rng = np.random.default_rng(9)
    pair = LRTPair(acc, rng)
    m, n = 5, 7
    w = codes(rng, m * n, bits=8)
    pair.run(Op.LRT_LOAD_WEIGHTS, w, rows_l=m, rows_r=n)
    cfg = random_config(rng, "PE2")
    lhs, rhs = random_operands(rng, cfg)
    acc.run(Op.PE2, pe_stream.stream_in(cfg, lhs, rhs), **tt_registers(cfg))
    with pytest.raises(AcceleratorError, match="C_LANES"):
        acc.run(Op.PE1, None, SIZE_A=1, SIZE_B=1, SIZE_C=8, SIZE_D=1)
    out = pair.run(Op.LRT_READ_WEIGHTS)
    np.testing.assert_array_equal(out[:m * n], w)


def test_lrt_norm2_high_word(acc):
    """A residual norm beyond 32 bits comes back whole (LRT_NORM2_HI)."""
    rng = np.random.default_rng(10)
    pair = LRTPair(acc, rng)
    pair.run(Op.LRT_LOAD_BASIS, np.zeros(200 * 8, np.int64), side=0, rows_l=200, rows_r=1, cols=0)
    pair.run(Op.LRT_PROJECT, np.full(200, -(1 << 15)))
    assert pair.model.norm2 == 200 << 30
    assert acc.read("LRT_NORM2_HI") == (200 << 30) >> 32 > 0


# ------------------------------------------------------------------------------------ regs

def test_encode_decode_signed_shift():
    shift = register("SHIFT")
    assert shift.signed and shift.width == 8
    for value, word in [(0, 0), (1, 1), (-1, 0xFF), (127, 0x7F), (-128, 0x80), (-16, 0xF0), (63, 0x3F)]:
        assert regs_mod.encode(shift, value) == word
        assert regs_mod.decode(shift, word) == value
    # only the register's bits of a bus word count
    assert regs_mod.decode(shift, 0xFFFF_FFF0) == -16
    assert regs_mod.decode(shift, 0x1234_5605) == 5
    for value in range(-128, 128):
        assert regs_mod.decode(shift, regs_mod.encode(shift, value)) == value


@pytest.mark.parametrize("name,bad", [("SHIFT", 128), ("SHIFT", -129), ("SIZE_A", -1), ("SIZE_A", 1 << 16),
                                      ("LRT_SIDE", 2), ("LRT_COLS", 256), ("LRT_RECIP", 1 << 16),
                                      ("OP", -1)])
def test_encode_range_errors(name, bad):
    reg = register(name)
    with pytest.raises(ValueError, match=name):
        regs_mod.encode(reg, bad)


def test_encode_decode_unsigned():
    reg = register("SIZE_A")
    assert regs_mod.encode(reg, 65535) == 0xFFFF
    assert regs_mod.decode(reg, 0xFFFF) == 65535                 # unsigned: no sign extension
    assert regs_mod.decode(register("CYCLES"), 0xFFFF_FFFF) == (1 << 32) - 1
    assert regs_mod.encode(register("LRT_SIDE"), 1) == 1


def test_registers_through_the_twin(acc):
    r = acc.regs
    assert r.read("ID") == ID_VALUE and r.read("VERSION") == VERSION
    for value in (-16, -1, 0, 63, 127, -128):
        r.write("SHIFT", value)
        assert r.read("SHIFT") == value
    r.write("SIZE_B", 65535)
    assert r.read("SIZE_B") == 65535
    with pytest.raises(ValueError, match="SHIFT"):
        r.write("SHIFT", 200)
    with pytest.raises(ValueError, match="read-only"):
        r.write("CYCLES", 1)
    with pytest.raises(ValueError, match="write-only"):
        r.read("CTRL")
    with pytest.raises(KeyError):
        r.read("NO_SUCH")
    with pytest.raises(KeyError, match="field"):
        r.field("STATUS", "NOPE")
    assert r.read("CAP_PE2_B_MAX") == P.pe2_b_max
    dump = r.dump()
    assert "CTRL" not in dump and dump["ID"] == ID_VALUE
    line = regs_mod.format_dump(dump)
    assert "ID=0x696e7369" in line and "STATUS=IDLE" in line


def test_format_dump_names_codes_and_status_bits():
    line = regs_mod.format_dump({"STATUS": 0b101, "ERROR_CODE": 5, "CYCLES": 300, "OP": 3})
    assert line == "STATUS=BUSY|ERROR ERROR_CODE=TILE CYCLES=0x12c OP=3"


# ------------------------------------------------------------------------------------ streams in error

def test_stream_errors_and_abort(acc):
    """STREAM_SHORT, STREAM_LONG and ABORTED, by driving the registers and the DMA by hand; the
    driver's next op is right."""
    rng = np.random.default_rng(12)
    cfg = PEConfig("PE1", 9, 2, 16, 3, 2)
    lhs, rhs = random_operands(rng, cfg)
    words = pe_stream.stream_in(cfg, lhs, rhs)
    r, dma = acc.regs, acc.dma
    buf = acc._buffer("in", words.size + 8)
    out = acc._buffer("out", cfg.out_words())
    buf[:words.size] = words
    buf[words.size:words.size + 8] = 1

    def attempt(nbytes):
        r.configure(OP=1, **tt_registers(cfg))
        r.command("START")
        assert r.read("STATUS") == 0b001
        dma.recvchannel.transfer(out, 0, cfg.out_words() * 2)
        if nbytes:
            dma.sendchannel.transfer(buf, 0, nbytes)
        status = r.read("STATUS")
        code = ErrorCode(r.read("ERROR_CODE"))
        acc._reset_dma()
        return status, code

    assert attempt(words.size * 2 - BEAT_BYTES) == (0b100, ErrorCode.STREAM_SHORT)
    assert attempt(words.size * 2 + BEAT_BYTES) == (0b100, ErrorCode.STREAM_LONG)
    r.configure(OP=1, **tt_registers(cfg))
    r.command("START")
    r.command("ABORT")
    assert (r.read("STATUS"), r.read("ERROR_CODE")) == (0b100, ErrorCode.ABORTED)
    r.command("ABORT")                                           # ignored while idle
    assert (r.read("STATUS"), r.read("ERROR_CODE")) == (0b100, ErrorCode.ABORTED)
    acc._reset_dma()
    got = acc.run(Op.PE1, words, **tt_registers(cfg))
    np.testing.assert_array_equal(got, pe_stream.reference_stream_out(cfg, lhs, rhs))


def test_start_while_busy_is_ignored(acc):
    cfg = PEConfig("PE3", 2, 5, 16, 1, 3)
    r = acc.regs
    r.configure(OP=3, **tt_registers(cfg))
    r.command("START")
    r.configure(SIZE_A=7)                                        # frozen while busy
    r.command("START")
    assert r.read("STATUS") == 0b001 and r.read("SIZE_A") == 2
    r.command("ABORT")
    acc._reset_dma()


# ------------------------------------------------------------------------------------ AXI DMA model

def _started_dma(memory):
    dma = AxiDmaModel(memory)
    dma.write(AxiDmaModel.CR, 1)
    dma.write(AxiDmaModel.S2MM + AxiDmaModel.CR, 1)
    return dma


def test_dma_model_moves_beats_from_a_live_buffer():
    memory = DeviceMemory()
    buf = memory.allocate(None, (32,), np.int16)
    buf[:] = np.arange(-16, 16)
    dma = _started_dma(memory)
    dma.write(AxiDmaModel.ADDR, buf.device_address)
    dma.write(AxiDmaModel.LENGTH, 64)
    assert dma.read(AxiDmaModel.SR) & 0x73 == 0                    # running, busy, no error
    assert dma.input_beats() == 4
    words, last = dma.pop_input(3)
    np.testing.assert_array_equal(words, np.arange(-16, 8))
    assert not last
    words, last = dma.pop_input(3)
    np.testing.assert_array_equal(words, np.arange(8, 16))
    assert last and dma.read(AxiDmaModel.SR) & 0x1002 == 0x1002    # idle, IOC_Irq
    dma.write(AxiDmaModel.SR, 0x1000)
    assert not dma.read(AxiDmaModel.SR) & 0x1000


@pytest.mark.parametrize("channel", ["MM2S", "S2MM"])
def test_dma_model_decode_error_for_an_address_without_buffer(channel):
    memory = DeviceMemory()
    buf = memory.allocate(None, (64,), np.int16)
    dma = _started_dma(memory)
    base = 0 if channel == "MM2S" else AxiDmaModel.S2MM
    for address, nbytes in [(0x7000_0000, 64), (buf.device_address + 64, 128),   # runs past the end
                            (buf.device_address - 4096, 16)]:
        dma.write(base + AxiDmaModel.CR, 4)                                      # soft reset
        dma.write(base + AxiDmaModel.CR, 1)
        dma.write(base + AxiDmaModel.ADDR, address)
        dma.write(base + AxiDmaModel.LENGTH, nbytes)
        sr = dma.read(base + AxiDmaModel.SR)
        assert sr & AxiDmaModel.DECODE_ERROR, hex(sr)                             # DMADecErr
        assert sr & 1                                                             # halted
        assert dma.input_beats() == 0 and dma.output_room() == 0


def test_dma_model_decode_error_for_a_freed_buffer():
    memory = DeviceMemory()
    buf = memory.allocate(None, (64,), np.int16)
    address = buf.device_address
    assert memory.view(address, 128) is not None
    del buf
    gc.collect()
    assert memory.view(address, 16) is None
    dma = _started_dma(memory)
    dma.write(AxiDmaModel.ADDR, address)
    dma.write(AxiDmaModel.LENGTH, 16)
    assert dma.read(AxiDmaModel.SR) & AxiDmaModel.DECODE_ERROR


@pytest.mark.parametrize("nbytes", [0, 8, 24])
def test_dma_model_internal_error_for_partial_beats(nbytes):
    memory = DeviceMemory()
    buf = memory.allocate(None, (64,), np.int16)
    dma = _started_dma(memory)
    dma.write(AxiDmaModel.ADDR, buf.device_address)
    dma.write(AxiDmaModel.LENGTH, nbytes)
    assert dma.read(AxiDmaModel.SR) & 0x71 == AxiDmaModel.INTERNAL_ERROR | 1


def _bogus_buffer(acc):
    """A PynqBuffer whose device address is outside the twin's DDR buffers."""
    return PynqBuffer((8192,), np.int16, buffer=np.zeros(16384, np.uint8), device=acc.device,
                      device_address=0x7000_0000, bo=0, coherent=False)


def _dmasr(message, channel):
    return int(re.search(rf"{channel}_DMASR=(0x[0-9a-f]+)", message).group(1), 16)


@pytest.mark.parametrize("role,channel", [("in", "MM2S"), ("out", "S2MM")])
def test_driver_on_a_dma_decode_error_raises_within_its_timeout(overlay, role, channel):
    """What happens: the DMA halts with DMADecErr, and the driver raises an AcceleratorError whose
    register dump shows the DMA status: the DMA's error as soon as it polls it, or at the latest
    the timeout of its deadline, never an endless poll; the next op runs."""
    acc = open_board(BOARD, mode="fast", bitstream=overlay, timeout_s=0.5)
    cfg = PEConfig("PE1", 5, 3, 16, 4, 2)
    lhs, rhs = random_operands(np.random.default_rng(1), cfg)
    words = pe_stream.stream_in(cfg, lhs, rhs)
    acc.buffers[role] = _bogus_buffer(acc)
    with pytest.raises(AcceleratorError) as info:
        acc.run(Op.PE1, words, **tt_registers(cfg))
    message = str(info.value)
    assert "the AXI DMA reported an error" in message or "timed out after 0.5 s" in message, message
    assert _dmasr(message, channel) & AxiDmaModel.DECODE_ERROR, message
    assert "Registers:" in message and "PE1" in message
    del acc.buffers[role]
    np.testing.assert_array_equal(acc.run(Op.PE1, words, **tt_registers(cfg)),
                                  pe_stream.reference_stream_out(cfg, lhs, rhs))


def test_driver_reports_a_dma_decode_error_promptly(overlay):
    acc = open_board(BOARD, mode="fast", bitstream=overlay, timeout_s=1.0)
    cfg = PEConfig("PE1", 5, 3, 16, 4, 2)
    lhs, rhs = random_operands(np.random.default_rng(1), cfg)
    acc.buffers["in"] = _bogus_buffer(acc)
    with pytest.raises(AcceleratorError) as info:
        acc.run(Op.PE1, pe_stream.stream_in(cfg, lhs, rhs), **tt_registers(cfg))
    # Promptly: the DMA's error as the driver polls it, not the timeout of its deadline.
    assert not isinstance(info.value, AcceleratorTimeout)
    assert "timed out" not in str(info.value) and "the AXI DMA reported an error" in str(info.value)
    assert "DMA" in str(info.value).split("Registers:")[0]
