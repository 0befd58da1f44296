"""The accelerator's block design as a Vivado hardware handoff (``.hwh``) for ``pynq.Overlay``.

A real build (:mod:`insitu.rtl.vivado`) leaves ``insitu_<board>.bit`` and ``insitu_<board>.hwh``
side by side. The simulated twins have no Vivado, so :func:`hwh_xml` writes the handoff the same
block design would produce: the processing system, the AXI DMA (simple mode, no scatter-gather)
and the accelerator with its register map, at the Tcl's fixed addresses, from the same constants.

It is written for pynq 4's own parsers and carries what they read:

* ``pynq.pl_server.hwh_parser`` (the ``_HWHUltrascale`` / ``_HWHZynq`` classes that ``HWH``
  names on the boards' CPUs; on x86 ``HWH`` is the bare base class, which cannot parse any
  file): the PS's ``MEMORYMAP`` gives ``ip_dict`` (addresses, ``type``, ``parameters``, and the
  ``REGISTERS`` of the accelerator's address block for ``register_map``); the PS's
  ``PL<n>``/``FCLK<n>`` enable and divisor parameters give ``clock_dict``; port nets give the
  interrupts.
* ``pynqmetadata`` (what ``pynq.Overlay`` uses for a full bitstream on an embedded device): the
  bus interfaces (master/slave, ``aximm``), scalar ports with their connections, and the clock's
  ``ACT_FREQMHZ`` / ``SRCSEL`` parameters.

The PL clock is the board's (``[fpga] pl_clock_hz`` of boards/<board>.toml): FCLK0's requested
and achieved rate, its divisors, and the clock net's ``CLKFREQUENCY``. Vivado picks the source PLL
and divisors from the board's PS presets; the twin models the PLLs of :data:`PS_PLLS` and takes the
first that divides to the board's clock exactly (:func:`pl_clock_divisors`), so its .hwh records
exactly the board's clock. :func:`hwh_clock_hz` reads the achieved rate back from any .hwh (a
Vivado build's too): what the driver converts cycles to seconds with on a board.

``mem_dict`` stays empty under both, as for a Vivado build: the DDR the DMA reaches is the PS's
own (it appears in the DMA's ``MEMORYMAP``, not the PS's), and pynq allocates it as ``PSDDR``.

:func:`check_hwh` reads a handoff back (a Vivado build's or a twin's) and refuses one that is not
this accelerator's block design, before ``insitu deploy`` ships it to a board.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable
from xml.etree import ElementTree as ET

from insitu.errors import UsageError
from insitu.io import atomic_write
from insitu.accel.params import IP_VLNV, STREAM_BITS, TOP_MODULE
from insitu.accel.regmap import REGISTERS, VERSION, Field
from insitu.accel.ip import (ACCEL_CELL, ADDRESS_BLOCK, ADDRESS_SPAN, AXIL_BUSIF, AXIS_MASTER_BUSIF,
                             AXIS_SLAVE_BUSIF, BD_NAME, CLOCK_PORT, DMA_CELL, DMA_LENGTH_BITS,
                             INTC_CELL, INTERRUPT_PORT, PS_PINS, RESET_PORT)
from insitu.rtl.vivado import address_map, board_design

#: pynq.lib.dma.DMA binds to exactly this VLNV.
DMA_VLNV = "xilinx.com:ip:axi_dma:7.1"

#: The DMA's configuration, as the block design Tcl sets it (CONFIG.<name>).
DMA_CONFIG = {
    "c_include_sg": 0, "c_sg_length_width": DMA_LENGTH_BITS,
    "c_include_mm2s": 1, "c_include_s2mm": 1, "c_include_mm2s_dre": 0, "c_include_s2mm_dre": 0,
    "c_m_axi_mm2s_data_width": STREAM_BITS, "c_m_axis_mm2s_tdata_width": STREAM_BITS,
    "c_m_axi_s2mm_data_width": STREAM_BITS, "c_s_axis_s2mm_tdata_width": STREAM_BITS,
    "c_mm2s_burst_size": 16, "c_s2mm_burst_size": 16, "c_addr_width": 32,
}

# Per processing system: its IP, the device family, and what the Tcl turns on.
_PS_VLNV = {"zynq_ultra_ps_e": "xilinx.com:ip:zynq_ultra_ps_e:3.4",
            "processing_system7": "xilinx.com:ip:processing_system7:5.5"}
_PS_ARCH = {"zynq_ultra_ps_e": "zynquplus", "processing_system7": "zynq"}
#: The PL clock's source PLLs the twin models, in the order the Tcl tries them (SRCSEL / CLKSRC
#: values), with their rates: the boards' PS reference clocks give a 1500 MHz IOPLL on the
#: Ultra96-V2 (no integer divisor of it is 200 MHz) and a 1000 MHz IO PLL on the ZedBoard; the
#: ZU+ RPLL is modeled at 1600 MHz (48 x the 33.33 MHz reference, a rate presets use), not read
#: from the Ultra96-V2's preset. A real build's .hwh records what Vivado chose.
PS_PLLS = {"zynq_ultra_ps_e": (("IOPLL", 1_500_000_000), ("RPLL", 1_600_000_000)),
           "processing_system7": (("IO PLL", 1_000_000_000),)}
#: The PS parameter holding PL clock 0's achieved rate in MHz, as Vivado writes it into a .hwh.
ACT_CLOCK_PARAMS = {"zynq_ultra_ps_e": "PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ",
                    "processing_system7": "PCW_ACT_FPGA0_PERIPHERAL_FREQMHZ"}

_IPXACT_ACCESS = {"rw": "read-write", "ro": "read-only", "wo": "write-only"}


def pl_clock_divisors(ps: str, clock_hz: int) -> tuple[str, int, int, float]:
    """The twin's PL clock 0 for ``clock_hz``: ``(source PLL, divisor0, divisor1, achieved Hz)``.

    The first PLL of :data:`PS_PLLS` with divisors (1..63 each) that give the clock exactly, else
    the closest rate of any (fewest stages first)."""
    best = None
    for source, pll in PS_PLLS[ps]:
        d0, d1 = min(((a, b) for b in range(1, 64) for a in range(1, 64)),
                     key=lambda d: (abs(pll / (d[0] * d[1]) - clock_hz), d[1], d[0]))
        got = pll / (d0 * d1)
        if best is None or abs(got - clock_hz) < abs(best[3] - clock_hz):
            best = (source, d0, d1, got)
        if got == clock_hz:
            break
    assert best is not None
    return best


def _ps_parameters(ps: str, hp_bits: int, interrupt: bool, clock_hz: int) -> dict:
    """The PS cell's parameters: its ports as the Tcl enables them and the four PL clocks.

    pynq reads, for every clock 0..3, the enable and both divisors (a missing one is an error),
    and pynqmetadata also the source PLL and the achieved frequency.
    """
    source, d0, d1, achieved = pl_clock_divisors(ps, clock_hz)
    want, got = f"{clock_hz / 1e6:g}", f"{achieved / 1e6:.6f}"
    params = {}
    for i in range(4):
        on = int(i == 0)     # fclk0 only: the whole PL runs on one clock
        if ps == "zynq_ultra_ps_e":
            pre = f"PSU__CRL_APB__PL{i}_REF_CTRL__"
            params.update({f"PSU__FPGA_PL{i}_ENABLE": on, pre + "SRCSEL": source,
                           pre + "DIVISOR0": d0, pre + "DIVISOR1": d1,
                           pre + "FREQMHZ": want, pre + "ACT_FREQMHZ": got if on else 0})
        else:
            params.update({f"PCW_FPGA_FCLK{i}_ENABLE": on, f"PCW_EN_CLK{i}_PORT": on,
                           f"PCW_FCLK{i}_PERIPHERAL_CLKSRC": source,
                           f"PCW_FCLK{i}_PERIPHERAL_DIVISOR0": d0,
                           f"PCW_FCLK{i}_PERIPHERAL_DIVISOR1": d1,
                           f"PCW_FPGA{i}_PERIPHERAL_FREQMHZ": want,
                           f"PCW_ACT_FPGA{i}_PERIPHERAL_FREQMHZ": got if on else 0})
    if ps == "zynq_ultra_ps_e":
        params.update({"PSU__USE__M_AXI_GP0": 1, "PSU__MAXIGP0__DATA_WIDTH": 32,
                       "PSU__USE__M_AXI_GP1": 0, "PSU__USE__M_AXI_GP2": 0,
                       "PSU__USE__S_AXI_GP2": 1, "PSU__SAXIGP2__DATA_WIDTH": hp_bits,
                       "PSU__USE__IRQ0": int(interrupt)})
    else:
        params.update({"PCW_USE_M_AXI_GP0": 1, "PCW_USE_S_AXI_HP0": 1,
                       "PCW_S_AXI_HP0_DATA_WIDTH": hp_bits, "PCW_EN_RST0_PORT": 1,
                       "PCW_USE_FABRIC_INTERRUPT": int(interrupt),
                       "PCW_IRQ_F2P_INTR": int(interrupt)})
    return params


class _Design:
    """An EDKSYSTEM document under construction: cells, nets, bus connections, address maps."""

    def __init__(self, name: str, arch: str, part: str, title: str, clock_hz: int):
        self.clock_hz = clock_hz
        self.root = ET.Element("EDKSYSTEM", EDWVERSION="1.2")
        self.root.append(ET.Comment(f" {title}: generated by insitu.fpga.hwh (register map "
                                    f"VERSION {VERSION:#010x}), not by Vivado "))
        ET.SubElement(self.root, "SYSTEMINFO", NAME=name, ARCH=arch, DEVICE=part)
        # Both parsers look these up unconditionally; nothing leaves the chip here.
        ET.SubElement(self.root, "EXTERNALINTERFACES")
        ET.SubElement(self.root, "EXTERNALPORTS")
        self.modules_el = ET.SubElement(self.root, "MODULES")
        self.cells: dict[str, ET.Element] = {}

    def cell(self, name: str, vlnv: str, modtype: str, params: dict,
             modclass: str = "PERIPHERAL") -> ET.Element:
        # IS_PL as every Vivado .hwh has it: pynqmetadata 0.1.2 (PYNQ v3.0.1 images) finds the
        # processing system as the cell with IS_PL="FALSE" and fails without one.
        mod = ET.SubElement(self.modules_el, "MODULE", FULLNAME=f"/{name}", INSTANCE=name,
                            VLNV=vlnv, MODTYPE=modtype, MODCLASS=modclass, IPTYPE="PERIPHERAL",
                            IS_ENABLE="1", IS_PL="FALSE" if modclass == "PROCESSOR" else "TRUE")
        pars = ET.SubElement(mod, "PARAMETERS")
        component = {"Component_Name": f"{BD_NAME}_{name}_0", "EDK_IPTYPE": "PERIPHERAL"}
        for key, value in {**component, **params}.items():
            ET.SubElement(pars, "PARAMETER", NAME=key, VALUE=str(value))
        for tag in ("PORTS", "BUSINTERFACES"):
            ET.SubElement(mod, tag)
        self.cells[name] = mod
        return mod

    def _section(self, cell: str, tag: str) -> ET.Element:
        """The PORTS or BUSINTERFACES of a cell (:meth:`cell` gives it both)."""
        section = self.cells[cell].find(tag)
        assert section is not None
        return section

    def net(self, source: tuple[str, str], *sinks: tuple[str, str], sigis: str = "") -> None:
        """One wire, named after its driver. As Vivado writes it: every end is a PORT carrying
        the net's SIGNAME; the driver lists all sinks as CONNECTIONS, each sink the driver."""
        signame = "_".join(source)
        extra = {"SIGIS": sigis} if sigis else {}
        if sigis == "clk":
            extra["CLKFREQUENCY"] = str(self.clock_hz)
        for end, direction, others in [(source, "O", sinks)] + [(s, "I", [source]) for s in sinks]:
            port = ET.SubElement(self._section(end[0], "PORTS"), "PORT",
                                 {"NAME": end[1], "DIR": direction, "SIGNAME": signame, **extra})
            conns = ET.SubElement(port, "CONNECTIONS")
            for cell, pin in others:
                ET.SubElement(conns, "CONNECTION", INSTANCE=cell, PORT=pin)

    def bus(self, master: tuple[str, str], slave: tuple[str, str], kind: str = "aximm") -> None:
        """A bus-interface connection (BUSNAME is the interface net)."""
        busname = "_".join(master)
        for (cell, busif), mode in ((master, "MASTER"), (slave, "SLAVE")):
            ET.SubElement(self._section(cell, "BUSINTERFACES"), "BUSINTERFACE", NAME=busif,
                          BUSNAME=busname, TYPE=mode, VLNV=f"xilinx.com:interface:{kind}:1.0")

    def memrange(self, master: tuple[str, str], target: tuple[str, str], block: str,
                 base: int, span: int, memtype: str = "REGISTER") -> None:
        """What ``master`` sees of ``target``'s address ``block`` (pynq's ip_dict comes from the
        PS's ranges: MEMTYPE REGISTER is an IP, MEMORY a memory)."""
        mod = self.cells[master[0]]
        mmap = mod.find("MEMORYMAP")
        if mmap is None:
            mmap = ET.SubElement(mod, "MEMORYMAP")
        ET.SubElement(mmap, "MEMRANGE", ADDRESSBLOCK=block, BASENAME="C_BASEADDR",
                      BASEVALUE=f"0x{base:08X}", HIGHNAME="C_HIGHADDR",
                      HIGHVALUE=f"0x{base + span - 1:08X}", INSTANCE=target[0],
                      IS_DATA="TRUE", IS_INSTRUCTION="TRUE", MASTERBUSINTERFACE=master[1],
                      MEMTYPE=memtype, SLAVEBUSINTERFACE=target[1])


