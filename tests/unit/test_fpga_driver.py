"""The PYNQ driver (`insitu.fpga.driver`) on the fast twin: errors and bad input.

A refused configuration, a stalled DMA (deadline, register dump, no endless poll), overlays of
another register map or without their .hwh, a real board here (no PYNQ device), what
`pynq.Overlay` hands out, and `pynq.allocate` on the twin's DDR.
"""

import re
import time

import numpy as np
import pynq
import pynq.lib.dma
import pytest

from insitu.boards import accelerator_params, get_board, pl_clock_hz
from insitu.errors import UsageError
from insitu.fpga import boards as fpga_boards
from insitu.fpga import twin as fpga_twin
from insitu.fpga.boards import open_board, twin_overlay_dir
from insitu.fpga.driver import (Accelerator, AcceleratorError, AcceleratorTimeout, BitstreamError,
                                InsituAcceleratorIP, InsituOverlay, overlay_clock_hz)
from insitu.fpga.twin import TwinDevice, write_twin_overlay
from insitu.accel.params import IP_VLNV
from insitu.accel.regmap import ID_VALUE, VERSION, ErrorCode, Op
from insitu.tt import pe_stream
from insitu.tt.pe_stream import PEConfig

pytestmark = pytest.mark.unit

SIM = get_board("ultra96v2-sim")


@pytest.fixture(scope="module")
def overlay(tmp_path_factory):
    return write_twin_overlay(SIM.twin_of, tmp_path_factory.mktemp("overlay"))


@pytest.fixture
def acc(overlay):
    return open_board(SIM, mode="fast", bitstream=overlay, timeout_s=2.0)


def regs_of(cfg):
    return dict(SIZE_A=cfg.a, SIZE_B=cfg.b, SIZE_C=cfg.c, SIZE_D=cfg.d, SHIFT=cfg.shift)


