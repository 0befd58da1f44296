"""`insitu.fpga.hwh`: the block design's .hwh, read back by pynq's own parsers and drivers.

pynq picks ``HWH`` by the CPU it runs on: on x86 it is the bare base class (it cannot parse any
file), so each board's file is parsed here with the class ``HWH`` names on that board's CPU
(``_HWHUltrascale`` on the Ultra96-V2, ``_HWHZynq`` on the ZedBoard).
"""

import re
from xml.etree import ElementTree as ET

import pytest

from insitu.fpga import hwh
from insitu.accel import ip
from insitu.rtl import vivado
from insitu.accel.params import IP_VLNV
from insitu.boards import pl_clock_hz
from insitu.accel.regmap import ID_VALUE, REGISTERS
from insitu.accel.ip import (ACCEL_CELL, ADDRESS_SPAN, DMA_CELL, DMA_LENGTH_BITS, INTC_CELL,
                             bitstream_name)
from insitu.rtl.vivado import address_map, board_design

pytestmark = pytest.mark.unit

hwh_parser = pytest.importorskip("pynq.pl_server.hwh_parser")
BOARDS = sorted(vivado.BOARD_DESIGNS)
ACCESS = {"rw": "read-write", "ro": "read-only", "wo": "write-only"}


def parse(board, path):
    """pynq's HWH parser of the board's processing system."""
    ps = board_design(board).ps
    cls = next(c for c in (hwh_parser._HWHUltrascale, hwh_parser._HWHZynq) if c.family_ps == ps)
    return cls(str(path))


class RegisterDevice:
    """What pynq.MMIO needs of a device that is not memory mapped: 32-bit register reads and
    writes (a twin serves these from its model)."""

    def __init__(self):
        self.words = {}
        self.writes = []

    def has_capability(self, cap):
        return cap == "REGISTER_RW"

    def read_registers(self, addr, length):
        return b"".join(self.words.get(addr + i, 0).to_bytes(4, "little")
                        for i in range(0, length, 4))

    def write_registers(self, addr, data):
        for i in range(0, len(data), 4):
            value = int.from_bytes(data[i:i + 4], "little")
            self.words[addr + i] = value
            self.writes.append((addr + i, value))


@pytest.fixture(params=BOARDS)
def board(request):
    return request.param


@pytest.fixture
def parsed(board, tmp_path):
    path = hwh.write_hwh(board, tmp_path / f"{bitstream_name(board)}.hwh")
    return parse(board, path)


def test_write_hwh_is_the_xml_written_atomically(board, tmp_path):
    path = hwh.write_hwh(board, tmp_path / "out" / "design.hwh")
    assert path == tmp_path / "out" / "design.hwh"
    assert path.read_text() == hwh.hwh_xml(board)
    assert [p.name for p in path.parent.iterdir()] == ["design.hwh"]      # no temporary left
    with pytest.raises(ValueError, match="no Vivado block design"):
        hwh.hwh_xml("pynq-z2")


def test_ip_dict_has_the_accelerator_and_the_dma_at_the_tcl_addresses(board, parsed):
    amap = address_map(board)
    assert set(parsed.ip_dict) == {ACCEL_CELL, DMA_CELL, board_design(board).ps_cell}
    accel = parsed.ip_dict[ACCEL_CELL]
    assert accel["type"] == IP_VLNV
    assert (accel["phys_addr"], accel["addr_range"]) == (amap["accel_base"], ADDRESS_SPAN)
    assert accel["interrupts"] == {} and accel["mem_id"] == ip.AXIL_BUSIF
    dma = parsed.ip_dict[DMA_CELL]
    assert dma["type"].startswith("xilinx.com:ip:axi_dma:")
    assert (dma["phys_addr"], dma["addr_range"]) == (amap["dma_base"], amap["dma_range"])
    assert dma["interrupts"] == {}                 # no controller: the driver polls
    assert parsed.interrupt_pins == {} and parsed.interrupt_controllers == {}
    # The DDR is the PS's own (pynq allocates it as PSDDR), as in a Vivado build's .hwh.
    assert parsed.mem_dict == {}


def test_dma_parameters_are_the_block_design_tcl_configuration(board, parsed):
    params = parsed.ip_dict[DMA_CELL]["parameters"]
    tcl = vivado.block_design_tcl(board)
    config = dict(re.findall(r"CONFIG\.(c_\w+) \{(\w+)\}", tcl))
    assert config and set(config) == set(hwh.DMA_CONFIG)
    for key, value in config.items():
        assert params[key] == value, key
    assert params["c_sg_length_width"] == str(DMA_LENGTH_BITS)


