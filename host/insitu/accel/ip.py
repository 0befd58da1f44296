"""Names of the accelerator as an IP in a block design: bus interfaces, ports, cells, PS pins.

The Vivado Tcl (:mod:`insitu.rtl.vivado`) builds the block design with these names, the .hwh
reader and the twins' .hwh writer (:mod:`insitu.fpga.hwh`) find the cells by them, and a PYNQ
overlay exposes the cells under them.
"""

from .regmap import ADDR_BITS

#: Bus interface names of the IP, which are also the prefixes of the top level's ports.
AXIL_BUSIF = "s_axi_control"
AXIS_SLAVE_BUSIF = "s_axis"
AXIS_MASTER_BUSIF = "m_axis"
CLOCK_PORT = "aclk"
RESET_PORT = "aresetn"
#: Optional level-high interrupt output of the top level ("op finished"). When the top has it,
#: the IP declares an interrupt interface and the block design routes it, with the DMA's two
#: interrupts, through an AXI interrupt controller to the PS (what pynq.Interrupt needs).
INTERRUPT_PORT = "interrupt"
#: Address block of ``s_axi_control`` (the BD segment is ``<cell>/s_axi_control/reg0``).
ADDRESS_BLOCK = "reg0"
ADDRESS_SPAN = 1 << ADDR_BITS
#: Block design and cell names (a PYNQ overlay exposes the cells under these names).
BD_NAME = "insitu"
ACCEL_CELL = "insitu_accel_0"
DMA_CELL = "axi_dma_0"
INTC_CELL = "axi_intc_0"
INTC_RANGE = 0x1_0000
#: Largest DMA transfer: 2**26 - 1 bytes per simple-mode transfer.
DMA_LENGTH_BITS = 26

#: The Zynq processing system's pins the block design connects, per PS IP.
PS_PINS = {
    # master port, HP slave port, PL clock, PL reset (active low), clock pins of the two ports
    # and the PL-to-PS interrupt input.
    "zynq_ultra_ps_e": ("M_AXI_HPM0_FPD", "S_AXI_HP0_FPD", "pl_clk0", "pl_resetn0",
                        ("maxihpm0_fpd_aclk", "saxihp0_fpd_aclk"), "pl_ps_irq0"),
    "processing_system7": ("M_AXI_GP0", "S_AXI_HP0", "FCLK_CLK0", "FCLK_RESET0_N",
                           ("M_AXI_GP0_ACLK", "S_AXI_HP0_ACLK"), "IRQ_F2P"),
}


def bitstream_name(board: str) -> str:
    """The overlay's file name without suffix (``<name>.bit`` beside ``<name>.hwh``) for a board."""
    return f"insitu_{board}"