def operands(cfg, seed=0):
    rng = np.random.default_rng(seed)
    a, b, c, d = cfg.a, cfg.b, cfg.c, cfg.d
    if cfg.kind == "PE1":
        return rng.integers(-3000, 3000, (a, b, c)), rng.integers(-8, 8, (b, d, c))
    if cfg.kind == "PE2":
        return rng.integers(-3000, 3000, (a, b, c)), rng.integers(-8, 8, (b, d))
    return rng.integers(-3000, 3000, (a, b)), rng.integers(-3000, 3000, (a // d, b, 16))


GOOD = PEConfig("PE1", 5, 3, 16, 4, shift=2)


def run_good(acc, cfg=GOOD, seed=0):
    lhs, rhs = operands(cfg, seed)
    out = acc.run(Op(cfg.op), pe_stream.stream_in(cfg, lhs, rhs), **regs_of(cfg))
    np.testing.assert_array_equal(out, pe_stream.reference_stream_out(cfg, lhs, rhs))
    return out


# ------------------------------------------------------------------------------------ refused ops

#: (op, registers, the code in the message)
REFUSED = [
    (Op.PE1, dict(SIZE_A=5, SIZE_B=3, SIZE_C=8, SIZE_D=4, SHIFT=2), "C_LANES"),
    (Op.PE1, dict(SIZE_A=0, SIZE_B=3, SIZE_C=16, SIZE_D=4, SHIFT=0), "ZERO_SIZE"),
    (Op.PE2, dict(SIZE_A=1, SIZE_B=513, SIZE_C=16, SIZE_D=1, SHIFT=0), "TILE"),
    (Op.PE1, dict(SIZE_A=1, SIZE_B=1, SIZE_C=16, SIZE_D=257, SHIFT=0), "FACTOR_WORDS"),
    (Op.PE3, dict(SIZE_A=5, SIZE_B=3, SIZE_C=16, SIZE_D=2, SHIFT=0), "BLOCK"),
    (Op.PE2, dict(SIZE_A=1, SIZE_B=1, SIZE_C=16, SIZE_D=1, SHIFT=64), "SHIFT"),
    (Op.LRT_LOAD_WEIGHTS, dict(LRT_ROWS_L=0, LRT_ROWS_R=3), "ZERO_SIZE"),
    (Op.LRT_READ_BASIS, dict(LRT_SIDE=1, LRT_ROWS_L=3, LRT_ROWS_R=300), "LRT_SIZE"),
    (Op.LRT_APPEND, dict(LRT_SIDE=0, LRT_ROWS_L=3, LRT_COLS=2, SHIFT=-17), "SHIFT"),
]


@pytest.mark.parametrize("op,registers,code", REFUSED, ids=[f"{o.name}-{c}" for o, _, c in REFUSED])
def test_refused_config_raises_with_code_and_register_dump(acc, op, registers, code):
    run_good(acc)
    with pytest.raises(AcceleratorError) as info:
        acc.run(op, None, **registers)
    message = str(info.value)
    assert not isinstance(info.value, AcceleratorTimeout)
    assert message.startswith(f"{op.name} refused its configuration: {code}."), message
    assert f"ERROR_CODE={code}" in message and "STATUS=ERROR" in message
    assert "Registers:" in message and "MM2S_DMASR=" in message and "S2MM_DMASR=" in message
    for name, value in registers.items():                       # the dump has what was written
        shown = f"{value:#x}" if value > 9 else str(value)
        if name != "SHIFT":
            assert f"{name}={shown}" in message, (name, message)
    assert acc.read("ERROR_CODE") == ErrorCode[code]
    # the next op still works, and the one after with other sizes
    run_good(acc, seed=1)
    run_good(acc, PEConfig("PE2", 2, 5, 32, 3, 1), seed=2)


def test_refused_config_with_its_stream_raises_accelerator_error(acc):
    cfg = PEConfig("PE1", 5, 3, 8, 4, shift=2)
    lhs, rhs = operands(cfg)
    with pytest.raises(AcceleratorError, match="C_LANES"):
        acc.run(Op.PE1, pe_stream.stream_in(cfg, lhs, rhs), **regs_of(cfg))


def test_bad_input_streams_are_refused_before_start(acc):
    lhs, rhs = operands(GOOD)
    words = pe_stream.stream_in(GOOD, lhs, rhs)
    with pytest.raises(ValueError, match="whole beats"):
        acc.run(Op.PE1, words[:-3], **regs_of(GOOD))
    with pytest.raises(ValueError, match=f"expects {GOOD.in_beats()} input beats"):
        acc.run(Op.PE1, words[:-8], **regs_of(GOOD))
    with pytest.raises(ValueError):
        acc.run(99, words, **regs_of(GOOD))                      # not an Op
    with pytest.raises(ValueError, match="SHIFT"):
        acc.run(Op.PE1, words, **{**regs_of(GOOD), "SHIFT": 300})  # does not fit the register
    assert acc.ops.total() == 0                                  # nothing ran
    run_good(acc)
    assert acc.ops == {"PE1": 1}


# ------------------------------------------------------------------------------------ timeouts

def test_stalled_dma_times_out_with_a_register_dump(overlay):
    acc = open_board(SIM, mode="fast", bitstream=overlay, timeout_s=0.5, fault="stall")
    lhs, rhs = operands(GOOD)
    words = pe_stream.stream_in(GOOD, lhs, rhs)
    for attempt in range(2):                                     # and again: no state left hanging
        t0 = time.monotonic()
        with pytest.raises(AcceleratorTimeout) as info:
            acc.run(Op.PE1, words, **regs_of(GOOD))
        # By its deadline (a 0.5 s timeout cannot end sooner), not by an endless poll: it returned.
        assert time.monotonic() - t0 >= 0.5
        message = str(info.value)
        assert "timed out after 0.5 s" in message
        assert "Registers:" in message and "STATUS=BUSY" in message
        assert f"IN_BEATS={GOOD.in_beats():#x}" in message and "BEATS_DONE_IN=0" in message
        assert re.search(r"MM2S_DMASR=0x[0-9a-f]+ S2MM_DMASR=0x[0-9a-f]+", message)
        # the driver aborted the op: the accelerator is idle, in ERROR with ABORTED
        assert acc.read("STATUS") == 0b100
        assert acc.read("ERROR_CODE") == ErrorCode.ABORTED
    assert isinstance(info.value, AcceleratorError)
    # an op without streams still runs on the stalled board
    out = acc.run(Op.LRT_APPEND, None, LRT_SIDE=0, LRT_ROWS_L=4, LRT_ROWS_R=4, LRT_COLS=0,
                  LRT_RECIP=1, SHIFT=0)
    assert out.size == 0 and acc.read("STATUS") == 0b010


def test_default_timeout_of_a_fast_twin(overlay):
    acc = open_board(SIM, mode="fast", bitstream=overlay)
    assert 0 < acc.timeout_s <= 60


# ------------------------------------------------------------------------------------ bitstreams

def _never_built(*args, **kwargs):
    """Stands in for slow work (an RTL model, an overlay) that a refusal comes before."""
    raise AssertionError("the slow work of a refused configuration was started")


@pytest.mark.parametrize("mode", ["fast", "rtl"])
def test_overlay_of_another_register_map_is_refused(tmp_path, mode, monkeypatch):
    other = VERSION ^ 0x0101_0000
    bit = write_twin_overlay(SIM.twin_of, tmp_path, version=other)
    # Refused before the slow work: the RTL is never compiled or simulated for it.
    for name in fpga_twin.RTL_MODELS:
        monkeypatch.setitem(fpga_twin.RTL_MODELS, name, _never_built)
    with pytest.raises(BitstreamError) as info:
        open_board(SIM, mode=mode, bitstream=bit)
    message = str(info.value)
    assert f"{other:#010x}" in message and f"{VERSION:#010x}" in message, message
    assert str(bit) in message
    assert info.value.exit_code == 2 and BitstreamError.exit_code == 2


def test_bit_without_its_hwh_is_refused(tmp_path):
    bit = write_twin_overlay(SIM.twin_of, tmp_path)
    bit.with_suffix(".hwh").unlink()
    with pytest.raises(BitstreamError, match=r"\.hwh is missing") as info:
        open_board(SIM, bitstream=bit)
    assert info.value.exit_code == 2
    with pytest.raises(BitstreamError, match=r"\.hwh"):
        InsituOverlay(bit, device=TwinDevice(SIM.twin_of))


def test_missing_bit_is_refused(tmp_path):
    with pytest.raises(BitstreamError, match="missing"):
        open_board(SIM, bitstream=tmp_path / "nothing.bit")
    with pytest.raises(BitstreamError, match="missing"):
        open_board(get_board("ultra96v2"), bitstream=tmp_path / "nothing.bit")


def test_a_vivado_bitstream_on_a_twin_is_refused(tmp_path):
    bit = write_twin_overlay(SIM.twin_of, tmp_path)
    bit.write_bytes(b"\x00\x09\x0f\xf0\x0f\xf0\x0f\xf0\x0f\xf0\x00\x00\x01a" + bytes(200))
    with pytest.raises(BitstreamError, match="not a twin overlay"):
        open_board(SIM, bitstream=bit)


def test_real_board_without_bitstream_is_a_usage_error():
    with pytest.raises(UsageError, match="--bitstream") as info:
        open_board(get_board("ultra96v2"))
    assert not isinstance(info.value, BitstreamError)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("board", ["ultra96v2", "zedboard"])
def test_real_board_with_bitstream_off_the_board_is_a_quick_usage_error(tmp_path, board, monkeypatch):
    """On this x86 machine there is no PYNQ device: a clear UsageError, before any overlay is
    loaded (the seconds it took are printed)."""
    bit = write_twin_overlay(board, tmp_path)
    # Refused by pynq's probe for a device, before any overlay is read or loaded.
    monkeypatch.setattr(fpga_boards, "InsituOverlay", _never_built)
    t0 = time.monotonic()
    with pytest.raises(UsageError) as info:
        open_board(get_board(board), bitstream=bit)
    elapsed = time.monotonic() - t0
    print(f"\n{board} with a bitstream off the board: UsageError after {elapsed:.3f} s")
    assert "no PYNQ board here" in str(info.value)
    assert not isinstance(info.value, BitstreamError)
    assert "-sim" in str(info.value)                              # says what to do instead


def test_non_fpga_board_and_unknown_mode_are_usage_errors(overlay):
    with pytest.raises(UsageError, match="not an FPGA board"):
        open_board(get_board("stm32f746-disco-sim"))
    with pytest.raises(UsageError, match="unknown twin mode"):
        open_board(SIM, mode="gate-level", bitstream=overlay)


def test_open_board_writes_its_overlay_in_the_cache(insitu_cache):
    acc = open_board(get_board("zedboard-sim"))
    folder = twin_overlay_dir() / "zedboard-sim"
    assert folder == insitu_cache / "overlays" / "zedboard-sim"
    assert sorted(p.name for p in folder.iterdir()) == ["insitu_zedboard.bit", "insitu_zedboard.hwh"]
    assert acc.device.board == "zedboard" and acc.clock_hz == get_board("zedboard-sim").fpga["pl_clock_hz"]
    run_good(acc)


# ------------------------------------------------------------------------------------ the overlay

def test_overlay_hands_out_the_accelerator_and_the_dma(acc):
    ov = acc.overlay
    assert isinstance(ov, pynq.Overlay)
    assert isinstance(ov.insitu_accel_0, InsituAcceleratorIP)
    assert isinstance(ov.axi_dma_0, pynq.lib.dma.DMA)
    assert ov.accel is ov.insitu_accel_0 and ov.dma is ov.axi_dma_0
    assert ov.ip_dict["insitu_accel_0"]["type"] == IP_VLNV
    assert "axi_dma" in ov.ip_dict["axi_dma_0"]["type"]
    accel_base = ov.ip_dict["insitu_accel_0"]["phys_addr"]
    dma_base = ov.ip_dict["axi_dma_0"]["phys_addr"]
    assert accel_base != dma_base
    # the IP's registers by name, and by address through pynq.MMIO
    assert ov.insitu_accel_0.regs.read("ID") == ID_VALUE
    assert ov.insitu_accel_0.read(0x04) == VERSION
    assert pynq.MMIO(accel_base, 0x1000, device=acc.device).read(0x00) == ID_VALUE
    assert isinstance(acc.device, TwinDevice) and acc.device.has_capability("REGISTER_RW")


def test_an_access_outside_every_window_is_an_error(acc):
    with pytest.raises(RuntimeError, match="no IP at address"):
        acc.device.read_registers(0x1234_0000, 4)


def test_allocate_on_the_twin_gives_distinct_device_addresses(acc):
    device = acc.device
    bufs = [pynq.allocate((n,), dtype=dt, target=device)
            for n, dt in [(100, np.int16), (4096, np.int16), (1, np.uint8), (3000, np.int32), (8, np.int16)]]
    spans = sorted((b.device_address, b.device_address + b.nbytes) for b in bufs)
    assert len({b.device_address for b in bufs}) == len(bufs)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))      # no overlap
    assert all(b.device_address % 4096 == 0 for b in bufs)
    assert all(b.physical_address == b.device_address for b in bufs)
    # what the DMA sees at a buffer's address is the buffer
    bufs[1][:] = np.arange(4096)
    seen = device.memory.view(bufs[1].device_address + 20, 8).view("<i2")
    np.testing.assert_array_equal(seen, [10, 11, 12, 13])


