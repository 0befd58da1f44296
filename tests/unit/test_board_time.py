"""The board's time from what the firmware counted (insitu.mcu.board_time)."""

import pytest

from insitu.boards import get_board
from insitu.errors import InsituError
from insitu.mcu.board_time import board_time, cycles_per_instruction, describe

TWIN = get_board("stm32f746-disco-sim")


def test_the_twin_board_carries_the_calibrated_cpi_of_its_board():
    cpi = cycles_per_instruction(TWIN)
    assert cpi == cycles_per_instruction(get_board("stm32f746-disco"))
    assert 0.5 <= cpi <= 1.5, "a Cortex-M7 issues at most two instructions a cycle"


def test_instructions_counted_on_the_twin_become_seconds_at_the_board_clock():
    stats = {"count": "instructions", "train_steps": 4, "train_mk": 2, "train_k": 400_000,
             "infer_steps": 2, "infer_mk": 0, "infer_k": 300_000}
    bt = board_time(stats, TWIN)
    assert bt is not None
    cpi = cycles_per_instruction(TWIN)
    assert bt["clock_hz"] == 216_000_000 and bt["cycles_per_instruction"] == cpi
    assert bt["train"]["instructions_per_sample"] == 600_000_000          # 2.4e9 / 4
    assert bt["train"]["cycles_per_sample"] == round(600_000_000 * cpi)
    assert bt["train"]["seconds_per_sample"] == pytest.approx(600_000_000 * cpi / 216e6, abs=1e-6)
    assert bt["infer"]["instructions_per_sample"] == 150_000_000
    assert "ms / training sample on the board at 216 MHz" in describe(bt)


def test_a_board_counts_cycles_and_the_unix_twin_nothing():
    bt = board_time({"count": "cycles", "train_steps": 2, "train_mk": 0, "train_k": 216_000}, TWIN)
    assert bt is not None
    assert bt["cycles_per_instruction"] is None and bt["infer"] is None
    assert bt["train"] == {"samples": 2, "instructions_per_sample": None, "cycles_per_sample": 108_000_000,
                           "seconds_per_sample": 0.5}
    assert board_time({"count": "none"}, TWIN) is None and describe(None) == ""


def test_a_board_file_without_a_cpi_is_named():
    board = get_board("ultra96v2")
    with pytest.raises(InsituError, match="cycles_per_instruction"):
        cycles_per_instruction(board)
