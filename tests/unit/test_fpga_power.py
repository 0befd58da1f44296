"""The FPGA boards' energy tables (Horowitz's figures, each board's static power)."""

import pytest

from insitu.fpga import power
from insitu.fpga.power import DEFAULT, table_for

pytestmark = pytest.mark.unit


def test_board_tables_price_the_pe_macs_with_horowitz_figures():
    assert DEFAULT.mac_16x4_pj == pytest.approx(0.3) and DEFAULT.mac_16x16_pj == pytest.approx(0.8800, abs=1e-3)
    assert DEFAULT.sram_word_pj == pytest.approx(2.5)
    assert DEFAULT.dram_byte_pj == pytest.approx(243.75)


def test_table_for_twins_and_unknown_boards():
    assert table_for("zedboard-sim") is power.ZEDBOARD and table_for("ultra96v2") is DEFAULT
    with pytest.raises(ValueError, match="no energy table"):
        table_for("stm32f746-disco")