def _properties(parent: ET.Element, **props) -> None:
    for key, value in props.items():
        ET.SubElement(parent, "PROPERTY", NAME=key.upper(), VALUE=str(value))


def _register_block(mod: ET.Element) -> None:
    """The accelerator's registers, as package_ip.tcl declares them (32-bit registers; one field
    per bit group, or the whole register as one field), where both parsers read them."""
    block = ET.SubElement(ET.SubElement(mod, "ADDRESSBLOCKS"), "ADDRESSBLOCK",
                          NAME=ADDRESS_BLOCK, INTERFACE=AXIL_BUSIF, RANGE=str(ADDRESS_SPAN),
                          USAGE="register", ACCESS="read-write")
    regs = ET.SubElement(block, "REGISTERS")
    for reg in REGISTERS:
        access = _IPXACT_ACCESS[reg.access]
        el = ET.SubElement(regs, "REGISTER", NAME=reg.name)
        _properties(el, description=reg.doc, address_offset=f"{reg.offset:#x}", size=32,
                    access=access, is_enabled="true")
        fields = ET.SubElement(el, "FIELDS")
        for f in reg.fields or (Field(reg.name, 0, reg.width, reg.doc),):
            _properties(ET.SubElement(fields, "FIELD", NAME=f.name), description=f.doc,
                        access=access, bit_offset=f.lsb, bit_width=f.width)