def test_accelerator_registers_are_the_register_map(parsed):
    regs = parsed.ip_dict[ACCEL_CELL]["registers"]
    assert list(regs) == [r.name for r in REGISTERS]
    for r in REGISTERS:
        entry = regs[r.name]
        assert (entry["address_offset"], entry["size"]) == (r.offset, 32)
        assert entry["access"] == ACCESS[r.access] and entry["description"] == r.doc
        fields = {f.name: (f.lsb, f.width) for f in r.fields} or {r.name: (0, r.width)}
        assert {k: (v["bit_offset"], v["bit_width"]) for k, v in entry["fields"].items()} == fields


def test_clock_dict_enables_fclk0_only(board, parsed):
    assert [parsed.clock_dict[i]["enable"] for i in range(4)] == [1, 0, 0, 0]
    assert parsed.ps_name == board_design(board).ps_cell


# The PS parameters of PL clock 0, per PS IP: requested MHz, achieved MHz, source, divisors.
CLOCK_PARAMS = {
    "zynq_ultra_ps_e": ("PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ", "PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ",
                        "PSU__CRL_APB__PL0_REF_CTRL__SRCSEL", "PSU__CRL_APB__PL0_REF_CTRL__DIVISOR0",
                        "PSU__CRL_APB__PL0_REF_CTRL__DIVISOR1"),
    "processing_system7": ("PCW_FPGA0_PERIPHERAL_FREQMHZ", "PCW_ACT_FPGA0_PERIPHERAL_FREQMHZ",
                           "PCW_FCLK0_PERIPHERAL_CLKSRC", "PCW_FCLK0_PERIPHERAL_DIVISOR0",
                           "PCW_FCLK0_PERIPHERAL_DIVISOR1"),
}


@pytest.mark.parametrize("board, mhz", [("ultra96v2", 200), ("zedboard", 125)])
def test_the_hwh_carries_the_board_clock(board, mhz, tmp_path):
    """FCLK0 asked and achieved at the board's pl_clock_hz, its divisors from a PLL the twin
    models, and the clock net's CLKFREQUENCY; read back by hwh_clock_hz and by pynq's parser."""
    assert pl_clock_hz(board) == mhz * 1_000_000
    path = hwh.write_hwh(board, tmp_path / "clock.hwh")
    root = ET.parse(path).getroot()
    design = board_design(board)
    ps = root.find(f"./MODULES/MODULE[@INSTANCE='{design.ps_cell}']")
    values = {p.get("NAME"): p.get("VALUE") for p in ps.iterfind("./PARAMETERS/PARAMETER")}
    want, act, src, div0, div1 = CLOCK_PARAMS[design.ps]
    assert float(values[want]) == mhz and float(values[act]) == mhz
    pll = dict(hwh.PS_PLLS[design.ps])[values[src]]
    assert pll / (int(values[div0]) * int(values[div1])) == mhz * 1_000_000
    freqs = {port.get("CLKFREQUENCY") for port in root.iter("PORT") if port.get("SIGIS") == "clk"}
    assert freqs == {str(mhz * 1_000_000)}
    assert hwh.hwh_clock_hz(path) == mhz * 1_000_000
    parsed = parse(board, path)
    assert (parsed.clock_dict[0]["divisor0"], parsed.clock_dict[0]["divisor1"]) == \
           (int(values[div0]), int(values[div1]))


def test_the_ultra96v2_clock_needs_another_pll_than_its_iopll():
    """1500 MHz / 200 MHz is no integer: the twin's ZU+ takes the first PLL that divides exactly,
    and reports the closest rate where none does."""
    assert hwh.pl_clock_divisors("zynq_ultra_ps_e", 200_000_000)[0] != "IOPLL"
    assert hwh.pl_clock_divisors("zynq_ultra_ps_e", 100_000_000) == ("IOPLL", 15, 1, 100_000_000)
    # 1000 MHz / 130 MHz: 8 gives 125 MHz, 7 gives 142.9 MHz; the closer one, not exact
    assert hwh.pl_clock_divisors("processing_system7", 130_000_000) == ("IO PLL", 8, 1, 125_000_000)