def test_figures_count_ops_cycles_and_bytes(acc):
    run_good(acc)
    cfg = PEConfig("PE3", 4, 9, 16, 2, 5)
    run_good(acc, cfg)
    fig = acc.figures()
    assert fig["ops"] == {"PE1": 1, "PE3": 1}
    params = accelerator_params(SIM)          # the twin's board's design (PE3: 2 batch lanes)
    assert fig["cycles_by_op"] == {"PE1": pe_stream.estimated_cycles(GOOD, params),
                                   "PE3": pe_stream.estimated_cycles(cfg, params)}
    assert fig["dma_bytes"] == 2 * sum(c.in_words() + c.out_words() for c in (GOOD, cfg))
    assert fig["seconds_at_board_clock"] == pytest.approx(fig["pl_cycles"] / fig["pl_clock_hz"])
    assert fig["pl_clock_hz"] == pl_clock_hz(SIM) and fig["pl_clock_source"] == "board file"


@pytest.mark.parametrize("name", ["ultra96v2-sim", "zedboard-sim"])
def test_twin_seconds_are_cycles_at_its_board_clock(name, tmp_path):
    """Each twin runs its board's design (parameters in its overlay) and reports seconds at its
    board's pl_clock_hz (Ultra96-V2 200 MHz, ZedBoard 125 MHz); its .hwh records the same clock."""
    board = get_board(name)
    bit = write_twin_overlay(board.twin_of, tmp_path)
    acc = open_board(board, mode="fast", bitstream=bit, timeout_s=2.0)
    cfg = PEConfig("PE3", 4, 9, 16, 2, 5)
    run_good(acc, cfg)
    run_good(acc)
    fig = acc.figures()
    clock = {"ultra96v2-sim": 200_000_000, "zedboard-sim": 125_000_000}[name]
    assert fig["pl_clock_hz"] == clock == pl_clock_hz(board)
    assert fig["seconds_at_board_clock"] == fig["pl_cycles"] / clock
    params = accelerator_params(board)
    assert acc.device.pl.params == params
    assert fig["cycles_by_op"]["PE3"] == pe_stream.estimated_cycles(cfg, params)
    assert acc.read("CAP_PE3_B_MAX") == params.pe3_b_max
    # The overlay's .hwh carries the clock (what a real board's driver reads).
    assert overlay_clock_hz(acc.overlay) == clock
    # Read from the overlay when no clock is given.
    assert Accelerator(acc.overlay, clock_hz=None).clock_hz == clock


