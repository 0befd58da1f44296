"""`insitu.rtl.generate` and the Vivado Tcl: files, consistency with the Verilog, atomic writes.

The PEs and the top level are replaced by small stand-ins with the same Verilog-facing ports (the
stand-in top holds the real register file), so these tests are fast and independent of the PEs.
The Tcl is run under ``tclsh`` against a mock of Vivado's commands: every script must parse and
run end to end, and every accelerator pin, port and address it names is checked.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from amaranth.hdl import ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from insitu.boards import accelerator_params, load_boards, pl_clock_hz
from insitu.errors import InsituError, UsageError
from insitu.accel import ip
from insitu.rtl import generate as gen
from insitu.accel import regmap
from insitu.rtl import vivado
from insitu.rtl.axil import AXILiteRegisters, AXILiteSignature
from insitu.rtl.timing import EXCEPTIONS
from insitu.accel.params import DEFAULT_PARAMS, IP_VLNV, STREAM_BITS, TOP_MODULE
from insitu.accel.regmap import ADDR_BITS, REGISTERS, VERSION

pytestmark = pytest.mark.unit


# ---- stand-ins -------------------------------------------------------------------------------


class StubPE(wiring.Component):
    a: In(8)
    b: Out(8)

    def __init__(self, params):
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.b.eq(self.a + 1)
        return m


class StubTop(wiring.Component):
    """The Vivado-facing ports of the contract around the real register file and a stream loop."""

    def __init__(self, params, interrupt=False, drop=(), extra=None):
        ports = vivado.top_ports(interrupt)
        members = {name: (In if d == "input" else Out)(w) for name, (d, w) in ports.items()
                   if name not in drop}
        members.update(extra or {})
        self.params = params
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain("sync")
        m.d.comb += [ClockSignal("sync").eq(self.aclk), ResetSignal("sync").eq(~self.aresetn)]
        m.submodules.regs = regs = AXILiteRegisters(params=self.params)
        members = self.signature.members
        for name, member in AXILiteSignature.members.items():
            port = f"{ip.AXIL_BUSIF}_{name}"
            if port not in members:
                continue
            outer, inner = getattr(self, port), getattr(regs.bus, name)
            m.d.comb += inner.eq(outer) if member.flow == Out else outer.eq(inner)
        loop = Signal(STREAM_BITS)
        with m.If(self.s_axis_tvalid & self.s_axis_tready):
            m.d.sync += loop.eq(self.s_axis_tdata)
        m.d.comb += self.m_axis_tdata.eq(loop)
        for sink, source in (("s_axis_tready", "m_axis_tready"), ("m_axis_tvalid", "s_axis_tvalid"),
                             ("m_axis_tlast", "s_axis_tlast"), ("m_axis_tkeep", "s_axis_tkeep")):
            if sink in members and source in members:
                m.d.comb += getattr(self, sink).eq(getattr(self, source))
        if "interrupt" in members:
            m.d.comb += self.interrupt.eq(regs.status[1])
        return m


def stub_sources(top=StubTop, **top_kwargs):
    pes = [gen.RTLSource(s.filename, s.verilog_name, s.module, s.attr, factory=StubPE)
           for s in gen.RTL_SOURCES[:-1]]
    last = gen.RTL_SOURCES[-1]
    return (*pes, gen.RTLSource(last.filename, last.verilog_name, last.module, last.attr,
                                factory=lambda p: top(p, **top_kwargs)))


@pytest.fixture
def stubs(monkeypatch):
    def use(**kwargs):
        monkeypatch.setattr(gen, "RTL_SOURCES", stub_sources(**kwargs))
    use()
    return use


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """One generate run per variant (without / with the interrupt port): interrupt -> folder."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        for interrupt in (False, True):
            mp.setattr(gen, "RTL_SOURCES", stub_sources(interrupt=interrupt))
            folder = tmp_path_factory.mktemp(f"rtl_irq{int(interrupt)}")
            out[interrupt] = (folder, gen.generate(folder))
    return out


@pytest.fixture
def fresh(generated, tmp_path):
    """A private copy of a generated folder (the mock builds write into it)."""
    def copy(interrupt=False):
        target = tmp_path / f"rtl{int(interrupt)}"
        shutil.copytree(generated[interrupt][0], target)
        return target
    return copy


