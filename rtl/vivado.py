"""Vivado Tcl for the accelerator: IP packaging, a block design per board, bitstream and .hwh.

``insitu rtl generate`` writes these scripts next to the Verilog; Vivado is not needed to write
them. In that folder::

    vivado -mode batch -source build_ultra96v2.tcl [-tclargs JOBS]

packages ``insitu_accel_<board>.v`` (the top level generated with that board's accelerator
parameters, :func:`insitu.boards.accelerator_params`) as IP
:data:`~insitu.accel.params.IP_VLNV`, with its out-of-context clock at the board's PL clock
(``insitu_accel_<board>_ooc.xdc``), builds the board's block design (processing system, AXI DMA,
the accelerator), runs synthesis, implementation and ``write_bitstream``, and leaves
``insitu_<board>.bit`` and ``insitu_<board>.hwh`` side by side: the pair ``pynq.Overlay`` loads.
Utilization, timing and power reports land beside them.

The Vivado-facing contract of the top level (:data:`~insitu.accel.params.TOP_MODULE`) is
:func:`top_ports`: ``aclk``, ``aresetn`` (active low), the AXI4-Lite slave ``s_axi_control_*``,
the AXI4-Stream slave ``s_axis_*`` and master ``m_axis_*``. The Tcl declares exactly these
ports as bus interfaces (nothing is left to Vivado's inference), and ``generate`` refuses a top
whose Verilog ports differ.

Block design (both boards): PS master port -> SmartConnect -> accelerator ``s_axi_control`` and
the DMA's ``S_AXI_LITE``; DMA ``M_AXI_MM2S``/``M_AXI_S2MM`` -> SmartConnect -> PS HP0 port; DMA
``M_AXIS_MM2S`` -> accelerator ``s_axis``; accelerator ``m_axis`` -> DMA ``S_AXIS_S2MM``; one
PL clock, the PS's FCLK0 at the board's ``pl_clock_hz`` (boards/<board>.toml; the PS's PLL that
gives it, the closest otherwise: the achieved rate is in the .hwh, where the driver reads it), and
a ``proc_sys_reset``. The DMA runs in simple
(register) mode with 128-bit streams. When the top level has an ``interrupt`` output, it and the
DMA's two interrupts reach the PS through an AXI interrupt controller (``pynq.Interrupt``);
otherwise nothing is wired and the driver polls STATUS.
"""

from __future__ import annotations

from dataclasses import dataclass

from insitu.accel.params import (IP_LIBRARY, IP_VENDOR, IP_VERSION, IP_VLNV, STREAM_BITS, TOP_MODULE,
                                 AcceleratorParams)
from insitu.accel.regmap import ADDR_BITS, REGISTERS, VERSION, Field
from insitu.accel.ip import (ACCEL_CELL, ADDRESS_BLOCK, ADDRESS_SPAN, AXIL_BUSIF, AXIS_MASTER_BUSIF,
                             AXIS_SLAVE_BUSIF, BD_NAME, CLOCK_PORT, DMA_CELL, DMA_LENGTH_BITS,
                             INTC_CELL, INTC_RANGE, INTERRUPT_PORT, PS_PINS, RESET_PORT,
                             bitstream_name)