def test_the_twins_differ_in_pe3_cycles_as_their_designs_do(tmp_path):
    """The same PE3 op: the Ultra96-V2's design (two batch entries a step) takes fewer cycles."""
    cfg = PEConfig("PE3", 4, 64, 16, 2, 5)
    cycles = {}
    for name in ("ultra96v2-sim", "zedboard-sim"):
        board = get_board(name)
        acc = open_board(board, mode="fast", bitstream=write_twin_overlay(board.twin_of, tmp_path / name))
        run_good(acc, cfg)
        cycles[name] = acc.figures()["cycles_by_op"]["PE3"]
    assert cycles["ultra96v2-sim"] < cycles["zedboard-sim"]


@pytest.mark.parametrize("mode", ["rtl", "rtl-amaranth"])
@pytest.mark.parametrize("name", ["ultra96v2-sim", "zedboard-sim"])
def test_the_rtl_twins_are_built_with_the_board_design(name, mode, tmp_path, monkeypatch):
    """The RTL models (compiled, Amaranth) get the board's parameters and clock from the twin
    overlay (recorded here, not built: a build is minutes)."""
    built = []

    class Recorded(Exception):
        pass

    def record(params, clock_hz=None):
        built.append((params, clock_hz))
        raise Recorded

    monkeypatch.setitem(fpga_twin.RTL_MODELS, mode, record)
    board = get_board(name)
    with pytest.raises(Recorded):
        open_board(board, mode=mode, bitstream=write_twin_overlay(board.twin_of, tmp_path))
    assert built == [(accelerator_params(board), pl_clock_hz(board))]