def test_hwh_clock_of_a_given_clock_and_of_files_without_one(tmp_path):
    path = hwh.write_hwh("zedboard", tmp_path / "z.hwh", clock_hz=100_000_000)
    assert hwh.hwh_clock_hz(path) == 100_000_000
    (tmp_path / "bad.hwh").write_text("<EDKSYSTEM><MODULES/></EDKSYSTEM>")
    assert hwh.hwh_clock_hz(tmp_path / "bad.hwh") is None
    (tmp_path / "junk.hwh").write_text("not xml")
    assert hwh.hwh_clock_hz(tmp_path / "junk.hwh") is None
    assert hwh.hwh_clock_hz(tmp_path / "missing.hwh") is None


def test_pynq_dma_driver_builds_simple_mode_channels(board, parsed):
    from pynq.lib.dma import DMA

    device = RegisterDevice()
    dma = DMA({**parsed.ip_dict[DMA_CELL], "device": device})
    assert dma.sendchannel is not None and dma.recvchannel is not None
    assert type(dma.sendchannel).__name__ == "_SDMAChannel"       # simple mode, not SG
    for channel in (dma.sendchannel, dma.recvchannel):
        assert channel._max_size == 2**DMA_LENGTH_BITS - 1
        assert channel._interrupt is None
    # Both channels were started through the DMA's registers (MM2S_DMACR, S2MM_DMACR).
    base = address_map(board)["dma_base"]
    assert (base + 0x00, 1) in device.writes and (base + 0x30, 1) in device.writes


def test_accelerator_register_map_reads_through_the_device(board, parsed):
    from pynq import DefaultIP

    device = RegisterDevice()
    base = address_map(board)["accel_base"]
    device.words[base] = ID_VALUE
    ip = DefaultIP({**parsed.ip_dict[ACCEL_CELL], "device": device})
    assert int(ip.register_map.ID) == ID_VALUE
    ip.register_map.OP = 3
    assert device.words[base + 0x18] == 3
    ip.register_map.CTRL.START = 1
    assert device.words[base + 0x08] == 1


def test_with_the_interrupt_controller(board, tmp_path):
    path = hwh.write_hwh(board, tmp_path / "irq.hwh", interrupt=True)
    parsed = parse(board, path)
    amap = address_map(board, interrupt=True)
    intc = parsed.ip_dict[INTC_CELL]
    assert (intc["phys_addr"], intc["addr_range"]) == (amap["intc_base"], amap["intc_range"])
    assert set(parsed.interrupt_controllers) == {INTC_CELL}
    assert parsed.interrupt_controllers[INTC_CELL]["parent"] == ""
    irqs = {name: (v["controller"], v["index"]) for name, v in parsed.ip_dict[DMA_CELL]
            ["interrupts"].items()}
    assert irqs == {"mm2s_introut": (INTC_CELL, 1), "s2mm_introut": (INTC_CELL, 2)}
    assert parsed.ip_dict[ACCEL_CELL]["interrupts"]["interrupt"]["index"] == 0


@pytest.mark.parametrize("interrupt", [False, True])
def test_pynqmetadata_reads_the_same_design(board, tmp_path, interrupt):
    """pynqmetadata is what pynq.Overlay parses a full bitstream's .hwh with on a board."""
    frontends = pytest.importorskip("pynqmetadata.frontends")
    from pynqmetadata.views.runtime import RuntimeMetadataParser

    path = hwh.write_hwh(board, tmp_path / "md.hwh", interrupt=interrupt)
    md = RuntimeMetadataParser(frontends.Metadata(input=str(path)))
    ref = parse(board, path)
    assert set(md.ip_dict) == set(ref.ip_dict)
    for name, entry in ref.ip_dict.items():
        if name == ref.ps_name:
            continue
        got = md.ip_dict[name]
        for key in ("type", "phys_addr", "addr_range", "parameters"):
            assert got[key] == entry[key], (name, key)
        assert set(got["interrupts"]) == set(entry["interrupts"])
        regs = {k: (v["address_offset"], v["access"]) for k, v in entry["registers"].items()}
        assert {k: (v["address_offset"], v["access"]) for k, v in got["registers"].items()} == regs
    assert md.mem_dict == {}
    assert md.clock_dict[0]["enable"] == 1
    if "frequency" in md.clock_dict[0] and board_design(board).ps == "zynq_ultra_ps_e":
        # newer pynqmetadata reads the achieved rate (on ZU+ only): the board's clock
        assert md.clock_dict[0]["frequency"] == pl_clock_hz(board) / 1e6
