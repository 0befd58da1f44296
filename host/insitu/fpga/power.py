"""The FPGA boards' energy tables: Horowitz's per-operation figures
(:mod:`insitu.measure.energy`) with each board's static power.

A run on a board with readable power rails measures its energy instead
(:func:`insitu.measure.rails.record_rails`); twins and boards without rails are estimated with
:func:`insitu.measure.energy.estimate_energy` and the table :func:`table_for` gives.

* 45 nm ASIC figures are used as they are for 16 nm (ZU3EG) and 28 nm (Z-7020) FPGAs. A smaller
  node lowers the energy, FPGA fabric (routing, a whole DSP slice per narrow MAC) raises it; the
  two do not cancel exactly, so the dynamic estimate compares algorithms with each other and is
  not an absolute figure for the board.
* Static power is an ASSUMPTION of the order of Vivado ``report_power`` / Xilinx Power Estimator
  figures for these parts, not a measurement: ZU3EG PL 0.3 W and PS 0.75 W (with a small PL design
  this totals ~1.2 W, the on-chip power the TT-on-FPGA paper reports for its Ultra96-V2 design);
  Z-7020 PL 0.14 W and PS 1.2 W. A busy CPU core adds ``cpu_active_w`` on top (0.3 W assumed for
  both). Board-level parts (DRAM chips, regulators, USB, Wi-Fi) are not in the estimate; the rails
  see some of them.
"""

from __future__ import annotations

from insitu.measure.energy import ACCUMULATE_PJ, DRAM_BYTE_PJ, SRAM_WORD_PJ, EnergyTable, mult_pj

ULTRA96V2 = EnergyTable(
    name="ultra96v2 (ZU3EG; Horowitz 45 nm ops, assumed static power)",
    mac_16x4_pj=mult_pj(16, 4) + ACCUMULATE_PJ, mac_16x16_pj=mult_pj(16, 16) + ACCUMULATE_PJ,
    sram_word_pj=SRAM_WORD_PJ, dram_byte_pj=DRAM_BYTE_PJ,
    pl_static_w=0.3, ps_static_w=0.75, cpu_active_w=0.3)
ZEDBOARD = EnergyTable(
    name="zedboard (Z-7020; Horowitz 45 nm ops, assumed static power)",
    mac_16x4_pj=ULTRA96V2.mac_16x4_pj, mac_16x16_pj=ULTRA96V2.mac_16x16_pj,
    sram_word_pj=SRAM_WORD_PJ, dram_byte_pj=DRAM_BYTE_PJ,
    pl_static_w=0.14, ps_static_w=1.2, cpu_active_w=0.3)
DEFAULT = ULTRA96V2
TABLES = {"ultra96v2": ULTRA96V2, "zedboard": ZEDBOARD}


def table_for(board: str) -> EnergyTable:
    """The table of a board or of its twin (``ultra96v2-sim`` -> ``ultra96v2``)."""
    key = board.removesuffix("-sim")
    if key not in TABLES:
        raise ValueError(f"no energy table for board {board!r}; known: {', '.join(TABLES)}")
    return TABLES[key]