def hwh_xml(board: str, interrupt: bool = False, clock_hz: int | None = None) -> str:
    """The ``.hwh`` (XML text) of ``board``'s block design ("ultra96v2" or "zedboard").

    ``clock_hz``: its PL clock (default: the board's ``pl_clock_hz``): FCLK0's rate and divisors
    (:func:`pl_clock_divisors`) and the clock net's CLKFREQUENCY.

    ``interrupt=True`` describes the design with the AXI interrupt controller (the accelerator's
    ``interrupt`` and the DMA's two, through an ``xlconcat``, to the PS), as the Tcl builds it for
    a top level with an interrupt output; pynq then lists them in ``interrupt_pins`` and in each
    IP's ``interrupts``. The twins use ``interrupt=False``: no controller, the driver polls, and
    every ``interrupts`` entry is an empty dict.
    """
    b = board_design(board)
    clock_hz = b.clock_hz if clock_hz is None else clock_hz
    amap = address_map(board, interrupt)
    ps = b.ps_cell
    master, hp_slave, pl_clk, pl_rst, ps_clock_pins, ps_irq = PS_PINS[b.ps]
    d = _Design(BD_NAME, _PS_ARCH[b.ps], b.part,
                f"block design {BD_NAME!r} of the insitu accelerator on {b.description}",
                round(pl_clock_divisors(b.ps, clock_hz)[3]))

    d.cell(ps, _PS_VLNV[b.ps], b.ps, _ps_parameters(b.ps, b.hp_bits, interrupt, clock_hz),
           modclass="PROCESSOR")
    accel = d.cell(ACCEL_CELL, IP_VLNV, TOP_MODULE, {})
    _register_block(accel)
    # The DMA's user parameters (lower case, what pynq's DMA reads) and the HDL generics they set
    # (upper case), as Vivado lists both; c_micro_dma keeps the IP's default, which the Tcl does.
    d.cell(DMA_CELL, DMA_VLNV, "axi_dma",
           {**{k.upper(): v for k, v in DMA_CONFIG.items()}, **DMA_CONFIG, "c_micro_dma": 0,
            "C_MICRO_DMA": 0})
    d.cell("axi_ctrl", "xilinx.com:ip:smartconnect:1.0", "smartconnect",
           {"NUM_SI": 1, "NUM_MI": 3 if interrupt else 2})
    d.cell("axi_mem", "xilinx.com:ip:smartconnect:1.0", "smartconnect", {"NUM_SI": 2, "NUM_MI": 1})
    d.cell("rst_pl", "xilinx.com:ip:proc_sys_reset:5.0", "proc_sys_reset", {})

    # Control: PS master -> SmartConnect -> the accelerator's and the DMA's registers.
    d.bus((ps, master), ("axi_ctrl", "S00_AXI"))
    d.bus(("axi_ctrl", "M00_AXI"), (ACCEL_CELL, AXIL_BUSIF))
    d.bus(("axi_ctrl", "M01_AXI"), (DMA_CELL, "S_AXI_LITE"))
    d.memrange((ps, master), (ACCEL_CELL, AXIL_BUSIF), ADDRESS_BLOCK,
               amap["accel_base"], amap["accel_range"])
    d.memrange((ps, master), (DMA_CELL, "S_AXI_LITE"), "Reg", amap["dma_base"], amap["dma_range"])
    # Data: DMA <-> DDR through the HP port, DMA <-> accelerator streams.
    d.bus((DMA_CELL, "M_AXI_MM2S"), ("axi_mem", "S00_AXI"))
    d.bus((DMA_CELL, "M_AXI_S2MM"), ("axi_mem", "S01_AXI"))
    d.bus(("axi_mem", "M00_AXI"), (ps, hp_slave))
    ddr_block = b.ddr_segment.split("/")[-1]
    for dma_master in ("M_AXI_MM2S", "M_AXI_S2MM"):
        d.memrange((DMA_CELL, dma_master), (ps, hp_slave), ddr_block, 0, b.ddr_range, "MEMORY")
    d.bus((DMA_CELL, "M_AXIS_MM2S"), (ACCEL_CELL, AXIS_SLAVE_BUSIF), "axis")
    d.bus((ACCEL_CELL, AXIS_MASTER_BUSIF), (DMA_CELL, "S_AXIS_S2MM"), "axis")

    # One PL clock and one reset for the whole PL.
    clocked = [(ps, pin) for pin in ps_clock_pins] + [
        ("axi_ctrl", "aclk"), ("axi_mem", "aclk"), (DMA_CELL, "s_axi_lite_aclk"),
        (DMA_CELL, "m_axi_mm2s_aclk"), (DMA_CELL, "m_axi_s2mm_aclk"), (ACCEL_CELL, CLOCK_PORT),
        ("rst_pl", "slowest_sync_clk")]
    reset = [(ACCEL_CELL, RESET_PORT), (DMA_CELL, "axi_resetn")]
    if interrupt:
        clocked.append((INTC_CELL, "s_axi_aclk"))
        reset.append((INTC_CELL, "s_axi_aresetn"))
        # The parser follows the PS's interrupt net to axi_intc (MODTYPE axi_intc, pin irq), its
        # intr net to an xlconcat (pin dout, NUM_PORTS) and the concat's In<n> nets to the pins.
        d.cell(INTC_CELL, "xilinx.com:ip:axi_intc:4.1", "axi_intc",
               {"C_IRQ_CONNECTION": 1, "C_IRQ_IS_LEVEL": 1, "C_NUM_INTR_INPUTS": 3})
        d.cell("irq_concat", "xilinx.com:ip:xlconcat:2.1", "xlconcat", {"NUM_PORTS": 3})
        d.bus(("axi_ctrl", "M02_AXI"), (INTC_CELL, "s_axi"))
        d.memrange((ps, master), (INTC_CELL, "s_axi"), "Reg", amap["intc_base"],
                   amap["intc_range"])
        sources = [(ACCEL_CELL, INTERRUPT_PORT), (DMA_CELL, "mm2s_introut"),
                   (DMA_CELL, "s2mm_introut")]
        for i, source in enumerate(sources):
            d.net(source, ("irq_concat", f"In{i}"), sigis="INTERRUPT")
        d.net(("irq_concat", "dout"), (INTC_CELL, "intr"), sigis="INTERRUPT")
        d.net((INTC_CELL, "irq"), (ps, ps_irq), sigis="INTERRUPT")

    d.net((ps, pl_clk), *clocked, sigis="clk")
    d.net((ps, pl_rst), ("rst_pl", "ext_reset_in"), sigis="rst")
    d.net(("rst_pl", "peripheral_aresetn"), *reset, sigis="rst")
    d.net(("rst_pl", "interconnect_aresetn"), ("axi_ctrl", "aresetn"), ("axi_mem", "aresetn"),
          sigis="rst")

    ET.indent(d.root, space="  ")
    xml = ET.tostring(d.root, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{xml}\n'


def write_hwh(board: str, path: str | Path, interrupt: bool = False,
              clock_hz: int | None = None) -> Path:
    """Write :func:`hwh_xml` to ``path`` atomically (next to a ``.bit`` of the same name for
    ``pynq.Overlay``); returns the path."""
    return atomic_write(path, hwh_xml(board, interrupt, clock_hz))


def hwh_clock_hz(path) -> int | None:
    """PL clock 0's achieved rate in Hz as a .hwh records it (the processing system's
    ``PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ`` or ``PCW_ACT_FPGA0_PERIPHERAL_FREQMHZ``, what
    Vivado writes and :func:`hwh_xml` too); None when the file has none (or does not parse)."""
    try:
        root = ET.parse(Path(path)).getroot()
    except (ET.ParseError, OSError, UnicodeDecodeError):
        return None
    for module in root.iterfind("./MODULES/MODULE"):
        name = ACT_CLOCK_PARAMS.get(module.get("MODTYPE", ""))
        if name is None:
            continue
        found = module.find(f"./PARAMETERS/PARAMETER[@NAME='{name}']")
        try:
            mhz = float(found.get("VALUE", "")) if found is not None else 0.0
        except ValueError:
            mhz = 0.0
        if mhz > 0:
            return round(mhz * 1e6)
    return None


def _property(el: ET.Element, name: str, convert: Callable[[Any], Any] = str):
    """The VALUE of the PROPERTY ``name`` of a handoff element (None when it has none)."""
    found = el.find(f"./PROPERTY[@NAME='{name}']")
    return None if found is None else convert(found.get("VALUE"))


def _number(text: str) -> int:
    return int(text, 0)


def register_map_differences(cell: ET.Element) -> list[str]:
    """How the accelerator cell's registers in a handoff differ from this register map (what
    VERSION sums up), compared as package_ip.tcl declares them: offsets and fields with their
    bits and access; empty when they agree."""
    found = {reg.get("NAME"): (_property(reg, "ADDRESS_OFFSET", _number),
                               {f.get("NAME"): (_property(f, "BIT_OFFSET", _number),
                                                _property(f, "BIT_WIDTH", _number),
                                                _property(f, "ACCESS"))
                                for f in reg.iterfind("./FIELDS/FIELD")})
             for reg in cell.iterfind(".//ADDRESSBLOCK/REGISTERS/REGISTER")}
    differences = []
    for reg in REGISTERS:
        access = _IPXACT_ACCESS[reg.access]
        fields = {f.name: (f.lsb, f.width, access)
                  for f in reg.fields or (Field(reg.name, 0, reg.width, reg.doc),)}
        if reg.name not in found:
            differences.append(f"no register {reg.name}")
        elif found[reg.name] != (reg.offset, fields):
            differences.append(f"register {reg.name} differs")
    differences += [f"register {name} is not in this map"
                    for name in found if name not in {r.name for r in REGISTERS}]
    return differences


def check_hwh(path, board: str) -> None:
    """Refuse (a UsageError naming ``path``) a .hwh that is not this insitu's accelerator on
    ``board``'s block design: it must parse, describe ``board``'s processing system, and hold
    the accelerator cell (:data:`~insitu.accel.params.IP_VLNV`) with this register map (the
    driver also reads VERSION from the hardware when it loads the overlay)."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not a hardware handoff (.hwh): its XML does not parse "
                         f"({exc})") from None
    if root.tag != "EDKSYSTEM":
        raise UsageError(f"{path} is not a hardware handoff (.hwh): its root element is "
                         f"<{root.tag}>, not <EDKSYSTEM>")
    rebuild = ("build the overlay from this insitu version (`insitu rtl generate`, then its "
               "Vivado script)")
    design = board_design(board)
    info = root.find("SYSTEMINFO")
    arch = info.get("ARCH") if info is not None else None
    if arch is not None and arch != _PS_ARCH[design.ps]:
        raise UsageError(f"{path} is a block design for a {arch} device; {board} is "
                         f"{design.description}, a {_PS_ARCH[design.ps]} device: give {board}'s "
                         "overlay")
    cell = root.find(f"./MODULES/MODULE[@INSTANCE='{ACCEL_CELL}']")
    if cell is None:
        raise UsageError(f"{path} has no {ACCEL_CELL} cell: it is not the block design of the "
                         f"insitu accelerator; {rebuild}")
    if cell.get("VLNV") != IP_VLNV:
        raise UsageError(f"{path}: its {ACCEL_CELL} is the IP {cell.get('VLNV')}, not {IP_VLNV}; "
                         f"{rebuild}")
    differences = register_map_differences(cell)
    if differences:
        raise UsageError(f"{path}: the registers of {ACCEL_CELL} are not this insitu's register "
                         f"map (VERSION {VERSION:#010x}): {'; '.join(differences[:3])}"
                         f"{' ...' if len(differences) > 3 else ''}; {rebuild}")