def module_ports(verilog: str, module: str) -> dict:
    """An independent reading of a module's port list: name -> (direction, width)."""
    head = re.search(rf"\bmodule\s+{module}\s*\(([^)]*)\)\s*;", verilog)
    assert head, f"no module {module}"
    ports = {}
    for name in (p.strip() for p in head.group(1).split(",")):
        decl = re.search(rf"\n\s*(input|output)\s+(?:\[(\d+):0\]\s+)?{name};", verilog)
        assert decl, name
        ports[name] = (decl.group(1), int(decl.group(2)) + 1 if decl.group(2) else 1)
    return ports


def tcl_physical_ports(tcl: str) -> set:
    """The top-level ports the packaging Tcl maps into bus interfaces."""
    out = set()
    for body in re.findall(r"insitu_add_bus \$core \S+ \S+ \S+ \{([^}]*)\}", tcl):
        words = body.split()
        out |= set(words[1::2])
    return out


# ---- generate --------------------------------------------------------------------------------


#: Per board: its top level, clock constraint, register map and Tcl.
BOARD_FILES = {"{top}_{b}.v", "{top}_{b}_ooc.xdc", "registers_{b}.md", "registers_{b}.json",
               "bd_{b}.tcl", "build_{b}.tcl"}
# ... and its declared false/multicycle paths (insitu.rtl.timing.EXCEPTIONS), where there are any.
if EXCEPTIONS:
    BOARD_FILES.add("{top}_{b}.xdc")