def test_a_real_board_reads_its_clock_from_the_overlay_hwh(tmp_path, monkeypatch):
    """board_clock on a real board: the PS's running clock where pynq reads it, else the .hwh's
    achieved rate (as Vivado writes it), else the board file's."""
    board = get_board("ultra96v2")

    class Overlay:
        bitfile_name = str(tmp_path / "insitu_ultra96v2.bit")
        clock_dict = {0: {"enable": 1, "divisor0": 8, "divisor1": 1}}      # pynq 3.0: no rate

    from insitu.fpga import hwh
    hwh.write_hwh("ultra96v2", tmp_path / "insitu_ultra96v2.hwh", clock_hz=187_500_000)
    assert fpga_boards.board_clock(board, Overlay()) == (187_500_000, "hwh")
    monkeypatch.setattr(fpga_boards, "running_pl_clock_hz", lambda: 199_998_000)
    assert fpga_boards.board_clock(board, Overlay(), running=True) == (199_998_000, "PS clock registers")
    monkeypatch.setattr(fpga_boards, "running_pl_clock_hz", lambda: None)
    Overlay.clock_dict = {0: {"enable": 1, "frequency": 199.998001}}     # newer pynqmetadata
    assert fpga_boards.board_clock(board, Overlay(), running=True) == (199_998_001, "hwh")
    Overlay.clock_dict = {0: {"enable": 1}}
    (tmp_path / "insitu_ultra96v2.hwh").write_text("<EDKSYSTEM/>")
    assert fpga_boards.board_clock(board, Overlay()) == (200_000_000, "board file")
    # a twin is its board's clock whatever its overlay says
    assert fpga_boards.board_clock(get_board("ultra96v2-sim"), Overlay()) == (200_000_000, "board file")


def test_registers_are_written_only_when_they_change(acc, monkeypatch):
    run_good(acc)
    writes = []
    real = acc.regs.write
    monkeypatch.setattr(acc.regs, "write", lambda name, value: (writes.append(name), real(name, value)))
    run_good(acc, seed=3)                                         # same sizes: nothing rewritten
    assert writes == []
    run_good(acc, PEConfig("PE1", 6, 3, 16, 4, shift=2))
    assert writes == ["SIZE_A"]