# AXI4-Lite channels seen from the slave: (logical name, direction, width).
_AXIL = (
    ("AWADDR", "input", ADDR_BITS), ("AWVALID", "input", 1), ("AWREADY", "output", 1),
    ("WDATA", "input", 32), ("WSTRB", "input", 4), ("WVALID", "input", 1), ("WREADY", "output", 1),
    ("BRESP", "output", 2), ("BVALID", "output", 1), ("BREADY", "input", 1),
    ("ARADDR", "input", ADDR_BITS), ("ARVALID", "input", 1), ("ARREADY", "output", 1),
    ("RDATA", "output", 32), ("RRESP", "output", 2), ("RVALID", "output", 1), ("RREADY", "input", 1),
)
# AXI4-Stream signals seen from the receiver: (logical name, direction, width).
_AXIS = (
    ("TDATA", "input", STREAM_BITS), ("TKEEP", "input", STREAM_BITS // 8), ("TLAST", "input", 1),
    ("TVALID", "input", 1), ("TREADY", "output", 1),
)


@dataclass(frozen=True)
class BusInterface:
    name: str
    bus_type: str            # VLNV without the version, e.g. xilinx.com:interface:aximm
    mode: str                # slave | master
    ports: tuple[tuple[str, str], ...]   # (logical, physical)


def _flip(direction: str) -> str:
    return "output" if direction == "input" else "input"


def top_ports(interrupt: bool = False) -> dict[str, tuple[str, int]]:
    """The ports the top-level Verilog module must have: name -> (direction, width)."""
    ports = {CLOCK_PORT: ("input", 1), RESET_PORT: ("input", 1)}
    if interrupt:
        ports[INTERRUPT_PORT] = ("output", 1)
    for logical, direction, width in _AXIL:
        ports[f"{AXIL_BUSIF}_{logical.lower()}"] = (direction, width)
    for busif, flip in ((AXIS_SLAVE_BUSIF, False), (AXIS_MASTER_BUSIF, True)):
        for logical, direction, width in _AXIS:
            ports[f"{busif}_{logical.lower()}"] = (_flip(direction) if flip else direction, width)
    return ports


def bus_interfaces(interrupt: bool = False) -> tuple[BusInterface, ...]:
    """The IP's bus interfaces and their port maps, as the packaging Tcl declares them."""
    def prefixed(busif, signals):
        return tuple((logical, f"{busif}_{logical.lower()}") for logical, _, _ in signals)

    irq = (BusInterface(INTERRUPT_PORT, "xilinx.com:signal:interrupt", "master",
                        (("INTERRUPT", INTERRUPT_PORT),)),) if interrupt else ()
    return irq + (
        BusInterface(AXIL_BUSIF, "xilinx.com:interface:aximm", "slave", prefixed(AXIL_BUSIF, _AXIL)),
        BusInterface(AXIS_SLAVE_BUSIF, "xilinx.com:interface:axis", "slave",
                     prefixed(AXIS_SLAVE_BUSIF, _AXIS)),
        BusInterface(AXIS_MASTER_BUSIF, "xilinx.com:interface:axis", "master",
                     prefixed(AXIS_MASTER_BUSIF, _AXIS)),
        BusInterface(CLOCK_PORT, "xilinx.com:signal:clock", "slave", (("CLK", CLOCK_PORT),)),
        BusInterface(RESET_PORT, "xilinx.com:signal:reset", "slave", (("RST", RESET_PORT),)),
    )


@dataclass(frozen=True)
class BoardDesign:
    """What the block design of one board needs (the board's resources are in boards/*.toml)."""

    key: str                     # the board's name in boards/ (ultra96v2, zedboard)
    description: str
    part: str                    # Vivado part name
    board_parts: tuple[str, ...]  # board-file patterns, tried in order (presets when installed)
    ps: str                      # zynq_ultra_ps_e | processing_system7
    accel_base: int              # the accelerator's s_axi_control base address (PS view)
    dma_base: int                # the AXI DMA's S_AXI_LITE base address
    dma_range: int
    ddr_segment: str             # the HP0 port's DDR segment seen by the DMA
    ddr_range: int
    hp_bits: int                 # HP0 data width
    intc_base: int               # the AXI interrupt controller (when the top has an interrupt)

    @property
    def ps_cell(self) -> str:
        return f"{self.ps}_0"

    @property
    def clock_hz(self) -> int:
        """The board's PL clock (boards/<key>.toml ``[fpga] pl_clock_hz``)."""
        from insitu.boards import pl_clock_hz

        return pl_clock_hz(self.key)

    @property
    def params(self) -> AcceleratorParams:
        """The accelerator parameters the board's design is generated with (its board file)."""
        from insitu.boards import accelerator_params

        return accelerator_params(self.key)


BOARD_DESIGNS: dict[str, BoardDesign] = {
    "ultra96v2": BoardDesign(
        key="ultra96v2", description="Avnet Ultra96-V2 (Zynq UltraScale+ ZU3EG)",
        part="xczu3eg-sbva484-1-i", board_parts=("avnet.com:ultra96v2:part0:*", "*:ultra96v2:*"),
        ps="zynq_ultra_ps_e", accel_base=0xA000_0000, dma_base=0xA001_0000, dma_range=0x1_0000,
        ddr_segment="SAXIGP2/HP0_DDR_LOW", ddr_range=0x8000_0000, hp_bits=128,
        intc_base=0xA002_0000),
    "zedboard": BoardDesign(
        key="zedboard", description="Digilent ZedBoard (Zynq-7000 XC7Z020)",
        part="xc7z020clg484-1",
        board_parts=("digilentinc.com:zedboard:part0:*", "em.avnet.com:zed:part0:*", "*:zedboard:*"),
        ps="processing_system7", accel_base=0x43C0_0000, dma_base=0x4040_0000, dma_range=0x1_0000,
        ddr_segment="S_AXI_HP0/HP0_DDR_LOWOCM", ddr_range=0x2000_0000, hp_bits=64,
        intc_base=0x4180_0000),
}


def board_design(key: str) -> BoardDesign:
    try:
        return BOARD_DESIGNS[key]
    except KeyError:
        raise ValueError(f"no Vivado block design for board {key!r}; known: "
                         f"{', '.join(BOARD_DESIGNS)}") from None


def top_filename(key: str) -> str:
    """The board's top-level Verilog (module :data:`~insitu.accel.params.TOP_MODULE`, the board's
    parameters), the file its IP is packaged from."""
    return f"{TOP_MODULE}_{key}.v"


def ooc_xdc_filename(key: str) -> str:
    """The board's out-of-context clock constraint (its PL clock period)."""
    return f"{TOP_MODULE}_{key}_ooc.xdc"


def paths_xdc_filename(key: str) -> str:
    """The board's declared false/multicycle paths (written only when there are any)."""
    return f"{TOP_MODULE}_{key}.xdc"


def mhz(hz: int | float) -> str:
    """A clock in MHz as the Tcl and the messages write it: 200, 125, 187.5."""
    return f"{hz / 1e6:.6f}".rstrip("0").rstrip(".")


def address_map(key: str, interrupt: bool = False) -> dict:
    """The PS-side addresses of one board's design (what a driver without the .hwh needs)."""
    b = board_design(key)
    out = {"accel_cell": ACCEL_CELL, "accel_base": b.accel_base, "accel_range": ADDRESS_SPAN,
           "dma_cell": DMA_CELL, "dma_base": b.dma_base, "dma_range": b.dma_range,
           "bitstream": bitstream_name(key), "part": b.part}
    if interrupt:
        out.update({"intc_cell": INTC_CELL, "intc_base": b.intc_base, "intc_range": INTC_RANGE})
    return out


# ---------------------------------------------------------------------------------------------
# Tcl text


def _brace(text: str) -> str:
    """``text`` as a braced Tcl word (braces and backslashes dropped so that it always parses)."""
    return "{" + " ".join(text.replace("{", "(").replace("}", ")").replace("\\", "/").split()) + "}"


def _subst(template: str, **values) -> str:
    import re

    for key, value in values.items():
        template = template.replace(f"@{key}@", str(value))
    leftover = re.search(r"@[A-Z_]+@", template)
    if leftover:
        raise AssertionError(f"unsubstituted Tcl template variable {leftover.group()}")
    return template


def _header(title: str) -> str:
    return (f"# {title}\n"
            f"# Generated by `insitu rtl generate` (register map VERSION {VERSION:#010x}, IP "
            f"{IP_VLNV}); do not edit.\n#\n")


_ACCESS = {"rw": "read-write", "ro": "read-only", "wo": "write-only"}


def _register_tcl() -> list[str]:
    lines = []
    for reg in REGISTERS:
        fields = reg.fields or (Field(reg.name, 0, reg.width, reg.doc),)
        words = " ".join(f"{{{f.name} {f.lsb} {f.width} {_brace(f.doc)}}}" for f in fields)
        lines.append(f"    insitu_add_register $block {reg.name} {reg.offset:#05x} "
                     f"{_ACCESS[reg.access]} {_brace(reg.doc)} {{{words}}}")
    return lines


_PACKAGE_TEMPLATE = r"""#   source package_ip.tcl
#   insitu_package_ip HDL_DIR IP_REPO_DIR PART BOARD
#
# Packages HDL_DIR/@TOP@_BOARD.v (the top level generated with BOARD's accelerator parameters,
# self-contained: the PEs are submodules in that file) as the IP @VLNV@ in
# IP_REPO_DIR/@TOP@. Every bus interface is declared here, none is left
# to inference: AXI4-Lite slave @AXIL@ (one @SPAN@-byte block of registers, @BLOCK@), AXI4-Stream
# slave @AXIS_S@ and master @AXIS_M@ (@STREAM_BITS@-bit TDATA), clock @CLK@ for all three and
# active-low reset @RST@.

proc insitu_add_bus {core name type mode ports} {
    set bif [ipx::add_bus_interface $name $core]
    set_property abstraction_type_vlnv ${type}_rtl:1.0 $bif
    set_property bus_type_vlnv ${type}:1.0 $bif
    set_property interface_mode $mode $bif
    foreach {logical physical} $ports {
        if {[llength [ipx::get_ports $physical -of_objects $core]] == 0} {
            error "insitu: the top level has no port $physical (bus interface $name)"
        }
        ipx::add_port_map $logical $bif
        set_property physical_name $physical [ipx::get_port_maps $logical -of_objects $bif]
    }
    return $bif
}

proc insitu_bus_parameter {core busif name value} {
    set bif [ipx::get_bus_interfaces $busif -of_objects $core]
    ipx::add_bus_parameter $name $bif
    set_property value $value [ipx::get_bus_parameters $name -of_objects $bif]
}

# fields: a list of {name lsb width description}; access: read-write, read-only or write-only.
proc insitu_add_register {block name offset access description fields} {
    set reg [ipx::add_register $name $block]
    set_property address_offset $offset $reg
    set_property size 32 $reg
    set_property description $description $reg
    foreach field $fields {
        lassign $field fname lsb width fdescription
        set f [ipx::add_field $fname $reg]
        set_property bit_offset $lsb $f
        set_property bit_width $width $f
        set_property access $access $f
        set_property description $fdescription $f
    }
}

proc insitu_package_ip {hdl_dir ip_repo part board} {
    set ip_dir [file join $ip_repo @TOP@]
    set work_dir [file join $ip_repo _package_project]
    file delete -force $ip_dir $work_dir
    file mkdir $ip_repo
    create_project -force insitu_package $work_dir -part $part
    set hdl [file join $hdl_dir @TOP@_${board}.v]
    if {![file exists $hdl]} {
        error "insitu: $hdl is missing (insitu rtl generate writes one top level per board)"
    }
    add_files -norecurse $hdl
    set_property top @TOP@ [current_fileset]
    # The IP's clock (the board's PL clock) for its out-of-context synthesis and implementation;
    # in the block design the PS constrains the clock it drives. Declared false/multicycle paths,
    # if any, apply everywhere. Both come from insitu.rtl.timing, the estimate's own constraints.
    set ooc_xdc [file join $hdl_dir @TOP@_${board}_ooc.xdc]
    add_files -fileset constrs_1 -norecurse $ooc_xdc
    set_property USED_IN {synthesis implementation out_of_context} [get_files $ooc_xdc]
    set paths_xdc [file join $hdl_dir @TOP@_${board}.xdc]
    if {[file exists $paths_xdc]} {
        add_files -fileset constrs_1 -norecurse $paths_xdc
    }
    update_compile_order -fileset sources_1
    ipx::package_project -root_dir $ip_dir -vendor @VENDOR@ -library @LIBRARY@ \
        -taxonomy /UserIP -import_files -set_current true
    set core [ipx::current_core]
    set_property vendor @VENDOR@ $core
    set_property library @LIBRARY@ $core
    set_property name @TOP@ $core
    set_property version @IPVERSION@ $core
    set_property display_name {insitu training accelerator} $core
    set_property description "TT-format and low-rank training PEs behind AXI4-Lite control and AXI4-Stream data (register map VERSION @VERSION@, generated for $board)" $core
    set_property vendor_display_name {insitu} $core
    set_property supported_families {zynq Production zynquplus Production} $core

    # Drop whatever the packager inferred; the interfaces are declared below.
    foreach bif [ipx::get_bus_interfaces -of_objects $core] {
        ipx::remove_bus_interface [get_property NAME $bif] $core
    }
    foreach mm [ipx::get_memory_maps -of_objects $core] {
        ipx::remove_memory_map [get_property NAME $mm] $core
    }

@BUSES@

    insitu_bus_parameter $core @CLK@ ASSOCIATED_BUSIF @AXIL@:@AXIS_S@:@AXIS_M@
    insitu_bus_parameter $core @CLK@ ASSOCIATED_RESET @RST@
    insitu_bus_parameter $core @RST@ POLARITY ACTIVE_LOW

    # The register file: one address block of @SPAN@ bytes; unknown offsets read 0.
    set mm [ipx::add_memory_map @AXIL@ $core]
    set_property slave_memory_map_ref @AXIL@ [ipx::get_bus_interfaces @AXIL@ -of_objects $core]
    set block [ipx::add_address_block @BLOCK@ $mm]
    set_property range @SPAN@ $block
    set_property width 32 $block
    set_property usage register $block
@REGISTERS@

    set_property core_revision 1 $core
    ipx::create_xgui_files $core
    ipx::update_checksums $core
    ipx::check_integrity $core
    ipx::save_core $core
    close_project
    puts "insitu: packaged @VLNV@ for $board in $ip_dir"
}
"""


def package_ip_tcl(interrupt: bool = False) -> str:
    """Tcl that packages the top-level Verilog as the accelerator's IP (``package_ip.tcl``)."""
    buses = []
    for bif in bus_interfaces(interrupt):
        ports = " ".join(f"{logical} {physical}" for logical, physical in bif.ports)
        buses.append(f"    insitu_add_bus $core {bif.name} {bif.bus_type} {bif.mode} {{{ports}}}")
    if interrupt:
        buses.append(f"    insitu_bus_parameter $core {INTERRUPT_PORT} SENSITIVITY LEVEL_HIGH")
    return _header("Package the insitu accelerator as a Vivado IP.") + _subst(
        _PACKAGE_TEMPLATE, TOP=TOP_MODULE, VLNV=IP_VLNV, VENDOR=IP_VENDOR, LIBRARY=IP_LIBRARY,
        IPVERSION=IP_VERSION, VERSION=f"{VERSION:#010x}", AXIL=AXIL_BUSIF, AXIS_S=AXIS_SLAVE_BUSIF,
        AXIS_M=AXIS_MASTER_BUSIF, CLK=CLOCK_PORT, RST=RESET_PORT, BLOCK=ADDRESS_BLOCK,
        SPAN=ADDRESS_SPAN, STREAM_BITS=STREAM_BITS, BUSES="\n".join(buses),
        REGISTERS="\n".join(_register_tcl()))


# Per-PS parts of the block design: the PS cell's setup, its pins and address spaces.
_PS_SETUP = {
    "zynq_ultra_ps_e": r"""
    set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:zynq_ultra_ps_e:* @PS@]
    apply_bd_automation -rule xilinx.com:bd_rule:zynq_ultra_ps_e \
        -config [list apply_board_preset [expr {$board_part ne "" ? 1 : 0}]] $ps
    # HPM0_FPD (32-bit) for the registers, HP0_FPD (@HP_BITS@-bit) for the DMA, PL clock 0 at the
    # board's @CLOCK_MHZ@ MHz.
    set_property -dict [list \
        CONFIG.PSU__USE__M_AXI_GP0 {1} \
        CONFIG.PSU__MAXIGP0__DATA_WIDTH {32} \
        CONFIG.PSU__USE__M_AXI_GP1 {0} \
        CONFIG.PSU__USE__M_AXI_GP2 {0} \
        CONFIG.PSU__USE__S_AXI_GP2 {1} \
        CONFIG.PSU__SAXIGP2__DATA_WIDTH {@HP_BITS@} \
        CONFIG.PSU__FPGA_PL0_ENABLE {1} \
        CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ {@CLOCK_MHZ@} \
@IRQ_CONFIG@    ] $ps
    insitu_pl_clock $ps PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ \
        PSU__CRL_APB__PL0_REF_CTRL__SRCSEL {IOPLL RPLL DPLL} @CLOCK_MHZ@
""",
    "processing_system7": r"""
    set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:processing_system7:* @PS@]
    apply_bd_automation -rule xilinx.com:bd_rule:processing_system7 \
        -config [list make_external "FIXED_IO, DDR" apply_board_preset \
                     [expr {$board_part ne "" ? 1 : 0}] Master Disable Slave Disable] $ps
    # M_AXI_GP0 for the registers, S_AXI_HP0 (@HP_BITS@-bit) for the DMA, FCLK_CLK0 at the
    # board's @CLOCK_MHZ@ MHz.
    set_property -dict [list \
        CONFIG.PCW_USE_M_AXI_GP0 {1} \
        CONFIG.PCW_USE_S_AXI_HP0 {1} \
        CONFIG.PCW_S_AXI_HP0_DATA_WIDTH {@HP_BITS@} \
        CONFIG.PCW_EN_CLK0_PORT {1} \
        CONFIG.PCW_EN_RST0_PORT {1} \
        CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ {@CLOCK_MHZ@} \
@IRQ_CONFIG@    ] $ps
    insitu_pl_clock $ps PCW_FPGA0_PERIPHERAL_FREQMHZ PCW_ACT_FPGA0_PERIPHERAL_FREQMHZ \
        PCW_FCLK0_PERIPHERAL_CLKSRC {{IO PLL} {ARM PLL} {DDR PLL}} @CLOCK_MHZ@
""",
}

# PS settings of the interrupt input (only when the top level has an interrupt).
_PS_IRQ_CONFIG = {
    "zynq_ultra_ps_e": "        CONFIG.PSU__USE__IRQ0 {1} \\\n",
    "processing_system7": ("        CONFIG.PCW_USE_FABRIC_INTERRUPT {1} \\\n"
                           "        CONFIG.PCW_IRQ_F2P_INTR {1} \\\n"),
}

_BD_TEMPLATE = r"""#   source bd_@BOARD@.tcl
#   insitu_build_@BOARD@ IP_REPO_DIR BUILD_DIR OUT_DIR JOBS
#
# @DESCRIPTION@, part @PART@. Needs the IP packaged by package_ip.tcl in IP_REPO_DIR.
# Writes OUT_DIR/@BIT@.bit and OUT_DIR/@BIT@.hwh (the pair pynq.Overlay loads) and the
# utilization, timing and power reports; the Vivado project is BUILD_DIR/vivado.
#
# Address map (PS view): @ACCEL@/@AXIL@ at @ACCEL_BASE@ (@SPAN@ bytes), @DMA@/S_AXI_LITE at
# @DMA_BASE@@IRQ_NOTE@. The DMA reaches DDR through @PS@/@DDR_SEGMENT@ (@DDR_RANGE@ bytes from 0).

# PL clock 0 at MHZ: the first of the PS's source PLLs whose achieved rate (the PS's ACT
# parameter) is within 0.1 % of it, else the closest one, with a warning. The achieved rate is
# what the .hwh records and the driver converts cycles to seconds with.
proc insitu_pl_clock {ps freq_param act_param src_param sources mhz} {
    set best_src ""
    set best_act ""
    set best_err ""
    foreach src $sources {
        set_property -dict [list CONFIG.$src_param $src CONFIG.$freq_param $mhz] $ps
        set act [get_property CONFIG.$act_param $ps]
        if {![string is double -strict $act]} {
            continue
        }
        set err [expr {abs($act - $mhz) / double($mhz)}]
        if {$best_src eq "" || $err < $best_err} {
            set best_src $src
            set best_act $act
            set best_err $err
        }
        if {$err <= 0.001} {
            break
        }
    }
    if {$best_src eq ""} {
        set_property -dict [list CONFIG.$src_param [lindex $sources 0] CONFIG.$freq_param $mhz] $ps
        puts "WARNING: insitu: PL clock 0 asked at $mhz MHz; the PS reports no achieved rate"
        return
    }
    set_property -dict [list CONFIG.$src_param $best_src CONFIG.$freq_param $mhz] $ps
    if {$best_err > 0.001} {
        puts "WARNING: insitu: PL clock 0 runs at $best_act MHz, not $mhz MHz (no PS PLL divides to it; the driver reads the achieved rate from the .hwh)"
    } else {
        puts "insitu: PL clock 0 at $best_act MHz from $best_src"
    }
}

proc insitu_find_board_part {patterns} {
    foreach pattern $patterns {
        set found [lsort [get_board_parts -quiet $pattern]]
        if {[llength $found] > 0} {
            return [lindex $found end]
        }
    }
    return ""
}

proc insitu_build_@BOARD@ {ip_repo build_dir out_dir jobs} {
    set project @BIT@
    set proj_dir [file join $build_dir vivado]
    file mkdir $out_dir
    create_project -force $project $proj_dir -part @PART@
    set board_part [insitu_find_board_part {@BOARD_PARTS@}]
    if {$board_part ne ""} {
        set_property board_part $board_part [current_project]
        puts "insitu: board part $board_part (its PS presets are applied)"
    } else {
        puts "WARNING: insitu: no board files for @BOARD@ are installed; the PS keeps its default presets (PYNQ's boot image configures DDR and MIO)"
    }
    set_property ip_repo_paths [list $ip_repo] [current_project]
    update_ip_catalog -rebuild
    if {[llength [get_ipdefs -quiet @VLNV@]] == 0} {
        error "insitu: IP @VLNV@ not found in $ip_repo (run insitu_package_ip first)"
    }

    create_bd_design @BD@
@PS_SETUP@
    set accel [create_bd_cell -type ip -vlnv @VLNV@ @ACCEL@]
    set dma [create_bd_cell -type ip -vlnv xilinx.com:ip:axi_dma:* @DMA@]
    set_property -dict [list \
        CONFIG.c_include_sg {0} \
        CONFIG.c_sg_length_width {@DMA_LENGTH_BITS@} \
        CONFIG.c_include_mm2s {1} \
        CONFIG.c_include_s2mm {1} \
        CONFIG.c_include_mm2s_dre {0} \
        CONFIG.c_include_s2mm_dre {0} \
        CONFIG.c_m_axi_mm2s_data_width {@STREAM_BITS@} \
        CONFIG.c_m_axis_mm2s_tdata_width {@STREAM_BITS@} \
        CONFIG.c_m_axi_s2mm_data_width {@STREAM_BITS@} \
        CONFIG.c_s_axis_s2mm_tdata_width {@STREAM_BITS@} \
        CONFIG.c_mm2s_burst_size {16} \
        CONFIG.c_s2mm_burst_size {16} \
        CONFIG.c_addr_width {32} \
    ] $dma
    set ctrl_ic [create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:* axi_ctrl]
    set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {@CTRL_MI@}] $ctrl_ic
    set mem_ic [create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:* axi_mem]
    set_property -dict [list CONFIG.NUM_SI {2} CONFIG.NUM_MI {1}] $mem_ic
    set rst [create_bd_cell -type ip -vlnv xilinx.com:ip:proc_sys_reset:* rst_pl]
@IRQ_CELLS@
    # Control: PS master -> SmartConnect -> accelerator registers and DMA registers.
    connect_bd_intf_net [get_bd_intf_pins @PS@/@PS_MASTER@] [get_bd_intf_pins axi_ctrl/S00_AXI]
    connect_bd_intf_net [get_bd_intf_pins axi_ctrl/M00_AXI] [get_bd_intf_pins @ACCEL@/@AXIL@]
    connect_bd_intf_net [get_bd_intf_pins axi_ctrl/M01_AXI] [get_bd_intf_pins @DMA@/S_AXI_LITE]
    # Data: DMA <-> DDR through the HP port, DMA <-> accelerator streams.
    connect_bd_intf_net [get_bd_intf_pins @DMA@/M_AXI_MM2S] [get_bd_intf_pins axi_mem/S00_AXI]
    connect_bd_intf_net [get_bd_intf_pins @DMA@/M_AXI_S2MM] [get_bd_intf_pins axi_mem/S01_AXI]
    connect_bd_intf_net [get_bd_intf_pins axi_mem/M00_AXI] [get_bd_intf_pins @PS@/@PS_SLAVE@]
    connect_bd_intf_net [get_bd_intf_pins @DMA@/M_AXIS_MM2S] [get_bd_intf_pins @ACCEL@/@AXIS_S@]
    connect_bd_intf_net [get_bd_intf_pins @ACCEL@/@AXIS_M@] [get_bd_intf_pins @DMA@/S_AXIS_S2MM]
@IRQ_CONNECT@
    # One clock (@CLOCK_MHZ@ MHz) and one reset for the whole PL.
    set clk [get_bd_pins @PS@/@PS_CLOCK@]
    foreach pin {@CLOCK_PINS@} {
        connect_bd_net $clk [get_bd_pins $pin]
    }
    connect_bd_net [get_bd_pins @PS@/@PS_RESET@] [get_bd_pins rst_pl/ext_reset_in]
    foreach pin {@RESET_PINS@} {
        connect_bd_net [get_bd_pins rst_pl/peripheral_aresetn] [get_bd_pins $pin]
    }
    foreach pin {axi_ctrl/aresetn axi_mem/aresetn} {
        connect_bd_net [get_bd_pins rst_pl/interconnect_aresetn] [get_bd_pins $pin]
    }

    # Fixed addresses: the driver's defaults and the .hwh agree.
    set ps_space [get_bd_addr_spaces @PS@/Data]
    assign_bd_address -offset @ACCEL_BASE@ -range @SPAN_HEX@ -target_address_space $ps_space \
        [get_bd_addr_segs @ACCEL@/@AXIL@/@BLOCK@] -force
    assign_bd_address -offset @DMA_BASE@ -range @DMA_RANGE@ -target_address_space $ps_space \
        [get_bd_addr_segs @DMA@/S_AXI_LITE/Reg] -force
@IRQ_ADDRESS@
    foreach space {@DMA@/Data_MM2S @DMA@/Data_S2MM} {
        assign_bd_address -offset 0x00000000 -range @DDR_RANGE@ \
            -target_address_space [get_bd_addr_spaces $space] \
            [get_bd_addr_segs @PS@/@DDR_SEGMENT@] -force
    }

    validate_bd_design
    save_bd_design
    set bd_file [get_files @BD@.bd]
    generate_target all $bd_file
    add_files -norecurse [make_wrapper -files $bd_file -top]
    set_property top @BD@_wrapper [current_fileset]
    update_compile_order -fileset sources_1

    launch_runs impl_1 -to_step write_bitstream -jobs $jobs
    wait_on_run impl_1
    if {[get_property PROGRESS [get_runs synth_1]] ne "100%"} {
        error "insitu: synthesis failed for @BOARD@; see $proj_dir/$project.runs/synth_1/runme.log"
    }
    if {[get_property PROGRESS [get_runs impl_1]] ne "100%"} {
        error "insitu: implementation failed for @BOARD@; see $proj_dir/$project.runs/impl_1/runme.log"
    }

    open_run impl_1
    report_utilization -file [file join $out_dir @BIT@_utilization.rpt]
    report_utilization -hierarchical -file [file join $out_dir @BIT@_utilization_hier.rpt]
    report_timing_summary -file [file join $out_dir @BIT@_timing.rpt]
    report_power -file [file join $out_dir @BIT@_power.rpt]
    set wns [get_property STATS.WNS [get_runs impl_1]]
    set whs [get_property STATS.WHS [get_runs impl_1]]
    set failed 0
    foreach slack [list $wns $whs] {
        if {![string is double -strict $slack] || $slack < 0} {
            set failed 1
        }
    }
    if {$failed} {
        error "insitu: timing not met on @BOARD@ at @CLOCK_MHZ@ MHz (WNS $wns ns, WHS $whs ns); see @BIT@_timing.rpt"
    }

    # The bitstream and its hardware handoff, side by side under one name for pynq.Overlay.
    set bit [file join $proj_dir $project.runs impl_1 @BD@_wrapper.bit]
    set hwh ""
    foreach dir {gen srcs} {
        set candidate [file join $proj_dir $project.$dir sources_1 bd @BD@ hw_handoff @BD@.hwh]
        if {[file exists $candidate]} {
            set hwh $candidate
            break
        }
    }
    if {![file exists $bit] || $hwh eq ""} {
        error "insitu: bitstream ($bit) or hardware handoff (@BD@.hwh) missing after the build"
    }
    file copy -force $bit [file join $out_dir @BIT@.bit]
    file copy -force $hwh [file join $out_dir @BIT@.hwh]
    close_project
    puts "insitu: wrote [file join $out_dir @BIT@.bit] and @BIT@.hwh (WNS $wns ns)"
}
"""


def _hex(value: int) -> str:
    return f"0x{value:08X}"


_IRQ_CELLS = r"""    # Interrupts: the accelerator's and the DMA's, through an AXI interrupt controller to the PS.
    set intc [create_bd_cell -type ip -vlnv xilinx.com:ip:axi_intc:* @INTC@]
    set_property -dict [list CONFIG.C_IRQ_CONNECTION {1} CONFIG.C_IRQ_IS_LEVEL {1}] $intc
    set irq_concat [create_bd_cell -type ip -vlnv xilinx.com:ip:xlconcat:* irq_concat]
    set_property -dict [list CONFIG.NUM_PORTS {3}] $irq_concat
"""

_IRQ_CONNECT = r"""    connect_bd_intf_net [get_bd_intf_pins axi_ctrl/M02_AXI] [get_bd_intf_pins @INTC@/s_axi]
    connect_bd_net [get_bd_pins @ACCEL@/@IRQ_PORT@] [get_bd_pins irq_concat/In0]
    connect_bd_net [get_bd_pins @DMA@/mm2s_introut] [get_bd_pins irq_concat/In1]
    connect_bd_net [get_bd_pins @DMA@/s2mm_introut] [get_bd_pins irq_concat/In2]
    connect_bd_net [get_bd_pins irq_concat/dout] [get_bd_pins @INTC@/intr]
    connect_bd_net [get_bd_pins @INTC@/irq] [get_bd_pins @PS@/@PS_IRQ@]
"""

_IRQ_ADDRESS = r"""    assign_bd_address -offset @INTC_BASE@ -range @INTC_RANGE@ -target_address_space $ps_space \
        [get_bd_addr_segs @INTC@/S_AXI/Reg] -force
"""


def block_design_tcl(key: str, interrupt: bool = False) -> str:
    """Tcl that builds one board's block design and bitstream (``bd_<board>.tcl``)."""
    b = board_design(key)
    master, slave, clock, reset, port_clocks, ps_irq = PS_PINS[b.ps]
    clock_mhz = mhz(b.clock_hz)
    values = dict(
        BOARD=key, DESCRIPTION=b.description, PART=b.part, BIT=bitstream_name(key), BD=BD_NAME,
        BOARD_PARTS=" ".join(b.board_parts), VLNV=IP_VLNV, PS=b.ps_cell, ACCEL=ACCEL_CELL,
        DMA=DMA_CELL, AXIL=AXIL_BUSIF, AXIS_S=AXIS_SLAVE_BUSIF, AXIS_M=AXIS_MASTER_BUSIF,
        RST=RESET_PORT, BLOCK=ADDRESS_BLOCK, SPAN=ADDRESS_SPAN, SPAN_HEX=_hex(ADDRESS_SPAN),
        ACCEL_BASE=_hex(b.accel_base), DMA_BASE=_hex(b.dma_base), DMA_RANGE=_hex(b.dma_range),
        DDR_SEGMENT=b.ddr_segment, DDR_RANGE=_hex(b.ddr_range), HP_BITS=b.hp_bits,
        STREAM_BITS=STREAM_BITS, DMA_LENGTH_BITS=DMA_LENGTH_BITS, CLOCK_MHZ=clock_mhz,
        PS_MASTER=master, PS_SLAVE=slave, PS_CLOCK=clock, PS_RESET=reset,
        CLOCK_PINS=" ".join([f"{b.ps_cell}/{pin}" for pin in port_clocks]
                            + ["axi_ctrl/aclk", "axi_mem/aclk", f"{DMA_CELL}/s_axi_lite_aclk",
                               f"{DMA_CELL}/m_axi_mm2s_aclk", f"{DMA_CELL}/m_axi_s2mm_aclk",
                               f"{ACCEL_CELL}/{CLOCK_PORT}", "rst_pl/slowest_sync_clk"]
                            + ([f"{INTC_CELL}/s_axi_aclk"] if interrupt else [])),
        RESET_PINS=" ".join([f"{ACCEL_CELL}/{RESET_PORT}", f"{DMA_CELL}/axi_resetn"]
                            + ([f"{INTC_CELL}/s_axi_aresetn"] if interrupt else [])),
        CTRL_MI=3 if interrupt else 2,
        IRQ_NOTE=f", {INTC_CELL}/S_AXI at {_hex(b.intc_base)}" if interrupt else "",
        INTC=INTC_CELL, INTC_BASE=_hex(b.intc_base), INTC_RANGE=_hex(INTC_RANGE),
        IRQ_PORT=INTERRUPT_PORT, PS_IRQ=ps_irq,
    )
    ps_setup = _subst(_PS_SETUP[b.ps].replace("@IRQ_CONFIG@",
                                              _PS_IRQ_CONFIG[b.ps] if interrupt else ""),
                      PS=b.ps_cell, HP_BITS=b.hp_bits, CLOCK_MHZ=clock_mhz)
    template = _BD_TEMPLATE.replace("@PS_SETUP@", ps_setup.strip("\n"))
    for key_, block in (("IRQ_CELLS", _IRQ_CELLS), ("IRQ_CONNECT", _IRQ_CONNECT),
                        ("IRQ_ADDRESS", _IRQ_ADDRESS)):
        template = template.replace(f"@{key_}@\n", block if interrupt else "")
    body = _subst(template, **values)
    return _header(f"Block design and bitstream of the insitu accelerator on {b.description}.") + body


_BUILD_TEMPLATE = r"""# End to end, in Vivado batch mode, from this folder:
#   vivado -mode batch -source build_@BOARD@.tcl [-tclargs JOBS]
# Packages @TOP@_@BOARD@.v (generated with this board's accelerator parameters; its clock
# @CLOCK_MHZ@ MHz) as IP @VLNV@, builds the @DESCRIPTION@ block design, runs synthesis,
# implementation and write_bitstream, and leaves @BIT@.bit and @BIT@.hwh in this folder
# (copy both to the board and load them with pynq.Overlay("@BIT@.bit")).

set here [file dirname [file normalize [info script]]]
set jobs 4
if {[info exists argv] && [llength $argv] > 0} {
    set jobs [lindex $argv 0]
}
source [file join $here package_ip.tcl]
source [file join $here bd_@BOARD@.tcl]
set build_dir [file join $here build_@BOARD@]
set ip_repo [file join $build_dir ip_repo]
file mkdir $build_dir
insitu_package_ip $here $ip_repo @PART@ @BOARD@
insitu_build_@BOARD@ $ip_repo $build_dir $here $jobs
"""


def build_tcl(key: str) -> str:
    """The top-level script of one board (``build_<board>.tcl``)."""
    b = board_design(key)
    return _header(f"Build the insitu accelerator for {b.description}.") + _subst(
        _BUILD_TEMPLATE, BOARD=key, TOP=TOP_MODULE, VLNV=IP_VLNV, DESCRIPTION=b.description,
        BIT=bitstream_name(key), PART=b.part, CLOCK_MHZ=mhz(b.clock_hz))


def tcl_files(interrupt: bool = False) -> dict[str, str]:
    """Every Tcl file ``insitu rtl generate`` writes: file name -> text.

    ``interrupt``: the top level has the :data:`INTERRUPT_PORT` output (see :func:`has_interrupt`).
    """
    files = {"package_ip.tcl": package_ip_tcl(interrupt)}
    for key in BOARD_DESIGNS:
        files[f"bd_{key}.tcl"] = block_design_tcl(key, interrupt)
        files[f"build_{key}.tcl"] = build_tcl(key)
    return files


# ---------------------------------------------------------------------------------------------
# The top level's Verilog against the contract


def verilog_ports(verilog: str, module: str) -> dict[str, tuple[str, int]]:
    """The ports of ``module`` in Verilog text: name -> (direction, width)."""
    import re

    head = re.search(rf"^\s*module\s+{re.escape(module)}\s*\((.*?)\)\s*;", verilog, re.MULTILINE | re.DOTALL)
    if not head:
        raise ValueError(f"no module {module} in the Verilog")
    names = [n.strip() for n in head.group(1).split(",") if n.strip()]
    end = verilog.find("endmodule", head.end())
    body = verilog[head.end():end if end >= 0 else len(verilog)]
    ports = {}
    for name in names:
        decl = re.search(rf"^\s*(input|output|inout)\s+(?:wire\s+|reg\s+)?(?:signed\s+)?"
                         rf"(?:\[(\d+):(\d+)\]\s*)?{re.escape(name)}\s*;", body, re.MULTILINE)
        if not decl:
            raise ValueError(f"module {module}: no declaration of port {name}")
        width = abs(int(decl.group(2)) - int(decl.group(3))) + 1 if decl.group(2) else 1
        ports[name] = (decl.group(1), width)
    return ports


def has_interrupt(verilog: str, module: str = TOP_MODULE) -> bool:
    """Whether the top level has the optional :data:`INTERRUPT_PORT` output."""
    return INTERRUPT_PORT in verilog_ports(verilog, module)


def check_top_ports(verilog: str, module: str = TOP_MODULE) -> list[str]:
    """Mismatches between the top-level Verilog and :func:`top_ports` (empty: it conforms).

    Every contract port must exist with its direction and width; an extra input is an error too
    (the block design would leave it unconnected). Extra outputs are allowed (left unconnected).
    """
    found = verilog_ports(verilog, module)
    problems = []
    expected = top_ports(interrupt=INTERRUPT_PORT in found)
    for name, (direction, width) in expected.items():
        if name not in found:
            problems.append(f"missing port {name} ({direction} [{width}])")
        elif found[name] != (direction, width):
            problems.append(f"port {name} is {found[name][0]} [{found[name][1]}], expected "
                            f"{direction} [{width}]")
    for name, (direction, _) in found.items():
        if name not in expected and direction != "output":
            problems.append(f"unexpected {direction} port {name} (the block design would leave it "
                            "unconnected)")
    return problems