def test_generate_writes_every_file_with_a_matching_manifest(generated):
    out, result = generated[False]
    reference = {"pe1.v", "pe2.v", "pe3.v", "pe_lrt.v", f"{TOP_MODULE}.v", "registers.md",
                 "registers.json"}
    per_board = {b: {f.format(top=TOP_MODULE, b=b) for f in BOARD_FILES}
                 for b in ("ultra96v2", "zedboard")}
    # The Ultra96-V2's parameters differ from the defaults: its PEs are written on their own too.
    per_board["ultra96v2"] |= {"pe1_ultra96v2.v", "pe2_ultra96v2.v", "pe3_ultra96v2.v",
                               "pe_lrt_ultra96v2.v"}
    expected = reference | per_board["ultra96v2"] | per_board["zedboard"] | {
        "package_ip.tcl", "manifest.json"}
    assert set(result["files"]) == expected and result["files"][-1] == "manifest.json"
    assert {p.name for p in out.iterdir()} == expected          # no temporary files left
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["version"] == VERSION and manifest["vlnv"] == IP_VLNV
    assert manifest["params"]["factor_words"] > 0 and manifest["top_module"] == TOP_MODULE
    assert set(manifest["files"]) == expected - {"manifest.json"}
    for board in ("ultra96v2", "zedboard"):
        entry = manifest["boards"][board]
        assert set(entry["files"]) == per_board[board]
        assert entry["clock_hz"] == pl_clock_hz(board)
        assert entry["params"] == json.loads(json.dumps(
            __import__("dataclasses").asdict(accelerator_params(board))))
        assert entry["part"] == vivado.BOARD_DESIGNS[board].part
    assert manifest["boards"]["ultra96v2"]["params"]["pe3_batch_lanes"] == 2
    assert manifest["boards"]["zedboard"]["params"] == manifest["params"]       # the defaults
    assert result["boards"] == manifest["boards"]
    import hashlib
    for name, meta in manifest["files"].items():
        data = (out / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == meta["sha256"] and len(data) == meta["bytes"]
    # Each Verilog file holds its module.
    for source in gen.RTL_SOURCES:
        assert re.search(rf"\bmodule {source.verilog_name}\(", (out / source.filename).read_text())


def test_each_board_top_level_is_generated_with_its_parameters(stubs, monkeypatch):
    """The board's top and PEs are built with the board's AcceleratorParams, the reference files
    with the defaults; each distinct parameter set is converted once."""
    built = []

    class Recording(StubTop):
        def __init__(self, params, **kwargs):
            built.append(params)
            super().__init__(params, **kwargs)

    monkeypatch.setattr(gen, "RTL_SOURCES", stub_sources(top=Recording))
    gen.render()
    assert built == [DEFAULT_PARAMS, accelerator_params("ultra96v2")]   # zedboard: the defaults


def test_xdc_clock_period_per_board(generated):
    out = generated[False][0]
    for board, period in (("ultra96v2", "5.000"), ("zedboard", "8.000")):
        xdc = (out / vivado.ooc_xdc_filename(board)).read_text()
        assert f"create_clock -period {period} -name aclk [get_ports aclk]" in xdc
        assert 1e9 / pl_clock_hz(board) == float(period)
    assert not (out / f"{TOP_MODULE}_ooc.xdc").exists()     # no board-independent clock


def test_paths_xdc_per_board_is_packaged(generated):
    """The declared multicycle paths go to each board's XDC, with the hold multiplier one less
    than the setup one (UG903), and package_ip.tcl adds that XDC to the IP."""
    out = generated[False][0]
    for board in ("ultra96v2", "zedboard"):
        xdc = (out / vivado.paths_xdc_filename(board)).read_text()
        for e in EXCEPTIONS:
            if e.cycles:
                assert f"set_multicycle_path {e.cycles} -setup -from " in xdc
                assert f"set_multicycle_path {e.cycles - 1} -hold -from " in xdc
        assert "left out" not in xdc
    tcl = (out / "package_ip.tcl").read_text()
    assert "set paths_xdc [file join $hdl_dir @TOP@_${board}.xdc]".replace("@TOP@", TOP_MODULE) in tcl
    assert "add_files -fileset constrs_1 -norecurse $paths_xdc" in tcl


@pytest.mark.parametrize("board, mhz", [("ultra96v2", "200"), ("zedboard", "125")])
def test_tcl_sets_each_board_fclk0(generated, board, mhz):
    """The PS's FCLK0 asked at the board's pl_clock_hz (property names as Vivado's PS IPs have
    them), with the search over the PS's source PLLs, and the messages at that clock."""
    out = generated[False][0]
    bd = (out / f"bd_{board}.tcl").read_text()
    want, act, src, plls = {
        "ultra96v2": ("PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ", "PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ",
                      "PSU__CRL_APB__PL0_REF_CTRL__SRCSEL", "{IOPLL RPLL DPLL}"),
        "zedboard": ("PCW_FPGA0_PERIPHERAL_FREQMHZ", "PCW_ACT_FPGA0_PERIPHERAL_FREQMHZ",
                     "PCW_FCLK0_PERIPHERAL_CLKSRC", "{{IO PLL} {ARM PLL} {DDR PLL}}"),
    }[board]
    assert f"CONFIG.{want} {{{mhz}}}" in bd
    assert f"insitu_pl_clock $ps {want} {act} \\\n        {src} {plls} {mhz}\n" in bd
    assert f"One clock ({mhz} MHz)" in bd and f"timing not met on {board} at {mhz} MHz" in bd
    assert "100" not in re.findall(r"FREQMHZ \{(\d+)\}", bd)
    build = (out / f"build_{board}.tcl").read_text()
    assert f"insitu_package_ip $here $ip_repo {vivado.BOARD_DESIGNS[board].part} {board}" in build
    registers = json.loads((out / f"registers_{board}.json").read_text())
    assert registers["clock_hz"] == pl_clock_hz(board) and registers["board"] == board
    assert registers["params"] == json.loads(json.dumps(
        __import__("dataclasses").asdict(accelerator_params(board))))


def test_generate_is_deterministic(stubs, generated):
    out = generated[False][0]
    files = gen.render()
    assert files == {name: (out / name).read_text() for name in files}


@pytest.mark.parametrize("interrupt", [False, True])
def test_tcl_maps_exactly_the_ports_of_the_top_verilog(generated, interrupt):
    tmp_path = generated[interrupt][0]
    ports = module_ports((tmp_path / f"{TOP_MODULE}.v").read_text(), TOP_MODULE)
    for board in vivado.BOARD_DESIGNS:         # every board's top has the same ports
        assert module_ports((tmp_path / vivado.top_filename(board)).read_text(), TOP_MODULE) == ports
    tcl = (tmp_path / "package_ip.tcl").read_text()
    mapped = tcl_physical_ports(tcl)
    assert mapped == set(ports)                     # every port named exists, every port mapped
    assert ("interrupt" in ports) == interrupt
    assert ports["s_axis_tdata"] == ("input", STREAM_BITS)
    assert ports["m_axis_tdata"] == ("output", STREAM_BITS)
    assert ports["s_axis_tkeep"] == ("input", STREAM_BITS // 8)
    assert ports["s_axi_control_awaddr"] == ("input", ADDR_BITS)
    assert ports["s_axi_control_araddr"] == ("input", ADDR_BITS)
    assert ports["s_axi_control_rdata"] == ("output", 32)
    # Interfaces, clock association, reset polarity and the 4 KB block.
    assert "insitu_add_bus $core s_axi_control xilinx.com:interface:aximm slave" in tcl
    assert "insitu_add_bus $core s_axis xilinx.com:interface:axis slave" in tcl
    assert "insitu_add_bus $core m_axis xilinx.com:interface:axis master" in tcl
    assert "ASSOCIATED_BUSIF s_axi_control:s_axis:m_axis" in tcl
    assert "insitu_bus_parameter $core aresetn POLARITY ACTIVE_LOW" in tcl
    assert f"set_property range {1 << ADDR_BITS} $block" in tcl
    assert "-vendor insitu.dev -library insitu" in tcl and "set_property name insitu_accel" in tcl
    for reg in REGISTERS:
        assert re.search(rf"insitu_add_register \$block {reg.name} {reg.offset:#05x} ", tcl), reg.name
    # The block design uses the accelerator's interfaces by these names.
    for board in vivado.BOARD_DESIGNS:
        bd = (tmp_path / f"bd_{board}.tcl").read_text()
        pins = set(re.findall(rf"{ip.ACCEL_CELL}/(\w+)", bd))
        busifs = {"s_axi_control", "s_axis", "m_axis"}
        assert pins <= busifs | set(ports)
        assert ("interrupt" in pins) == interrupt


def test_block_design_addresses_widths_and_clock(generated):
    tmp_path = generated[False][0]
    data = json.loads((tmp_path / "registers.json").read_text())
    for key, board in vivado.BOARD_DESIGNS.items():
        bd = (tmp_path / f"bd_{key}.tcl").read_text()
        accel = re.search(r"assign_bd_address -offset (0x[0-9A-F]+) -range (0x[0-9A-F]+) .*\n.*"
                          r"insitu_accel_0/s_axi_control/reg0", bd)
        dma = re.search(r"assign_bd_address -offset (0x[0-9A-F]+) .*\n.*axi_dma_0/S_AXI_LITE/Reg", bd)
        assert int(accel.group(1), 16) == board.accel_base
        assert int(accel.group(2), 16) == 1 << ADDR_BITS
        assert int(dma.group(1), 16) == board.dma_base
        assert data["boards"][key]["accel_base"] == board.accel_base
        assert data["boards"][key]["dma_base"] == board.dma_base
        for param in ("c_m_axis_mm2s_tdata_width", "c_s_axis_s2mm_tdata_width",
                      "c_m_axi_mm2s_data_width", "c_m_axi_s2mm_data_width"):
            assert f"CONFIG.{param} {{{STREAM_BITS}}}" in bd
        assert f"-part {board.part}" in bd
        assert f"{{{board.clock_hz // 1_000_000}}}" in bd
        build = (tmp_path / f"build_{key}.tcl").read_text()
        assert f"insitu_package_ip $here $ip_repo {board.part} {key}" in build
        assert f"source [file join $here bd_{key}.tcl]" in build
    assert vivado.BOARD_DESIGNS["ultra96v2"].accel_base == 0xA0000000
    assert vivado.BOARD_DESIGNS["zedboard"].accel_base == 0x43C00000
    u96 = (tmp_path / "bd_ultra96v2.tcl").read_text()
    assert "zynq_ultra_ps_e" in u96 and "M_AXI_HPM0_FPD" in u96 and "S_AXI_HP0_FPD" in u96
    assert "CONFIG.PSU__SAXIGP2__DATA_WIDTH {128}" in u96 and "pl_clk0" in u96
    zed = (tmp_path / "bd_zedboard.tcl").read_text()
    assert "processing_system7" in zed and "M_AXI_GP0" in zed and "S_AXI_HP0" in zed
    assert "FCLK_CLK0" in zed


def test_board_designs_agree_with_the_board_files():
    boards = load_boards()
    for key, design in vivado.BOARD_DESIGNS.items():
        fpga = boards[key].fpga
        # boards/*.toml may write the part with extra dashes; Vivado's name is design.part.
        assert fpga["part"].replace("-", "") == design.part.replace("-", ""), key
        assert fpga["pl_clock_hz"] == design.clock_hz
        assert design.params == accelerator_params(key)
        assert {"zynqmp": "zynq_ultra_ps_e", "zynq7000": "processing_system7"}[fpga["family"]] == design.ps


def test_registers_md_and_json_describe_the_map(generated):
    tmp_path = generated[False][0]
    md = (tmp_path / "registers.md").read_text()
    assert md == regmap.markdown()
    for board in vivado.BOARD_DESIGNS:          # a board's map: its parameters' reset values
        assert (tmp_path / f"registers_{board}.md").read_text() == \
            regmap.markdown(accelerator_params(board))
    for reg in REGISTERS:
        assert f"| `{reg.offset:#05x}` | `{reg.name}` |" in md
    data = json.loads((tmp_path / "registers.json").read_text())
    assert data["version"] == VERSION and int(data["version_hex"], 16) == VERSION
    assert data["addr_bits"] == ADDR_BITS and data["stream"]["bits"] == STREAM_BITS
    assert [r["name"] for r in data["registers"]] == [r.name for r in REGISTERS]
    for entry, reg in zip(data["registers"], REGISTERS):
        assert (entry["offset"], entry["access"], entry["width"], entry["signed"]) == \
            (reg.offset, reg.access, reg.width, reg.signed)
        assert [f["name"] for f in entry["fields"]] == [f.name for f in reg.fields]
        assert entry["reset"] == regmap.reset_value(reg)
    assert data["ops"] == {o.name: o.value for o in regmap.Op}
    assert data["error_codes"] == {e.name: e.value for e in regmap.ErrorCode}


# ---- refusals and atomicity -------------------------------------------------------------------


def test_out_dir_that_is_a_file_is_refused(stubs, tmp_path):
    target = tmp_path / "afile"
    target.write_text("keep me")
    with pytest.raises(UsageError, match="existing file"):
        gen.generate(target)
    with pytest.raises(UsageError, match="is a file"):
        gen.generate(target / "sub")
    assert target.read_text() == "keep me"


def test_a_top_with_wrong_ports_is_refused(monkeypatch, tmp_path):
    def only_top(**kwargs):
        monkeypatch.setattr(gen, "RTL_SOURCES", stub_sources(**kwargs)[-1:])

    only_top(drop=("s_axis_tkeep",))
    with pytest.raises(InsituError, match="missing port s_axis_tkeep"):
        gen.generate(tmp_path / "a")
    only_top(extra={"debug_in": In(1)})
    with pytest.raises(InsituError, match="unexpected input port debug_in"):
        gen.generate(tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    narrow = gen.to_verilog(StubTop(DEFAULT_PARAMS, extra={"s_axis_tuser": Out(2)}), TOP_MODULE)
    assert vivado.check_top_ports(narrow) == []          # an extra output is allowed


def test_a_failed_conversion_writes_nothing(fresh, monkeypatch):
    out = fresh()
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(params):
        raise RuntimeError("elaboration failed")

    sources = stub_sources()
    monkeypatch.setattr(gen, "RTL_SOURCES", (sources[0], gen.RTLSource("pe2.v", "pe2", "x", "y",
                                                                      factory=broken)))
    with pytest.raises(RuntimeError):
        gen.generate(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_interrupted_write_leaves_no_partial_file(monkeypatch, tmp_path):
    import insitu.io

    monkeypatch.setattr(gen, "RTL_SOURCES", stub_sources()[-1:])

    real = insitu.io.atomic_write
    calls = []

    def flaky(path, data):
        calls.append(path)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(insitu.io, "atomic_write", flaky)
    with pytest.raises(InsituError, match="No space left"):
        gen.generate(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {c.name for c in calls[:3]}            # whole files only, no temporaries
    assert "manifest.json" not in names                    # the manifest comes last


def test_missing_rtl_modules_are_named(monkeypatch, tmp_path):
    missing = gen.RTLSource("pe9.v", "pe9", "insitu.rtl.no_such_pe", "PE9")
    monkeypatch.setattr(gen, "RTL_SOURCES", (missing,))
    with pytest.raises(InsituError, match="insitu.rtl.no_such_pe"):
        gen.generate(tmp_path)
    assert not any(tmp_path.iterdir())


def test_verilog_port_parser_and_contract_check():
    v = ("module insitu_accel(aclk, aresetn, x\n, y);\n  input aclk;\n  wire aclk;\n"
         "  input aresetn;\n  output [127:0] x;\n  input [3:0] y;\nendmodule\n")
    assert vivado.verilog_ports(v, "insitu_accel") == {
        "aclk": ("input", 1), "aresetn": ("input", 1), "x": ("output", 128), "y": ("input", 4)}
    problems = vivado.check_top_ports(v)
    assert any("missing port s_axi_control_awaddr" in p for p in problems)
    assert any("unexpected input port y" in p for p in problems)
    assert not any("port x" in p for p in problems)          # extra outputs are allowed
    with pytest.raises(ValueError, match="no module"):
        vivado.verilog_ports(v, "other")


def test_unknown_board_is_refused():
    with pytest.raises(ValueError, match="no Vivado block design for board 'pynq-z2'"):
        vivado.block_design_tcl("pynq-z2")


# ---- the Tcl under a mock Vivado ---------------------------------------------------------------

MOCK_VIVADO = r"""
# A stand-in for Vivado: every unknown command is logged and returns a handle. Commands whose
# result the scripts test return what a successful run returns. Run files are created so that the
# scripts' copies of the bitstream and the .hwh can be checked.
set ::log [open $::env(MOCK_LOG) w]
set ::ports [split $::env(MOCK_PORTS) ,]
set ::board_parts $::env(MOCK_BOARD_PARTS)
set ::projects {}
# The PS's properties set so far; MOCK_ACT (a dict source PLL -> achieved MHz) answers the ACT
# parameter of the source last set, as the PS IP does; without it the ACT reads as no number.
set ::props [dict create]

set ::vivado_commands {
    create_project add_files set_property get_property update_compile_order current_project
    current_fileset close_project update_ip_catalog get_ipdefs get_board_parts get_files
    ipx::package_project ipx::current_core ipx::get_bus_interfaces ipx::remove_bus_interface
    ipx::get_memory_maps ipx::remove_memory_map ipx::add_bus_interface ipx::get_ports
    ipx::add_port_map ipx::get_port_maps ipx::add_bus_parameter ipx::get_bus_parameters
    ipx::add_memory_map ipx::add_address_block ipx::add_register ipx::add_field
    ipx::create_xgui_files ipx::update_checksums ipx::check_integrity ipx::save_core
    create_bd_design create_bd_cell apply_bd_automation connect_bd_intf_net connect_bd_net
    get_bd_intf_pins get_bd_pins get_bd_addr_spaces get_bd_addr_segs assign_bd_address
    validate_bd_design save_bd_design generate_target make_wrapper launch_runs wait_on_run
    get_runs open_run report_utilization report_timing_summary report_power
}

proc unknown {cmd args} {
    if {[lsearch -exact $::vivado_commands $cmd] < 0} {
        error "mock vivado: no command '$cmd'"
    }
    if {$cmd eq "set_property" && [llength $args] != 3} {
        error "mock vivado: set_property takes 3 words (name value object or -dict list object): $args"
    }
    puts $::log [concat [list $cmd] $args]
    if {$cmd eq "set_property" && [lindex $args 0] eq "-dict"} {
        foreach {key value} [lindex $args 1] { dict set ::props $key $value }
    }
    if {$cmd eq "get_property" && [string match CONFIG.*ACT_* [lindex $args 0]]
            && [info exists ::env(MOCK_ACT)]} {
        dict for {key value} $::props {
            if {[string match *SRCSEL $key] || [string match *CLKSRC $key]} {
                if {[dict exists $::env(MOCK_ACT) $value]} { return [dict get $::env(MOCK_ACT) $value] }
            }
        }
    }
    switch -- $cmd {
        create_project {
            lassign $args name dir
            if {[string match -* $name]} { lassign [lrange $args 1 end] name dir }
            file mkdir $dir
            lappend ::projects [list $name $dir]
            return $name
        }
        launch_runs {
            lassign [lindex $::projects end] name dir
            file mkdir [file join $dir $name.runs impl_1]
            set f [open [file join $dir $name.runs impl_1 insitu_wrapper.bit] w]; puts $f bit; close $f
            set hh [file join $dir $name.gen sources_1 bd insitu hw_handoff]
            file mkdir $hh
            set f [open [file join $hh insitu.hwh] w]; puts $f hwh; close $f
            return impl_1
        }
        get_board_parts { return $::board_parts }
        get_ipdefs { return [lindex $args end] }
        ipx::get_ports {
            set name [lindex $args 0]
            if {[lsearch -exact $::ports $name] >= 0} { return $name }
            return ""
        }
        ipx::get_bus_interfaces {
            if {[lindex $args 0] eq "-of_objects"} { return {inferred_a inferred_b} }
            return [lindex $args 0]
        }
        ipx::get_memory_maps {
            if {[lindex $args 0] eq "-of_objects"} { return {inferred_mm} }
            return [lindex $args 0]
        }
        get_property {
            switch -- [lindex $args 0] {
                PROGRESS { return 100% }
                STATS.WNS { return 0.250 }
                STATS.WHS { return 0.010 }
                NAME { return [lindex $args 1] }
            }
            return value
        }
        make_wrapper { return /mock/insitu_wrapper.v }
        default { return "$cmd:[lindex $args end]" }
    }
}
"""


def run_mock_build(out: Path, board: str, ports, board_parts: str = "", act: str | None = None):
    tclsh = shutil.which("tclsh")
    if not tclsh:
        pytest.skip("tclsh is not installed (apt-get install tcl)")
    log = out / f"mock_{board}.log"
    driver = out / "mock_driver.tcl"
    driver.write_text(MOCK_VIVADO + f"\nset argv {{3}}\nsource {out / f'build_{board}.tcl'}\n")
    env = {"MOCK_LOG": str(log), "MOCK_PORTS": ",".join(ports), "MOCK_BOARD_PARTS": board_parts,
           "PATH": "/usr/bin:/bin", **({"MOCK_ACT": act} if act is not None else {})}
    run = subprocess.run([tclsh, str(driver)], capture_output=True, text=True, env=env, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout, log.read_text().splitlines()


@pytest.mark.parametrize("interrupt", [False, True])
@pytest.mark.parametrize("board", sorted(vivado.BOARD_DESIGNS))
def test_build_scripts_run_end_to_end_under_a_mock_vivado(fresh, board, interrupt):
    tmp_path = fresh(interrupt)
    ports = module_ports((tmp_path / vivado.top_filename(board)).read_text(), TOP_MODULE)
    stdout, log = run_mock_build(tmp_path, board, ports)
    design = vivado.BOARD_DESIGNS[board]
    # The bitstream and hardware handoff side by side, as pynq.Overlay wants them.
    assert (tmp_path / f"insitu_{board}.bit").read_text() == "bit\n"
    assert (tmp_path / f"insitu_{board}.hwh").read_text() == "hwh\n"
    assert "no board files" in stdout                     # none installed in the mock
    text = "\n".join(log)
    # Packaging: the inferred interfaces are removed, the top's ports mapped one by one.
    assert "ipx::remove_bus_interface inferred_a" in text
    mapped = {line.split()[2] for line in log if line.startswith("set_property physical_name")}
    assert mapped == set(ports)
    assert "create_project -force insitu_package" in text and f"-part {design.part}" in text
    assert f"ipx::package_project -root_dir {tmp_path}/build_{board}/ip_repo/insitu_accel" in text
    # The board's own top level is packaged.
    assert f"add_files -norecurse {tmp_path / vivado.top_filename(board)}" in text
    # The clock constraint goes into the IP before packaging, for its out-of-context runs: the
    # board's period.
    ooc = tmp_path / vivado.ooc_xdc_filename(board)
    assert f"add_files -fileset constrs_1 -norecurse {ooc}" in text
    assert text.index(f"add_files -fileset constrs_1 -norecurse {ooc}") < text.index("ipx::package_project")
    period = 1e9 / pl_clock_hz(board)
    assert f"create_clock -period {period:.3f} -name aclk [get_ports aclk]" in ooc.read_text()
    # FCLK0 at the board's clock, the source PLL tried (the mock reports no achieved rate).
    mhz = vivado.mhz(pl_clock_hz(board))
    freq = {"ultra96v2": "PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ",
            "zedboard": "PCW_FPGA0_PERIPHERAL_FREQMHZ"}[board]
    assert re.search(rf"set_property -dict \{{CONFIG\.\w+ .*CONFIG\.{freq} {mhz}\}}", text), text
    assert f"PL clock 0 asked at {mhz} MHz" in stdout
    # Block design: the accelerator cell from the packaged VLNV, fixed addresses, the run.
    assert f"create_bd_cell -type ip -vlnv {IP_VLNV} insitu_accel_0" in text
    assert (f"assign_bd_address -offset {design.accel_base:#010X}".replace("0X", "0x")
            in text)
    assert "launch_runs impl_1 -to_step write_bitstream -jobs 3" in text
    assert ("axi_intc_0" in text) == interrupt


@pytest.mark.parametrize("board, act, source, message", [
    # the Ultra96-V2's 1500 MHz IOPLL gives 187.5 MHz: the RPLL within 0.1 % is taken
    ("ultra96v2", "IOPLL 187.5 RPLL 199.998 DPLL 200.0", "RPLL", "PL clock 0 at 199.998 MHz from RPLL"),
    # none within 0.1 %: the closest, with a warning naming the rate the board will run at
    ("ultra96v2", "IOPLL 187.5 RPLL 214.28 DPLL 190.0", "DPLL",
     "WARNING: insitu: PL clock 0 runs at 190.0 MHz, not 200 MHz"),
    ("zedboard", "{IO PLL} 125.0 {ARM PLL} 133.3", "IO PLL", "PL clock 0 at 125.0 MHz from IO PLL"),
])
def test_the_pl_clock_source_is_the_pll_that_gives_the_board_clock(fresh, board, act, source, message):
    tmp_path = fresh()
    ports = module_ports((tmp_path / vivado.top_filename(board)).read_text(), TOP_MODULE)
    stdout, log = run_mock_build(tmp_path, board, ports, act=act)
    assert message in stdout
    src_param = {"ultra96v2": "PSU__CRL_APB__PL0_REF_CTRL__SRCSEL",
                 "zedboard": "PCW_FCLK0_PERIPHERAL_CLKSRC"}[board]
    last = [line for line in log if f"CONFIG.{src_param}" in line][-1]
    assert f"CONFIG.{src_param} {{{source}}}" in last or f"CONFIG.{src_param} {source} " in last


def test_build_scripts_apply_board_presets_when_board_files_exist(fresh):
    tmp_path = fresh()
    ports = module_ports((tmp_path / vivado.top_filename("ultra96v2")).read_text(), TOP_MODULE)
    _, log = run_mock_build(tmp_path, "ultra96v2", ports,
                                 board_parts="avnet.com:ultra96v2:part0:1.2")
    text = "\n".join(log)
    assert "set_property board_part avnet.com:ultra96v2:part0:1.2" in text
    assert "apply_board_preset 1" in text


def test_packaging_fails_clearly_on_a_missing_port(fresh):
    tmp_path = fresh()
    ports = module_ports((tmp_path / vivado.top_filename("zedboard")).read_text(), TOP_MODULE)
    ports.pop("m_axis_tlast")
    tclsh = shutil.which("tclsh")
    if not tclsh:
        pytest.skip("tclsh is not installed (apt-get install tcl)")
    driver = tmp_path / "mock_driver.tcl"
    driver.write_text(MOCK_VIVADO + f"\nsource {tmp_path / 'build_zedboard.tcl'}\n")
    env = {"MOCK_LOG": str(tmp_path / "log"), "MOCK_PORTS": ",".join(ports), "MOCK_BOARD_PARTS": "",
           "PATH": "/usr/bin:/bin"}
    run = subprocess.run([tclsh, str(driver)], capture_output=True, text=True, env=env, timeout=60,
                         check=False)
    assert run.returncode != 0
    assert "the top level has no port m_axis_tlast (bus interface m_axis)" in run.stderr


# ------------------------------------------------------------------ the Verilog cache across processes

def test_converting_the_components_imports_only_the_sources_the_cache_key_hashes():
    """A fresh interpreter imports each component's module: every insitu module it loads is one
    of verilog_cache.source_files(), so no source the text depends on is left out of its key."""
    from insitu.rtl import verilog_cache

    modules = [source.module for source in gen.RTL_SOURCES] + ["insitu.rtl.generate"]
    run = subprocess.run([sys.executable, "-c", f"""
import importlib, json, sys
for name in {modules!r}:
    importlib.import_module(name)
print(json.dumps(sorted(m.__file__ for n, m in sys.modules.items()
                        if n.split('.')[0] == 'insitu' and getattr(m, '__file__', None))))
"""], capture_output=True, text=True, check=True)
    loaded = {Path(f).resolve() for f in json.loads(run.stdout)}
    assert loaded and loaded <= set(verilog_cache.source_files()), loaded - set(verilog_cache.source_files())


def test_the_cache_serves_the_converted_text_and_a_changed_source_is_a_new_key(insitu_cache, monkeypatch):
    from insitu.rtl import verilog_cache

    calls = []

    def convert(component, name):
        calls.append(name)
        return f"module {name}; // {type(component).__name__}\nendmodule\n"

    monkeypatch.setattr(gen, "to_verilog", convert)
    first = verilog_cache.converted("insitu.rtl.pe1", "PE1", DEFAULT_PARAMS, "pe1")
    assert verilog_cache.converted("insitu.rtl.pe1", "PE1", DEFAULT_PARAMS, "pe1") == first
    assert calls == ["pe1"]                                      # the second came from the cache
    (entry,) = (insitu_cache / verilog_cache.FOLDER).glob("*.v")
    assert entry.read_text() == first
    # Other parameters are another entry.
    verilog_cache.converted("insitu.rtl.pe1", "PE1", accelerator_params("ultra96v2"), "pe1")
    assert calls == ["pe1", "pe1"]
    # Another source: converted again, and the old source's entries are gone.
    monkeypatch.setattr(verilog_cache, "source_digest", lambda: "0123456789abcdef")
    verilog_cache.converted("insitu.rtl.pe1", "PE1", DEFAULT_PARAMS, "pe1")
    assert calls == ["pe1", "pe1", "pe1"]
    assert [p.name[:16] for p in (insitu_cache / verilog_cache.FOLDER).glob("*.v")] == ["0123456789abcdef"]
