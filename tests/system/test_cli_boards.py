"""`insitu boards`, `insitu data list` and `insitu doctor`: their tables never cut a cell when
stdout is not a terminal (a pipe, a file, CliRunner's output)."""

import pytest
from click.testing import CliRunner

from insitu.cli import main

pytestmark = pytest.mark.system


def test_boards_piped_shows_every_name_in_full():
    result = CliRunner().invoke(main, ["boards"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "stm32f746-disco-sim" in result.output and "…" not in result.output
    for name in ("ultra96v2-sim", "zedboard-sim", "STM32F746NGH6"):
        assert name in result.output


def test_data_list_piped_is_not_cut():
    result = CliRunner().invoke(main, ["data", "list"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "fashion-mnist" in result.output and "…" not in result.output
